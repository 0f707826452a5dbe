"""Tool calls a model writes as text, streamed: the caller gets the call, never its text.

Asked for a whole answer, the guard hands a call written into ``content`` back as a structured
call (``validation/_extract.py``). Streamed, the text of that call must not reach the caller
first and the call after it: the gate in ``guard/_stream.py`` holds the text back from where a
call may begin, and what it held goes out at the end when it was no call. Compared here: the
stream with the whole answer, on recorded real SmolLM2 answers and on every written shape, and
the guarded stream with the raw one where nothing is wrong.
"""

from __future__ import annotations

import inspect
import json
import random
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentguard as ag
from _openai_upstream import Upstream, wrapped_client
from agentguard import GuardConfig
from agentguard.guard import Guard
from agentguard.guard._stream import CallGate
from agentguard.testing import FakeClock, Reply, ScriptedModel
from agentguard.transport import ModelRequest, StreamChunk
from test_guard_realanswers import RECORDED, _reply, _request
from test_wrap import TOOLS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import agenttasks
from bench_agenttasks import SMALL_MODEL_PROFILE

openai = pytest.importorskip("openai")
GROUNDING = Path(__file__).parent / "data" / "smollm2_grounding.jsonl"
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")

ONE_TIER = {
    "tiers": {"small": {"model": "small"}},
    "escalation": {"chain": ["small"]},
    "memory_pressure": {"enabled": False},
}
ASKED = [{"role": "user", "content": "show me setup.cfg"}]
STYLES = ["hermes", "hermes_unclosed", "function_tag", "python_tag", "mistral", "fenced", "bare"]
#: healthy answers with the characters a call may open with, in prose and code
PROSE = [
    "The set {a, b} has two items; see [the docs](https://example.org) and note x < 5.",
    "Use this:\n```python\nconfig = {'path': 'setup.cfg'}\nprint(config)\n```\nThat is all.",
    '```json\n{"city": "Paris", "temperature_c": 18}\n```',
    '{"city": "Paris", "temperature_c": 18}',
    "functional programming is fine.",
    "<b>bold</b> [x] {y} `z`",
]


def _guard(model: ScriptedModel, **extra: Any) -> Guard:
    clock = FakeClock()
    config = GuardConfig.from_dict({**ONE_TIER, **extra}, env={})
    return Guard(model, config, clock=clock, sleep=clock.sleep, rng=random.Random(0))


def _streamed(chunks: list[StreamChunk]) -> tuple[str, list[tuple[str, str]]]:
    text = "".join(c.content or "" for c in chunks)
    calls = [
        (call["function"]["name"], call["function"]["arguments"])
        for c in chunks
        for call in c.tool_calls
    ]
    return text, calls


def _whole(message: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()
    ]
    return message.get("content") or "", calls


# -- the gate ----------------------------------------------------------------------------------

PIECES = st.sampled_from(
    [
        "a",
        "word ",
        " ",
        "\n",
        "{",
        "}",
        "[",
        "<",
        "`",
        '"',
        ":",
        "```json\n",
        '{"name":',
        '"name"',
        "<tool_call>",
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "functions.",
        "<function=",
    ]
)


def _feed(text: str, cuts: list[int]) -> tuple[CallGate, list[str]]:
    gate, out, at = CallGate(), [], 0
    for cut in [*sorted({c % (len(text) + 1) for c in cuts}), len(text)]:
        out.append(gate.feed(text[at:cut]))
        assert len(gate._pending) < CallGate.LOOKAHEAD  # what waits stays bounded
        at = cut
    return gate, out


@given(st.lists(PIECES, max_size=40).map("".join), st.lists(st.integers(0, 400), max_size=12))
def test_the_gate_releases_a_prefix_whatever_the_chunks(text: str, cuts: list[int]) -> None:
    """What goes out is a prefix of the text; what it is, and whether a call was found, do not
    depend on where the chunks were cut; without a call nothing is lost."""
    gate, out = _feed(text, cuts)
    assert "".join(out) == gate.sent
    assert text.startswith(gate.sent)
    whole, _ = _feed(text, [])
    assert (gate.held, gate.sent + gate._pending) == (whole.held, whole.sent + whole._pending)
    if not gate.held:
        assert gate.sent + gate._pending == text


@given(st.text(alphabet=st.characters(blacklist_characters="<[{`"), min_size=1))
def test_text_that_cannot_open_a_call_goes_out_as_it_comes(text: str) -> None:
    """No character a call opens with, after a first word: released at once, whole."""
    gate = CallGate()
    assert gate.feed("Sure, " + text) == "Sure, " + text


@pytest.mark.parametrize("style", STYLES)
def test_each_written_shape_is_held_from_its_opening(style: str) -> None:
    """After prose, the call's text is held from where it opens, whatever the chunking."""
    call = Reply.embedded("read_file", {"path": "a.txt"}, style=style).content
    assert call is not None
    for size in (1, 2, 5, 64):
        gate = CallGate()
        text = "Let me look. " + call
        released = "".join(gate.feed(text[i : i + size]) for i in range(0, len(text), size))
        assert gate.held
        assert released == "Let me look. "


# -- stream against whole answer ---------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 4, 16])
@pytest.mark.parametrize("style", STYLES)
def test_a_streamed_text_call_arrives_as_the_whole_answer_has_it(style: str, size: int) -> None:
    """Streamed, the caller gets the structured call and no text of it, as non-streamed."""
    reply = Reply.embedded("read_file", {"path": "a.txt"}, style=style)
    request = ModelRequest(model="small", messages=ASKED, params={"tools": TOOLS})
    whole = _guard(ScriptedModel([reply])).complete(request)
    chunks = list(_guard(ScriptedModel([reply], chunk_size=size)).stream(request))
    assert _streamed(chunks) == _whole(whole.message) == ("", [("read_file", '{"path": "a.txt"}')])
    assert chunks[-1].finish_reason == "tool_calls"


def _recorded() -> list[tuple[str, list[Reply], ModelRequest]]:
    """Every recorded real answer (both files) with the request it answered."""
    cases = [
        (f"{line['task']}-{i}", [_reply(line)], _request(line)) for i, line in enumerate(RECORDED)
    ]
    for i, text in enumerate(GROUNDING.read_text(encoding="utf-8").splitlines()):
        line = json.loads(text)
        replies = [
            Reply(a["content"], tuple(a["tool_calls"] or ()), a["finish_reason"])
            for a in line["answers"]
        ]
        messages = [*agenttasks.SEED_MESSAGES, *line["messages"]]
        params = {"tools": agenttasks.TOOLS, "temperature": 0, "max_tokens": 160}
        cases.append((f"{line['case']}-{i}", replies, ModelRequest("smollm2", messages, params)))
    return cases


RECORDED_CASES = _recorded()


@pytest.mark.parametrize("profile", [False, True], ids=["default", "profile"])
@pytest.mark.parametrize("size", [1, 16])
@pytest.mark.parametrize("case", RECORDED_CASES, ids=lambda case: case[0])
def test_recorded_real_answers_stream_as_they_answer_whole(
    case: tuple[str, list[Reply], ModelRequest], size: int, profile: bool
) -> None:
    """Every recorded SmolLM2 answer (both server modes, both turns, and the answers the
    small-model profile's checks reject): streamed, the caller gets what the whole answer
    has — the same calls and the same text, after the same re-asks. Under the profile a text
    answer is held until judged, so a rejected one never reaches the caller."""
    _, replies, request = case
    script = [*replies, *[Reply.text("done")] * 8]
    extra = {"tool_validation": SMALL_MODEL_PROFILE} if profile else {}
    whole_model, stream_model = ScriptedModel(script), ScriptedModel(script, chunk_size=size)
    whole = _guard(whole_model, **extra).complete(request)
    streamed = _streamed(list(_guard(stream_model, **extra).stream(request)))
    assert len(stream_model.requests) == len(whole_model.requests)
    assert streamed == _whole(whole.message)


@pytest.mark.parametrize("text", PROSE)
def test_prose_with_braces_streams_whole_and_unchanged(text: str) -> None:
    """No call in it: the held text goes out at the end; the caller reads every character."""
    request = ModelRequest(model="small", messages=ASKED, params={"tools": TOOLS})
    for size in (1, 7, 64):
        chunks = list(_guard(ScriptedModel([Reply.text(text)], chunk_size=size)).stream(request))
        assert _streamed(chunks) == (text, [])


def test_prose_before_a_call_streams_live_and_the_call_follows() -> None:
    """The text before the call goes out as it comes; the call is handed over structured."""
    reply = Reply.text('I will read it now. {"name": "read_file", "arguments": {"path": "a.txt"}}')
    request = ModelRequest(model="small", messages=ASKED, params={"tools": TOOLS})
    chunks = list(_guard(ScriptedModel([reply], chunk_size=4)).stream(request))
    text, calls = _streamed(chunks)
    assert text.rstrip() == "I will read it now."
    assert calls == [("read_file", '{"path": "a.txt"}')]


def test_without_tools_or_repairs_nothing_is_held() -> None:
    """No tools on offer (or repairs off): nothing is extracted, so every chunk goes out as it
    came, the upstream's own object."""
    reply = Reply.embedded("read_file", {"path": "a.txt"}, style="hermes")
    for params, extra in (({}, {}), ({"tools": TOOLS}, {"tool_validation": {"repair": False}})):
        request = ModelRequest(model="small", messages=ASKED, params=params)
        chunks = list(_guard(ScriptedModel([reply], chunk_size=4), **extra).stream(request))
        texts = [c.content for c in chunks if c.content]
        assert all(len(t) <= 4 for t in texts)
        assert "".join(texts) == reply.content


# -- through the real openai client ------------------------------------------------------------


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _chat(client: Any, asynchronous: bool) -> list[Any]:
    stream = await _maybe(
        client.chat.completions.create(model="small", messages=ASKED, tools=TOOLS, stream=True)
    )
    return [c async for c in stream] if asynchronous else list(stream)


def _read(chunks: list[Any]) -> tuple[str, list[tuple[str, str]]]:
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [
        (call.function.name, call.function.arguments)
        for c in chunks
        if c.choices
        for call in c.choices[0].delta.tool_calls or ()
    ]
    return text, calls


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_the_openai_client_reads_the_call_not_its_text(asynchronous: bool) -> None:
    """wrap(): the SDK's stream carries the structured call only; the SDK's accumulated
    message (``stream.get_final_completion``'s shape) has no text of it."""
    config = GuardConfig.from_dict(ONE_TIER, env={})
    model = ScriptedModel([Reply.embedded("read_file", {"path": "a.txt"}, style="hermes")])
    chunks = await _chat(wrapped_client(model, config, asynchronous=asynchronous), asynchronous)
    assert _read(chunks) == ("", [("read_file", '{"path": "a.txt"}')])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("text", PROSE)
async def test_healthy_prose_reads_as_the_raw_stream(text: str, asynchronous: bool) -> None:
    """Differential, guarded against raw: the same text and finish through the real client."""
    config = GuardConfig.from_dict(ONE_TIER, env={})
    raw_upstream = Upstream(http, [Reply.text(text)])
    raw = await _chat(raw_upstream.client(openai, asynchronous=asynchronous), asynchronous)
    model = ScriptedModel([Reply.text(text)])
    guarded = await _chat(wrapped_client(model, config, asynchronous=asynchronous), asynchronous)
    assert _read(guarded) == _read(raw) == (text, [])
    assert guarded[-1].choices[0].finish_reason == raw[-1].choices[0].finish_reason


def test_a_responses_stream_carries_the_function_call_item_only() -> None:
    """Responses API through wrap(): no text delta of the written call, one function call."""
    config = GuardConfig.from_dict(ONE_TIER, env={})
    reply = Reply.embedded("read_file", {"path": "b.txt"}, style="hermes")
    client = ag.wrap(Upstream(http, [reply]).client(openai, asynchronous=False), config)
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    events = list(
        client.responses.create(model="small", input="read b.txt", tools=tools, stream=True)
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "<tool_call>" not in deltas
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.name, json.loads(i.arguments)) for i in done if i.type == "function_call"] == [
        ("read_file", {"path": "b.txt"})
    ]


# -- the guard's words copied back -------------------------------------------------------------

COPIED = json.loads(
    (Path(__file__).parent / "data" / "smollm2_copied_corrections.json").read_text("utf-8")
)


def _answers(run: dict[str, Any]) -> list[Reply]:
    return [
        Reply(a["content"], tuple(a["tool_calls"] or ()), a["finish_reason"])
        for a in run["answers"]
    ]


def _asked(run: dict[str, Any]) -> ModelRequest:
    messages = [*agenttasks.SEED_MESSAGES, *run["messages"]]
    params = {"tools": agenttasks.TOOLS, "temperature": 0, "max_tokens": 160}
    return ModelRequest("smollm2", messages, params)


@pytest.mark.parametrize("size", [1, 16])
@pytest.mark.parametrize("run", COPIED, ids=lambda run: run["task"])
def test_a_correction_copied_back_never_streams_out(run: dict[str, Any], size: int) -> None:
    """Recorded: SmolLM2 wrote its call as text (wrong), then copied the guard's correction
    back as its answer, then made the right call. Streamed, the first answer's text is held
    (a call); the copy, the answer to a correction, is held until judged and, rejected, never
    reaches the caller: the stream ends as the whole answer does, with the call alone."""
    whole = _guard(ScriptedModel(_answers(run))).complete(_asked(run))
    model = ScriptedModel(_answers(run), chunk_size=size)
    text, calls = _streamed(list(_guard(model).stream(_asked(run))))
    assert len(model.requests) == len(run["answers"])
    assert (text, calls) == _whole(whole.message)
    assert text == ""
    assert calls == [
        (a["function"]["name"], a["function"]["arguments"])
        for a in run["answers"][-1]["tool_calls"]
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_copied_correction_beside_a_call_is_left_out(stream: bool) -> None:
    """The correction copied back beside the right call (the recorded copy, then the call):
    the call goes on, the guard's words do not, streamed or not."""
    run = COPIED[0]
    first, copy, *_ = run["answers"]
    call = '{"name": "search_flights", "arguments": {"origin": "Berlin", "destination": "Rome"}}'
    script = [Reply(first["content"]), Reply(copy["content"] + "\n" + call)]
    guard = _guard(ScriptedModel(script, chunk_size=5))
    if stream:
        streamed = guard.stream(_asked(run))
        text, calls = _streamed(list(streamed))
        report = streamed.report
    else:
        response = guard.complete(_asked(run))
        text, calls = _whole(response.message)
        report = ag.report_of(response)
    assert text == ""
    assert calls == [("search_flights", '{"origin": "Berlin", "destination": "Rome"}')]
    assert report is not None
    assert any("copied the guard's correction back" in w for w in report.warnings)


def test_a_held_answer_that_degenerates_is_still_cut() -> None:
    """Under the answer checks the text is held until judged; a degenerating answer is cut all
    the same (no more tokens paid for), and goes out whole once judged."""
    phrase = "I will check the logs again."
    model = ScriptedModel([Reply.degenerate(phrase, times=400)], chunk_size=16)
    request = ModelRequest(model="small", messages=ASKED, params={"tools": TOOLS})
    streamed = _guard(model, tool_validation=SMALL_MODEL_PROFILE).stream(request)
    chunks = list(streamed)
    text = "".join(c.content or "" for c in chunks)
    assert len(text) < len(" ".join([phrase] * 400)) // 4
    assert chunks[-1].finish_reason == "length"
    assert streamed.report is not None
    assert any("stream cut" in w for w in streamed.report.warnings)
