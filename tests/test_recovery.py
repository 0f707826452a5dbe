"""The loop recovery ladder (``agentguard.guard._recovery``), rung by rung.

Unit tests of what each rung builds (notes, the recovery turn, pruning, the forcing request),
then an agent that loops for real — the real openai client, sync, async and streaming, over a
scripted upstream — checking exactly what each rung sends upstream, that the caller's history
is never touched, and that a provider's own loop refusal is answered by the ladder.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentguard as ag
from _localmodels import tool
from _openai_upstream import wrapped_client
from agentguard.config import LoopRecoveryConfig
from agentguard.events import LoopRecovery
from agentguard.guard._recovery import (
    add_note,
    climb,
    echoes,
    exchanges,
    force_answer,
    provider_refusal,
    prune,
    results_turn,
    rung_request,
    shrink,
    summary,
)
from agentguard.testing import Fault, Reply, ScriptedModel, capture_events
from agentguard.transport import ORIGINAL, ModelRequest, report_of
from agentguard.types import Severity

openai = pytest.importorskip("openai")

CONFIG = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
QUESTION = [
    {"role": "system", "content": "You book flights."},
    {"role": "user", "content": "Cheapest flight Oslo to Rome tomorrow?"},
]
MODES = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])


def _call(i: int, name: str = "search_flights", args: str = '{"query": "Oslo Rome"}') -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}
        ],
    }


def _result(i: int, content: Any = "[]") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": content}


def _loop(times: int, result: str = "[]") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = copy.deepcopy(QUESTION)
    for i in range(times):
        messages += [_call(i), _result(i, result)]
    return messages


def _paired(messages: list[dict[str, Any]]) -> bool:
    """Every tool call is answered by exactly one tool message after it, and every tool
    message answers a call made before it (by position, ids may repeat)."""
    waiting: list[str] = []
    for message in messages:
        if message.get("role") == "assistant":
            if waiting:
                return False  # a new turn before the last one's results
            waiting = [c["id"] for c in message.get("tool_calls") or ()]
        elif message.get("role") == "tool":
            if message.get("tool_call_id") not in waiting:
                return False
            waiting.remove(message["tool_call_id"])
    return True


# -- notes ----------------------------------------------------------------------------------------


def test_a_note_after_tool_results_is_a_user_turn_at_the_end() -> None:
    """auto and after_results add a user turn after the results, never between them."""
    messages = [*QUESTION, _call(0), _result(0)]
    for placement in ("auto", "after_results"):
        noted = add_note(messages, "[agentguard] look", placement)
        assert noted[:-1] == messages
        assert noted[-1] == {"role": "user", "content": "[agentguard] look"}


def test_auto_merges_into_a_trailing_user_turn() -> None:
    """Two user turns in a row break alternating templates: auto extends the user's text."""
    noted = add_note(QUESTION, "[agentguard] look", "auto")
    assert len(noted) == 2
    assert noted[-1]["content"] == f"{QUESTION[-1]['content']}\n\n[agentguard] look"
    assert add_note(QUESTION, "note", "after_results")[-1] == {"role": "user", "content": "note"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[]", "[]\n\nnote"),
        (None, "note"),
        (
            [{"type": "text", "text": "[]"}],
            [{"type": "text", "text": "[]"}, {"type": "text", "text": "note"}],
        ),
    ],
)
def test_tool_result_placement_goes_inside_the_last_result(content: Any, expected: Any) -> None:
    """tool_result puts the note in the last tool message; a changed message loses ORIGINAL."""
    last = {**_result(0, content), ORIGINAL: {"type": "function_call_output"}}
    messages = [*QUESTION, _call(0), last]
    before = copy.deepcopy(messages)
    noted = add_note(messages, "note", "tool_result")
    assert messages == before
    assert len(noted) == len(messages)
    assert noted[-1]["content"] == expected
    assert ORIGINAL not in noted[-1]


# -- pruning, the recovery turn --------------------------------------------------------------------


def test_prune_keeps_the_first_of_repeated_exchanges() -> None:
    """The same call with the same result again is left out, call and result together."""
    messages = _loop(5)
    before = copy.deepcopy(messages)
    pruned = prune(messages, tool="search_flights")
    assert messages == before
    assert pruned == _loop(1)


def test_prune_of_the_looping_tool_drops_same_results_whatever_the_arguments() -> None:
    """Rewordings that all come back empty: one is enough; another tool's equal acks stay."""
    messages = copy.deepcopy(QUESTION)
    for i, query in enumerate(["Oslo Rome", "cheap Oslo Rome", "Oslo to Rome low cost"]):
        messages += [_call(i, args=json.dumps({"query": query})), _result(i)]
    for i, path in enumerate(["a.txt", "b.txt"], start=3):
        messages += [_call(i, "write_file", json.dumps({"path": path})), _result(i, "ok")]
    pruned = prune(messages, tool="search_flights")
    assert [m.get("tool_call_id") for m in pruned if m["role"] == "tool"] == ["c0", "c3", "c4"]
    # without naming the tool only exact repeats go: nothing here
    assert prune(messages) == messages


def test_prune_keeps_an_assistant_text_and_its_other_calls() -> None:
    """A message with a repeated call among others keeps the rest; ids reused are matched by
    position; a reasoning item standing for a dropped call goes with it."""
    both = {
        "role": "assistant",
        "content": "Searching again.",
        "tool_calls": [
            _call(1)["tool_calls"][0],
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
        ],
        ORIGINAL: {"kept": False},
    }
    reasoning = {"role": "x-agentguard-opaque", ORIGINAL: {"type": "reasoning"}}
    messages = [
        *QUESTION,
        _call(0),
        _result(0),
        both,
        _result(1),
        _result(2, "sunny"),
        reasoning,
        _call(0),  # a reused id
        _result(0),
    ]
    pruned = prune(messages)
    assert pruned[4]["content"] == "Searching again."
    assert [c["id"] for c in pruned[4]["tool_calls"]] == ["c2"]
    assert ORIGINAL not in pruned[4]
    assert pruned[5] == _result(2, "sunny")
    assert len(pruned) == 6
    assert _paired(pruned)


def test_exchanges_pair_results_with_reused_ids_and_missing_ids() -> None:
    """Local servers reuse call_0; some send no id at all: results still pair in order."""
    messages = [*QUESTION, _call(0), _result(0, "one"), _call(0), _result(0, "two")]
    anonymous = {"role": "tool", "content": "three"}
    messages += [_call(9), anonymous]
    assert [e.result for e in exchanges(messages)] == ["one", "two", "three"]


def test_the_recovery_turn_is_compact_and_lists_what_came_back() -> None:
    """One line per distinct call, counted, each cut to digest_chars; at most summary_max_items."""
    cfg = LoopRecoveryConfig(summary_max_items=3, digest_chars=40)
    messages = copy.deepcopy(QUESTION)
    for i in range(50):
        args = json.dumps({"query": f"q{i % 5}"})
        messages += [_call(i, args=args), _result(i, "x " * 500)]
    text = summary(messages, cfg, reason="Loop.")
    lines = text.splitlines()
    assert lines[0].startswith("[agentguard] Loop. You are repeating yourself")
    listed = [line for line in lines if line.startswith("- ")]
    assert len(listed) == 3
    assert all(line.endswith("(10 times)") for line in listed)
    assert all(len(line) < 2 * 40 + 40 for line in listed)
    assert len(text) < 800
    forced = summary(messages, cfg, forced=True)
    assert "Tools are off for this turn" in forced


def test_climb_one_rung_per_flag_and_break_forces_at_least() -> None:
    cfg = LoopRecoveryConfig()
    rungs = cfg.rungs
    assert rungs[climb(-1, Severity.WARNING, cfg)] == "hint"
    assert rungs[climb(0, Severity.CRITICAL, cfg)] == "summary"
    assert rungs[climb(-1, Severity.BREAK, cfg)] == "force"
    assert rungs[climb(3, Severity.BREAK, cfg)] == "escalate"
    assert rungs[climb(5, Severity.BREAK, cfg)] == "stop"
    # a text loop skips force: turning tools off changes nothing for a text answer
    assert rungs[climb(-1, Severity.BREAK, cfg, tool_loop=False)] == "escalate"
    assert rungs[climb(2, Severity.WARNING, cfg, tool_loop=False)] == "escalate"
    short = LoopRecoveryConfig(rungs=["hint", "stop"])
    assert short.rungs[climb(-1, Severity.BREAK, short)] == "stop"


def test_the_ladder_is_configured_from_files_and_the_environment() -> None:
    cfg = ag.GuardConfig.from_dict(
        {"reliability": {"loop_detection": {"recovery": {"rungs": ["hint", "force", "stop"]}}}},
        env={"AGENTGUARD_LOOP_DETECTION__RECOVERY__HINT_PLACEMENT": "tool_result"},
    )
    assert cfg.loop_detection.recovery.rungs == ["hint", "force", "stop"]
    assert cfg.loop_detection.recovery.hint_placement == "tool_result"
    assert ag.GuardConfig().loop_detection.recovery.rungs == [
        "hint", "summary", "prune", "force", "escalate", "stop"
    ]  # fmt: skip


def test_rungs_are_validated() -> None:
    with pytest.raises(ag.ConfigError):
        ag.GuardConfig.from_dict({"loop_detection": {"recovery": {"rungs": ["hint", "hint"]}}})
    with pytest.raises(ag.ConfigError):
        ag.GuardConfig.from_dict({"loop_detection": {"recovery": {"rungs": ["nudge"]}}})
    with pytest.raises(ag.ConfigError):
        ag.GuardConfig.from_dict({"loop_detection": {"recovery": {"hint_placement": "middle"}}})


def test_force_answer_is_a_reusable_request_builder() -> None:
    """force_answer: pruned history, a recovery turn with the results, tool_choice none; the
    request it came from is unchanged."""
    request = ModelRequest(
        model="m", messages=_loop(4), params={"tools": TOOLS, "tool_choice": "auto", "seed": 1}
    )
    before = copy.deepcopy(request.messages)
    forced = force_answer(request, reason="You already have this.", tool="search_flights")
    assert request.messages == before
    assert request.params["tool_choice"] == "auto"
    assert forced.params == {"tool_choice": "none", "seed": 1}
    assert forced.tools == request.tools
    assert forced.messages[:-1] == _loop(1)
    note = forced.messages[-1]
    assert note["role"] == "user"
    assert "You already have this." in note["content"]
    assert 'search_flights({"query": "Oslo Rome"}) -> [] (4 times)' in note["content"]


def test_provider_refusal_is_recognised_only_for_loop_refusals() -> None:
    class Refused(Exception):
        status_code = 400

    class Busy(Exception):
        status_code = 503

    error = provider_refusal(Refused("Error code: 400 - Repetitive tool calls detected"))
    assert error is not None
    assert error.to_error()["detector"] == "provider_refusal"
    assert provider_refusal(Refused("maximum context length is 4096 tokens")) is None
    assert provider_refusal(Busy("Repetitive tool calls detected")) is None


_EXCHANGE = st.tuples(
    st.sampled_from(["search", "read", "write"]),
    st.sampled_from(['{"q": 1}', '{"q": 2}', "{}"]),
    st.sampled_from(["[]", "ok", "Error: nope", "a longer result that says something"]),
    st.integers(1, 3),  # calls in one message
    st.booleans(),  # text beside the calls
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_EXCHANGE, max_size=12), st.sampled_from([None, "search", "read"]))
def test_prune_keeps_pairing_valid_and_every_distinct_answer(
    turns: list[tuple[str, str, str, int, bool]], tool: str | None
) -> None:
    """Whatever the transcript, pruning keeps calls and results paired, never drops a message
    that is no repeated exchange, and keeps one of each (call, result)."""
    messages: list[dict[str, Any]] = copy.deepcopy(QUESTION)
    n = 0
    for name, args, result, count, text in turns:
        calls = []
        for _ in range(count):
            calls.append(
                {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}}
            )
            n += 1
        messages.append(
            {"role": "assistant", "content": "hm" if text else None, "tool_calls": calls}
        )
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": result} for c in calls]
    pruned = prune(messages, tool=tool)
    assert _paired(pruned)
    assert pruned[:2] == QUESTION
    before = {(e.name, e.arguments, e.result) for e in exchanges(messages)}
    after = {(e.name, e.arguments, e.result) for e in exchanges(pruned)}
    if tool is None:
        assert after == before
    else:
        assert {x for x in before if x[0] != tool} <= after
        assert {(x[0], x[2]) for x in before} == {(x[0], x[2]) for x in after}
    assert prune(pruned, tool=tool) == pruned
    # shrinking (a context-length 400) keeps every tool's distinct results, paired
    shrunk = shrink(messages)
    assert _paired(shrunk)
    assert shrunk[:2] == QUESTION
    kept = exchanges(shrunk)
    assert {(e.name, e.result) for e in kept} == {(e.name, e.result) for e in exchanges(messages)}
    assert len({(e.name, e.result) for e in kept}) == len(kept)


# -- a real agent loop through the real openai client ----------------------------------------------


def _looping_model() -> ScriptedModel:
    """A model that repeats one search until tools are turned off, then answers."""

    def step(request: ModelRequest) -> Reply:
        if request.params.get("tool_choice") == "none":
            return Reply.text("No flights found for tomorrow.")
        return Reply.call("search_flights", {"query": "Oslo Rome"})

    return ScriptedModel([step], cycle=True)


def _assemble(stream: Any) -> dict[str, Any]:
    """A streamed chat answer as one assistant message (text and tool calls)."""
    text, calls = "", {}
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for tc in delta.tool_calls or ():
            entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] = tc.id or entry["id"]
            if tc.function is not None:
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
    return _message(text, [calls[i] for i in sorted(calls)])


async def _assemble_async(stream: Any) -> dict[str, Any]:
    chunks = [chunk async for chunk in stream]
    return _assemble(iter(chunks))


def _message(text: str | None, calls: list[dict[str, str]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in calls
        ]
    return message


def _agent(
    model: ScriptedModel,
    *,
    asynchronous: bool,
    stream: bool,
    config: ag.GuardConfig = CONFIG,
    result: Any = lambda n: "[]",
    name: str = "gpt-x",
) -> tuple[list[dict[str, Any]], list[Any], list[str]]:
    """Run the agent until it answers in text (at most 12 turns): the final history, the
    reports, and the hook events' rungs. Checks after each call that the caller's history is
    as it was."""
    client = wrapped_client(model, config, asynchronous=asynchronous)
    messages: list[dict[str, Any]] = copy.deepcopy(QUESTION)
    reports: list[Any] = []

    async def ask(snapshot: list[dict[str, Any]]) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": name, "messages": snapshot, "tools": TOOLS}
        if stream:
            got = await client.chat.completions.create(**kw, stream=True)
            message = await _assemble_async(got)
            reports.append(got.report if hasattr(got, "report") else None)
            return message
        answer = await client.chat.completions.create(**kw)
        reports.append(report_of(answer))
        return answer.choices[0].message.model_dump(exclude_none=True)

    def ask_sync(snapshot: list[dict[str, Any]]) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": name, "messages": snapshot, "tools": TOOLS}
        if stream:
            got = client.chat.completions.create(**kw, stream=True)
            message = _assemble(got)
            reports.append(getattr(got, "report", None))
            return message
        answer = client.chat.completions.create(**kw)
        reports.append(report_of(answer))
        return answer.choices[0].message.model_dump(exclude_none=True)

    with capture_events() as events:
        for _ in range(12):
            before = copy.deepcopy(messages)
            message = asyncio.run(ask(messages)) if asynchronous else ask_sync(messages)
            assert messages == before  # the caller's history is never touched
            calls = message.get("tool_calls") or []
            message.setdefault("content", None)
            messages.append(
                {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
            )
            if not calls:
                break
            done = sum(1 for m in messages if m["role"] == "tool")
            messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": result(done + i)}
                for i, c in enumerate(calls)
            ]
    rungs = [e.rung for e in events if isinstance(e, LoopRecovery)]
    return messages, reports, rungs


def _history(request: ModelRequest) -> list[dict[str, Any]]:
    """What went upstream, call ids left out (the scripted model numbers its own)."""
    out = []
    for message in request.messages:
        m = {k: v for k, v in message.items() if k not in ("tool_call_id", "tool_calls")}
        m.setdefault("content", None)
        calls = [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in message.get("tool_calls") or ()
        ]
        if calls:
            m["tool_calls"] = calls
        out.append(m)
    return out


def _shape(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _history(ModelRequest(model="m", messages=messages))


@MODES
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_looping_agent_climbs_the_ladder_and_ends_with_an_answer(
    asynchronous: bool, stream: bool
) -> None:
    """The same search returning nothing: hint at the third repeat, then the recovery turn,
    then the pruned context, then tool_choice none — and the agent ends with an answer."""
    model = _looping_model()
    messages, reports, rungs = _agent(model, asynchronous=asynchronous, stream=stream)
    assert rungs == ["hint", "summary", "prune", "force"]
    assert messages[-1] == {"role": "assistant", "content": "No flights found for tomorrow."}
    sent = model.requests
    assert len(sent) == 7
    # healthy turns go upstream as the caller sent them
    for i in range(3):
        assert _history(sent[i]) == _shape(_loop(i))
        assert "tool_choice" not in sent[i].params
    # hint: the caller's history, then a user turn after the results
    hint = _history(sent[3])
    assert hint[:-1] == _shape(_loop(3))
    assert hint[-1]["role"] == "user"
    assert hint[-1]["content"].startswith("[agentguard] ")
    assert "search_flights" in hint[-1]["content"]
    # summary: the history, then one recovery turn listing the call and what came back
    turn = _history(sent[4])
    assert turn[:-1] == _shape(_loop(4))
    assert 'search_flights({"query": "Oslo Rome"}) -> [] (4 times)' in turn[-1]["content"]
    # prune: one exchange left, and the recovery turn
    pruned = _history(sent[5])
    assert pruned[:-1] == _shape(_loop(1))
    assert "(5 times)" in pruned[-1]["content"]
    assert "tool_choice" not in sent[5].params
    # force: the pruned context, tools still declared, tool_choice none
    forced = _history(sent[6])
    assert forced[:-1] == _shape(_loop(1))
    assert "Tools are off for this turn" in forced[-1]["content"]
    assert sent[6].params["tool_choice"] == "none"
    assert sent[6].tools == sent[0].tools
    if not stream:
        assert [r.recovery for r in reports] == [
            (),
            (),
            (),
            ("hint",),
            ("summary",),
            ("prune",),
            ("force",),
        ]


@MODES
def test_a_loop_that_outlives_every_rung_stops_with_a_structured_reason(asynchronous: bool) -> None:
    """A model that ignores tool_choice none: escalation has nowhere to go, the run stops."""
    model = ScriptedModel([Reply.call("search_flights", {"query": "Oslo Rome"})], cycle=True)
    with pytest.raises(ag.LoopDetected) as info:
        _agent(model, asynchronous=asynchronous, stream=False)
    error = info.value.to_error()
    assert error["detector"] in ("poll_no_progress", "same_result")
    assert error["tool"] == "search_flights"
    report = info.value.agentguard_report  # type: ignore[attr-defined]
    assert report.recovery[-1] in ("escalate", "stop")


def test_escalate_sends_the_summary_instead_of_the_loop_to_the_next_tier() -> None:
    """With a stronger tier, the escalate rung gives it the pruned context and the summary."""
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "tiers": {"fast": {"model": "small"}, "strong": {"model": "big"}},
            "escalation": {"chain": ["fast", "strong"]},
            "loop_detection": {"recovery": {"rungs": ["hint", "escalate", "stop"]}},
        },
        env={},
    )

    def step(request: ModelRequest) -> Reply:
        if request.model == "big":
            return Reply.text("Nothing flies tomorrow.")
        return Reply.call("search_flights", {"query": "Oslo Rome"})

    model = ScriptedModel([step], cycle=True)
    messages, reports, rungs = _agent(
        model, asynchronous=False, stream=False, config=config, name="small"
    )
    assert rungs == ["hint", "escalate"]
    assert messages[-1]["content"] == "Nothing flies tomorrow."
    last = model.requests[-1]
    assert last.model == "big"
    assert _history(last)[:-1] == _shape(_loop(1))
    assert "(4 times)" in _history(last)[-1]["content"]
    assert reports[-1].reasons == ("loop_detected",)


@pytest.mark.parametrize("placement", ["tool_result", "after_results", "auto"])
def test_hint_placement_is_configurable(placement: str) -> None:
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "loop_detection": {"recovery": {"hint_placement": placement}},
        },
        env={},
    )
    model = _looping_model()
    _agent(model, asynchronous=False, stream=False, config=config)
    hinted = _history(model.requests[3])
    if placement == "tool_result":
        assert hinted[:-1] == _shape(_loop(3))[:-1]
        assert hinted[-1]["role"] == "tool"
        assert hinted[-1]["content"].startswith("[]\n\n[agentguard] ")
    else:
        assert hinted[:-1] == _shape(_loop(3))
        assert hinted[-1]["role"] == "user"


@MODES
def test_a_provider_loop_refusal_is_answered_by_forcing_from_the_pruned_context(
    asynchronous: bool,
) -> None:
    """An upstream answering 400 "Repetitive tool calls detected" refuses the conversation; the
    guard sends the pruned one with tools off instead, and the agent gets its answer."""

    def step(request: ModelRequest) -> Reply | Fault:
        calls = sum(1 for m in request.messages if m.get("role") == "tool")
        if calls >= 2:
            return Fault(400, {}, "Repetitive tool calls detected")
        return Reply.text("No flights.")

    model = ScriptedModel([step], cycle=True)
    config = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "loop_detection": {"enabled": True}}, env={}
    )
    client = wrapped_client(model, config, asynchronous=asynchronous)
    history = _loop(2)
    before = copy.deepcopy(history)

    async def ask() -> Any:
        return await client.chat.completions.create(model="gpt-x", messages=history, tools=TOOLS)

    answer = (
        asyncio.run(ask())
        if asynchronous
        else client.chat.completions.create(model="gpt-x", messages=history, tools=TOOLS)
    )
    assert history == before
    assert answer.choices[0].message.content == "No flights."
    refused, forced = model.requests
    assert _history(refused) == _shape(_loop(2))
    assert _history(forced)[:-1] == _shape(_loop(1))
    assert forced.params["tool_choice"] == "none"
    report = report_of(answer)
    assert report is not None
    assert report.recovery == ("force",)
    assert [a.outcome for a in report.attempts] == ["client_error", "ok"]


def test_a_provider_refusal_that_persists_is_a_loop_detected() -> None:
    model = ScriptedModel([Fault(400, {}, "Repetitive tool calls detected")], cycle=True)
    client = wrapped_client(model, CONFIG)
    with pytest.raises(ag.LoopDetected) as info:
        client.chat.completions.create(model="gpt-x", messages=_loop(2), tools=TOOLS)
    assert info.value.detector == "provider_refusal"
    assert isinstance(info.value.__context__, openai.BadRequestError)
    assert len(model.requests) == 2  # refused, forced and refused: escalation has no tier


def test_healthy_runs_take_no_rung() -> None:
    """Distinct searches with distinct results: nothing added, nothing pruned, no event."""
    results = iter(range(100))

    def step(request: ModelRequest) -> Reply:
        n = next(results)
        if n == 6:
            return Reply.text("Booked.")
        return Reply.call("search_flights", {"query": f"Oslo Rome day {n}"})

    model = ScriptedModel([step], cycle=True)
    messages, reports, rungs = _agent(
        model, asynchronous=False, stream=False, result=lambda n: f'[{{"flight": "SK{n}"}}]'
    )
    assert messages[-1]["content"] == "Booked."
    assert rungs == []
    assert all(r.recovery == () and r.warnings == () for r in reports)
    for request in model.requests:
        assert "tool_choice" not in request.params
        assert not any(
            str(m.get("content", "")).startswith("[agentguard]") for m in request.messages
        )


def test_the_forcing_rung_through_the_responses_api() -> None:
    """responses.create: the pruned items (a reasoning item going with its call), a user item
    with the recovery turn, tool_choice none — the caller's items untouched."""
    from importlib import import_module

    from _openai_upstream import Upstream

    http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
    upstream = Upstream(http, [Reply.text("No flights tomorrow.")])
    client = ag.wrap(upstream.client(openai, asynchronous=False), CONFIG)
    items: list[dict[str, Any]] = [{"role": "user", "content": "Cheapest flight Oslo to Rome?"}]
    for i in range(8):
        items += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": []},
            {
                "type": "function_call",
                "call_id": f"c{i}",
                "name": "search_flights",
                "arguments": '{"query": "Oslo Rome"}',
            },
            {"type": "function_call_output", "call_id": f"c{i}", "output": "[]"},
        ]
    before = copy.deepcopy(items)
    tools = [
        {
            "type": "function",
            "name": "search_flights",
            "parameters": TOOLS[0]["function"]["parameters"],
        }
    ]
    answer = client.responses.create(model="gpt-x", input=items, tools=tools)
    assert items == before
    assert answer.output_text == "No flights tomorrow."
    ((_, _, content, _),) = upstream.seen
    body = json.loads(content)
    assert body["tool_choice"] == "none"
    assert body["tools"] == tools
    assert body["input"][:4] == items[:4]  # the question, the first reasoning, call and result
    assert len(body["input"]) == 5
    assert body["input"][4]["role"] == "user"
    assert "(8 times)" in body["input"][4]["content"]


@MODES
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_repeated_call_in_the_answer_is_replaced_by_a_forced_answer(
    asynchronous: bool, stream: bool
) -> None:
    """The model answers with the call once more (BREAK): that answer is not delivered, the
    call asks again with tools off, and the caller gets the forced answer — in a stream after
    the narration that already went out."""

    def step(request: ModelRequest) -> Reply:
        if request.params.get("tool_choice") == "none":
            return Reply.text(" No flights found.")
        return Reply.call("search_flights", {"query": "Oslo Rome"}, content="Searching again.")

    model = ScriptedModel([step], cycle=True)
    client = wrapped_client(model, CONFIG, asynchronous=asynchronous)
    history = _loop(6)
    kw: dict[str, Any] = {"model": "gpt-x", "messages": history, "tools": TOOLS}

    async def ask() -> tuple[dict[str, Any], Any]:
        if stream:
            got = await client.chat.completions.create(**kw, stream=True)
            return await _assemble_async(got), report_of(got)
        answer = await client.chat.completions.create(**kw)
        return answer.choices[0].message.model_dump(exclude_none=True), report_of(answer)

    def ask_sync() -> tuple[dict[str, Any], Any]:
        if stream:
            got = client.chat.completions.create(**kw, stream=True)
            return _assemble(got), report_of(got)
        answer = client.chat.completions.create(**kw)
        return answer.choices[0].message.model_dump(exclude_none=True), report_of(answer)

    message, report = asyncio.run(ask()) if asynchronous else ask_sync()
    assert "tool_calls" not in message
    expected = "Searching again. No flights found." if stream else " No flights found."
    assert message["content"] == expected
    assert report.recovery == ("hint", "force")
    first, forced = model.requests
    assert "tool_choice" not in first.params
    assert forced.params["tool_choice"] == "none"
    assert _history(forced)[:-1] == _shape(_loop(1))


def test_a_call_never_asks_the_same_way_twice() -> None:
    """A ladder without a rung above the one taken: an answer that loops again stops the call
    (a short ladder cannot make one call re-ask forever)."""
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "loop_detection": {"recovery": {"rungs": ["hint"]}},
        },
        env={},
    )
    model = ScriptedModel([Reply.call("search_flights", {"query": "Oslo Rome"})], cycle=True)
    client = wrapped_client(model, config)
    with pytest.raises(ag.LoopDetected) as info:
        client.chat.completions.create(model="gpt-x", messages=_loop(6), tools=TOOLS)
    assert len(model.requests) == 1  # with the transcript's hint; the answer looped again
    assert info.value.agentguard_report.recovery == ("hint", "stop")  # type: ignore[attr-defined]


def test_a_cap_set_aside_stays_set_aside_when_forcing() -> None:
    """A request whose cap is no token count holds None (the budget uses its own); forcing
    must not read the caller's -5 back from params."""
    request = ModelRequest(model="m", messages=_loop(3), params={"max_tokens": -5})
    assert request.max_output_tokens == -5
    readable = dataclasses.replace(request)
    object.__setattr__(readable, "max_output_tokens", None)
    forced = force_answer(readable)
    assert forced.max_output_tokens is None
    assert forced.params["max_tokens"] == -5  # still sent as the caller wrote it
    cfg = LoopRecoveryConfig()
    for rung in ("hint", "summary", "prune", "escalate", "force"):
        assert rung_request(rung, readable, cfg, hint="h", tool=None).max_output_tokens is None
    with pytest.raises(ValueError, match="no request"):
        rung_request("stop", readable, cfg, hint="h", tool=None)


# -- an answer that copies the recovery turn back ------------------------------------------------

#: Final answers SmolLM2-135M gave to the forcing rung's recovery turn in a recorded
#: loop-recovery run (source in the file and in tests/data/SOURCES.md). Each copies the turn
#: back instead of answering; the guard used to deliver them as the model's answer.
PARROTS = json.loads(
    (Path(__file__).resolve().parent / "data" / "smollm2_parroted_recovery.json").read_text(
        encoding="utf-8"
    )
)["answers"]


def _forcing_note() -> str:
    reason = "search_flights returned the same result 4 times."
    return summary(_loop(4), LoopRecoveryConfig(), reason=reason, forced=True)


@pytest.mark.parametrize("recorded", PARROTS, ids=lambda r: r["task"])
def test_recorded_copies_of_the_recovery_turn_are_echoes(recorded: dict[str, str]) -> None:
    assert echoes(recorded["content"], _forcing_note())


@pytest.mark.parametrize(
    "answer",
    [
        "No flights found for tomorrow.",
        "There is no flight from Oslo to Rome tomorrow: the search came back empty.",
        # quoting a result line is using the results, not copying the guard
        'search_flights({"query": "Oslo Rome"}) -> [] : nothing flies.',
        "",
    ],
)
def test_answers_from_the_results_are_not_echoes(answer: str) -> None:
    assert not echoes(answer, _forcing_note())


def test_the_restated_request_is_the_users_words_not_the_guards() -> None:
    """The turn that restates the request quotes the user: an answer repeating the question's
    words answers it; the guard's own closing sentence is still its own."""
    question = "What is the weather in Paris right now?"
    note = results_turn(_loop(1), LoopRecoveryConfig(), question)
    assert not echoes("The weather in Paris right now is sunny, 21 C.", note, quoted=question)
    assert echoes("Answer from these results, please.", note, quoted=question)


#: text of words the recovery turn never uses (it has no word made of only these letters)
FOREIGN = st.text("qxzjk ,.\n", min_size=0, max_size=80)


@given(before=FOREIGN, after=FOREIGN)
@settings(max_examples=60, deadline=None)
def test_a_guard_sentence_anywhere_in_an_answer_is_an_echo(before: str, after: str) -> None:
    note = _forcing_note()
    assert echoes(f"{before} Give your final answer now from these results. {after}", note)
    assert echoes(f"{before} you're repeating yourself without progress {after}", note)
    assert not echoes(f"{before} {after}", note)
    assert not echoes(f"{before} your final answer {after}", note)  # three words: too few


def _parroting_model(answers: list[str], *, strong: str | None = None) -> ScriptedModel:
    """Repeats the search until tools are off; then answers with ``answers`` in turn (the last
    one from then on); a ``strong`` tier (model "big") answers at once."""
    forced: list[str] = []

    def step(request: ModelRequest) -> Reply:
        if strong is not None and request.model == "big":
            return Reply.text(strong)
        if request.params.get("tool_choice") == "none":
            forced.append(_history(request)[-1]["content"])
            return Reply.text(answers[min(len(forced), len(answers)) - 1])
        return Reply.call("search_flights", {"query": "Oslo Rome"})

    model = ScriptedModel([step], cycle=True)
    model.forced = forced  # type: ignore[attr-defined]
    return model


COPY = "You are repeating yourself without progress. Tools are off for this turn."


@MODES
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_copied_recovery_turn_is_asked_again_with_the_request_restated(
    asynchronous: bool, stream: bool
) -> None:
    """The forced answer copies the recovery turn: it never reaches the caller (not even in a
    stream); the call asks once more with the user's request and the results, tools off."""
    model = _parroting_model([COPY, "No flights tomorrow."])
    messages, reports, rungs = _agent(model, asynchronous=asynchronous, stream=stream)
    assert rungs == ["hint", "summary", "prune", "force"]
    assert messages[-1] == {"role": "assistant", "content": "No flights tomorrow."}
    first, second = model.forced  # type: ignore[attr-defined]
    assert "Tools are off for this turn" in first
    assert second.startswith("Cheapest flight Oslo to Rome tomorrow?\nTool results:\n")
    assert second.endswith("Answer from these results.")
    assert model.requests[-1].params["tool_choice"] == "none"
    if not stream:
        assert any("copied the recovery turn back" in w for w in reports[-1].warnings)


@MODES
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_copied_again_with_no_tier_left_the_results_are_the_answer(
    asynchronous: bool, stream: bool
) -> None:
    model = _parroting_model([COPY, "Answer from these results."])
    messages, reports, _ = _agent(model, asynchronous=asynchronous, stream=stream)
    answer = messages[-1]["content"]
    assert answer.startswith("The results in hand:")
    assert 'search_flights({"query": "Oslo Rome"}) -> []' in answer
    assert "repeating yourself" not in answer
    if not stream:
        assert any("answered with the results" in w for w in reports[-1].warnings)


def test_copied_again_with_a_tier_above_moves_up() -> None:
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "tiers": {"fast": {"model": "small"}, "strong": {"model": "big"}},
            "escalation": {"chain": ["fast", "strong"]},
        },
        env={},
    )
    model = _parroting_model([COPY], strong="Nothing flies tomorrow.")
    messages, reports, _ = _agent(
        model, asynchronous=False, stream=False, config=config, name="small"
    )
    assert messages[-1]["content"] == "Nothing flies tomorrow."
    assert model.requests[-1].model == "big"
    assert reports[-1].tier == "strong"
    assert len(model.forced) == 2  # type: ignore[attr-defined]


def test_copied_again_when_loops_do_not_escalate_the_results_are_the_answer() -> None:
    """A tier above that loops do not move to (``escalate_on`` without ``loop_detected``):
    the results in hand are the answer, no exception."""
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "tiers": {"fast": {"model": "small"}, "strong": {"model": "big"}},
            "escalation": {"chain": ["fast", "strong"], "escalate_on": ["server_error"]},
        },
        env={},
    )
    model = _parroting_model([COPY], strong="unused")
    messages, _, _ = _agent(model, asynchronous=False, stream=False, config=config, name="small")
    assert messages[-1]["content"].startswith("The results in hand:")
    assert all(r.model == "small" for r in model.requests)


# -- a conversation that outgrows the server's context ------------------------------------------


def _emails(times: int) -> list[dict[str, Any]]:
    """An agent retrying send_email with a new body each time; the mail server is down."""
    messages: list[dict[str, Any]] = copy.deepcopy(QUESTION)
    for i in range(times):
        body = json.dumps({"to": "bob@example.com", "body": f"Hi Bob, attempt {i}: " + "x" * 200})
        messages += [_call(i, "send_email", body), _result(i, '{"error": "SMTP server down"}')]
    return messages


def _small_context(limit: int, answer: Reply) -> ScriptedModel:
    """A server whose context holds ``limit`` messages: longer requests get llama.cpp's 400."""

    def step(request: ModelRequest) -> Reply | Fault:
        if len(request.messages) > limit:
            return Fault(
                400,
                {},
                "This model's maximum context length is 2048 tokens. However, you requested "
                "2208 tokens (2048 in the messages, 160 in the completion).",
            )
        return answer

    return ScriptedModel([step], cycle=True)


@MODES
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_context_length_400_is_sent_again_without_repeated_results(
    asynchronous: bool, stream: bool
) -> None:
    """The recorded shape: SmolLM2 retried send_email with new bodies against a server that
    was down until llama.cpp answered 400 (context full). The guard sends the call again with
    one exchange per distinct result; the caller's history is untouched."""
    model = _small_context(6, Reply.text("The mail server is down; Bob was not emailed."))
    client = wrapped_client(model, CONFIG, asynchronous=asynchronous)
    history = _emails(4)
    before = copy.deepcopy(history)
    kw: dict[str, Any] = {"model": "gpt-x", "messages": history, "tools": TOOLS}

    async def ask() -> tuple[str, Any]:
        if stream:
            got = await client.chat.completions.create(**kw, stream=True)
            return (await _assemble_async(got))["content"], report_of(got)
        answer = await client.chat.completions.create(**kw)
        return answer.choices[0].message.content, report_of(answer)

    def ask_sync() -> tuple[str, Any]:
        if stream:
            got = client.chat.completions.create(**kw, stream=True)
            return _assemble(got)["content"], report_of(got)
        answer = client.chat.completions.create(**kw)
        return answer.choices[0].message.content, report_of(answer)

    text, report = asyncio.run(ask()) if asynchronous else ask_sync()
    assert text == "The mail server is down; Bob was not emailed."
    assert history == before
    first, second = model.requests
    assert len(first.messages) == 10
    assert _history(second) == _shape(_emails(1))
    assert any("context overflow: sent again without 6 messages" in w for w in report.warnings)
    assert any(w.startswith("quality: context_overflow") for w in report.warnings)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_context_length_400_with_nothing_to_leave_out_asks_from_the_results(
    stream: bool,
) -> None:
    """Nothing repeats, yet the server's context is full (the recorded ``order_pending`` shape,
    where llama-cpp-python's function-calling format overflowed on its own runaway): the answer
    is asked for from the results, tools off, in a compact conversation — the system message
    and one turn with the request and the results — instead of the run ending in the 400."""
    model = _small_context(2, Reply.text("The mail server is down; Bob was not emailed."))
    client = wrapped_client(model, CONFIG)
    history = _emails(1)
    before = copy.deepcopy(history)
    kw: dict[str, Any] = {"model": "gpt-x", "messages": history, "tools": TOOLS}
    if stream:
        answer = client.chat.completions.create(**kw, stream=True)
        text = _assemble(answer)["content"]
    else:
        answer = client.chat.completions.create(**kw)
        text = answer.choices[0].message.content
    assert text == "The mail server is down; Bob was not emailed."
    assert history == before
    first, second = model.requests
    assert len(first.messages) == 4
    system, turn = second.messages
    assert system == QUESTION[0]
    assert turn["role"] == "user"
    assert turn["content"].startswith("Cheapest flight Oslo to Rome tomorrow?\nTool results:\n")
    assert '-> {"error": "SMTP server down"}' in turn["content"]
    assert second.params["tool_choice"] == "none"
    report = report_of(answer)
    assert any("compact conversation" in w for w in report.warnings)


def test_a_context_length_400_without_tool_results_is_raised() -> None:
    """A long chat with no tool results: nothing to answer from, the 400 is the caller's."""
    model = _small_context(1, Reply.text("unused"))
    client = wrapped_client(model, CONFIG)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="gpt-x", messages=QUESTION, tools=TOOLS)
    assert len(model.requests) == 1


def test_a_context_length_400_after_shrinking_asks_from_the_results() -> None:
    """Shrunk and still too long: the compact conversation comes next, once."""
    model = _small_context(3, Reply.text("The mail server is down."))
    client = wrapped_client(model, CONFIG)
    answer = client.chat.completions.create(model="gpt-x", messages=_emails(4), tools=TOOLS)
    assert answer.choices[0].message.content == "The mail server is down."
    assert [len(r.messages) for r in model.requests] == [10, 4, 2]


def test_a_context_length_400_of_the_compact_conversation_is_raised() -> None:
    """The compact conversation overflows too: raised, never a fourth request."""
    model = _small_context(1, Reply.text("unused"))
    client = wrapped_client(model, CONFIG)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="gpt-x", messages=_emails(4), tools=TOOLS)
    assert [len(r.messages) for r in model.requests] == [10, 4, 2]


def _email_down(tools_off: Callable[[ModelRequest], Reply]) -> tuple[Any, ScriptedModel]:
    """The recorded ``email_down`` run (SmolLM2, llama.cpp's function-calling format), as the
    guard sees it: four attempts in the history, a server whose context holds six messages, a
    model that writes attempt 2's call again while tools are on and answers ``tools_off``
    (tools off). Sent once through a wrapped client in the small-model setting; the answer and
    the model."""
    history = _emails(4)
    again = history[2 + 2 * 2]["tool_calls"][0]["function"]["arguments"]  # attempt 2

    def step(request: ModelRequest) -> Reply | Fault:
        if len(request.messages) > 6:
            return Fault(400, {}, "This model's maximum context length is 2048 tokens.")
        if request.params.get("tool_choice") == "none":
            return tools_off(request)
        return Reply.call("send_email", json.loads(again))

    model = ScriptedModel([step], cycle=True)
    config = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "tool_validation": {"answered_repeats_after": 1}},
        env={},
    )
    client = wrapped_client(model, config)
    tools = [tool("send_email", "to", "body")]
    return client.chat.completions.create(model="gpt-x", messages=history, tools=tools), model


def test_a_repeat_of_a_call_the_shrink_left_out_is_still_an_answered_repeat() -> None:
    """The context overflowed, the guard sent the call again without the repeated results, and
    the model, seeing less, wrote again a call the caller's history had answered already. What
    the guard left out of the request was answered all the same: the repeat is recovered
    (the answer asked for from the results, tools off), not handed back to the agent."""
    answer, model = _email_down(
        lambda _: Reply.text("The mail server is down; Bob was not emailed.")
    )
    assert answer.choices[0].message.content == "The mail server is down; Bob was not emailed."
    assert not answer.choices[0].message.tool_calls
    assert [len(r.messages) for r in model.requests][:2] == [10, 4]
    assert model.requests[-1].params["tool_choice"] == "none"
    report = report_of(answer)
    assert any("repeated answered calls (send_email)" in w for w in report.warnings)


def test_after_an_overflow_the_parroted_answer_is_asked_for_again_compact() -> None:
    """One step on: the answer to the recovery turn copied the turn back, and the guard asked
    again with the request and its results restated. It sent the caller's whole conversation
    — the one that had overflowed — at 868 more tokens on SmolLM2. After an overflow that
    re-ask is the compact one: the system messages and the restated turn."""
    forced: list[ModelRequest] = []

    def tools_off(request: ModelRequest) -> Reply:
        forced.append(request)
        if len(forced) == 1:  # the recovery turn, copied back
            return Reply.text(str(request.messages[-1]["content"]))
        return Reply.text("The mail server is down; Bob was not emailed.")

    answer, _ = _email_down(tools_off)
    assert answer.choices[0].message.content == "The mail server is down; Bob was not emailed."
    assert len(forced) == 2
    compact = forced[1].messages
    assert [m["role"] for m in compact] == ["system", "user"]
    assert "SMTP server down" in str(compact[-1]["content"])  # the results, restated
    report = report_of(answer)
    assert any("copied the recovery turn back: asked again" in w for w in report.warnings)


def test_another_400_is_not_shrunk() -> None:
    model = ScriptedModel([Fault(400, {}, "Invalid value for 'temperature'.")], cycle=True)
    client = wrapped_client(model, CONFIG)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-x", messages=_emails(4), tools=TOOLS)
    assert len(model.requests) == 1
