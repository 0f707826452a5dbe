"""The OpenTelemetry side of agentguard's telemetry: spans, span events and metrics.

Imported only once the application has OpenTelemetry in use (see :mod:`._gate`); it needs
``opentelemetry-api`` only (the ``otel`` extra). Whatever fails in here is logged and
swallowed: telemetry never breaks a call or a stream.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import _internal as _metrics_state
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentguard import _clock
from agentguard._redact import redact, redact_content
from agentguard.transport import TRACE_PARENT, ModelRequest, ModelResponse, StreamChunk

from . import _semconv as sc

__all__ = ["Bridge", "global_bridge", "on_event"]

logger = logging.getLogger("agentguard.telemetry")

_VERSION = "0.1.0.dev0"
_SCHEMA = "https://opentelemetry.io/schemas/1.41.1"
_CONTENT_LIMIT = 64_000  # characters of captured content per attribute


def _quietly(what: str) -> None:
    logger.debug("agentguard telemetry: %s failed (ignored)", what, exc_info=True)


class Bridge:
    """A tracer, a meter's instruments and the settings they are used with.

    Args:
        tracer_provider: where spans go.
        meter_provider: where metrics go.
        capture_content: record message content, tool arguments and results (opt-in).
        latest: emit only the latest experimental conventions (``gen_ai_latest_experimental``);
            otherwise the provider is also named by the older ``gen_ai.system``.
        clock: monotonic seconds, for durations and the time to the first chunk.
    """

    def __init__(
        self,
        tracer_provider: Any,
        meter_provider: Any,
        *,
        capture_content: bool,
        latest: bool,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.tracer = tracer_provider.get_tracer("agentguard", _VERSION, schema_url=_SCHEMA)
        meter = meter_provider.get_meter("agentguard", _VERSION, schema_url=_SCHEMA)
        self.capture = capture_content
        self.latest = latest
        self.clock = clock or _clock.monotonic
        self.duration = meter.create_histogram(
            sc.OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(sc.DURATION_BUCKETS),
        )
        self.tokens = meter.create_histogram(
            sc.TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(sc.TOKEN_BUCKETS),
        )
        self.first_chunk = meter.create_histogram(
            sc.FIRST_CHUNK,
            unit="s",
            description="Time to receive the first chunk of a streamed response.",
            explicit_bucket_boundaries_advisory=list(sc.DURATION_BUCKETS),
        )
        self.decisions = meter.create_counter(
            sc.DECISIONS,
            unit="{decision}",
            description="Guard decisions (repairs, corrections, loop verdicts, escalations ...).",
        )

    # -- the guarded model call ------------------------------------------------------------------

    def call(self, request: ModelRequest, session: str | None, stream: bool) -> _Call:
        """The span of one guarded model call (its attempts are children)."""
        attrs: dict[str, Any] = {sc.REQUEST_MODEL: request.model}
        if stream:
            attrs[sc.STREAM] = True
        if session:
            attrs[sc.CONVERSATION] = session
        name = f"agentguard chat {request.model}".rstrip()
        return _Call(self, name, attrs, _parent(request.extensions.get(TRACE_PARENT)))

    def tool(self, name: str) -> _ToolCall:
        """The span of one guarded tool call (its attempts are children)."""
        span = self.tracer.start_span(
            f"agentguard tool {name}", kind=SpanKind.INTERNAL, attributes={sc.TOOL_NAME: name}
        )
        return _ToolCall(self, span)

    def provider_attributes(self, transport: Any, request: ModelRequest) -> dict[str, Any]:
        """``gen_ai.provider.name`` and ``server.*`` as the transport knows them."""
        attrs: dict[str, Any] = {}
        describe = getattr(transport, "otel_attributes", None)
        if callable(describe):
            try:
                attrs.update(describe(request))
            except Exception:
                _quietly("otel_attributes")
        provider = attrs.setdefault(sc.PROVIDER, "unknown")
        if not self.latest:
            attrs[sc.SYSTEM] = provider
        return attrs

    def metric_attributes(self, span_attrs: Mapping[str, Any]) -> dict[str, Any]:
        keep = (sc.OPERATION, sc.PROVIDER, sc.REQUEST_MODEL, sc.RESPONSE_MODEL, sc.SERVER_ADDRESS,
                sc.SERVER_PORT, sc.ERROR_TYPE)  # fmt: skip
        return {k: span_attrs[k] for k in keep if k in span_attrs}

    def content(self, value: Any) -> str:
        """Captured content as a JSON string, redacted (the values of secret-looking keys too,
        inside tool arguments and results that are JSON text) and bounded."""
        text = json.dumps(redact_content(value), ensure_ascii=False, default=str)
        return text if len(text) <= _CONTENT_LIMIT else text[:_CONTENT_LIMIT] + "…"


def _error_type(exc: BaseException) -> str:
    """A low-cardinality error identifier: the HTTP status when there is one, else the class."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return str(status)
    if isinstance(exc, TimeoutError):
        return "timeout"
    return type(exc).__qualname__


def _fail(span: Any, exc: BaseException) -> str:
    kind = _error_type(exc)
    span.set_attribute(sc.ERROR_TYPE, kind)
    span.set_status(Status(StatusCode.ERROR, kind))
    return kind


class _Active:
    """Makes a span the current one in the OpenTelemetry context, for a while."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Any) -> None:
        self._span = span
        self._token: Any = None

    def __enter__(self) -> _Active:
        if self._span is None:  # no span to make current (it could not be started)
            return self
        try:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        except Exception:
            _quietly("attach")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            try:
                otel_context.detach(self._token)
            except Exception:
                _quietly("detach")
            self._token = None


def _parent(given: Any) -> Any:
    """The context a guarded call's span starts in, from what an adapter set as its
    :data:`~agentguard.transport.TRACE_PARENT`: ``None`` for the current context (nothing set,
    or nothing usable: a damaged header is no parent). A span or a context is taken as given;
    the caller's trace-context headers only when no span is current (an instrumented server
    has continued the caller's trace already, in a span of its own)."""
    if given is None:
        return None
    try:
        if isinstance(given, trace.Span):
            return trace.set_span_in_context(given)
        if isinstance(given, Mapping):
            if trace.get_current_span().get_span_context().is_valid:
                return None
            carrier = {str(k).lower(): str(v) for k, v in given.items()}
            found = propagate.extract(carrier)
            valid = trace.get_current_span(found).get_span_context().is_valid
            return found if valid else None
        if isinstance(given, otel_context.Context):
            return given
    except Exception:
        _quietly("trace parent")
    return None


class _Call:
    """A guarded model call being recorded (see :func:`agentguard.telemetry._gate.observe_call`)."""

    __slots__ = ("_active", "_attempts", "_attrs", "_b", "_ended", "_name", "_parent", "_span",
                 "_started")  # fmt: skip

    def __init__(
        self, bridge: Bridge, name: str, attrs: dict[str, Any], parent: Any = None
    ) -> None:
        self._b = bridge
        self._name, self._attrs = name, attrs
        # the span starts with the call's first step (a stream never read records nothing),
        # as a child of the parent the adapter named, else of what was current when the call
        # was made
        self._parent = otel_context.get_current() if parent is None else parent
        self._span: Any = None
        self._started = False
        self._active: _Active | None = None
        self._attempts = 0
        self._ended = False

    @property
    def span(self) -> Any:
        """The call's span, started on first use; ``None`` when the tracer failed to start it."""
        if not self._started:
            self._started = True
            try:
                self._span = self._b.tracer.start_span(
                    self._name, context=self._parent, kind=SpanKind.INTERNAL, attributes=self._attrs
                )
            except Exception:
                _quietly("call span")
        return self._span

    # the whole call, sync or async: current while it runs, ended with it
    def __enter__(self) -> _Call:
        self._active = _Active(self.span).__enter__()
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self._active is not None:
            self._active.__exit__()
        self.end(exc)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with _Active(self.span):
            return fn(*args)

    async def arun(self, fn: Callable[..., Any], *args: Any) -> Any:
        with _Active(self.span):
            return await fn(*args)

    def report(self, report: Any) -> None:
        if self.span is None:
            return
        try:
            _report(self.span, report)
        except Exception:
            _quietly("report")

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            span = self._span
            if span is None:  # never started: a stream that was never read
                return
            if isinstance(error, GeneratorExit):
                span.set_attribute("agentguard.stream.closed_early", True)
            elif isinstance(error, BaseException):
                _fail(span, error)
                report = getattr(error, "agentguard_report", None)
                if report is not None:
                    _report(span, report)
            span.end()
        except Exception:
            _quietly("end")

    # attempts
    def _attempt(self, transport: Any, tier: Any, request: ModelRequest, session: str | None,
                 stream: bool) -> _Attempt:  # fmt: skip
        self._attempts += 1
        b = self._b
        attrs = {sc.OPERATION: "chat", **b.provider_attributes(transport, request)}
        attrs[sc.REQUEST_MODEL] = request.model
        if request.max_output_tokens is not None:
            attrs[sc.MAX_TOKENS] = request.max_output_tokens
        for key, name in sc.REQUEST_PARAMS:
            value = request.params.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                attrs[name] = value
        if stream:
            attrs[sc.STREAM] = True
        if session:
            attrs[sc.CONVERSATION] = session
        attrs["agentguard.tier"] = getattr(tier, "name", "")
        attrs["agentguard.attempt"] = self._attempts
        span = self.span
        parent = self._parent if span is None else trace.set_span_in_context(span)
        span = b.tracer.start_span(
            f"chat {request.model}", context=parent, kind=SpanKind.CLIENT, attributes=attrs
        )  # a failure here: the attempt goes on unrecorded (see _start)
        if b.capture:
            span.set_attribute(sc.INPUT_MESSAGES, b.content(_messages(request.messages)))
        return _Attempt(b, span, attrs)

    def send(self, transport: Any, action: Any) -> ModelResponse:
        attempt = self._start(transport, action, stream=False)
        if attempt is None:
            response: ModelResponse = transport.send(action.request)
            return response
        try:
            with _Active(attempt.span):
                response = transport.send(action.request)
        except BaseException as exc:
            attempt.failed(exc)
            raise
        attempt.answered(response)
        return response

    async def asend(self, transport: Any, action: Any) -> ModelResponse:
        attempt = self._start(transport, action, stream=False)
        if attempt is None:
            response: ModelResponse = await transport.asend(action.request)
            return response
        try:
            with _Active(attempt.span):
                response = await transport.asend(action.request)
        except BaseException as exc:
            attempt.failed(exc)
            raise
        attempt.answered(response)
        return response

    def stream(self, transport: Any, action: Any) -> Iterator[StreamChunk]:
        attempt = self._start(transport, action, stream=True)
        if attempt is None:
            return iter(transport.stream(action.request))
        try:
            with _Active(attempt.span):
                chunks = iter(transport.stream(action.request))
        except BaseException as exc:
            attempt.failed(exc)
            raise
        return _Chunks(attempt, chunks)

    def astream(self, transport: Any, action: Any) -> AsyncIterator[StreamChunk]:
        attempt = self._start(transport, action, stream=True)
        if attempt is None:
            return aiter(transport.astream(action.request))
        try:
            chunks = aiter(transport.astream(action.request))
        except BaseException as exc:
            attempt.failed(exc)
            raise
        return _AChunks(attempt, chunks)

    def _start(self, transport: Any, action: Any, *, stream: bool) -> _Attempt | None:
        try:
            return self._attempt(
                transport, action.tier, action.request, getattr(action, "session", None), stream
            )
        except Exception:
            _quietly("attempt")
            return None


def _report(span: Any, report: Any) -> None:
    """What the guard did, on the call's span (counts and names only, never content)."""
    usage = report.usage
    attrs: dict[str, Any] = {
        sc.CONVERSATION: report.session,
        "agentguard.session.source": report.session_source,
        "agentguard.attempts": len(report.attempts),
        "agentguard.retries": report.retries,
        "agentguard.corrections": report.corrections,
        "agentguard.repairs": len(report.repairs),
        "agentguard.budget": report.budget,
        "agentguard.memory_pressure": report.memory_pressure,
        "agentguard.fail_open": report.fail_open,
        "agentguard.usage.input_tokens": usage.prompt_tokens,
        "agentguard.usage.output_tokens": usage.completion_tokens,
        "agentguard.usage.estimated": usage.estimated,
        "agentguard.warnings": len(report.warnings),
    }
    if report.tier is not None:
        attrs["agentguard.tier"] = report.tier
    if report.model:
        attrs["agentguard.model"] = report.model  # the serving tier's model, as configured
    if report.escalated_from is not None:
        attrs["agentguard.escalated_from"] = report.escalated_from
    if report.reasons:
        attrs["agentguard.escalation.reasons"] = list(report.reasons)
    if report.cost is not None:
        attrs["agentguard.cost"] = report.cost
    span.set_attributes(attrs)


class _Attempt:
    """One upstream attempt's ``chat {model}`` span, and its metrics."""

    __slots__ = ("_attrs", "_b", "_done", "_first", "_start", "finish", "model", "rid", "span",
                 "text", "usage")  # fmt: skip

    def __init__(self, bridge: Bridge, span: Any, attrs: dict[str, Any]) -> None:
        self._b = bridge
        self.span = span
        self._attrs = attrs
        self._start = bridge.clock()
        self._first: float | None = None
        self._done = False
        # what a stream delivered
        self.finish: str | None = None
        self.usage: Any = None
        self.model: str | None = None
        self.rid: str | None = None
        self.text: list[str] = []

    def _metrics(self, error: str | None = None) -> None:
        b = self._b
        attrs = b.metric_attributes(self._attrs)
        if error is not None:
            attrs[sc.ERROR_TYPE] = error
        b.duration.record(max(0.0, b.clock() - self._start), attrs)

    def failed(self, exc: BaseException) -> None:
        if self._done:
            return
        self._done = True
        try:
            kind = _fail(self.span, exc)
            self._metrics(kind)
            self.span.end()
        except Exception:
            _quietly("attempt failure")

    def answered(self, response: ModelResponse, *, closed_early: bool = False) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._answered(response, closed_early)
        except Exception:
            _quietly("attempt answer")

    def _answered(self, response: ModelResponse, closed_early: bool) -> None:
        b, span = self._b, self.span
        attrs: dict[str, Any] = {}
        if response.model:
            attrs[sc.RESPONSE_MODEL] = response.model
            self._attrs[sc.RESPONSE_MODEL] = response.model
        if response.id:
            attrs[sc.RESPONSE_ID] = response.id
        if response.finish_reason:
            attrs[sc.FINISH_REASONS] = [response.finish_reason]
        usage = response.usage  # as the upstream reported it: estimates are not recorded
        if usage is not None:
            attrs[sc.INPUT_TOKENS] = usage.prompt_tokens
            attrs[sc.OUTPUT_TOKENS] = usage.completion_tokens
        if self._first is not None:
            attrs[sc.TIME_TO_FIRST_CHUNK] = self._first
        if closed_early:
            attrs["agentguard.stream.closed_early"] = True
        span.set_attributes(attrs)
        if b.capture:
            message = {**response.message, "finish_reason": response.finish_reason}
            span.set_attribute(sc.OUTPUT_MESSAGES, b.content(_messages([message], output=True)))
        self._metrics()
        if usage is not None:
            base = b.metric_attributes(self._attrs)
            b.tokens.record(usage.prompt_tokens, {**base, sc.TOKEN_TYPE: "input"})
            b.tokens.record(usage.completion_tokens, {**base, sc.TOKEN_TYPE: "output"})
        span.end()

    # streams
    def chunk(self, chunk: StreamChunk) -> None:
        if chunk.comment is not None:  # an upstream's keep-alive: not the answer's first chunk
            return
        try:
            if self._first is None:
                self._first = max(0.0, self._b.clock() - self._start)
                self._b.first_chunk.record(self._first, self._b.metric_attributes(self._attrs))
            if chunk.content and self._b.capture:  # kept only to be recorded
                self.text.append(chunk.content)
            if chunk.finish_reason:
                self.finish = chunk.finish_reason
            if chunk.usage is not None:
                self.usage = chunk.usage
            raw = chunk.raw
            if self.model is None:
                self.model = _field(raw, "model")
                self.rid = _field(raw, "id")
        except Exception:
            _quietly("chunk")

    def ended(self, *, closed_early: bool) -> None:
        message = {"role": "assistant", "content": "".join(self.text) if self._b.capture else None}
        response = ModelResponse(
            message=message,
            finish_reason=self.finish,
            usage=self.usage,
            model=self.model or "",
            id=self.rid,
        )
        self.answered(response, closed_early=closed_early)


def _field(raw: Any, name: str) -> str | None:
    value = raw.get(name) if isinstance(raw, Mapping) else getattr(raw, name, None)
    return value if isinstance(value, str) and value else None


class _Chunks:
    """An attempt's upstream chunks: recorded as they pass, the span ended with the stream."""

    __slots__ = ("_attempt", "_chunks")

    def __init__(self, attempt: _Attempt, chunks: Iterator[StreamChunk]) -> None:
        self._attempt = attempt
        self._chunks = chunks

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> StreamChunk:
        attempt = self._attempt
        try:
            with _Active(attempt.span):
                chunk = next(self._chunks)
        except StopIteration:
            attempt.ended(closed_early=False)
            raise
        except BaseException as exc:
            attempt.failed(exc)
            raise
        attempt.chunk(chunk)
        return chunk

    def close(self) -> None:
        try:
            close = getattr(self._chunks, "close", None)
            if callable(close):
                close()
        finally:
            self._attempt.ended(closed_early=True)  # a no-op when it ended already


class _AChunks:
    """Async twin of :class:`_Chunks`."""

    __slots__ = ("_attempt", "_chunks")

    def __init__(self, attempt: _Attempt, chunks: AsyncIterator[StreamChunk]) -> None:
        self._attempt = attempt
        self._chunks = chunks

    def __aiter__(self) -> _AChunks:
        return self

    async def __anext__(self) -> StreamChunk:
        attempt = self._attempt
        try:
            with _Active(attempt.span):
                chunk = await anext(self._chunks)
        except StopAsyncIteration:
            attempt.ended(closed_early=False)
            raise
        except BaseException as exc:
            attempt.failed(exc)
            raise
        attempt.chunk(chunk)
        return chunk

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._chunks, "aclose", None)
            if callable(aclose):
                await aclose()
        finally:
            self._attempt.ended(closed_early=True)


def _messages(messages: Sequence[Any], *, output: bool = False) -> list[dict[str, Any]]:
    """Chat messages in the conventions' input / output messages form (role and parts)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = m.get("role") or "assistant"
        content = m.get("content")
        parts: list[dict[str, Any]] = []
        if role == "tool":
            parts.append({"type": "tool_call_response", "id": m.get("tool_call_id"),
                          "response": content})  # fmt: skip
        elif isinstance(content, str) and content:
            parts.append({"type": "text", "content": content})
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "content": part["text"]})
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {} if isinstance(call, Mapping) else {}
            parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                          "arguments": _arguments(fn.get("arguments"))})  # fmt: skip
        message: dict[str, Any] = {"role": role, "parts": parts}
        if output:
            message["finish_reason"] = m.get("finish_reason") or ""
        out.append(message)
    return out


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


# -- ToolGuard ---------------------------------------------------------------------------------


class _ToolCall:
    """A guarded tool call being recorded; its attempts are ``execute_tool`` spans."""

    __slots__ = ("_active", "_b", "_span")

    def __init__(self, bridge: Bridge, span: Any) -> None:
        self._b = bridge
        self._span = span
        self._active: _Active | None = None

    def __enter__(self) -> _ToolCall:
        self._active = _Active(self._span).__enter__()
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        try:
            if self._active is not None:
                self._active.__exit__()
            if exc is not None:
                _fail(self._span, exc)
            self._span.end()
        except Exception:
            _quietly("tool call end")

    def outcome(self, outcome: Any) -> None:
        try:
            attrs: dict[str, Any] = {
                "agentguard.tool.ok": bool(outcome.ok),
                "agentguard.tool.attempts": outcome.attempts,
            }
            error = outcome.error
            if error is not None:
                attrs[sc.ERROR_TYPE] = error.kind
                self._span.set_status(Status(StatusCode.ERROR, error.kind))
            if outcome.fallback:
                attrs["agentguard.tool.fallback"] = outcome.fallback
            if outcome.replayed:
                attrs["agentguard.tool.replayed"] = True
            self._span.set_attributes(attrs)
        except Exception:
            _quietly("tool outcome")


def _tool_span(bridge: Bridge, action: Any) -> Any:
    tool = action.tool
    attrs: dict[str, Any] = {
        sc.OPERATION: "execute_tool",
        sc.TOOL_NAME: tool.name,
        sc.TOOL_TYPE: "function",
        "agentguard.tool.criticality": str(getattr(tool, "criticality", "")),
    }
    description = getattr(tool, "description", None)
    if isinstance(description, str) and description:
        attrs[sc.TOOL_DESCRIPTION] = description[:500]
    span = bridge.tracer.start_span(
        f"execute_tool {tool.name}", kind=SpanKind.INTERNAL, attributes=attrs
    )
    if bridge.capture:
        span.set_attribute(sc.TOOL_ARGUMENTS, bridge.content(action.arguments))
    return span


def _tool_done(bridge: Bridge, span: Any, value: Any) -> None:
    try:
        if bridge.capture:
            span.set_attribute(sc.TOOL_RESULT, bridge.content(value))
        span.end()
    except Exception:
        _quietly("tool attempt end")


def _tool_failed(span: Any, exc: BaseException) -> None:
    try:
        _fail(span, exc)
        span.end()
    except Exception:
        _quietly("tool attempt failure")


def tool_attempt(bridge: Bridge, fn: Callable[..., Any], action: Any, *args: Any,
                 **kwargs: Any) -> Any:  # fmt: skip
    """Run one ToolGuard attempt (``fn(action, ...)``) inside its ``execute_tool`` span."""
    try:
        span = _tool_span(bridge, action)
    except Exception:
        _quietly("tool attempt")
        return fn(action, *args, **kwargs)
    try:
        with _Active(span):
            value = fn(action, *args, **kwargs)
    except BaseException as exc:
        _tool_failed(span, exc)
        raise
    _tool_done(bridge, span, value)
    return value


async def atool_attempt(bridge: Bridge, fn: Callable[..., Any], action: Any, *args: Any,
                        **kwargs: Any) -> Any:  # fmt: skip
    """Async twin of :func:`tool_attempt`."""
    try:
        span = _tool_span(bridge, action)
    except Exception:
        _quietly("tool attempt")
        return await fn(action, *args, **kwargs)
    try:
        with _Active(span):
            value = await fn(action, *args, **kwargs)
    except BaseException as exc:
        _tool_failed(span, exc)
        raise
    _tool_done(bridge, span, value)
    return value


# -- events ------------------------------------------------------------------------------------


def on_event(bridge: Bridge, event: Any) -> None:
    """A guard decision: an event on the current span, and one more in the decisions counter."""
    kind = getattr(event, "kind", "event")
    decision = sc.decision_of(event)
    span = trace.get_current_span()
    recording = span.is_recording()
    if decision is None:
        if kind in sc.NOT_DECISIONS or not recording:
            return
        # an event kind without a mapping: its plain fields, as an agentguard event
        attrs = {
            f"agentguard.{k}": v
            for k, v in event.to_dict().items()
            if k not in ("kind", "message", "session") and isinstance(v, (str, bool, int, float))
        }
        span.add_event(f"agentguard.{kind}", attrs)
        return
    attrs = decision.attributes(kind)
    if bridge.capture:
        message = getattr(event, "message", None)
        if isinstance(message, str) and message:
            attrs["agentguard.message"] = redact(message)
    if recording:
        span.add_event(sc.GUARDRAIL_EVENT, attrs)
    counted = {
        k: attrs[k]
        for k in (sc.GUARDRAIL_POLICY, sc.GUARDRAIL_RESULT_VALUE, sc.GUARDRAIL_RULE)
        if k in attrs
    }
    bridge.decisions.add(1, counted)


# -- the global providers ----------------------------------------------------------------------

_global: tuple[Any, Any, Bridge] | None = None
_UNKNOWN = object()
# a provider named by the environment is built by the API on first use (not set beforehand)
_FROM_ENV = (
    "OTEL_PYTHON_TRACER_PROVIDER" in os.environ or "OTEL_PYTHON_METER_PROVIDER" in os.environ
)


def _unset(provider: Any, *names: str) -> bool:
    return type(provider).__name__ in names


def global_bridge() -> Bridge | None:
    """The bridge over the global providers, or ``None`` when neither is configured (then
    recording would cost time and produce nothing).

    The API keeps the providers set with ``set_tracer_provider`` / ``set_meter_provider`` in
    module globals (set once): reading those is the whole cost of a call while nothing is set.
    Where they cannot be read (another API version), the public getters decide.
    """
    global _global  # noqa: PLW0603 - one bridge per pair of global providers
    tracer_set = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    meter_set = getattr(_metrics_state, "_METER_PROVIDER", _UNKNOWN)
    if tracer_set is None and meter_set is None and not _FROM_ENV:
        return None
    cached = _global
    if cached is not None and cached[0] is tracer_set and cached[1] is meter_set:
        return cached[2]
    tracer_provider = trace.get_tracer_provider()
    meter_provider = metrics.get_meter_provider()
    if _unset(tracer_provider, "ProxyTracerProvider", "NoOpTracerProvider") and _unset(
        meter_provider, "_ProxyMeterProvider", "NoOpMeterProvider"
    ):
        return None
    latest = sc.latest_from_env()
    bridge = Bridge(
        tracer_provider, meter_provider, capture_content=sc.capture_from_env(latest), latest=latest
    )
    _global = (tracer_set, meter_set, bridge)
    return bridge
