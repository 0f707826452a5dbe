"""Guard and AsyncGuard: the pipeline, driven through a transport.

A guard puts the whole pipeline (see :mod:`agentguard.guard._pipeline`) in front of any
:class:`~agentguard.transport.Transport`::

    guard = Guard(ScriptedModel([...]), config)
    response = guard.complete(ModelRequest(model="fast", messages=[...]))
    report_of(response)

When tiers have their own endpoints, give a function of the tier instead:
``Guard(tier_transport=lambda tier: ..., config=config)``. :func:`agentguard.wrap` builds a
guard around an openai client; use one directly for other transports.

The guard must never break the agent it protects: a fault inside agentguard itself lets the
call through unguarded (``fail_mode: open``, the default), reports it as a
:class:`~agentguard.events.GuardInternalError` event and marks the report ``fail_open``. A stream
fails open the same way: the caller gets what the upstream sent that it has not seen yet, then
the rest of the upstream stream as it comes. With ``fail_mode: closed`` the fault is raised as a
:class:`~agentguard.GuardFailure`, the fault chained as its cause, streams included.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator
from typing import Any, TypeVar

import anyio

from agentguard import _clock
from agentguard._engine import Ask, Call, Open, Send, Sleep, acall, arun, astream, call, run, stream
from agentguard._redact import redact
from agentguard.budget import TokenLedger
from agentguard.config import GuardConfig
from agentguard.events import GuardInternalError, Hook
from agentguard.exceptions import AgentGuardError, EscalationRequired, GuardFailure
from agentguard.pressure import MemoryPressureProbe
from agentguard.telemetry._gate import OFF, observe_call
from agentguard.transport import (
    UNGUARDED,
    AsyncTransport,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    Transport,
    split_session_header,
)
from agentguard.types import Choice, EscalationPrompt, Tier

from ._pipeline import Pipeline
from ._report import GuardReport, attach_report
from ._session import resolve_session

__all__ = ["AsyncGuard", "Confirm", "Guard"]

T = TypeVar("T")

#: Confirm mode's callback: shown the prompt, returns the user's choice (may be async for
#: :class:`AsyncGuard`).
Confirm = Callable[[EscalationPrompt], "Choice | Awaitable[Choice]"]


def _no_callback(prompt: EscalationPrompt) -> Choice:
    raise EscalationRequired(prompt)


def _tier_transport(
    guard: str, method: str, transport: T | None, tier_transport: Callable[[Tier], T] | None
) -> Callable[[Tier], T]:
    """The guard's tier -> transport function, from exactly one of its two arguments."""
    if (transport is None) == (tier_transport is None):
        raise TypeError(
            f"{guard} takes exactly one of transport= (one transport for every tier) and "
            "tier_transport= (a function giving the transport of a tier)"
        )
    if tier_transport is not None:
        return tier_transport
    if isinstance(transport, type) or not callable(getattr(transport, method, None)):
        raise TypeError(
            f"{guard}(transport=...) takes a transport instance (with a {method}() method), "
            f"not {transport!r}; pass a function of the tier as tier_transport="
        )
    return lambda tier: transport  # type: ignore[return-value]


class _Base:
    def __init__(
        self,
        config: GuardConfig | None,
        *,
        ledger: TokenLedger | None,
        probe: MemoryPressureProbe | None,
        confirm: Confirm | None,
        clock: Callable[[], float] | None,
        rng: random.Random | None,
        hooks: Iterable[Hook] | None,
    ) -> None:
        self.pipeline = Pipeline(
            config, ledger=ledger, probe=probe, clock=clock, rng=rng, hooks=hooks
        )
        self._confirm: Confirm = confirm or _no_callback

    @property
    def config(self) -> GuardConfig:
        """The configuration in force."""
        return self.pipeline.config

    def run_of_call(self, call_id: str) -> str | None:
        """The run (the report's ``session``) of the latest answer this guard handed back with
        the tool call ``call_id``: the run about to execute it. ``None`` when no answer the
        guard remembers gave it (the latest 16,384 ids are kept).

        A ToolGuard keeps loop state per run (``ToolGuard.call(..., run=...)``): an adapter
        running the agent's tools looks up each call's run here.
        """
        return self.pipeline.call_runs.get(call_id)

    def _fail_open(
        self,
        request: ModelRequest,
        session: str | None,
        exc: BaseException,
        component: str = "pipeline",
    ) -> GuardReport:
        """Report an internal fault; raise it as a :class:`GuardFailure` when fail-closed."""
        message = redact(_message_of(exc))
        self.pipeline.emitter.emit(
            GuardInternalError(
                session=session,
                component=component,
                error_type=type(exc).__name__,
                message=message,
            )
        )
        if self.config.fail_mode == "closed":
            failure = GuardFailure(
                f"agentguard failed internally ({type(exc).__name__}: {message}); "
                "fail_mode is closed, so the call was not let through unguarded",
                component=component,
                error_type=type(exc).__name__,
            )
            report = getattr(exc, "agentguard_report", None)
            if isinstance(report, GuardReport):  # what the guard did before the fault
                failure.agentguard_report = report
                failure.attempts = report.attempts
            raise failure from exc
        try:
            sid, source = resolve_session(
                request.messages, explicit=session, headers=request.headers
            )
        except Exception:  # messages the guard cannot read: the report says so
            sid, source = session or "unknown", "explicit" if session else "fingerprint"
        return GuardReport(session=sid, session_source=source, model=request.model, fail_open=True)


def _message_of(exc: BaseException) -> str:
    """An exception's message, whatever its ``__str__`` does."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}>"


def _unguarded(request: ModelRequest, tier: Tier) -> ModelRequest:
    """``request`` as sent to ``tier`` when the guard fails open: without the guard's own header,
    for the tier's model (a request naming a tier, ``"fast"``, is for the model it stands for),
    marked :data:`~agentguard.transport.UNGUARDED` (a transport with retries of its own makes
    it as the caller's client would)."""
    _, headers = split_session_header(request.headers)
    return dataclasses.replace(
        request,
        model=tier.model,
        headers=headers,
        extensions={**request.extensions, UNGUARDED: True},
    )


class _Trace:
    """Tells the guard's own faults from upstream errors and policy decisions."""

    __slots__ = ("failed", "last", "obs", "upstream")

    def __init__(self, obs: Any = OFF) -> None:
        self.upstream: set[int] = set()
        self.last: ModelResponse | None = None
        # the last model call's error, while no answer came after it: what the caller would
        # have got from the raw client, should the guard fail while handling it
        self.failed: BaseException | None = None
        self.obs = obs  # the call's telemetry (see agentguard.telemetry)

    def answered(self, response: ModelResponse) -> None:
        self.last, self.failed = response, None

    def error(self, exc: BaseException) -> None:
        self.upstream.add(id(exc))
        if isinstance(exc, Exception):  # not a cancellation or an exit passing through
            self.failed = exc

    def unanswered(self) -> BaseException | None:
        """The upstream's error to raise when the guard fails open with no answer to give."""
        return self.failed if self.last is None else None

    def internal(self, exc: BaseException) -> bool:
        return (
            not isinstance(exc, AgentGuardError)
            and id(exc) not in self.upstream
            and isinstance(exc, Exception)
        )


class _StreamTrace(_Trace):
    """A stream's trace: the current attempt's upstream stream, what it sent, and what the
    caller was given of it, so that a stream can fail open where the guard stopped.

    The upstream of the current attempt is closed when the next attempt opens its own, and by
    :meth:`close` at the end; the engine's own close (on a fault) is left to it, so that a
    fail-open can read on.
    """

    __slots__ = ("broken", "cursor", "final_sent", "opened", "received", "source")

    def __init__(self, obs: Any = OFF) -> None:
        super().__init__(obs)
        self.source: Any = None  # the current attempt's upstream iterator
        self.opened = False
        # what the current attempt's upstream sent, a chunk given to the caller whole as None
        self.received: list[StreamChunk | None] = []
        self.cursor = 0  # received[:cursor]: their text went out live
        self.final_sent = False  # the guard began releasing the answer's end (calls, finish)
        self.broken: BaseException | None = None  # what ended the current attempt's upstream

    def attempt(self, source: Any) -> None:
        """A new attempt's upstream stream: the previous one is done with."""
        self.close()
        self.source, self.opened, self.broken, self.failed = source, True, None, None
        self.received, self.cursor, self.final_sent = [], 0, False

    def keep(self, chunk: StreamChunk) -> None:
        """Record a chunk the current attempt's upstream sent; a keep-alive goes straight to
        the caller and is not kept (an upstream sending nothing else holds no memory)."""
        if chunk.comment is None:
            self.received.append(chunk)

    def broke(self, exc: BaseException) -> None:
        """The current attempt's upstream raised ``exc``: how it ended, should it be an error."""
        self.error(exc)
        if isinstance(exc, Exception):
            self.broken = exc

    def rest(self) -> Any:
        """Where a fail-open reads on: the current attempt's upstream, or ``None`` when there
        was none. Raises the upstream's error when that is how it ended, or how the only
        attempt to open one did (what the raw client would have raised)."""
        if self.broken is not None:
            raise self.broken
        if not self.opened and self.failed is not None:
            raise self.failed
        return self.source

    def sent(self, chunk: StreamChunk) -> None:
        """The caller was given ``chunk``: live text (of the next received chunk with text), or
        the answer's end (an upstream's keep-alive is neither)."""
        if chunk.comment is not None:
            return
        if not (chunk.content or chunk.reasoning):
            self.final_sent = True
            return
        received = self.received
        at = self.cursor
        while at < len(received):
            item = received[at]
            at += 1
            if item is not None and (item.content or item.reasoning):
                if not (item.tool_calls or item.finish_reason or item.usage is not None):
                    received[at - 1] = None  # given whole: nothing left to keep
                break
        self.cursor = at

    def unseen(self) -> Iterator[StreamChunk]:
        """What the current attempt's upstream sent that the caller was not given: its chunks
        after those whose text went out live (whose other parts are given now)."""
        if self.final_sent:
            return
        for at, chunk in enumerate(self.received):
            if chunk is None:
                continue
            if at < self.cursor and (chunk.content or chunk.reasoning):
                yield dataclasses.replace(chunk, content=None, reasoning=None, raw=None)
            else:
                yield chunk

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        self.source = None
        if callable(close):
            close()

    async def aclose(self) -> None:
        aclose = getattr(self.source, "aclose", None)
        self.source = None
        if callable(aclose):
            await aclose()


class _Upstream:
    """The upstream chunks of one attempt as the engine reads them, recorded in the trace; the
    engine's ``close`` is deferred to the trace (see :class:`_StreamTrace`)."""

    __slots__ = ("_chunks", "_trace")

    def __init__(self, chunks: Any, trace: _StreamTrace) -> None:
        self._chunks = chunks
        self._trace = trace

    def __iter__(self) -> _Upstream:
        return self

    def __next__(self) -> StreamChunk:
        try:
            chunk: StreamChunk = next(self._chunks)
        except StopIteration:
            raise
        except BaseException as exc:
            self._trace.broke(exc)
            raise
        self._trace.keep(chunk)
        return chunk

    def __aiter__(self) -> _Upstream:
        return self

    async def __anext__(self) -> StreamChunk:
        try:
            chunk: StreamChunk = await anext(self._chunks)
        except StopAsyncIteration:
            raise
        except BaseException as exc:
            self._trace.broke(exc)
            raise
        self._trace.keep(chunk)
        return chunk


class Guard(_Base):
    """The pipeline over a synchronous transport.

    Give exactly one of ``transport`` and ``tier_transport``.

    Args:
        transport: the model transport, for every tier.
        config: the configuration (defaults when ``None``).
        tier_transport: a function giving the transport of a tier (tiers can have their own
            endpoints), called for every model call.
        ledger: a token ledger to share (default: one built from the config).
        probe: a memory-pressure probe (default: one built from the config).
        confirm: confirm mode's callback; without one, confirm mode raises
            :class:`~agentguard.EscalationRequired`.
        clock: monotonic seconds (injected in tests).
        sleep: how to wait between retries (injected in tests).
        rng: randomness for backoff jitter (seed it for reproducible runs).
        hooks: event hooks of this guard.
    """

    def __init__(
        self,
        transport: Transport | None = None,
        config: GuardConfig | None = None,
        *,
        tier_transport: Callable[[Tier], Transport] | None = None,
        ledger: TokenLedger | None = None,
        probe: MemoryPressureProbe | None = None,
        confirm: Callable[[EscalationPrompt], Choice] | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        super().__init__(
            config, ledger=ledger, probe=probe, confirm=confirm, clock=clock, rng=rng, hooks=hooks
        )
        self._transport_for = _tier_transport("Guard", "send", transport, tier_transport)
        self._sleep = sleep or _clock.sleep

    def _handlers(self, trace: _Trace) -> dict[type, Callable[[Any], Any]]:
        def send(action: Send) -> ModelResponse:
            try:
                response: ModelResponse = trace.obs.send(self._transport_for(action.tier), action)
            except BaseException as exc:
                trace.error(exc)
                raise
            trace.answered(response)
            return response

        return {
            Send: send,
            Sleep: lambda a: self._sleep(a.seconds),
            Ask: lambda a: self._confirm(a.prompt),
            Call: call,
        }

    def complete(self, request: ModelRequest, *, session: str | None = None) -> ModelResponse:
        """One guarded call. The report is attached: ``report_of(response)`` (and its ``raw``)."""
        trace = _Trace(observe_call(request, session))
        with trace.obs:  # the call's span: current while the guard works, ended with the call
            try:
                response, report = run(
                    self.pipeline.plan(request, session=session), self._handlers(trace)
                )
            except BaseException as exc:
                if not trace.internal(exc):
                    raise
                report = self._fail_open(request, session, exc)
                failed = trace.unanswered()
                if failed is not None:  # the upstream's own error, as the raw client raises it
                    raise failed from None
                if trace.last is not None:
                    response = trace.last
                else:  # the call the guard did not make, unguarded
                    tier = self.pipeline.policy.tier_for(request.model)
                    response = self._transport_for(tier).send(_unguarded(request, tier))
            trace.obs.report(report)
        attach_report(response.raw, report)
        return dataclasses.replace(response, report=report)

    def stream(self, request: ModelRequest, *, session: str | None = None) -> GuardedStream:
        """One guarded streaming call: an iterator of chunks; the report once it is exhausted."""
        trace = _StreamTrace(observe_call(request, session, stream=True))

        def open_stream(action: Open) -> Iterator[StreamChunk]:
            try:
                chunks = trace.obs.stream(self._transport_for(action.tier), action)
            except BaseException as exc:
                trace.error(exc)
                raise
            trace.attempt(chunks)
            return _Upstream(chunks, trace)

        plan = self.pipeline.stream_plan(request, session=session)
        engine = stream(plan, self._handlers(trace), open=open_stream)
        return GuardedStream(self._failsafe(request, session, trace, engine))

    def _failsafe(
        self,
        request: ModelRequest,
        session: str | None,
        trace: _StreamTrace,
        engine: Generator[StreamChunk, None, GuardReport],
    ) -> Generator[StreamChunk, None, GuardReport]:
        """The engine's chunks; on an internal fault, the stream fails open (or closed)."""
        obs = trace.obs  # each step with the call's span current (see Guard.complete)
        failure: BaseException | None = None
        try:
            while True:
                try:
                    chunk = obs.run(next, engine)
                except StopIteration as stop:
                    report: GuardReport = stop.value
                    obs.report(report)
                    return report
                except Exception as exc:
                    if not trace.internal(exc):
                        raise
                    report = obs.run(self._fail_open, request, session, exc, "stream")
                    obs.report(report)
                    yield from trace.unseen()
                    source = trace.rest()
                    if source is not None:  # read on where the guard stopped
                        yield from source
                    elif not trace.opened:  # the fault came before any upstream call
                        tier = self.pipeline.policy.tier_for(request.model)
                        yield from self._transport_for(tier).stream(_unguarded(request, tier))
                    return report
                trace.sent(chunk)
                yield chunk
        except BaseException as exc:  # GeneratorExit: the caller closed or dropped the stream
            failure = exc
            raise
        finally:
            engine.close()
            trace.close()
            obs.end(failure)


class GuardedStream:
    """The chunks of a guarded stream; :attr:`report` is set when the stream is exhausted."""

    def __init__(self, chunks: Iterator[Any]) -> None:
        self._chunks = chunks
        self.report: GuardReport | None = None

    def __iter__(self) -> GuardedStream:
        return self

    def __next__(self) -> StreamChunk:
        try:
            chunk: StreamChunk = next(self._chunks)
        except StopIteration as stop:
            if self.report is None:  # (read again after its end, a generator returns nothing)
                self.report = stop.value
                attach_report(self, self.report)  # report_of(stream) as for any guarded answer
            raise StopIteration from None
        return chunk

    def close(self) -> None:
        """Stop reading; closes the upstream stream."""
        close = getattr(self._chunks, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> GuardedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncGuard(_Base):
    """The pipeline over an asynchronous transport; the same logic as :class:`Guard`.

    Give exactly one of ``transport`` and ``tier_transport``.

    Args:
        transport: the async model transport, for every tier.
        config: as for :class:`Guard`.
        tier_transport: a function giving the async transport of a tier.
        ledger: as for :class:`Guard`.
        probe: as for :class:`Guard`.
        confirm: confirm mode's callback, sync or async.
        clock: as for :class:`Guard`.
        sleep: an async sleep (injected in tests; default ``anyio.sleep``).
        rng: as for :class:`Guard`.
        hooks: as for :class:`Guard`.
    """

    def __init__(
        self,
        transport: AsyncTransport | None = None,
        config: GuardConfig | None = None,
        *,
        tier_transport: Callable[[Tier], AsyncTransport] | None = None,
        ledger: TokenLedger | None = None,
        probe: MemoryPressureProbe | None = None,
        confirm: Confirm | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        super().__init__(
            config, ledger=ledger, probe=probe, confirm=confirm, clock=clock, rng=rng, hooks=hooks
        )
        self._transport_for = _tier_transport("AsyncGuard", "asend", transport, tier_transport)
        self._sleep = sleep or anyio.sleep

    def _handlers(self, trace: _Trace) -> dict[type, Callable[[Any], Any]]:
        async def send(action: Send) -> ModelResponse:
            try:
                response: ModelResponse = await trace.obs.asend(
                    self._transport_for(action.tier), action
                )
            except BaseException as exc:
                trace.error(exc)
                raise
            trace.answered(response)
            return response

        return {
            Send: send,
            Sleep: lambda a: self._sleep(a.seconds),
            Ask: lambda a: self._confirm(a.prompt),
            Call: acall,
        }

    async def acomplete(
        self, request: ModelRequest, *, session: str | None = None
    ) -> ModelResponse:
        """One guarded call (see :meth:`Guard.complete`)."""
        trace = _Trace(observe_call(request, session))
        with trace.obs:  # as in Guard.complete
            try:
                response, report = await arun(
                    self.pipeline.plan(request, session=session), self._handlers(trace)
                )
            except BaseException as exc:
                if not trace.internal(exc):
                    raise
                report = self._fail_open(request, session, exc)
                failed = trace.unanswered()
                if failed is not None:  # as in Guard.complete
                    raise failed from None
                if trace.last is not None:  # as in Guard.complete
                    response = trace.last
                else:
                    tier = self.pipeline.policy.tier_for(request.model)
                    response = await self._transport_for(tier).asend(_unguarded(request, tier))
            trace.obs.report(report)
        attach_report(response.raw, report)
        return dataclasses.replace(response, report=report)

    def astream(self, request: ModelRequest, *, session: str | None = None) -> AsyncGuardedStream:
        """One guarded streaming call: an async iterator of chunks; the report at its end."""
        trace = _StreamTrace(observe_call(request, session, stream=True))
        result = AsyncGuardedStream()

        def open_stream(action: Open) -> AsyncIterator[StreamChunk]:
            try:
                chunks = trace.obs.astream(self._transport_for(action.tier), action)
            except BaseException as exc:
                trace.error(exc)
                raise
            trace.attempt(chunks)
            return _Upstream(chunks, trace)

        def done(report: GuardReport) -> None:
            trace.obs.report(report)
            result.report = report
            attach_report(result, report)

        plan = self.pipeline.stream_plan(request, session=session)
        engine = astream(plan, self._handlers(trace), open=open_stream, done=done)
        result.chunks = self._afailsafe(request, session, trace, engine, done)
        return result

    async def _afailsafe(
        self,
        request: ModelRequest,
        session: str | None,
        trace: _StreamTrace,
        engine: AsyncIterator[StreamChunk],
        done: Callable[[GuardReport], None],
    ) -> AsyncIterator[StreamChunk]:
        """The engine's chunks; on an internal fault, the stream fails open (or closed)."""
        obs = trace.obs  # as in Guard._failsafe
        failure: BaseException | None = None
        try:
            while True:
                try:
                    chunk = await obs.arun(anext, engine)
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    if not trace.internal(exc):
                        raise
                    report = obs.run(self._fail_open, request, session, exc, "stream")
                    for held in trace.unseen():
                        yield held
                    source = trace.rest()
                    if source is None and not trace.opened:  # before any upstream call
                        tier = self.pipeline.policy.tier_for(request.model)
                        source = self._transport_for(tier).astream(_unguarded(request, tier))
                    if source is not None:  # read on where the guard stopped
                        async for rest in source:
                            yield rest
                    done(report)
                    return
                trace.sent(chunk)
                yield chunk
        except BaseException as exc:
            failure = exc
            raise
        finally:
            aclose = getattr(engine, "aclose", None)
            if callable(aclose):
                await aclose()
            await trace.aclose()
            obs.end(failure)


class AsyncGuardedStream:
    """The chunks of a guarded async stream; :attr:`report` is set when it is exhausted."""

    def __init__(self) -> None:
        self.chunks: AsyncIterator[Any] | None = None
        self.report: GuardReport | None = None

    def __aiter__(self) -> AsyncGuardedStream:
        return self

    def __anext__(self) -> Awaitable[StreamChunk]:
        # the chunks' own awaitable, not a coroutine around it (one frame less per chunk)
        assert self.chunks is not None
        return anext(self.chunks)

    async def aclose(self) -> None:
        """Stop reading; closes the upstream stream."""
        aclose = getattr(self.chunks, "aclose", None)
        if callable(aclose):
            await aclose()

    async def __aenter__(self) -> AsyncGuardedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
