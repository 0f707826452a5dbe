"""ToolGuard: resilient tool execution for custom agent loops.

One guarded call (:meth:`ToolGuard.call` / :meth:`ToolGuard.acall`) is a sans-I/O plan (the
shape of the model pipeline's, see ``agentguard._engine``): loop check → approval of a high-risk
tool → idempotency key → attempts through the tool's breaker, each under its timeout, retried
with full-jitter backoff while the turn's retry budget lasts → the fallback chain → dead letter →
loop record. The plan yields what it wants done (run an attempt, sleep, a store or breaker
operation, ask a person) and a sync and an async driver carry it out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import difflib
import json
import random
import threading
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from agentguard import _clock, _engine
from agentguard._engine import perform
from agentguard._fingerprint import canonical_json, fingerprint_bytes
from agentguard.config import GuardConfig, ToolBreakerConfig, ToolRetryConfig, ToolsConfig
from agentguard.events import (
    Emitter,
    Event,
    HandOffRequested,
    Hook,
    RetryBudgetExhausted,
    StoreFallback,
    ToolCallFailed,
    ToolCallRefused,
    ToolCallReplayed,
    ToolCallRetried,
    ToolCallStarted,
    ToolCallSucceeded,
    ToolDeadLettered,
    ToolFallbackUsed,
)
from agentguard.exceptions import StoreError, StoreUnavailable
from agentguard.loops import LoopDetector, ToolLoopPolicy
from agentguard.resilience import (
    BreakerDecision,
    BreakerState,
    CircuitBreaker,
    Classification,
    Classifier,
    ErrorClass,
    RetryBudget,
    RetryDecision,
    RetryPolicy,
    classify,
)
from agentguard.storage import Store, store_from_config, with_fallback
from agentguard.types import Severity

from ._errors import checked, classify_failure, describe
from ._model import (
    Criticality,
    DeadLetter,
    Default,
    GuardedTool,
    HandOff,
    ToolError,
    ToolOutcome,
    TraceEntry,
    dead_letter_errors,
    decode_arguments,
    schema_validator,
)
from ._run import DaemonPool, Invoke, ainvoke, invoke

__all__ = ["ToolGuard", "Turn"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
Plan = Generator[Any, Any, T]

_NO_FALLBACK = {ErrorClass.CLIENT_ERROR.value, "loop_detected", "not_approved"}
_NO_FALLBACK |= {"duplicate_in_flight", "idempotency_conflict", "unknown_tool"}
_DEAD_LETTER = {c.value for c in ErrorClass} - {"client_error", "cancelled"} | {"breaker_open"}


@dataclass(frozen=True, slots=True)
class _Consult:
    """Hand a decision to the person behind ``on_hand_off``; the result is their answer."""

    hand_off: HandOff


class Turn:
    """One agent turn: its retry budget, the trace of its tool calls and the model's reasoning.

    Attributes:
        id: the turn's id.
        budget: retries left across all tools in this turn.
        trace: every guarded call of the turn, in order.
        reasoning: the model's last reasoning (shown to a person on hand-off).
    """

    __slots__ = ("budget", "exhausted", "id", "reasoning", "trace")

    def __init__(
        self, retries: int, *, id: str | None = None, reasoning: str | None = None
    ) -> None:
        self.id = id or uuid.uuid4().hex[:12]
        self.budget = RetryBudget(retries)
        self.trace: list[TraceEntry] = []
        self.reasoning = reasoning
        self.exhausted = False  # the budget ran out: the guard stops intervening

    def __repr__(self) -> str:
        return f"Turn({self.id!r}, calls={len(self.trace)}, retries_left={self.budget.remaining})"


@dataclass(slots=True)
class _Result:
    """What a run of one tool (its attempts, without fallbacks) came to."""

    ok: bool
    value: Any = None
    error: ToolError | None = None
    attempts: int = 0
    errors: list[Classification] = field(default_factory=list)


class ToolGuard:
    """Resilient tool execution: timeouts, retries, breakers, idempotency, fallbacks, hand-off.

    Register tools with :meth:`tool` (a decorator) or :meth:`register`, then run each call the
    model makes through :meth:`call` (or :meth:`acall`) and give the model
    ``outcome.todescribe(tool_call_id)``: a value, or a structured error saying what failed and
    whether retrying can help. Wrap each agent turn in :meth:`turn` (or call :meth:`new_turn`) so
    the retry budget and the hand-off trace are per turn.

    Args:
        config: a :class:`~agentguard.GuardConfig` (its ``tools``, ``loop_detection``,
            ``storage`` and ``fail_mode``), the ``tools`` section alone, or ``None``.
        store: where breakers, idempotency keys and dead letters live; default: the one
            ``config.storage`` names (breakers then stay in this object when that is memory).
            Pass a ``RedisStore`` to share breakers across a fleet.
        loop_detector: the run's LoopDetector (share yours to also check text); default: one
            built from ``config.loop_detection``.
        on_hand_off: called with a :class:`HandOff` when the retry budget runs out, a blocking
            tool's breaker is open, or a high-risk tool is about to run (then its truthy answer
            approves the call; without a callback high-risk calls are refused). May be async
            under :meth:`acall`.
        classifiers: error classifiers asked before the built-in rules.
        clock: wall-clock seconds (breaker state and keys are shared across hosts).
        sleep: the sync drivers' wait; ``asleep``: the async one's.
        rng: the retry jitter's randomness.
        executor: the executor sync tools with a timeout run on (default: a thread pool).
        hooks: event hooks.
        session: the session id put on events and hand-offs.
        scope: keeps the idempotency keys and dead letters of different agents on one store apart.
    """

    def __init__(
        self,
        config: GuardConfig | ToolsConfig | None = None,
        *,
        store: Store | None = None,
        loop_detector: LoopDetector | None = None,
        on_hand_off: Callable[[HandOff], Any] | None = None,
        classifiers: Sequence[Classifier] = (),
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        asleep: Callable[[float], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
        executor: concurrent.futures.Executor | None = None,
        hooks: Sequence[Hook] | None = None,
        session: str | None = None,
        scope: str = "default",
    ) -> None:
        full = config if isinstance(config, GuardConfig) else GuardConfig()
        self.config = config if isinstance(config, ToolsConfig) else full.tools
        self._fail_open = full.fail_mode == "open"
        self._hooks = tuple(hooks or ())
        storage = full.storage
        self.store: Store = store if store is not None else store_from_config(storage)
        # An unreachable store: the outage policy the ledger follows too (FallbackStore);
        # closed when either the guard's or the storage's fail_mode says so.
        closed = not self._fail_open or storage.fail_mode == "closed"
        self._store = with_fallback(
            self.store,
            fail_mode="closed" if closed else "open",
            retry_seconds=storage.retry_seconds,
            hooks=self._hooks,
            session=session,
        )
        # Breakers stay in this object unless a store to share them through is given or configured.
        local = store is None and storage.backend == "memory"
        self._breaker_store = None if local else self._store
        self._emitter = Emitter(self._hooks)
        self._detector = loop_detector or LoopDetector(full, hooks=self._hooks, session=session)
        self._detector_lock = threading.Lock()
        self.on_hand_off = on_hand_off
        self._classifiers = tuple(classifiers)
        self._clock = clock or _clock.wall
        self._sleep = sleep or _clock.sleep
        self._asleep = asleep
        self._rng = rng or random.Random()
        self._executor = executor
        self._own_executor: DaemonPool | None = None
        self.session = session
        self.scope = scope
        self._tools: dict[str, GuardedTool] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._policies: dict[str, RetryPolicy] = {}
        self._default_turn = Turn(self.config.retry_budget_per_turn)
        self._turn: contextvars.ContextVar[Turn | None] = contextvars.ContextVar(
            f"agentguard_turn_{id(self)}", default=None
        )
        self._handlers: dict[type, _engine.Handler] = {
            Invoke: self._invoke,
            _engine.Sleep: lambda a: self._sleep(a.seconds),
            _engine.Call: _engine.call,
            _Consult: self._consult,
        }
        self._ahandlers: dict[type, _engine.Handler] = {
            Invoke: self._ainvoke,
            _engine.Sleep: self._asleep_for,
            _engine.Call: _engine.acall,
            _Consult: self._consult,
        }

    # -- registration ---------------------------------------------------------------------------

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        criticality: Criticality | str = ...,
        timeout: float | None = ...,
        side_effecting: bool = ...,
        idempotent: bool | None = ...,
        high_risk: bool = ...,
        fallbacks: Sequence[str | Default] = ...,
        retry: ToolRetryConfig | Mapping[str, Any] | None = ...,
        breaker: ToolBreakerConfig | Mapping[str, Any] | None = ...,
        volatile_fields: Sequence[str] = ...,
        result_schema: Mapping[str, Any] | Callable[[Any], Any] | None = ...,
        classifiers: Sequence[Classifier] = ...,
    ) -> Callable[[F], F]: ...

    def tool(self, fn: Any = None, /, **options: Any) -> Any:
        """Register a function as a tool: ``@tools.tool`` or ``@tools.tool(criticality=...)``.

        Takes the options of :meth:`register`; the function itself is returned unchanged.
        """

        def decorate(f: F) -> F:
            self.register(f, **options)
            return f

        return decorate(fn) if fn is not None else decorate

    def register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        criticality: Criticality | str = Criticality.ENHANCING,
        timeout: float | Literal["default"] | None = "default",
        side_effecting: bool = False,
        idempotent: bool | None = None,
        high_risk: bool = False,
        fallbacks: Sequence[str | Default] = (),
        retry: ToolRetryConfig | Mapping[str, Any] | None = None,
        breaker: ToolBreakerConfig | Mapping[str, Any] | None = None,
        volatile_fields: Sequence[str] = (),
        result_schema: Mapping[str, Any] | Callable[[Any], Any] | None = None,
        classifiers: Sequence[Classifier] = (),
    ) -> GuardedTool:
        """Register ``fn`` (sync or async) as a tool.

        Args:
            fn: the tool; called with the model's arguments as keywords (plus
                ``idempotency_key=`` when it accepts one and is side-effecting).
            name: the name the model uses (default: the function's name).
            criticality: ``blocking``, ``enhancing`` (default) or ``optional``: the timeout tier.
            timeout: seconds per attempt; default: the criticality's (``tools.timeouts``);
                ``None``: untimed.
            side_effecting: it changes something; idempotency keys apply, and it is retried
                only when ``idempotent`` or when it takes an ``idempotency_key`` (else only 429s).
            idempotent: calling it twice does no more than once (default: not side-effecting).
            high_risk: each call needs a person's approval through ``on_hand_off``.
            fallbacks: tool names and :class:`Default` values tried in order when it fails.
            retry: overrides of ``tools.retry`` for this tool.
            breaker: overrides of ``tools.breaker`` for this tool.
            volatile_fields: result fields that change without meaning progress (ids,
                timestamps), ignored by loop detection.
            result_schema: a JSON schema, or a callable raising on a bad result; a result that
                does not match is a ``schema`` error (drift is caught, not passed on).
            classifiers: error classifiers for this tool, asked before the guard's.

        Returns:
            The registration.
        """
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name:
            raise ValueError("a tool needs a name: pass name=...")
        level = Criticality(criticality)
        seconds = getattr(self.config.timeouts, level.value) if timeout == "default" else timeout
        tool = GuardedTool(
            name=tool_name,
            fn=fn,
            criticality=level,
            timeout=seconds,
            side_effecting=side_effecting,
            idempotent=(not side_effecting) if idempotent is None else idempotent,
            high_risk=high_risk,
            fallbacks=tuple(fallbacks),
            retry=_section(ToolRetryConfig, self.config.retry, retry),
            breaker=_section(ToolBreakerConfig, self.config.breaker, breaker),
            volatile_fields=frozenset(volatile_fields),
            validate_result=None if result_schema is None else schema_validator(result_schema),
            classifiers=tuple(classifiers),
        )
        self._tools[tool_name] = tool
        b = tool.breaker
        self._breakers[tool_name] = CircuitBreaker(
            f"tool:{tool_name}",
            failure_rate=b.failure_rate,
            min_calls=b.min_calls,
            window=b.window_seconds,
            open_for=b.open_seconds,
            half_open_probes=b.half_open_probes,
            close_after=b.close_after,
            clock=self._clock,
            hooks=self._hooks,
            store=self._breaker_store,
        )
        r = tool.retry
        self._policies[tool_name] = RetryPolicy(
            max_attempts=r.max_attempts,
            base=r.base_seconds,
            cap=r.cap_seconds,
            max_retry_after=r.max_retry_after_seconds,
            rng=self._rng,
        )
        if volatile_fields:
            with self._detector_lock:
                self._detector.declare(
                    ToolLoopPolicy(tool_name, volatile_results=frozenset(volatile_fields))
                )
        return tool

    @property
    def tools(self) -> Mapping[str, GuardedTool]:
        """The registered tools by name."""
        return dict(self._tools)

    def breaker(self, name: str) -> CircuitBreaker:
        """The circuit breaker of tool ``name``."""
        return self._breakers[name]

    @property
    def loop_detector(self) -> LoopDetector:
        """The LoopDetector every call goes through."""
        return self._detector

    # -- turns ----------------------------------------------------------------------------------

    @property
    def current_turn(self) -> Turn:
        """The turn calls are counted in now (the innermost :meth:`turn`, else the default)."""
        return self._turn.get() or self._default_turn

    def new_turn(self, *, reasoning: str | None = None, id: str | None = None) -> Turn:
        """Start a new default turn: a fresh retry budget and trace (for loops without ``with``)."""
        self._default_turn = Turn(self.config.retry_budget_per_turn, id=id, reasoning=reasoning)
        return self._default_turn

    @contextlib.contextmanager
    def turn(self, *, reasoning: str | None = None, id: str | None = None) -> Iterator[Turn]:
        """Count the calls inside the block as one agent turn (per thread / async task).

        Args:
            reasoning: the model's reasoning for this turn (shown on hand-off); update it with
                :meth:`note_reasoning`.
            id: the turn's id (default: a random one).
        """
        current = Turn(self.config.retry_budget_per_turn, id=id, reasoning=reasoning)
        token = self._turn.set(current)
        try:
            yield current
        finally:
            self._turn.reset(token)

    def note_reasoning(self, text: str | None) -> None:
        """Record the model's latest reasoning in the current turn (for hand-off payloads)."""
        self.current_turn.reasoning = text

    # -- calls ----------------------------------------------------------------------------------

    def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ToolOutcome:
        """Run tool ``name`` with ``arguments`` (a dict or a JSON object text), guarded.

        Never raises for a tool's failure: the outcome carries the error for the model.
        Cancellation and ``KeyboardInterrupt`` go through.

        Args:
            name: the tool's name, as the model gave it.
            arguments: its arguments.
            idempotency_key: the key of this logical operation (side-effecting tools); default:
                a fingerprint of the session, the tool and the arguments.

        Raises:
            RuntimeError: ``name`` is an async tool and an event loop is running in this
                thread (use ``await acall(...)`` there).
        """
        tool = self._tools.get(name)
        if tool is not None and tool.is_async and _loop_running():
            raise RuntimeError(
                f"tool {name!r} is async and an event loop is running in this thread: "
                f"use `await tools.acall({name!r}, ...)`"
            )
        return _engine.run(self._plan(name, arguments, idempotency_key), self._handlers)

    async def acall(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ToolOutcome:
        """Async twin of :meth:`call` (async tools are awaited; sync ones run on a thread)."""
        return await _engine.arun(self._plan(name, arguments, idempotency_key), self._ahandlers)

    def _invoke(self, action: Invoke) -> Any:
        return invoke(action, self._pool if self.config.sync_timeouts else None)

    async def _ainvoke(self, action: Invoke) -> Any:
        return await ainvoke(action, threads=self.config.sync_timeouts)

    def _asleep_for(self, action: _engine.Sleep) -> Awaitable[None]:
        if self._asleep is not None:
            return self._asleep(action.seconds)
        import anyio  # noqa: PLC0415 - only the async driver needs it

        return anyio.sleep(action.seconds)

    def _consult(self, action: _Consult) -> Any:
        return None if self.on_hand_off is None else self.on_hand_off(action.hand_off)

    def _pool(self) -> concurrent.futures.Executor:
        if self._executor is not None:
            return self._executor
        if self._own_executor is None:
            self._own_executor = DaemonPool("agentguard-tool")
        return self._own_executor

    def close(self) -> None:
        """Stop the worker threads this guard started (abandoned tools finish on their own)."""
        if self._own_executor is not None:
            self._own_executor.shutdown(wait=False, cancel_futures=True)
            self._own_executor = None

    # -- the plan of one call -------------------------------------------------------------------

    def _plan(
        self, name: str, raw: Mapping[str, Any] | str | None, key: str | None
    ) -> Plan[ToolOutcome]:
        turn = self.current_turn
        start = self._clock()
        self._emit(ToolCallStarted(tool=name, turn=turn.id, session=self.session))
        try:
            arguments = decode_arguments(raw)
        except (TypeError, ValueError) as exc:
            error = ToolError("client_error", name, f"The arguments are not a JSON object: {exc}.")
            return self._finish(turn, {}, ToolOutcome(name, False, error=error), start)
        tool = self._tools.get(name)
        if tool is None:
            return self._refuse(turn, name, arguments, start, self._unknown(name))
        if not self.config.enabled:
            return (yield from self._unguarded(turn, tool, arguments, start))
        # JSON text: the detector memoises its fingerprint, so check and record compute it once
        checking = self._detector.config.enabled
        seen = raw if isinstance(raw, str) or not checking else _text(arguments)
        with self._detector_lock:
            verdict = self._detector.check_tool_call(name, seen)
        if verdict.severity is Severity.BREAK:
            return self._refuse(turn, name, arguments, start, ("loop_detected", verdict.message))
        if tool.high_risk:
            approved = None
            if self.on_hand_off is not None:
                approved = yield from self._hand_off("high_risk", tool, arguments, None, turn)
            if not approved:
                why = "no person approved it" if self.on_hand_off else "no approver is configured"
                message = f"`{name}` is a high-risk tool and was not run: {why}."
                return self._refuse(turn, name, arguments, start, ("not_approved", message))
        if tool.side_effecting:
            key = key or self._derive_key(name, arguments)
            claimed = yield from self._claim(tool, arguments, key)
            if isinstance(claimed, ToolOutcome):
                return self._finish(turn, arguments, claimed, start)
        outcome = yield from self._run_chain(
            turn, tool, arguments, key if tool.side_effecting else None, start
        )
        if tool.side_effecting and key is not None:
            yield from self._settle(key, arguments, outcome)
        with self._detector_lock:
            after = self._detector.record_tool_result(
                name,
                seen,
                outcome.value if outcome.ok else (outcome.error.kind if outcome.error else ""),
                error=not outcome.ok,
            )
        # the verdict after the result is the one that knows whether the call made progress
        hint = after.message if after.severity >= Severity.WARNING else ""
        return self._finish(turn, arguments, outcome, start, hint)

    def _unguarded(
        self, turn: Turn, tool: GuardedTool, arguments: dict[str, Any], start: float
    ) -> Plan[ToolOutcome]:
        try:
            value = yield Invoke(tool, arguments, None, None)
        except Exception as exc:
            c = classify(exc, classifiers=tool.classifiers + self._classifiers)
            error = ToolError(c.error_class.value, tool.name, describe(tool, c, 1), c.retryable)
            return self._finish(
                turn, arguments, ToolOutcome(tool.name, False, error=error, attempts=1), start
            )
        return self._finish(turn, arguments, ToolOutcome(tool.name, True, value, attempts=1), start)

    def _run_chain(
        self,
        turn: Turn,
        tool: GuardedTool,
        arguments: dict[str, Any],
        key: str | None,
        start: float,
    ) -> Plan[ToolOutcome]:
        """The tool's attempts, then its fallbacks; a dead letter when all failed."""
        result = yield from self._attempts(turn, tool, arguments, key)
        if result.ok:
            return ToolOutcome(tool.name, True, result.value, attempts=result.attempts)
        error = result.error
        assert error is not None
        attempts = result.attempts
        if error.kind not in _NO_FALLBACK and not turn.exhausted:
            for fallback in tool.fallbacks:
                if isinstance(fallback, Default):
                    self._emit(
                        ToolFallbackUsed(
                            tool=tool.name,
                            fallback="default",
                            error=error.kind,
                            session=self.session,
                        )
                    )
                    return ToolOutcome(
                        tool.name, True, fallback.value, attempts=attempts, fallback="default"
                    )
                other = self._tools.get(fallback)
                if other is None:
                    continue
                sub = yield from self._attempts(turn, other, arguments, None)
                attempts += sub.attempts
                if sub.ok:
                    self._emit(
                        ToolFallbackUsed(
                            tool=tool.name,
                            fallback=fallback,
                            error=error.kind,
                            session=self.session,
                        )
                    )
                    return ToolOutcome(
                        tool.name, True, sub.value, attempts=attempts, fallback=fallback
                    )
        if error.kind == "breaker_open" and tool.criticality is Criticality.BLOCKING:
            yield from self._hand_off("breaker_open", tool, arguments, error, turn)
        if error.kind in _DEAD_LETTER:
            yield from self._dead_letter(turn, tool, arguments, key, result)
        return ToolOutcome(tool.name, False, error=error, attempts=attempts)

    def _attempts(
        self, turn: Turn, tool: GuardedTool, arguments: dict[str, Any], key: str | None
    ) -> Plan[_Result]:
        """Attempts of one tool through its breaker, retried while policy and budget allow."""
        breaker = self._breakers[tool.name]
        policy = self._policies[tool.name]
        result = _Result(False)
        first = self._clock()
        while True:
            decision = yield from self._breaker_allow(breaker)
            if not decision.allowed:
                result.error = self._breaker_error(tool, decision, result)
                self._emit(
                    ToolCallRefused(
                        tool=tool.name,
                        reason="breaker_open",
                        message=result.error.message,
                        session=self.session,
                    )
                )
                return result
            result.attempts += 1
            try:
                value = yield Invoke(tool, arguments, key, tool.timeout)
                if tool.validate_result is not None:
                    value = checked(tool, value)
            except Exception as exc:
                c = classify_failure(tool, exc, self._classifiers)
                result.errors.append(c)
                yield from self._breaker_record(breaker, c)
                retry = policy.decide(result.attempts - 1, c, elapsed=self._clock() - first)
                if (
                    retry.retry
                    and not tool.retries_safely
                    and c.error_class is not ErrorClass.RATE_LIMITED
                ):
                    retry = RetryDecision(
                        False, 0.0, "side-effecting tool: not retried", retry.retry_after
                    )
                if retry.retry:
                    if turn.budget.try_acquire():
                        self._emit(
                            ToolCallRetried(
                                tool=tool.name,
                                attempt=result.attempts,
                                error=c.error_class.value,
                                delay=retry.delay,
                                retry_after=retry.retry_after,
                                session=self.session,
                            )
                        )
                        yield _engine.Sleep(retry.delay)
                        continue
                    yield from self._budget_exhausted(turn, tool, arguments, c)
                state = breaker.state.value if breaker.store is None else "closed"
                result.error = ToolError(
                    c.error_class.value,
                    tool.name,
                    describe(
                        tool,
                        c,
                        result.attempts,
                        retry,
                        exhausted=turn.exhausted,
                        alternatives=tool.fallback_names(),
                    ),
                    retryable=c.retryable,
                    retry_after=retry.retry_after
                    if retry.retry_after is not None
                    else c.retry_after,
                    status_code=c.status_code,
                    breaker=state,
                    alternatives=tool.fallback_names(),
                    budget_exhausted=turn.exhausted,
                )
                return result
            except BaseException:  # cancellation: never swallowed, never counted
                if decision.probe and breaker.store is None:
                    breaker.record_failure(Classification.of(ErrorClass.CANCELLED))
                raise
            yield from self._breaker_record(breaker, None)
            result.ok, result.value = True, value
            return result

    # -- breakers, through the store when they live there ----------------------------------------

    def _breaker_allow(self, breaker: CircuitBreaker) -> Plan[BreakerDecision]:
        if breaker.store is None:
            return breaker.allow()
        try:
            decision = yield from perform(breaker.allow, breaker.aallow)
        except StoreError as exc:
            self._store_failed(exc)
            return BreakerDecision(True, BreakerState.CLOSED)
        return decision

    def _breaker_record(
        self, breaker: CircuitBreaker, failure: Classification | None
    ) -> Plan[None]:
        if breaker.store is None:
            if failure is None:
                breaker.record_success()
            else:
                breaker.record_failure(failure)
            return
        try:
            if failure is None:
                yield from perform(breaker.record_success, breaker.arecord_success)
            else:
                yield from perform(breaker.record_failure, breaker.arecord_failure, failure)
        except StoreError as exc:
            self._store_failed(exc)

    def _breaker_error(
        self, tool: GuardedTool, decision: BreakerDecision, result: _Result
    ) -> ToolError:
        now = self._clock()
        wait = None if decision.retry_at is None else max(0.0, decision.retry_at - now)
        when = "shortly" if wait is None else f"in {wait:.0f}s"
        alternatives = tool.fallback_names()
        also = f" Alternatives: {', '.join(alternatives)}." if alternatives else ""
        message = (
            f"`{tool.name}` is unavailable: its circuit breaker is {decision.state.value} after "
            f"repeated failures, so it was not called. It will be tried again {when}; do not "
            f"call it before then.{also}"
        )
        return ToolError(
            "breaker_open",
            tool.name,
            message,
            retryable=True,
            retry_after=wait,
            breaker=decision.state.value,
            retry_at=decision.retry_at,
            alternatives=alternatives,
        )

    # -- idempotency ------------------------------------------------------------------------------

    def _derive_key(self, name: str, arguments: Mapping[str, Any]) -> str:
        return fingerprint_bytes(canonical_json([self.session, name, arguments]))

    def _claim(
        self, tool: GuardedTool, arguments: Mapping[str, Any], key: str
    ) -> Plan[ToolOutcome | None]:
        """Claim ``key`` for this call; an outcome when the call must not run."""
        digest = fingerprint_bytes(canonical_json(arguments))
        mine = json.dumps({"fp": digest, "state": "running"})
        try:
            store = self._store
            held = yield from perform(
                store.claim,
                store.aclaim,
                self._idem_ns,
                key,
                mine,
                self._clock(),
                self.config.idempotency_lease_seconds,
            )
        except StoreError as exc:
            self._store_failed(exc)
            return None
        if held is None:
            return None
        record = json.loads(held)
        if record["fp"] != digest:
            message = (
                f"The idempotency key of this `{tool.name}` call was already used with different "
                "arguments; use a new key for a new operation."
            )
            reason = "idempotency_conflict"
        elif record["state"] == "running":
            message = (
                f"An identical `{tool.name}` call is still running; it was not started again. "
                "Wait for its result instead of repeating it."
            )
            reason = "duplicate_in_flight"
        else:
            self._emit(ToolCallReplayed(tool=tool.name, key=key, session=self.session))
            return ToolOutcome.from_dict(record["outcome"], replayed=True)
        self._emit(
            ToolCallRefused(tool=tool.name, reason=reason, message=message, session=self.session)
        )
        error = ToolError(reason, tool.name, message, retryable=reason == "duplicate_in_flight")
        return ToolOutcome(tool.name, False, error=error)

    def _settle(self, key: str, arguments: Mapping[str, Any], outcome: ToolOutcome) -> Plan[None]:
        """Keep a success for replay; free the key of a failure so a later call can try again."""
        store, now = self._store, self._clock()
        try:
            if outcome.ok:
                digest = fingerprint_bytes(canonical_json(arguments))
                done = json.dumps(
                    {"fp": digest, "state": "done", "outcome": outcome.to_dict()}, default=str
                )
                ttl = self.config.idempotency_ttl_seconds
                yield from perform(store.put, store.aput, self._idem_ns, key, done, now, ttl)
            else:
                yield from perform(store.delete, store.adelete, self._idem_ns, key, now)
        except StoreError as exc:
            self._store_failed(exc)

    @property
    def _idem_ns(self) -> str:
        return f"idempotency:{self.scope}"

    @property
    def _dead_ns(self) -> str:
        return f"dead_letters:{self.scope}"

    # -- dead letters -----------------------------------------------------------------------------

    def _dead_letter(
        self,
        turn: Turn,
        tool: GuardedTool,
        arguments: Mapping[str, Any],
        key: str | None,
        result: _Result,
    ) -> Plan[None]:
        assert result.error is not None
        letter = DeadLetter(
            id=uuid.uuid4().hex[:16],
            tool=tool.name,
            arguments=arguments,
            errors=dead_letter_errors(result.errors)
            or (
                {
                    "error_class": result.error.kind,
                    "reason": result.error.message,
                    "status_code": None,
                },
            ),
            attempts=result.attempts,
            at=self._clock(),
            idempotency_key=key,
            turn=turn.id,
            session=self.session,
        )
        try:
            store = self._store
            yield from perform(
                store.put,
                store.aput,
                self._dead_ns,
                letter.id,
                letter.to_json(),
                letter.at,
                self.config.dead_letter_ttl_seconds,
            )
        except StoreError as exc:
            self._store_failed(exc)
            return
        self._emit(
            ToolDeadLettered(
                tool=tool.name,
                letter=letter.id,
                error=result.error.kind,
                attempts=result.attempts,
                session=self.session,
            )
        )

    def dead_letters(self) -> list[DeadLetter]:
        """The calls that failed for good (and are not expired or replayed), oldest first."""
        items = self._store.items(self._dead_ns, self._clock())
        return sorted((DeadLetter.from_json(v) for _, v in items), key=lambda d: (d.at, d.id))

    def discard_dead_letter(self, letter_id: str) -> bool:
        """Drop a dead letter; ``False`` when there was none with that id."""
        return self._store.delete(self._dead_ns, letter_id, self._clock())

    def replay(self, letter: DeadLetter | str) -> ToolOutcome:
        """Run a dead-lettered call again, by hand (same arguments, same idempotency key).

        A success removes the letter; a failure leaves it and records a new one.
        """
        found = self._letter(letter)
        outcome = self.call(found.tool, found.arguments, idempotency_key=found.idempotency_key)
        if outcome.ok:
            self.discard_dead_letter(found.id)
        return outcome

    async def areplay(self, letter: DeadLetter | str) -> ToolOutcome:
        """Async twin of :meth:`replay`."""
        found = self._letter(letter)
        outcome = await self.acall(
            found.tool, found.arguments, idempotency_key=found.idempotency_key
        )
        if outcome.ok:
            self.discard_dead_letter(found.id)
        return outcome

    def _letter(self, letter: DeadLetter | str) -> DeadLetter:
        if isinstance(letter, DeadLetter):
            return letter
        text = self._store.get(self._dead_ns, letter, self._clock())
        if text is None:
            raise KeyError(f"no dead letter {letter!r}")
        return DeadLetter.from_json(text)

    # -- budget, hand-off, refusals, events --------------------------------------------------------

    def _budget_exhausted(
        self, turn: Turn, tool: GuardedTool, arguments: Mapping[str, Any], c: Classification
    ) -> Plan[None]:
        if turn.exhausted:
            return
        turn.exhausted = True
        self._emit(
            RetryBudgetExhausted(
                turn=turn.id, total=turn.budget.total, tool=tool.name, session=self.session
            )
        )
        error = ToolError(
            c.error_class.value,
            tool.name,
            describe(tool, c, 0, exhausted=True),
            c.retryable,
            budget_exhausted=True,
        )
        yield from self._hand_off("retry_budget_exhausted", tool, arguments, error, turn)

    def _hand_off(
        self,
        reason: str,
        tool: GuardedTool,
        arguments: Mapping[str, Any],
        error: ToolError | None,
        turn: Turn,
    ) -> Plan[Any]:
        self._emit(
            HandOffRequested(reason=reason, tool=tool.name, turn=turn.id, session=self.session)
        )
        if self.on_hand_off is None:
            return None
        payload = HandOff(
            reason,
            tool.name,
            arguments,
            error,
            tuple(turn.trace),
            turn.reasoning,
            turn.id,
            self.session,
        )
        return (yield _Consult(payload))

    def _unknown(self, name: str) -> tuple[str, str]:
        close = difflib.get_close_matches(name, list(self._tools), n=3, cutoff=0.5)
        known = close or sorted(self._tools)[:10]
        label = "Closest tools" if close else "Available tools"
        return "unknown_tool", f"There is no tool `{name}`. {label}: {', '.join(known) or 'none'}."

    def _refuse(
        self,
        turn: Turn,
        name: str,
        arguments: Mapping[str, Any],
        start: float,
        why: tuple[str, str],
    ) -> ToolOutcome:
        """Answer without running the tool; ``why`` is the reason and the message."""
        reason, message = why
        self._emit(ToolCallRefused(tool=name, reason=reason, message=message, session=self.session))
        tool = self._tools.get(name)
        alternatives = tool.fallback_names() if tool is not None else ()
        error = ToolError(reason, name, message, alternatives=alternatives)
        return self._finish(turn, arguments, ToolOutcome(name, False, error=error), start)

    def _finish(
        self,
        turn: Turn,
        arguments: Mapping[str, Any],
        done: ToolOutcome,
        start: float,
        hint: str = "",
    ) -> ToolOutcome:
        elapsed = self._clock() - start
        outcome = ToolOutcome(
            done.tool,
            done.ok,
            done.value,
            done.error,
            done.attempts,
            elapsed,
            done.fallback,
            done.replayed,
            hint,
        )
        error = outcome.error
        turn.trace.append(
            TraceEntry(
                outcome.tool,
                arguments,
                outcome.ok,
                None if error is None else error.kind,
                outcome.attempts,
                elapsed,
                outcome.fallback,
            )
        )
        if error is None:
            self._emit(
                ToolCallSucceeded(
                    tool=outcome.tool,
                    attempts=outcome.attempts,
                    elapsed=elapsed,
                    fallback=outcome.fallback,
                    session=self.session,
                )
            )
        else:
            self._emit(
                ToolCallFailed(
                    tool=outcome.tool,
                    error=error.kind,
                    retryable=error.retryable,
                    attempts=outcome.attempts,
                    elapsed=elapsed,
                    session=self.session,
                )
            )
        return outcome

    def _store_failed(self, exc: StoreError) -> None:
        """A store fault other than an outage (the store wrapper handles those): fail open."""
        if not self._fail_open or isinstance(exc, StoreUnavailable):
            raise exc
        self._emit(
            StoreFallback(
                store=self.store.name,
                error_type=type(exc).__name__,
                message=str(exc)[:200],
                session=self.session,
            )
        )

    def _emit(self, event: Event) -> None:
        self._emitter.emit(event)

    def __repr__(self) -> str:
        return f"ToolGuard(tools={sorted(self._tools)!r}, store={self.store.name})"


def _text(arguments: Mapping[str, Any]) -> str:
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON data: the detector copes with the dict itself
        return json.dumps(arguments, ensure_ascii=False, default=repr)


def _section(model: type[T], base: Any, override: Any) -> T:
    if override is None:
        return base  # type: ignore[no-any-return]
    if isinstance(override, model):
        return override
    return model.model_validate({**base.model_dump(), **dict(override)})  # type: ignore[attr-defined,no-any-return]


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
