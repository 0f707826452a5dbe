"""The guarded call end to end, through ScriptedModel: every failure mode and escalation path."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from agentguard import (
    BudgetExceeded,
    EscalationRequired,
    GuardConfig,
    GuardFailure,
    LoopDetected,
    ModelError,
    TiersExhausted,
    ToolValidationFailed,
)
from agentguard.budget import estimate_tokens
from agentguard.escalation import Choice, EscalationPrompt
from agentguard.events import Escalated, GuardInternalError
from agentguard.guard import AsyncGuard, Guard
from agentguard.guard import session as ag_session
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, capture_events
from agentguard.transport import SESSION_HEADER, ModelRequest, report_of
from agentguard.types import Tier

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the docs.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
TIERS = {
    "tiers": {
        "fast": {"model": "small"},
        "standard": {"model": "medium"},
        "premium": {"model": "big"},
    },
    "escalation": {"chain": ["fast", "standard", "premium"], "max_retries_before_escalate": 2},
    "memory_pressure": {"enabled": False},
}


def _cfg(**extra: Any) -> GuardConfig:
    data: dict[str, Any] = {k: dict(v) for k, v in TIERS.items()}
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return GuardConfig.from_dict(data, env={})


def _req(
    model: str = "fast", tools: bool = True, messages: list[dict[str, Any]] | None = None
) -> ModelRequest:
    params: dict[str, Any] = {"tools": TOOLS} if tools else {}
    msgs = messages or [{"role": "user", "content": "find the install guide"}]
    return ModelRequest(model=model, messages=msgs, params=params)


def _guard(
    model: ScriptedModel, config: GuardConfig | None = None, **kw: Any
) -> tuple[Guard, FakeClock]:
    clock = FakeClock()
    guard = Guard(
        model, config or _cfg(), clock=clock, sleep=clock.sleep, rng=random.Random(0), **kw
    )
    return guard, clock


def test_clean_call_passes_through_with_a_report() -> None:
    """A valid answer comes back unchanged, with a report of what (little) happened."""
    model = ScriptedModel([Reply.call("search", {"query": "install"})])
    guard, _ = _guard(model)
    response = guard.complete(_req())
    assert response.message["tool_calls"][0]["function"]["arguments"] == '{"query": "install"}'
    report = report_of(response)
    assert report is not None
    assert (report.tier, report.retries, report.corrections, report.escalated) == (
        "fast",
        0,
        0,
        False,
    )
    assert report.usage.total_tokens > 0
    assert report.budget == "ok"
    assert model.requests[0].model == "small"


def test_rate_limit_waits_for_retry_after_then_succeeds() -> None:
    """A 429 with Retry-After is waited out (on the injected clock) and retried once."""
    model = ScriptedModel([Fault.rate_limit(retry_after=2), Reply.text("ok")])
    guard, clock = _guard(model)
    response = guard.complete(_req(tools=False))
    assert response.message["content"] == "ok"
    assert clock.sleeps == [2.0]
    report = report_of(response)
    assert report is not None
    assert report.retries == 1


def test_retry_after_beyond_cap_escalates_instead_of_waiting() -> None:
    """A Retry-After longer than max_retry_after moves to the next tier at once."""
    model = ScriptedModel(
        {"small": [Fault.rate_limit(retry_after=600)], "medium": [Reply.text("ok")]}
    )
    guard, clock = _guard(model)
    response = guard.complete(_req(tools=False))
    assert clock.sleeps == []
    report = report_of(response)
    assert report is not None
    assert (report.tier, report.escalated_from, report.reasons) == (
        "standard",
        "fast",
        ("rate_limited",),
    )


def test_dead_tier_escalates_after_retries() -> None:
    """Repeated 5xx: retries on the tier, then the next tier serves; an event says so."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 5, "medium": [Reply.text("fine")]})
    guard, clock = _guard(model)
    with capture_events() as events:
        response = guard.complete(_req(tools=False))
    report = report_of(response)
    assert report is not None
    assert report.tier == "standard"
    assert report.retries == 2  # max_retries_before_escalate: 2 retries on fast, then move
    assert len(clock.sleeps) == 2
    assert [e.reason for e in events.of_type(Escalated)] == ["server_error"]


def test_every_tier_failing_raises_with_the_history() -> None:
    """When the chain is exhausted the error carries every attempt."""
    model = ScriptedModel([Fault.server_error(500)], cycle=True)
    guard, _ = _guard(model)
    with pytest.raises(TiersExhausted) as info:
        guard.complete(_req(tools=False))
    tiers = [a.tier for a in info.value.attempts]
    assert tiers[0] == "fast"
    assert tiers[-1] == "premium"


def test_client_error_is_not_retried_or_escalated() -> None:
    """A 400 is the request's fault: it surfaces at once."""
    model = ScriptedModel([Fault.context_length()])
    guard, clock = _guard(model)
    with pytest.raises(ModelError) as info:
        guard.complete(_req(tools=False))
    assert info.value.status_code == 400
    assert clock.sleeps == []
    assert len(model.requests) == 1


def test_text_embedded_call_is_repaired_for_free() -> None:
    """A tool call written as text becomes a real tool call, with no extra model call."""
    model = ScriptedModel([Reply.embedded("search", {"query": "install"}, style="hermes")])
    guard, _ = _guard(model)
    response = guard.complete(_req())
    calls = response.message["tool_calls"]
    assert calls[0]["function"]["name"] == "search"
    assert response.finish_reason == "tool_calls"
    report = report_of(response)
    assert report is not None
    assert report.repairs
    assert report.corrections == 0
    assert len(model.requests) == 1


def test_tools_changed_in_place_are_validated_as_they_are_now() -> None:
    """The validator cache never serves a stale tool set, even when the caller's list object is
    reused and edited in place between calls."""
    tools = copy.deepcopy(TOOLS)
    model = ScriptedModel(
        [Reply.call("search", {"query": "a"}), Reply.call("lookup", {"query": "b"})]
    )
    guard, _ = _guard(model)
    messages = [{"role": "user", "content": "find the install guide"}]
    guard.complete(ModelRequest(model="fast", messages=messages, params={"tools": tools}))
    tools[0]["function"]["name"] = "lookup"
    response = guard.complete(
        ModelRequest(model="fast", messages=messages, params={"tools": tools})
    )
    assert response.message["tool_calls"][0]["function"]["name"] == "lookup"
    report = report_of(response)
    assert report is not None
    assert (report.repairs, report.corrections) == ((), 0)


def test_invalid_call_gets_a_corrective_reask() -> None:
    """A call missing a required field is re-asked once with a precise correction."""
    model = ScriptedModel([Reply.call("search", {}), Reply.call("search", {"query": "install"})])
    guard, _ = _guard(model)
    response = guard.complete(_req())
    assert '"install"' in response.message["tool_calls"][0]["function"]["arguments"]
    report = report_of(response)
    assert report is not None
    assert report.corrections == 1
    second = model.requests[1].messages
    assert second[-2]["role"] == "assistant"
    assert second[-2]["content"] == ""  # never null: some servers reject it
    assert "query" in second[-1]["content"]


def test_persistent_invalid_calls_escalate_then_fail_typed() -> None:
    """Still invalid after max_retries on every tier: a typed error, never a bad answer."""
    model = ScriptedModel([Reply.call("search", {})], cycle=True)
    config = _cfg(tool_validation={"max_retries": 1})
    guard, _ = _guard(model, config)
    with pytest.raises(TiersExhausted) as info:
        guard.complete(_req())
    assert info.value.reason == "tool_validation_failure"
    assert isinstance(info.value.__cause__, ToolValidationFailed)
    assert len(model.requests) == 6  # 2 per tier


def test_single_tier_invalid_calls_raise_tool_validation_failed() -> None:
    """Without tiers to move to, the validation error itself surfaces."""
    model = ScriptedModel([Reply.call("search", {})], cycle=True)
    config = GuardConfig.from_dict(
        {"tool_validation": {"max_retries": 1}, "memory_pressure": {"enabled": False}}, env={}
    )
    guard, _ = _guard(model, config)
    with pytest.raises(ToolValidationFailed):
        guard.complete(_req(model="gpt-x"))


def _looping_history(times: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "is the build done?"}]
    for i in range(times):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "build_status", "arguments": "{}"},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "content": "status: running, 40%"}
        )
    return messages


def test_transcript_loop_break_forces_an_answer_then_stops_with_a_structured_error() -> None:
    """A stuck polling loop first gets an answer forced from the results in hand; a run that
    comes back still looping is stopped with a structured loop error."""
    model = ScriptedModel([Reply.text("running, 40%: not done yet")], cycle=True)
    config = GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    guard, _ = _guard(model, config)
    response = guard.complete(_req(model="gpt-x", tools=False, messages=_looping_history(40)))
    report = report_of(response)
    assert report is not None
    assert report.recovery == ("force",)
    (sent,) = model.requests
    assert "tool_choice" not in sent.params  # no tools declared: nothing to turn off
    assert len(sent.messages) == 1 + 2 + 1  # the question, one exchange, the recovery turn
    assert "give your final answer now" in str(sent.messages[-1]["content"])
    again = _looping_history(41)  # the agent went on calling after the forced answer
    again[81:81] = [dict(response.message)]
    with pytest.raises(LoopDetected) as info:
        guard.complete(_req(model="gpt-x", tools=False, messages=again))
    error = info.value.to_error()
    assert error["type"] == "loop_detected"
    assert error["message"]
    assert len(model.requests) == 1


def test_transcript_loop_break_escalates_and_reports_the_serving_tier() -> None:
    """With a stronger tier, a loop that outlived the forced answer moves the call there with
    the pruned conversation, and the report says so."""
    model = ScriptedModel({"small": [Reply.text("not done")], "medium": [Reply.text("stuck")]})
    guard, _ = _guard(model)
    forced = guard.complete(_req(tools=False, messages=_looping_history(40)))
    again = _looping_history(41)
    again[81:81] = [dict(forced.message)]
    response = guard.complete(_req(tools=False, messages=again))
    report = report_of(response)
    assert report is not None
    assert (report.tier, report.escalated_from, report.reasons, report.recovery) == (
        "standard",
        "fast",
        ("loop_detected",),
        ("escalate",),
    )
    assert [r.model for r in model.requests] == ["small", "medium"]
    assert len(model.requests[-1].messages) == 1 + 2 + 1 + 1  # and the forced answer


def test_loop_warning_adds_a_hint_for_the_model() -> None:
    """A loop at WARNING lets the call through with a hint for the model after the results."""
    model = ScriptedModel([Reply.text("ok")], cycle=True)
    config = GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    guard, _ = _guard(model, config)
    for n in range(1, 40):
        response = guard.complete(_req(model="gpt-x", tools=False, messages=_looping_history(n)))
        report = report_of(response)
        assert report is not None
        if report.warnings:
            assert report.recovery == ("hint",)
            last = model.requests[-1].messages[-1]
            assert last["role"] == "user"
            assert str(last["content"]).startswith("[agentguard]")
            return
    pytest.fail("no warning")


def test_transcript_is_processed_incrementally() -> None:
    """Messages already seen in a session are not fed again (a growing history stays cheap)."""
    model = ScriptedModel([Reply.text("a"), Reply.text("b")])
    guard, _ = _guard(model, GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    history = _looping_history(2)
    first = guard.complete(_req(model="gpt-x", tools=False, messages=history))
    (state,) = guard.pipeline._runs
    seen = len(state.marks)
    follow_up = [*history, dict(first.message), {"role": "user", "content": "and?"}]
    guard.complete(_req(model="gpt-x", tools=False, messages=follow_up))
    assert list(guard.pipeline._runs) == [state]  # the same run, continued
    assert len(state.marks) == seen + 2  # the new user message and the new answer


def test_incremental_prompt_estimate_matches_a_full_estimate() -> None:
    """Over an append-only conversation the running estimate equals estimating it all again."""
    model = ScriptedModel([Reply.call("search", {"query": f"q{i}"}) for i in range(6)])
    guard, _ = _guard(model)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "find the install guide"}]
    for i in range(6):
        request = _req(messages=list(messages))
        response = guard.complete(request, session="s")
        (call,) = guard.pipeline._runs
        assert call.last is not None
        expected = estimate_tokens(messages) - 3 + estimate_tokens([response.message]) - 3
        assert call.last[2] == expected
        messages.append(dict(response.message))
        tool_id = response.message["tool_calls"][0]["id"]
        messages.append({"role": "tool", "tool_call_id": tool_id, "content": f"result {i}"})


def test_a_repeated_message_with_a_reused_call_id_is_still_judged() -> None:
    """Local models reuse call ids: the same call and result again is new, and a loop."""
    same = Reply.call("search", {"query": "status"}, id="call_0")
    model = ScriptedModel([same] * 12)
    guard, _ = _guard(model)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "wait for the build"}]

    def turns(n: int) -> None:
        for _ in range(n):
            response = guard.complete(_req(messages=list(messages)), session="s")
            messages.append(dict(response.message))
            messages.append({"role": "tool", "tool_call_id": "call_0", "content": "pending"})

    turns(3)
    with pytest.raises((LoopDetected, TiersExhausted)):
        turns(9)


def test_opening_breaker_moves_on_without_waiting() -> None:
    """When a failure opens the tier's breaker, the guard escalates at once instead of waiting."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 9, "medium": [Reply.text("ok")]})
    guard, clock = _guard(model, _cfg(escalation={"max_retries_before_escalate": 8}))
    response = guard.complete(_req(tools=False))
    assert response.message["content"] == "ok"
    assert len([r for r in model.requests if r.model == "small"]) == 5  # the breaker's min_calls
    assert len(clock.sleeps) == 4  # no wait after the failure that opened it


def test_an_open_tier_stays_skipped_however_many_model_names_follow() -> None:
    """A request starts past a configured tier whose breaker is open, after hundreds of requests
    for models no tier has: each is a tier of its own, whose breakers are bounded (the least
    recently used go first), while the configured tiers' are never dropped."""
    from agentguard.guard._pipeline import IMPLICIT_BREAKERS

    model = ScriptedModel({"small": [Fault.server_error(503)], "*": [Reply.text("ok")]}, cycle=True)
    guard, _ = _guard(model, _cfg(escalation={"max_retries_before_escalate": 8}))
    guard.complete(_req(tools=False))
    for i in range(IMPLICIT_BREAKERS + 50):
        guard.complete(_req(f"model-{i}", tools=False))
    response = guard.complete(_req(tools=False))
    assert response.message["content"] == "ok"
    assert len([r for r in model.requests if r.model == "small"]) == 5  # still open: skipped
    assert model.requests[-1].model == "medium"
    breakers = guard.pipeline.breakers
    assert len(breakers) == IMPLICIT_BREAKERS + 3
    assert {"fast", "standard", "premium"} <= set(breakers)
    assert "model-0" not in breakers  # the least recently used went
    assert f"model-{IMPLICIT_BREAKERS + 49}" in breakers


def test_confirm_mode_without_callback_raises_with_options() -> None:
    """No silent failover: confirm mode asks, and without a callback raises the question."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 3, "medium": [Reply.text("ok")]})
    guard, _ = _guard(model, _cfg(escalation={"mode": "confirm"}))
    with pytest.raises(EscalationRequired) as info:
        guard.complete(_req(tools=False))
    prompt = info.value.prompt
    assert prompt.proposed is not None
    assert prompt.proposed.name == "standard"
    assert [o.value for o in prompt.options] == ["retry", "use_backup", "cancel"]
    assert prompt.attempts == 3
    assert prompt.message == "HTTP 503 (transient)"  # what failed, not the trigger's name


def test_confirm_mode_callback_chooses_backup() -> None:
    """With a callback, the user's choice is followed."""
    asked: list[EscalationPrompt] = []

    def confirm(prompt: EscalationPrompt) -> Choice:
        asked.append(prompt)
        return Choice.USE_BACKUP

    model = ScriptedModel({"small": [Fault.server_error(503)] * 3, "medium": [Reply.text("ok")]})
    guard, _ = _guard(model, _cfg(escalation={"mode": "confirm"}), confirm=confirm)
    response = guard.complete(_req(tools=False))
    assert response.message["content"] == "ok"
    assert len(asked) == 1


def test_hard_stop_budget_refuses_before_spending() -> None:
    """Under hard_stop a call that would pass the session budget is refused up front."""
    # a long answer that is no degenerate text (the loop ladder would stop that one first)
    model = ScriptedModel([Reply.text(" ".join(f"w{i}" for i in range(130)))], cycle=True)
    config = _cfg(
        token_budget={"per_session": 300, "policy": "hard_stop", "max_output_tokens": 100}
    )
    guard, _ = _guard(model, config)
    served = 0
    with pytest.raises(BudgetExceeded) as info:  # noqa: PT012 - the loop runs until refused
        for _ in range(10):
            guard.complete(_req(tools=False), session="s1")
            served += 1
    assert served < 10
    assert info.value.budget == "session"
    assert guard.pipeline.ledger is not None
    assert guard.pipeline.ledger.usage("s1").session_tokens <= 300


def test_output_cap_is_applied_to_the_request() -> None:
    """max_tokens is clamped to the per-request output cap."""
    model = ScriptedModel([Reply.text("ok")])
    guard, _ = _guard(model, _cfg(token_budget={"max_output_tokens": 64}))
    request = ModelRequest(
        model="fast", messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 5000}
    )
    guard.complete(request)
    assert model.requests[0].max_output_tokens == 64
    assert model.requests[0].to_body()["max_tokens"] == 64


def test_missing_usage_is_estimated() -> None:
    """A response without usage is still counted, marked estimated."""
    model = ScriptedModel([Reply.text("hello there", usage=None)])
    guard, _ = _guard(model)
    report = report_of(guard.complete(_req(tools=False)))
    assert report is not None
    assert report.usage.estimated
    assert report.usage.total_tokens > 0


def test_internal_fault_fails_open_and_is_reported() -> None:
    """A bug inside the guard lets the call through unguarded and emits an event."""
    model = ScriptedModel([Reply.text("straight through")])
    guard, _ = _guard(model)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("guard bug")

    guard.pipeline._check_transcript = broken  # type: ignore[method-assign]
    with capture_events() as events:
        response = guard.complete(_req(tools=False))
    assert response.message["content"] == "straight through"
    report = report_of(response)
    assert report is not None
    assert report.fail_open
    assert events.of_type(GuardInternalError)


def test_fail_closed_raises_internal_faults() -> None:
    """fail_mode: closed surfaces the guard's own fault, as a typed error with the fault as its
    cause (issue 15: it used to re-raise the raw exception)."""
    model = ScriptedModel([Reply.text("x")])
    guard, _ = _guard(
        model,
        _cfg(fail_mode="closed")
        if False
        else GuardConfig.from_dict({"fail_mode": "closed"}, env={}),
    )

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("guard bug")

    guard.pipeline._check_transcript = broken  # type: ignore[method-assign]
    with pytest.raises(GuardFailure, match="guard bug") as raised:
        guard.complete(_req(tools=False))
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert raised.value.component == "pipeline"
    assert raised.value.error_type == "RuntimeError"


def test_streaming_passes_content_and_holds_tool_calls_until_valid() -> None:
    """Content streams as it comes; a text-embedded call is released as a real call at the end."""
    model = ScriptedModel(
        [
            Reply(
                content="Let me look. ", tool_calls=Reply.call("search", {"query": "x"}).tool_calls
            )
        ],
        chunk_size=4,
    )
    guard, _ = _guard(model)
    stream = guard.stream(_req())
    chunks = list(stream)
    text = "".join(c.content or "" for c in chunks)
    assert text == "Let me look. "
    calls = [tc for c in chunks for tc in c.tool_calls]
    assert len(calls) == 1
    assert calls[0]["function"]["arguments"] == '{"query": "x"}'
    assert chunks[-1].finish_reason == "tool_calls"
    assert stream.report is not None


def test_streaming_reask_does_not_send_text_twice() -> None:
    """After a re-ask, the text the caller already has is not streamed again; the call is."""
    model = ScriptedModel(
        [
            Reply(content="Searching now. ", tool_calls=Reply.call("zap_all", {}).tool_calls),
            Reply(
                content="Searching now. ",
                tool_calls=Reply.call("search", {"query": "x"}).tool_calls,
            ),
        ],
        chunk_size=5,
    )
    guard, _ = _guard(model)
    stream = guard.stream(_req())
    chunks = list(stream)
    assert "".join(c.content or "" for c in chunks) == "Searching now. "
    calls = [tc for c in chunks for tc in c.tool_calls]
    assert [c["function"]["name"] for c in calls] == ["search"]
    assert stream.report is not None
    assert stream.report.corrections == 1


def test_degenerate_stream_is_cut_early_with_finish_reason_length() -> None:
    """A stream that degenerates into repetition stops early, says why, and is flagged."""
    phrase = "I will check the logs again."
    model = ScriptedModel([Reply.degenerate(phrase, times=400)], chunk_size=16)
    guard, _ = _guard(model)
    with capture_events() as events:
        stream = guard.stream(_req(tools=False))
        chunks = list(stream)
    text = "".join(c.content or "" for c in chunks)
    assert 0 < len(text) < len(" ".join([phrase] * 400)) // 4
    assert chunks[-1].finish_reason == "length"
    assert stream.report is not None
    assert any("stream cut" in w for w in stream.report.warnings)
    assert any(getattr(e, "detector", None) == "degenerate_text" for e in events)


def test_degenerate_stream_cut_can_be_switched_off() -> None:
    """With cut_degenerate_streams off, the whole answer streams."""
    phrase = "I will check the logs again."
    model = ScriptedModel([Reply.degenerate(phrase, times=60), Reply.text("fine")], chunk_size=64)
    guard, _ = _guard(model, _cfg(loop_detection={"cut_degenerate_streams": False}))
    chunks = list(guard.stream(_req(tools=False)))
    assert "".join(c.content or "" for c in chunks).startswith(" ".join([phrase] * 60))


@pytest.mark.anyio
async def test_async_guard_runs_the_same_logic() -> None:
    """The async guard retries, escalates and reports like the sync one."""
    model = ScriptedModel({"small": [Fault.timeout()] * 3, "medium": [Reply.text("async ok")]})
    clock = FakeClock()
    guard = AsyncGuard(model, _cfg(), clock=clock, sleep=clock.asleep, rng=random.Random(0))
    response = await guard.acomplete(_req(tools=False))
    report = report_of(response)
    assert report is not None
    assert (report.tier, report.reasons) == ("standard", ("timeout",))


def test_canary_key_never_leaks() -> None:
    """A secret in an upstream error never reaches events, reports or exception text."""
    canary = "sk-canary-0123456789abcdef"
    model = ScriptedModel([Fault(status=500, message=f"upstream echoed key {canary}")], cycle=True)
    guard, _ = _guard(model)
    with capture_events() as events, pytest.raises(TiersExhausted) as info:
        guard.complete(_req(tools=False))
    assert canary not in str(info.value)
    assert all(canary not in repr(a) for a in info.value.attempts)
    assert all(canary not in str(e.to_dict()) for e in events)


def test_one_session_precedence_explicit_header_context_fingerprint() -> None:
    """The most specific source names the session, and the report says which it was."""
    model = ScriptedModel([Reply.text("ok")], cycle=True)
    guard, _ = _guard(model)
    header = {"X-AgentGuard-Session": "from-header"}

    def source(session: str | None = None, **kw: Any) -> tuple[str, str]:
        request = ModelRequest("fast", [{"role": "user", "content": "hi"}], **kw)
        report = report_of(guard.complete(request, session=session))
        assert report is not None
        return report.session, report.session_source

    with ag_session("from-context"):
        assert source("given", headers=header) == ("given", "explicit")
        assert source(headers=header) == ("from-header", "header")
        assert source() == ("from-context", "context")
    assert source()[1] == "fingerprint"
    # the guard's own header never reaches the transport
    assert all(SESSION_HEADER not in {k.lower() for k in r.headers} for r in model.requests)


def test_transport_and_tier_transport_are_explicit() -> None:
    """A guard takes exactly one of transport= and tier_transport=, and says so otherwise."""
    model = ScriptedModel([Reply.text("one"), Reply.text("two")])
    seen: list[str] = []

    def per_tier(tier: Tier) -> ScriptedModel:
        seen.append(tier.name)
        return model

    assert Guard(transport=model).complete(_req(tools=False)).message["content"] == "one"
    guard = Guard(tier_transport=per_tier, config=_cfg())
    assert guard.complete(_req(tools=False)).message["content"] == "two"
    assert seen == ["fast"]
    with pytest.raises(TypeError, match="exactly one"):
        Guard()
    with pytest.raises(TypeError, match="exactly one"):
        Guard(model, tier_transport=per_tier)
    with pytest.raises(TypeError, match="tier_transport"):
        Guard(per_tier)  # type: ignore[arg-type]  # a function is not a transport
    with pytest.raises(TypeError, match="instance"):
        AsyncGuard(ScriptedModel)  # type: ignore[arg-type]  # the class, not an instance


def test_extensions_reach_the_transport_on_every_attempt() -> None:
    """An adapter's per-call context in ModelRequest.extensions reaches each attempt as given."""
    model = ScriptedModel([Fault.server_error(502), Reply.text("ok")])
    guard, _ = _guard(model)
    context = object()
    request = ModelRequest("fast", [{"role": "user", "content": "hi"}], extensions={"x": context})
    guard.complete(request)
    assert [r.extensions["x"] for r in model.requests] == [context, context]


@pytest.mark.anyio
async def test_report_of_a_guarded_stream_once_exhausted() -> None:
    """report_of() finds a guard's stream report, sync and async, once the stream has ended."""
    model = ScriptedModel([Reply.text("one"), Reply.text("two")])
    guard, clock = _guard(model)
    stream = guard.stream(_req(tools=False))
    list(stream)
    assert report_of(stream) is stream.report is not None
    aguard = AsyncGuard(model, _cfg(), clock=clock, sleep=clock.asleep, rng=random.Random(0))
    astream = aguard.astream(_req(tools=False))
    _ = [chunk async for chunk in astream]
    assert report_of(astream) is astream.report is not None
