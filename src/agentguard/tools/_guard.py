"""ToolGuard: resilient tool execution for custom agent loops — the registration facade.

This module registers tools and runs calls: :meth:`ToolGuard.call` and :meth:`ToolGuard.acall`
carry out the plan of one call (``_plan.py``) with the sync and the async driver of
``agentguard._engine``. The plan's parts live beside it: turns and hand-off (``_turns.py``), the
breaker steps (``_breakers.py``), idempotency keys (``_idempotency.py``), dead letters
(``_letters.py``), running one attempt under its timeout (``_run.py``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import random
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from agentguard import _clock, _engine
from agentguard._redact import redact
from agentguard.config import GuardConfig, ToolBreakerConfig, ToolRetryConfig, ToolsConfig
from agentguard.events import Emitter, Event, Hook, StoreFallback
from agentguard.exceptions import StoreError, StoreUnavailable
from agentguard.loops import LoopDetector, ToolLoopPolicy
from agentguard.resilience import CircuitBreaker, Classifier, RetryPolicy
from agentguard.storage import Store, store_from_config, with_fallback
from agentguard.telemetry._gate import atool_attempt, observe_tool, tool_attempt

from . import _letters as letters
from ._model import (
    Criticality,
    DeadLetter,
    Default,
    GuardedTool,
    HandOff,
    ToolOutcome,
    schema_validator,
)
from ._plan import plan
from ._run import Invoke, Workers, ainvoke, invoke
from ._turns import Consult, Turn

__all__ = ["ToolGuard", "Turn"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: Runs whose tool loop state a ToolGuard keeps by default (the least recently used forgotten).
MAX_RUNS = 4_096


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
        loop_detector: the LoopDetector of calls made without a ``run`` (share yours to also
            check text); default: one built from ``config.loop_detection``. Each run named in
            :meth:`call` gets a LoopDetector of its own, with this one's configuration.
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
        max_runs: runs whose loop state is kept at once (the least recently used is forgotten:
            a run that comes back after that starts afresh).
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
        max_runs: int = MAX_RUNS,
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
        # A loop is one run repeating itself: an agent reused for many runs (the adapters' one
        # ToolGuard) keeps each run's calls apart, or separate runs making the same call add up.
        self._runs: collections.OrderedDict[str, LoopDetector] = collections.OrderedDict()
        self._max_runs = max_runs
        self._loop_policies: dict[str, ToolLoopPolicy] = {}  # declared so far, for every run
        self.on_hand_off = on_hand_off
        self._classifiers = tuple(classifiers)
        self._clock = clock or _clock.wall
        self._sleep = sleep or _clock.sleep
        self._asleep = asleep
        self._rng = rng or random.Random()
        self._workers = Workers(executor)
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
            Consult: self._consult,
        }
        self._ahandlers: dict[type, _engine.Handler] = {
            Invoke: self._ainvoke,
            _engine.Sleep: self._asleep_for,
            _engine.Call: _engine.acall,
            Consult: self._consult,
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
            max_attempts=r.max_attempts if r.stop is None else None,  # a stop strategy replaces it
            base=r.base_seconds,
            cap=r.cap_seconds,
            max_retry_after=r.max_retry_after_seconds,
            rng=self._rng,
            wait=r.wait,
            stop=r.stop,
        )
        if volatile_fields:
            policy = ToolLoopPolicy(tool_name, volatile_results=frozenset(volatile_fields))
            with self._detector_lock:
                self._loop_policies[tool_name] = policy
                for detector in (self._detector, *self._runs.values()):
                    detector.declare(policy)
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
        """The LoopDetector of calls made without a ``run`` (each run has its own)."""
        return self._detector

    def _loop_detector(self, run: str | None) -> LoopDetector:
        """The LoopDetector of ``run`` (made on first use); call it holding ``_detector_lock``."""
        if run is None:
            return self._detector
        detector = self._runs.get(run)
        if detector is not None:
            self._runs.move_to_end(run)
            return detector
        detector = LoopDetector(self._detector.config, hooks=self._hooks, session=run)
        for policy in self._loop_policies.values():
            detector.declare(policy)
        self._runs[run] = detector
        if len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)
        return detector

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
        run: str | None = None,
    ) -> ToolOutcome:
        """Run tool ``name`` with ``arguments`` (a dict or a JSON object text), guarded.

        Never raises for a tool's failure: the outcome carries the error for the model.
        Cancellation and ``KeyboardInterrupt`` go through.

        Args:
            name: the tool's name, as the model gave it.
            arguments: its arguments.
            idempotency_key: the key of this logical operation (side-effecting tools); default:
                a fingerprint of the session, the tool and the arguments.
            run: the agent run making the call (the guard report's ``session`` of the answer
                that asked for it): loop detection judges the calls of one run together, and
                the calls of other runs not at all. ``None``: the calls made without a run, as
                one run (:attr:`loop_detector`).

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
        with observe_tool(name) as obs:  # the call's span, when telemetry records
            outcome: ToolOutcome = _engine.run(
                plan(self, name, arguments, idempotency_key, run), self._handlers
            )
            obs.outcome(outcome)
        return outcome

    async def acall(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        idempotency_key: str | None = None,
        run: str | None = None,
    ) -> ToolOutcome:
        """Async twin of :meth:`call` (async tools are awaited; sync ones run on a thread)."""
        with observe_tool(name) as obs:
            outcome: ToolOutcome = await _engine.arun(
                plan(self, name, arguments, idempotency_key, run), self._ahandlers
            )
            obs.outcome(outcome)
        return outcome

    def _invoke(self, action: Invoke) -> Any:
        # one attempt: an ``execute_tool`` span when telemetry records
        return tool_attempt(invoke, action, self._workers if self.config.sync_timeouts else None)

    async def _ainvoke(self, action: Invoke) -> Any:
        return await atool_attempt(ainvoke, action, threads=self.config.sync_timeouts)

    def _asleep_for(self, action: _engine.Sleep) -> Awaitable[None]:
        if self._asleep is not None:
            return self._asleep(action.seconds)
        import anyio  # noqa: PLC0415 - only the async driver needs it

        return anyio.sleep(action.seconds)

    def _consult(self, action: Consult) -> Any:
        return None if self.on_hand_off is None else self.on_hand_off(action.hand_off)

    def close(self) -> None:
        """Stop the worker threads this guard started (abandoned tools finish on their own)."""
        self._workers.close()

    # -- dead letters -----------------------------------------------------------------------------

    def dead_letters(self) -> list[DeadLetter]:
        """The calls that failed for good (and are not expired or replayed), oldest first."""
        items = self._store.items(letters.namespace(self), self._clock())
        return sorted((DeadLetter.from_json(v) for _, v in items), key=lambda d: (d.at, d.id))

    def discard_dead_letter(self, letter_id: str) -> bool:
        """Drop a dead letter; ``False`` when there was none with that id."""
        return self._store.delete(letters.namespace(self), letter_id, self._clock())

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
        text = self._store.get(letters.namespace(self), letter, self._clock())
        if text is None:
            raise KeyError(f"no dead letter {letter!r}")
        return DeadLetter.from_json(text)

    # -- shared by the plan's parts --------------------------------------------------------------

    def _store_failed(self, exc: StoreError) -> None:
        """A store fault other than an outage (the store wrapper handles those): fail open."""
        if not self._fail_open or isinstance(exc, StoreUnavailable):
            raise exc
        self._emit(
            StoreFallback(
                store=self.store.name,
                error_type=type(exc).__name__,
                message=redact(str(exc))[:200],  # redacted whole, then cut
                session=self.session,
            )
        )

    def _emit(self, event: Event) -> None:
        self._emitter.emit(event)

    def __repr__(self) -> str:
        return f"ToolGuard(tools={sorted(self._tools)!r}, store={self.store.name})"


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
