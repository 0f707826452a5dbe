"""OpenTelemetry: GenAI spans, guardrail span events and metrics, checked on the real SDK.

Spans go to the SDK's ``InMemorySpanExporter`` and metrics to its ``InMemoryMetricReader``
through ``agentguard.telemetry.configure`` (the global providers can be set once per process:
the tests that need them run in a subprocess). Attribute names are checked against the names
the GenAI semantic conventions define (``open-telemetry/semantic-conventions-genai``,
``docs/registry/attributes/gen-ai.md``).
"""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import agentguard
from _hostile import TOOLS
from agentguard import BudgetExceeded, GuardConfig, LoopDetected
from agentguard import telemetry as ag_telemetry
from agentguard.guard import AsyncGuard, Guard
from agentguard.telemetry import _semconv
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel
from agentguard.tools import ToolGuard
from agentguard.transport import TRACE_PARENT, ModelRequest, StreamChunk, report_of

# The gen_ai.* attributes the conventions define that agentguard may record (registry names).
CONVENTION_ATTRIBUTES = {
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.system",  # deprecated name of gen_ai.provider.name (v1.36.0 and before)
    "gen_ai.request.model",
    "gen_ai.request.max_tokens",
    "gen_ai.request.temperature",
    "gen_ai.request.top_p",
    "gen_ai.request.frequency_penalty",
    "gen_ai.request.presence_penalty",
    "gen_ai.request.seed",
    "gen_ai.request.stream",
    "gen_ai.response.model",
    "gen_ai.response.id",
    "gen_ai.response.finish_reasons",
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.conversation.id",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.name",
    "gen_ai.tool.type",
    "gen_ai.tool.description",
    "gen_ai.tool.call.id",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "gen_ai.token.type",
    "gen_ai.guardrail.component.name",
    "gen_ai.guardrail.policy.id",
    "gen_ai.guardrail.policy.rule.id",
    "gen_ai.guardrail.result.type",
    "gen_ai.guardrail.result.value",
    "gen_ai.guardrail.result.reason",
    "gen_ai.guardrail.source",
}
OTHER_CONVENTIONS = {"error.type", "server.address", "server.port"}


def _python(code: str) -> None:
    """Run ``code`` in a fresh interpreter that imports this tree's agentguard."""
    src = os.path.dirname(os.path.dirname(agentguard.__file__))
    # another test module may have switched the SDK off for its framework (OTEL_SDK_DISABLED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = src
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


def _check_names(attributes: Any) -> None:
    for name in attributes or {}:
        if name.startswith("gen_ai."):
            assert name in CONVENTION_ATTRIBUTES, name
        else:
            assert name in OTHER_CONVENTIONS or name.startswith("agentguard."), name


class Recorded:
    """The spans and metrics one test recorded."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.clock = FakeClock()

    @property
    def spans(self) -> list[ReadableSpan]:
        spans = list(self.exporter.get_finished_spans())
        for span in spans:
            _check_names(span.attributes)
            for event in span.events:
                _check_names(event.attributes)
        return spans

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        found = self.named(prefix)
        assert len(found) == 1, [s.name for s in self.spans]
        return found[0]

    def metrics(self) -> dict[str, Any]:
        data = self.reader.get_metrics_data()
        out: dict[str, Any] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out[metric.name] = metric
        return out


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorded]:
    """agentguard's telemetry recorded in memory for one test, then back to the default."""
    # the crewai tests switch the SDK off for crewai's own telemetry, for the whole process
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    recorded = Recorded()
    ag_telemetry.configure(
        tracer_provider=recorded.tracer_provider,
        meter_provider=recorded.meter_provider,
        clock=recorded.clock,
    )
    try:
        yield recorded
    finally:
        ag_telemetry.configure()


def _config(**extra: Any) -> GuardConfig:
    data: dict[str, Any] = {
        "tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}},
        "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 1},
        "memory_pressure": {"enabled": False},
    }
    data.update(extra)
    return GuardConfig.from_dict(data, env={})


def _guard(model: ScriptedModel, **extra: Any) -> Guard:
    clock = FakeClock()
    return Guard(model, _config(**extra), clock=clock, sleep=clock.sleep, rng=random.Random(0))


def _request(**kw: Any) -> ModelRequest:
    kw.setdefault("messages", [{"role": "user", "content": "find x"}])
    return ModelRequest(model="fast", **kw)


def _guardrail(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == "gen_ai.guardrail.result"]


def _result(policy: str, value: str, kind: str, rule: str, more: dict[str, Any]) -> dict[str, Any]:
    """A ``gen_ai.guardrail.result`` event's attributes as agentguard writes them (the reason
    is the event's kind), with the decision's ``more``."""
    return {
        "gen_ai.guardrail.component.name": "agentguard",
        "gen_ai.guardrail.policy.id": policy,
        "gen_ai.guardrail.result.type": "action",
        "gen_ai.guardrail.result.value": value,
        "gen_ai.guardrail.result.reason": kind,
        "gen_ai.guardrail.policy.rule.id": rule,
        "agentguard.event": kind,
        **more,
    }


# -- spans of a guarded call ----------------------------------------------------------------------


def test_a_call_is_a_parent_span_with_one_chat_client_span_per_attempt(otel: Recorded) -> None:
    """One guarded call: its INTERNAL span, and a ``chat {model}`` CLIENT child with the
    required and recommended GenAI attributes."""
    guard = _guard(ScriptedModel([Reply.text("hello")]))
    response = guard.complete(_request(params={"temperature": 0.2}), session="run-1")
    call = otel.one("agentguard chat")
    chat = otel.one("chat small")
    assert call.name == "agentguard chat fast"
    assert call.kind is SpanKind.INTERNAL
    assert chat.kind is SpanKind.CLIENT
    assert chat.parent is not None
    assert chat.parent.span_id == call.context.span_id
    assert chat.context.trace_id == call.context.trace_id
    attrs = dict(chat.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "unknown"  # ScriptedModel names no provider
    assert attrs["gen_ai.request.model"] == "small"
    assert attrs["gen_ai.request.temperature"] == 0.2
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["gen_ai.response.id"] == response.id
    assert attrs["gen_ai.conversation.id"] == "run-1"
    usage = response.usage
    assert usage is not None
    assert attrs["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert "gen_ai.input.messages" not in attrs  # no content unless asked for
    parent = dict(call.attributes or {})
    assert parent["gen_ai.conversation.id"] == "run-1"
    assert parent["agentguard.tier"] == "fast"
    assert parent["agentguard.attempts"] == 1
    assert "gen_ai.operation.name" not in parent  # not an inference span: tokens count once
    assert call.status.status_code is StatusCode.UNSET


_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
_CALLER_SPAN = 0x00F067AA0BA902B7
_TRACEPARENT = f"00-{_TRACE:032x}-{_CALLER_SPAN:016x}-01"


@pytest.mark.parametrize(
    ("given", "joins"),
    [
        ({"traceparent": _TRACEPARENT}, True),
        ({"Traceparent": _TRACEPARENT, "tracestate": "vendor=1"}, True),
        ({"traceparent": "00-damaged"}, False),
        ({}, False),
        (42, False),
    ],
)
def test_the_callers_trace_context_parents_the_call(
    otel: Recorded, given: Any, joins: bool
) -> None:
    """A request whose adapter set :data:`TRACE_PARENT` to the caller's trace-context headers
    is recorded in the caller's trace; headers that name no trace (damaged, none, not headers)
    leave the call a root of its own, and never fail it."""
    guard = _guard(ScriptedModel([Reply.text("hello")]))
    guard.complete(_request(extensions={TRACE_PARENT: given}))
    call = otel.one("agentguard chat")
    assert (call.context.trace_id == _TRACE) is joins
    if joins:
        assert call.parent is not None
        assert call.parent.span_id == _CALLER_SPAN
    else:
        assert call.parent is None


def test_a_current_span_wins_over_the_callers_headers_and_a_given_span_over_both(
    otel: Recorded,
) -> None:
    """Under an instrumented server the current span has continued the caller's trace: the
    headers are not read again. A span the adapter names (a proxy's own request span) is the
    parent whatever is current."""
    tracer = otel.tracer_provider.get_tracer("app")
    guard = _guard(ScriptedModel([Reply.text("one"), Reply.text("two")]))
    proxy = tracer.start_span("proxy request")
    with tracer.start_as_current_span("server") as server:
        guard.complete(_request(extensions={TRACE_PARENT: {"traceparent": _TRACEPARENT}}))
        guard.complete(_request(extensions={TRACE_PARENT: proxy}))
    proxy.end()
    first, second = otel.named("agentguard chat")
    assert first.parent is not None
    assert first.parent.span_id == server.get_span_context().span_id
    assert second.parent is not None
    assert second.parent.span_id == proxy.get_span_context().span_id


def test_failed_attempts_and_an_escalation_are_recorded(otel: Recorded) -> None:
    """A 500, a retry, another 500, then the premium tier: three chat spans (two in error)
    and the escalation decision as a guardrail event on the call's span (two failures do
    not open the tier's breaker: see the breaker test below)."""
    model = ScriptedModel(
        {"small": [Fault.server_error(), Fault.server_error()], "big": [Reply.text("ok")]}
    )
    guard = _guard(model)
    assert guard.complete(_request()).message["content"] == "ok"
    chats = sorted(otel.named("chat "), key=lambda s: s.start_time or 0)
    assert [s.name for s in chats] == ["chat small", "chat small", "chat big"]
    assert [dict(s.attributes or {}).get("error.type") for s in chats] == ["500", "500", None]
    assert chats[0].status.status_code is StatusCode.ERROR
    assert [dict(s.attributes or {})["agentguard.attempt"] for s in chats] == [1, 2, 3]
    events = _guardrail(otel.one("agentguard chat"))
    escalated = [e for e in events if e["gen_ai.guardrail.policy.id"] == "escalation"]
    more = {"agentguard.tier.from": "fast", "agentguard.tier.to": "premium"}
    assert escalated == [_result("escalation", "escalated", "escalated", "server_error", more)]
    parent = dict(otel.one("agentguard chat").attributes or {})
    assert parent["agentguard.escalated_from"] == "fast"
    assert parent["agentguard.escalation.reasons"] == ("server_error",)


def test_repairs_and_corrections_are_guardrail_events(otel: Recorded) -> None:
    """A text-embedded call repaired, then a missing argument re-asked: each decision is an
    event with its rule (the repair or error kind), never the content."""
    model = ScriptedModel(
        [
            Reply.call("read_file", {}),
            Reply.embedded("read_file", {"path": "secret plans"}),
        ]
    )
    guard = _guard(model)
    guard.complete(_request(tools=TOOLS))
    events = _guardrail(otel.one("agentguard chat"))
    values = [(e["gen_ai.guardrail.result.value"], e.get("gen_ai.guardrail.policy.rule.id"))
              for e in events]  # fmt: skip
    assert ("rejected", "missing_required") in values
    assert ("correction", "missing_required") in values
    assert any(v == "repaired" for v, _ in values)
    assert "secret plans" not in json.dumps([dict(e) for e in events])
    assert len(otel.named("chat small")) == 2


def test_a_refused_loop_ends_the_call_span_in_error_with_its_verdict(otel: Recorded) -> None:
    """The same call again and again: the loop verdicts are events, and the refusal (a
    LoopDetected) ends the call's span in error."""
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "x"}'}}
    ]}  # fmt: skip
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for _ in range(12):
        history += [call, {"role": "tool", "tool_call_id": "c1", "content": "nothing"}]
    stop_only = {"recovery": {"rungs": ["stop"]}}
    guard = _guard(
        ScriptedModel([Reply.text("x")], cycle=True),
        escalation={"enabled": False},
        loop_detection=stop_only,
    )
    with pytest.raises(LoopDetected):
        guard.complete(ModelRequest(model="fast", messages=history, tools=TOOLS))
    span = otel.one("agentguard chat")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "LoopDetected"
    loops = [e for e in _guardrail(span) if e["gen_ai.guardrail.policy.id"] == "loop_detection"]
    values = [(e["agentguard.event"], e["gen_ai.guardrail.result.value"]) for e in loops]
    assert ("loop_flagged", "break") in values  # the verdict
    assert ("loop_recovery", "stop") in values  # the rung taken
    assert {e["gen_ai.guardrail.source"] for e in loops} == {"tool_call"}


def test_a_loop_recovered_records_the_rung_taken(otel: Recorded) -> None:
    """With the default recovery ladder the call goes on, and the rung is a guardrail event."""
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "x"}'}}
    ]}  # fmt: skip
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for _ in range(4):
        history += [call, {"role": "tool", "tool_call_id": "c1", "content": "nothing"}]
    guard = _guard(ScriptedModel([Reply.text("the file is empty")]))
    guard.complete(ModelRequest(model="fast", messages=history, tools=TOOLS))
    span = otel.one("agentguard chat")
    rungs = [e["gen_ai.guardrail.result.value"] for e in _guardrail(span)
             if e["agentguard.event"] == "loop_recovery"]  # fmt: skip
    assert rungs
    assert set(rungs) <= {"hint", "summary", "prune", "force", "escalate"}
    assert span.status.status_code is StatusCode.UNSET


def test_a_budget_refusal_is_an_event_and_an_error(otel: Recorded) -> None:
    """A hard-stop budget refuses the call before any model call: one event, no chat span."""
    guard = _guard(
        ScriptedModel([Reply.text("x")]),
        token_budget={"policy": "hard_stop", "per_session": 5},
    )
    with pytest.raises(BudgetExceeded):
        guard.complete(_request())
    assert otel.named("chat ") == []
    span = otel.one("agentguard chat")
    assert dict(span.attributes or {})["agentguard.budget"] == "exceeded"
    refused = [e for e in _guardrail(span) if e["gen_ai.guardrail.policy.id"] == "token_budget"]
    assert refused[-1]["gen_ai.guardrail.result.value"] == "refuse"


def _no_content(events: list[dict[str, Any]], *texts: str) -> None:
    """No guardrail event carries message content (nor the guard's own hint or message)."""
    said = json.dumps(events)
    for text in texts:
        assert text not in said
    assert all("agentguard.message" not in e for e in events)


def test_a_budget_warning_is_one_event_on_the_call_that_passed_the_line(otel: Recorded) -> None:
    """Calls one after another in a session until its usage passes warn_ratio: one
    ``budget_warning`` guardrail event, on the span of the call whose usage passed the line,
    with the budget's numbers and no content — not one per call whose hold reached past it."""
    guard = _guard(
        ScriptedModel([Reply.text("the plans are in the safe")], cycle=True),
        token_budget={"per_session": 1_000, "warn_ratio": 0.5, "max_output_tokens": 500},
    )
    prompt = [{"role": "user", "content": "where are the secret plans"}]
    for _ in range(25):
        guard.complete(_request(messages=prompt), session="run-1")
    calls = sorted(otel.named("agentguard chat"), key=lambda s: s.start_time or 0)
    events = [(i, e) for i, span in enumerate(calls) for e in _guardrail(span)
              if e["agentguard.event"] == "budget_warning"]  # fmt: skip
    assert len(events) == 1
    at, event = events[0]
    used = 0
    for i, span in enumerate(calls[: at + 1]):
        attrs = dict(span.attributes or {})
        used += attrs["agentguard.usage.input_tokens"] + attrs["agentguard.usage.output_tokens"]
        assert (used >= 500) is (i == at)  # the first call to take the session past the line
    more = {"gen_ai.guardrail.source": "input", "agentguard.budget.used": used,
            "agentguard.budget.limit": 1_000}  # fmt: skip
    assert event == _result("token_budget", "warning", "budget_warning", "session", more)
    _no_content([e for span in calls for e in _guardrail(span)], "secret plans", "the safe")


def test_circuit_breaker_changes_are_events_on_the_calls_that_changed_it(otel: Recorded) -> None:
    """A tier failing call after call: its breaker opens during one call; after the open
    period the next call's probe half-opens and closes it. Each change is a ``circuit_breaker``
    guardrail event on the span of the call it happened in, naming the breaker (the tier) and
    the state before."""
    clock = FakeClock()
    model = ScriptedModel(  # five failures open it (min_calls 5), on the third call
        {"small": [Fault.server_error()] * 5 + [Reply.text("back")], "big": [Reply.text("ok")] * 3}
    )
    guard = Guard(model, _config(), clock=clock, sleep=clock.sleep, rng=random.Random(0))
    prompt = [{"role": "user", "content": "where are the secret plans"}]
    for _ in range(3):
        guard.complete(_request(messages=prompt))
    clock.advance(31)  # the breaker's open period (30 s) is over
    assert guard.complete(_request(messages=prompt)).message["content"] == "back"
    calls = sorted(otel.named("agentguard chat"), key=lambda s: s.start_time or 0)
    changes = [
        [(e["agentguard.breaker.previous"], e["gen_ai.guardrail.result.value"]) for e in
         _guardrail(span) if e["gen_ai.guardrail.policy.id"] == "circuit_breaker"]
        for span in calls
    ]  # fmt: skip
    assert changes == [
        [],
        [],
        [("closed", "open")],
        [("open", "half_open"), ("half_open", "closed")],
    ]
    events = [e for span in calls for e in _guardrail(span)]
    breakers = [e for e in events if e["gen_ai.guardrail.policy.id"] == "circuit_breaker"]
    assert breakers == [
        _result("circuit_breaker", state, "breaker_state_changed", "tier:fast",
                {"agentguard.breaker.previous": previous})
        for previous, state in (("closed", "open"), ("open", "half_open"), ("half_open", "closed"))
    ]  # fmt: skip
    _no_content(events, "secret plans")


def _fault(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected fault near the secret plans")


@pytest.mark.parametrize("how", ["complete", "stream", "acomplete", "astream"])
def test_a_fail_open_is_an_event_on_the_calls_span(
    otel: Recorded, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault inside the guard (the validator raising) that the call fails open on: a
    ``fail_open`` guardrail event on the call's span naming the component and the error's
    class, never its message or the conversation; the span says ``agentguard.fail_open`` and
    is not in error (the caller got the model's answer)."""
    from agentguard import ToolCallValidator

    monkeypatch.setattr(ToolCallValidator, "validate", _fault)
    clock = FakeClock()
    model = ScriptedModel([Reply.call("read_file", {"path": "plans.txt"})])
    request = _request(messages=[{"role": "user", "content": "open the secret plans"}], tools=TOOLS)
    if how in ("complete", "stream"):
        guard = Guard(model, _config(), clock=clock, sleep=clock.sleep, rng=random.Random(0))
        answer: Any = guard.complete(request) if how == "complete" else list(guard.stream(request))
    else:
        aguard = AsyncGuard(model, _config(), clock=clock, sleep=clock.asleep, rng=random.Random(0))

        async def main() -> Any:
            if how == "acomplete":
                return await aguard.acomplete(request)
            return [chunk async for chunk in aguard.astream(request)]

        answer = anyio.run(main)
    assert answer  # the model's answer went through, unguarded
    span = otel.one("agentguard chat")
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {})["agentguard.fail_open"] is True
    events = _guardrail(span)
    failed = [e for e in events if e["gen_ai.guardrail.policy.id"] == "fail_open"]
    component = "stream" if "stream" in how else "pipeline"
    more = {"error.type": "RuntimeError"}
    assert failed == [
        _result("fail_open", "internal_error", "guard_internal_error", component, more)
    ]
    _no_content(events, "secret plans", "injected fault", "plans.txt")


def test_events_outside_a_guarded_call_go_to_the_current_span(otel: Recorded) -> None:
    """A component used on its own inside the application's span: its decisions land there."""
    from agentguard.loops import LoopDetector

    tracer = otel.tracer_provider.get_tracer("app")
    detector = LoopDetector(_config())
    with tracer.start_as_current_span("app step"):
        for _ in range(4):
            detector.check_tool_call("search", {"query": "x"})
            detector.record_tool_result("search", {"query": "x"}, "same")
    span = otel.one("app step")
    assert any(e["gen_ai.guardrail.policy.id"] == "loop_detection" for e in _guardrail(span))


# -- streams ----------------------------------------------------------------------------------


def test_a_stream_records_the_time_to_its_first_chunk_and_ends_with_it(otel: Recorded) -> None:
    """A streamed attempt's span carries ``gen_ai.request.stream`` and the time to the first
    chunk, and ends (with the call's span) when the stream is exhausted."""
    guard = _guard(ScriptedModel([Reply.text("a streamed answer")]))
    stream = guard.stream(_request())
    next(stream)
    assert otel.named("agentguard chat") == []  # still open
    list(stream)
    chat = otel.one("chat small")
    attrs = dict(chat.attributes or {})
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.response.time_to_first_chunk"] == 0.0  # the fake clock stood still
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    call = otel.one("agentguard chat")
    assert dict(call.attributes or {})["agentguard.attempts"] == 1
    assert chat.parent is not None
    assert chat.parent.span_id == call.context.span_id


def test_a_keep_alive_is_not_the_streams_first_chunk(otel: Recorded) -> None:
    """An upstream's keep-alive (``: OPENROUTER PROCESSING``) before the answer: the time to
    the first chunk is the answer's, not the keep-alive's."""
    clock = FakeClock()
    model = ScriptedModel([Reply.text("a streamed answer")])

    class Thinking:
        def send(self, request: ModelRequest) -> Any:
            return model.send(request)

        def stream(self, request: ModelRequest) -> Any:
            yield StreamChunk(comment=" OPENROUTER PROCESSING")
            otel.clock.advance(7.0)  # the model thinks
            yield from model.stream(request)

    guard = Guard(Thinking(), _config(), clock=clock, sleep=clock.sleep, rng=random.Random(0))
    list(guard.stream(_request()))
    attrs = dict(otel.one("chat small").attributes or {})
    assert attrs["gen_ai.response.time_to_first_chunk"] == 7.0


def test_a_stream_closed_early_ends_its_spans(otel: Recorded) -> None:
    """The caller stops reading: both spans end, marked as closed early, not as errors."""
    guard = _guard(ScriptedModel([Reply.text("word " * 50)], chunk_size=4))
    stream = guard.stream(_request())
    next(stream)
    stream.close()
    call = otel.one("agentguard chat")
    chat = otel.one("chat small")
    assert dict(call.attributes or {})["agentguard.stream.closed_early"] is True
    assert dict(chat.attributes or {})["agentguard.stream.closed_early"] is True
    assert call.status.status_code is StatusCode.UNSET


def test_a_stream_dropped_mid_answer_ends_its_spans(otel: Recorded) -> None:
    """The caller drops a half-read stream without closing it: once it is collected, both
    spans end (closed early), and the next call records normally."""
    guard = _guard(ScriptedModel([Reply.text("word " * 50), Reply.text("next")], chunk_size=4))
    stream = guard.stream(_request())
    next(stream)
    del stream
    gc.collect()
    assert dict(otel.one("chat small").attributes or {})["agentguard.stream.closed_early"] is True
    assert dict(otel.one("agentguard chat").attributes or {})["agentguard.stream.closed_early"]
    guard.complete(_request(messages=[{"role": "user", "content": "next"}]))
    assert len(otel.named("agentguard chat")) == 2


def test_a_stream_never_read_records_nothing(otel: Recorded) -> None:
    """A stream made and dropped unread: no span is started, none is left open."""
    guard = _guard(ScriptedModel([Reply.text("unread"), Reply.text("read")]))
    stream = guard.stream(_request())
    del stream
    guard.complete(_request(messages=[{"role": "user", "content": "next"}]))
    assert [s.name for s in otel.spans if s.name.startswith("agentguard")] == [
        "agentguard chat fast"
    ]


def test_async_calls_and_streams_record_the_same_spans(otel: Recorded) -> None:
    """AsyncGuard: acomplete and astream, each a call span with its chat child."""
    clock = FakeClock()
    model = ScriptedModel([Reply.text("one"), Reply.text("two")])
    guard = AsyncGuard(model, _config(), clock=clock, sleep=clock.asleep, rng=random.Random(0))

    async def main() -> None:
        await guard.acomplete(_request(), session="s")
        stream = guard.astream(_request(), session="s")
        async for _ in stream:
            pass
        assert report_of(stream) is not None

    anyio.run(main)
    calls = otel.named("agentguard chat")
    chats = otel.named("chat small")
    assert len(calls) == 2
    assert len(chats) == 2
    assert {c.parent.span_id for c in chats if c.parent} == {c.context.span_id for c in calls}
    assert [dict(c.attributes or {}).get("gen_ai.request.stream") for c in chats].count(True) == 1


# -- ToolGuard --------------------------------------------------------------------------------


def test_each_tool_attempt_is_an_execute_tool_span(otel: Recorded) -> None:
    """A flaky tool retried once: two ``execute_tool`` spans (the first in error) under the
    tool call's span, which carries the retry decision."""
    clock = FakeClock()
    cfg = GuardConfig.from_dict({"tools": {"sync_timeouts": False}}, env={})
    tools = ToolGuard(cfg, clock=clock, sleep=clock.sleep, rng=random.Random(1))
    calls = iter([ConnectionError("reset"), "found"])

    @tools.tool(criticality="blocking")
    def search(query: str) -> str:
        """Search the docs."""
        step = next(calls)
        if isinstance(step, Exception):
            raise step
        return step

    assert tools.call("search", {"query": "x"}).value == "found"
    parent = otel.one("agentguard tool search")
    attempts = otel.named("execute_tool search")
    assert len(attempts) == 2
    for span in attempts:
        attrs = dict(span.attributes or {})
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["gen_ai.tool.name"] == "search"
        assert span.parent is not None
        assert span.parent.span_id == parent.context.span_id
    errors = [dict(s.attributes or {}).get("error.type") for s in attempts]
    assert sorted(errors, key=str) == ["ConnectionError", None]
    events = _guardrail(parent)
    assert [e["gen_ai.guardrail.result.value"] for e in events] == ["call_retried"]
    assert "gen_ai.tool.call.arguments" not in dict(attempts[0].attributes or {})


def test_tool_content_is_recorded_only_when_asked(otel: Recorded) -> None:
    """``capture_content=True``: arguments and result as JSON, secrets redacted."""
    ag_telemetry.configure(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
        capture_content=True,
    )  # fmt: skip
    tools = ToolGuard(GuardConfig.from_dict({"tools": {"sync_timeouts": False}}, env={}))
    tools.register(lambda query: {"hits": [query]}, name="search")
    tools.call("search", {"query": "sk-abcdefghijklmnopqrstuvwx1234"})
    attrs = dict(otel.one("execute_tool search").attributes or {})
    assert json.loads(str(attrs["gen_ai.tool.call.arguments"])) == {"query": "***"}
    assert "hits" in json.loads(str(attrs["gen_ai.tool.call.result"]))


# -- content, conventions switch ---------------------------------------------------------------


def test_captured_messages_follow_the_conventions_parts_form(otel: Recorded) -> None:
    """With capture on, input and output messages are JSON in the role / parts form."""
    ag_telemetry.configure(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
        capture_content=True,
    )  # fmt: skip
    guard = _guard(ScriptedModel([Reply.call("read_file", {"path": "x"}, id="c9")]))
    guard.complete(_request(tools=TOOLS))
    attrs = dict(otel.one("chat small").attributes or {})
    assert json.loads(str(attrs["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "find x"}]}
    ]
    assert json.loads(str(attrs["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c9", "name": "read_file", "arguments": {"path": "x"}}],
            "finish_reason": "tool_calls",
        }
    ]  # fmt: skip


def test_captured_messages_mask_the_values_of_secret_looking_keys(otel: Recorded) -> None:
    """With capture on, a tool call's arguments (a JSON string) with ``password`` and
    ``api_key``, and a tool result with ``client_secret`` (plain values, no key shape), are
    recorded with those values as ``***``; the other fields as they were."""
    ag_telemetry.configure(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
        capture_content=True,
    )  # fmt: skip
    password, key, secret = "hunter2-correct-horse", "plainkey0123456789", "clientsecret-abc-1"
    model = ScriptedModel(
        [Reply.call("login", {"user": "bob", "password": password, "api_key": key})]
    )
    asked = [
        {"role": "user", "content": "log in"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "login", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": json.dumps({"client_secret": secret})},
    ]  # fmt: skip
    login = {"type": "function", "function": {"name": "login", "parameters": {"type": "object"}}}
    _guard(model).complete(_request(messages=asked, tools=[login]))
    attrs = dict(otel.one("chat small").attributes or {})
    recorded = json.dumps({k: str(v) for k, v in attrs.items()})
    for value in (password, key, secret):
        assert value not in recorded
    output = json.loads(str(attrs["gen_ai.output.messages"]))
    arguments = output[0]["parts"][0]["arguments"]
    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert arguments == {"user": "bob", "password": "***", "api_key": "***"}
    response = json.loads(str(attrs["gen_ai.input.messages"]))[-1]["parts"][0]["response"]
    assert json.loads(response) == {"client_secret": "***"}


def test_a_captured_stream_records_its_text(otel: Recorded) -> None:
    """With capture on, a streamed attempt's output message is the text it streamed."""
    ag_telemetry.configure(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
        capture_content=True,
    )  # fmt: skip
    guard = _guard(ScriptedModel([Reply.text("streamed words here")], chunk_size=4))
    list(guard.stream(_request()))
    output = json.loads(
        str(dict(otel.one("chat small").attributes or {})["gen_ai.output.messages"])
    )
    assert output == [
        {"role": "assistant", "parts": [{"type": "text", "content": "streamed words here"}],
         "finish_reason": "stop"}
    ]  # fmt: skip


def test_the_stability_opt_in_drops_the_older_provider_attribute(
    otel: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the opt-in the provider is also ``gen_ai.system`` (as v1.36.0 named it); with
    ``gen_ai_latest_experimental`` only the latest attributes are emitted."""
    guard = _guard(ScriptedModel([Reply.text("a"), Reply.text("b")]))
    guard.complete(_request())
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")
    ag_telemetry.configure(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    guard.complete(_request(messages=[{"role": "user", "content": "again"}]))
    first, second = sorted(otel.named("chat small"), key=lambda s: s.start_time or 0)
    assert dict(first.attributes or {})["gen_ai.system"] == "unknown"
    assert "gen_ai.system" not in dict(second.attributes or {})


def test_the_capture_switch_reads_as_the_conventions_define_it() -> None:
    """Latest conventions: a mode (SPAN_ONLY / SPAN_AND_EVENT record on spans); before: a
    boolean."""
    env = _semconv.CAPTURE_ENV
    assert _semconv.capture_from_env(True, {env: "SPAN_ONLY"})
    assert _semconv.capture_from_env(True, {env: "span_and_event"})
    assert not _semconv.capture_from_env(True, {env: "true"})
    assert not _semconv.capture_from_env(True, {env: "NO_CONTENT"})
    assert _semconv.capture_from_env(False, {env: "true"})
    assert not _semconv.capture_from_env(False, {})
    assert _semconv.latest_from_env({_semconv.STABILITY_ENV: "gen_ai_latest_experimental"})
    assert not _semconv.latest_from_env({_semconv.STABILITY_ENV: "http"})


def test_every_decision_event_maps_onto_a_guardrail_result() -> None:
    """Each event kind that records a decision has its policy, value and rule; outcomes (a
    tool call started, succeeded, failed) are left to the spans."""
    from agentguard import events as ev

    cases = [
        (ev.LoopRecovery(rung="prune", detector="cycle", severity="critical", count=4),
         ("loop_detection", "prune", "cycle")),
        (ev.QualityDegraded(tier="fast", signal="prompt_truncated", detail="512 of 4000"),
         ("quality", "prompt_truncated", None)),
        (ev.CorrectionRequested(error="missing_required", errors=1, correction=1, tier="fast"),
         ("tool_validation", "correction", "missing_required")),
        (ev.BudgetExhausted(budget="hour", used=9, requested=2, limit=10, policy="hard_stop",
                            action="refuse"), ("token_budget", "refuse", "hour")),
        (ev.GuardInternalError(component="stream", error_type="KeyError", message="x"),
         ("fail_open", "internal_error", "stream")),
        (ev.ToolCallRefused(tool="pay", reason="breaker_open", message="m"),
         ("tool_guard", "call_refused", "breaker_open")),
    ]  # fmt: skip
    for event, (policy, value, rule) in cases:
        decision = _semconv.decision_of(event)
        assert decision is not None, event.kind
        assert (decision.policy, decision.value, decision.rule) == (policy, value, rule)
        _check_names(decision.attributes(event.kind))
    assert _semconv.decision_of(ev.ToolCallStarted(tool="t", turn="1")) is None


def test_provider_names_map_onto_the_conventions_well_known_values() -> None:
    """litellm-style names become the conventions' values; unknown names pass as they are."""
    assert ag_telemetry.provider_name("bedrock") == "aws.bedrock"
    assert ag_telemetry.provider_name("gemini") == "gcp.gemini"
    assert ag_telemetry.provider_name("anthropic") == "anthropic"
    assert ag_telemetry.provider_name("my_gateway") == "my_gateway"
    assert ag_telemetry.provider_name(None) == "unknown"


# -- metrics ----------------------------------------------------------------------------------


def test_metrics_follow_the_conventions_names_units_and_buckets(otel: Recorded) -> None:
    """Duration and token histograms with the advised boundaries, the time to the first
    chunk for streams, and the decisions counter."""
    guard = _guard(ScriptedModel([Reply.embedded("read_file", {"path": "x"}), Reply.text("b")]))
    guard.complete(_request(tools=TOOLS))
    list(guard.stream(_request(messages=[{"role": "user", "content": "more"}])))
    metrics = otel.metrics()
    duration = metrics["gen_ai.client.operation.duration"]
    assert duration.unit == "s"
    points = list(duration.data.data_points)
    assert points[0].explicit_bounds == _semconv.DURATION_BUCKETS
    assert points[0].attributes["gen_ai.operation.name"] == "chat"
    assert points[0].attributes["gen_ai.provider.name"] == "unknown"
    tokens = metrics["gen_ai.client.token.usage"]
    assert tokens.unit == "{token}"
    kinds = {p.attributes["gen_ai.token.type"] for p in tokens.data.data_points}
    assert kinds == {"input", "output"}
    assert next(iter(tokens.data.data_points)).explicit_bounds == _semconv.TOKEN_BUCKETS
    first = metrics["gen_ai.client.operation.time_to_first_chunk"]
    assert sum(p.count for p in first.data.data_points) == 1
    decisions = metrics["agentguard.guard.decisions"]
    repaired = [p for p in decisions.data.data_points
                if p.attributes["gen_ai.guardrail.result.value"] == "repaired"]  # fmt: skip
    assert repaired
    assert repaired[0].value >= 1
    for metric in metrics.values():
        for point in metric.data.data_points:
            _check_names(point.attributes)


def test_estimated_usage_is_not_recorded_as_token_usage(otel: Recorded) -> None:
    """An upstream that reports no usage: no ``gen_ai.usage.*`` and no token histogram (the
    conventions forbid reporting what was not counted)."""
    guard = _guard(ScriptedModel([Reply.text("x", usage=None)]))
    guard.complete(_request())
    assert "gen_ai.usage.input_tokens" not in dict(otel.one("chat small").attributes or {})
    assert "gen_ai.client.token.usage" not in otel.metrics()


# -- context, fail-open, zero cost -------------------------------------------------------------


def test_guard_spans_join_the_current_trace(otel: Recorded) -> None:
    """Inside an application's (or a framework's) span, the guarded call is its child."""
    tracer = otel.tracer_provider.get_tracer("app")
    guard = _guard(ScriptedModel([Reply.text("x")]))
    with tracer.start_as_current_span("agent run") as root:
        guard.complete(_request())
    call = otel.one("agentguard chat")
    assert call.parent is not None
    assert call.parent.span_id == root.get_span_context().span_id
    assert {s.context.trace_id for s in otel.spans} == {root.get_span_context().trace_id}


class _Broken:
    """A tracer provider whose every use fails."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the collector is down")


class _BrokenSpans(TracerProvider):
    """Spans that fail when they are written to."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        real = super().get_tracer(*args, **kwargs)

        class Tracer:
            def start_span(self, *a: Any, **k: Any) -> Any:
                span = real.start_span(*a, **k)

                def fail(*_: Any, **__: Any) -> None:
                    raise RuntimeError("span broken")

                span.set_attribute = fail  # type: ignore[method-assign]
                span.set_attributes = fail  # type: ignore[method-assign]
                span.add_event = fail  # type: ignore[method-assign]
                return span

        return Tracer()


@pytest.mark.parametrize("provider", [_Broken(), _BrokenSpans()], ids=["tracer", "spans"])
def test_telemetry_that_fails_never_breaks_a_call_or_a_stream(provider: Any) -> None:
    """A failing tracer or span: calls, streams and tool calls go on, unchanged."""
    ag_telemetry.configure(tracer_provider=provider, meter_provider=MeterProvider())
    try:
        guard = _guard(ScriptedModel([Reply.text("one"), Reply.embedded("read_file", {"path": "q"}),
                                      Reply.text("three")]))  # fmt: skip
        assert guard.complete(_request()).message["content"] == "one"
        assert guard.complete(_request(tools=TOOLS, messages=[{"role": "user", "content": "2"}]))
        chunks = list(guard.stream(_request(messages=[{"role": "user", "content": "3"}])))
        assert "".join(c.content or "" for c in chunks) == "three"
        tools = ToolGuard(GuardConfig.from_dict({"tools": {"sync_timeouts": False}}, env={}))
        tools.register(lambda: 7, name="seven")
        assert tools.call("seven", {}).value == 7
        clock = FakeClock()
        aguard = AsyncGuard(ScriptedModel([Reply.text("four"), Reply.text("five")]), _config(),
                            clock=clock, sleep=clock.asleep)  # fmt: skip

        async def main() -> list[str]:
            first = await aguard.acomplete(_request())
            texts = [str(first.message["content"])]
            async for chunk in aguard.astream(
                _request(messages=[{"role": "user", "content": "5"}])
            ):
                texts.append(chunk.content or "")
            return texts

        assert "".join(anyio.run(main)) == "fourfive"
    finally:
        ag_telemetry.configure()


def test_without_a_provider_nothing_of_opentelemetry_is_imported() -> None:
    """A guarded call, stream and tool call in a fresh process: no opentelemetry module loads."""
    code = textwrap.dedent(
        """
        import sys
        from agentguard.guard import Guard
        from agentguard.testing import Reply, ScriptedModel
        from agentguard.tools import ToolGuard
        from agentguard.transport import ModelRequest
        guard = Guard(ScriptedModel([Reply.text("a"), Reply.text("b")]))
        guard.complete(ModelRequest(model="m", messages=[{"role": "user", "content": "x"}]))
        list(guard.stream(ModelRequest(model="m", messages=[{"role": "user", "content": "y"}])))
        tools = ToolGuard()
        tools.register(lambda: 1, name="one")
        tools.call("one", {})
        loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
        assert loaded == [], loaded
        assert "agentguard.telemetry._otel" not in sys.modules
        """
    )
    _python(code)


def test_global_providers_are_used_without_any_agentguard_setup() -> None:
    """An application that sets the global SDK providers gets agentguard's spans as they are;
    with the API imported but no provider set, nothing is recorded."""
    code = textwrap.dedent(
        """
        from opentelemetry import trace
        from agentguard.guard import Guard
        from agentguard.telemetry import _gate
        from agentguard.testing import Reply, ScriptedModel
        from agentguard.transport import ModelRequest
        guard = Guard(ScriptedModel([Reply.text("a"), Reply.text("b")]))
        request = ModelRequest(model="m", messages=[{"role": "user", "content": "x"}])
        guard.complete(request)
        assert _gate.bridge() is None  # the API is imported, no provider is set
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        guard.complete(ModelRequest(model="m", messages=[{"role": "user", "content": "y"}]))
        names = sorted(s.name for s in exporter.get_finished_spans())
        assert names == ["agentguard chat m", "chat m"], names
        """
    )
    _python(code)


def test_the_openai_transport_names_its_provider_and_server(otel: Recorded) -> None:
    """Through the real openai client: ``gen_ai.provider.name`` is ``openai`` and the server
    is the client's base URL."""
    pytest.importorskip("openai")
    from _openai_upstream import wrapped_client

    client = wrapped_client(ScriptedModel([Reply.text("hi")]), _config())
    client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "x"}])
    attrs = dict(otel.one("chat small").attributes or {})
    assert attrs["gen_ai.provider.name"] == "openai"
    assert (attrs["server.address"], attrs["server.port"]) == ("scripted.invalid", 80)
    assert attrs["gen_ai.response.model"] == "small"


def test_the_current_span_is_left_as_it_was(otel: Recorded) -> None:
    """After calls and streams (read whole, closed early), the application's context is
    unchanged: no agentguard span stays current."""
    text = " ".join(f"word{i}" for i in range(30))
    guard = _guard(ScriptedModel([Reply.text(text)], cycle=True, chunk_size=5))
    before = trace.get_current_span()
    guard.complete(_request())
    stream = guard.stream(_request(messages=[{"role": "user", "content": "s"}]))
    next(stream)
    assert trace.get_current_span() is before
    stream.close()
    list(guard.stream(_request(messages=[{"role": "user", "content": "t"}])))
    assert trace.get_current_span() is before


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed in ``text`` (each starting a line), in order."""
    decoder = json.JSONDecoder()
    found, at = [], 0
    while (start := text.find("\n{", at)) != -1:
        value, at = decoder.raw_decode(text, start + 1)
        found.append(value)
    return found


def test_the_demo_records_its_run_to_the_console() -> None:
    """``agentguard demo --otel``: the console exporter prints the trace of the run (the agent
    run as root, guarded calls, attempts, tool attempts) and the metrics."""
    pytest.importorskip("openai")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTGUARD_", "OTEL_"))}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(agentguard.__file__))
    proc = subprocess.run(
        [sys.executable, "-m", "agentguard", "demo", "--speed", "0", "--otel",
         "--scenario", "flaky_tool"],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OpenTelemetry spans and metrics go to the console" in proc.stderr
    printed = _json_objects("\n" + proc.stderr)
    spans = [o for o in printed if "context" in o]
    root = next(s for s in spans if s["name"] == "agent run flaky_tool")
    assert root["parent_id"] is None
    assert {s["context"]["trace_id"] for s in spans} == {root["context"]["trace_id"]}
    names = {s["name"] for s in spans}
    assert {"agentguard chat fast", "agentguard tool fetch_ticket"} <= names
    assert "execute_tool fetch_ticket" in names
    assert any(n.startswith("chat ") for n in names)
    metrics = json.dumps([o for o in printed if "resource_metrics" in o])
    assert "gen_ai.client.operation.duration" in metrics
