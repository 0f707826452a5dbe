"""CircuitBreaker: stop calling what keeps failing, and probe it carefully before trusting it.

Closed → open when the *failure rate* over a rolling time window passes a threshold, once the
window holds a minimum number of calls (so two failures out of two at start-up do not trip it).
Open → half-open after ``open_for`` seconds. Half-open admits a limited number of concurrent
probe calls; enough successes close it, one failure opens it again. Client errors and
cancellations count as neither success nor failure: a bad request says nothing about the
health of what it was sent to.

The breaker is a state machine on an injected clock (the one in ``storage/_breaker.py``). It
keeps its state in memory, or, given a ``store=``, in a :class:`~agentguard.storage.Store`, so
that every worker sharing the store shares the breaker (ToolGuard's breakers behind a
``RedisStore`` serve a whole fleet). Both run the same transitions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentguard import _clock
from agentguard.events import BreakerStateChanged, Emitter, Hook
from agentguard.storage._breaker import (
    BreakerOutcome,
    BreakerRecord,
    BreakerSpec,
    BreakerView,
    breaker_allow,
    breaker_count,
    breaker_view,
)

from ._classify import Classification, ErrorClass

if TYPE_CHECKING:
    from agentguard.storage import Store

__all__ = ["BreakerDecision", "BreakerSnapshot", "BreakerState", "CircuitBreaker"]

_IGNORED = {ErrorClass.CLIENT_ERROR, ErrorClass.CANCELLED}


class BreakerState(str, enum.Enum):
    """The three states of a circuit breaker."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerDecision:
    """Whether a call may go ahead.

    Attributes:
        allowed: go ahead, or answer at once without calling.
        state: the breaker's state.
        probe: the call is a half-open probe: report how it ends (``record_ignored`` when it
            ends with no outcome, abandoned or cancelled), or its slot stays taken.
        retry_at: when an open breaker will let a probe through (clock seconds).
    """

    allowed: bool
    state: BreakerState
    probe: bool = False
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """The breaker's state and window, for reports and errors."""

    name: str
    state: BreakerState
    calls: int
    failures: int
    failure_rate: float
    retry_at: float | None


class CircuitBreaker:
    """A failure-rate circuit breaker.

    Args:
        name: what it protects (in events and errors; the key of its state in a store).
        failure_rate: share of failed calls in the window that opens it (default 0.5).
        min_calls: calls the window must hold before the rate counts (default 5).
        window: seconds of history the rate is computed over (default 60).
        buckets: the window's granularity; memory is O(buckets).
        open_for: seconds an open breaker waits before probing (default 30).
        half_open_probes: concurrent probe calls allowed when half-open (default 1).
        close_after: successful probes that close it again (default 1).
        probe_lease: seconds after which a probe that never reported stops counting (default:
            never in memory; ``open_for`` with a store, where a worker may die mid-probe).
        clock: seconds (injected in tests); monotonic by default, wall-clock with a store
            (workers on several hosts must agree on it).
        hooks: event hooks.
        store: keep the state in this store (shared by every breaker of the same name on it)
            instead of in this object.
    """

    def __init__(
        self,
        name: str = "breaker",
        *,
        failure_rate: float = 0.5,
        min_calls: int = 5,
        window: float = 60.0,
        buckets: int = 12,
        open_for: float = 30.0,
        half_open_probes: int = 1,
        close_after: int = 1,
        probe_lease: float | None = None,
        clock: Callable[[], float] | None = None,
        hooks: Iterable[Hook] | None = None,
        store: Store | None = None,
    ) -> None:
        if probe_lease is None and store is not None:
            probe_lease = open_for
        self.spec = BreakerSpec(
            name,
            failure_rate,
            min_calls,
            window,
            buckets,
            open_for,
            half_open_probes,
            close_after,
            probe_lease,
        )
        self.store = store
        self._clock = clock or (_clock.monotonic if store is None else _clock.wall)
        self._emitter = Emitter(hooks)
        self._record = BreakerRecord()

    @property
    def name(self) -> str:
        """What the breaker protects."""
        return self.spec.name

    # -- one step, locally or in the store --------------------------------------------------

    def _step(self, op: str) -> BreakerView:
        now = self._clock()
        store, spec = self.store, self.spec
        if store is None:
            if op == "allow":
                view = breaker_allow(spec, self._record, now)
            elif op == "view":
                view = breaker_view(spec, self._record, now)
            else:
                changes = breaker_count(spec, self._record, _outcome(op), now)
                if not changes:  # the common case: nothing to report, no view to build
                    return _UNCHANGED
                view = breaker_view(spec, self._record, now)
                view = BreakerView(
                    view.state,
                    False,
                    False,
                    view.retry_at,
                    view.calls,
                    view.failures,
                    tuple(changes),
                )
        elif op == "allow":
            view = store.breaker_allow(spec, now)
        elif op == "view":
            view = store.breaker_view(spec, now)
        else:
            view = store.breaker_record(spec, _outcome(op), now)
        return self._report(view)

    async def _astep(self, op: str) -> BreakerView:
        store = self.store
        if store is None:
            return self._step(op)
        now = self._clock()
        if op == "allow":
            view = await store.abreaker_allow(self.spec, now)
        elif op == "view":
            view = await store.abreaker_view(self.spec, now)
        else:
            view = await store.abreaker_record(self.spec, _outcome(op), now)
        return self._report(view)

    def _report(self, view: BreakerView) -> BreakerView:
        for previous, state in view.changes:
            self._emitter.emit(
                BreakerStateChanged(
                    name=self.spec.name,
                    previous=previous,
                    state=state,
                    failure_rate=view.failure_rate,
                    retry_at=view.retry_at if state == "open" else None,
                )
            )
        return view

    # -- the public operations --------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state (an open breaker whose wait is over reads as half-open)."""
        if self.store is None and self._record.state == "closed":  # nothing to work out
            return BreakerState.CLOSED
        return BreakerState(self._step("view").state)

    def allow(self) -> BreakerDecision:
        """May a call go ahead now? A half-open breaker hands out a limited number of probes."""
        record = self._record
        if self.store is None and record.state == "closed":  # the happy path: nothing to decide
            return _ALLOWED
        return _decision(self._step("allow"))

    async def aallow(self) -> BreakerDecision:
        """Async twin of :meth:`allow` (only a store-backed breaker does I/O)."""
        if self.store is None:
            return self.allow()
        return _decision(await self._astep("allow"))

    def record_success(self) -> None:
        """Report a call that succeeded."""
        self._step("success")

    def record_failure(self, classification: Classification | None = None) -> None:
        """Report a call that failed; client errors and cancellations are ignored."""
        self._step(_failure(classification))

    def record_ignored(self) -> None:
        """Report a call whose end says nothing of the health of what it was sent to (abandoned
        by its caller, cancelled, answered "wait" by a rate limit): it counts as neither
        success nor failure, and a half-open probe's slot is free again."""
        self._step("ignored")

    async def arecord_success(self) -> None:
        """Async twin of :meth:`record_success`."""
        await self._astep("success")

    async def arecord_failure(self, classification: Classification | None = None) -> None:
        """Async twin of :meth:`record_failure`."""
        await self._astep(_failure(classification))

    async def arecord_ignored(self) -> None:
        """Async twin of :meth:`record_ignored`."""
        await self._astep("ignored")

    def snapshot(self) -> BreakerSnapshot:
        """The state and the window's counts."""
        return _snapshot(self.spec.name, self._step("view"))

    async def asnapshot(self) -> BreakerSnapshot:
        """Async twin of :meth:`snapshot`."""
        return _snapshot(self.spec.name, await self._astep("view"))

    def __repr__(self) -> str:
        where = "" if self.store is None else f", store={self.store.name}"
        return f"CircuitBreaker({self.spec.name!r}, state={self._record.state}{where})"


_ALLOWED = BreakerDecision(True, BreakerState.CLOSED)
_UNCHANGED = BreakerView("closed", False, False, None, 0, 0)


def _outcome(op: str) -> BreakerOutcome:
    if op == "success":
        return "success"
    return "failure" if op == "failure" else "ignored"


def _failure(classification: Classification | None) -> str:
    ignored = classification is not None and classification.error_class in _IGNORED
    return "ignored" if ignored else "failure"


def _decision(view: BreakerView) -> BreakerDecision:
    return BreakerDecision(view.allowed, BreakerState(view.state), view.probe, view.retry_at)


def _snapshot(name: str, view: BreakerView) -> BreakerSnapshot:
    state = BreakerState(view.state)
    return BreakerSnapshot(name, state, view.calls, view.failures, view.failure_rate, view.retry_at)
