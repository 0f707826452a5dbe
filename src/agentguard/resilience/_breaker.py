"""CircuitBreaker: stop calling what keeps failing, and probe it carefully before trusting it.

Closed → open when the *failure rate* over a rolling time window passes a threshold, once the
window holds a minimum number of calls (so two failures out of two at start-up do not trip it).
Open → half-open after ``open_for`` seconds. Half-open admits a limited number of concurrent
probe calls; enough successes close it, one failure opens it again. Client errors and
cancellations count as neither success nor failure: a bad request says nothing about the
health of what it was sent to.

The breaker is a pure state machine on an injected clock. It keeps its state in memory; a
breaker shared by a fleet (ToolGuard's, through a ``Store``) keeps the same transitions.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agentguard import _clock
from agentguard.events import BreakerStateChanged, Emitter, Hook

from ._classify import Classification, ErrorClass

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
        probe: the call is a half-open probe (report its outcome!).
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
        name: what it protects (in events and errors).
        failure_rate: share of failed calls in the window that opens it (default 0.5).
        min_calls: calls the window must hold before the rate counts (default 5).
        window: seconds of history the rate is computed over (default 60).
        buckets: the window's granularity; memory is O(buckets).
        open_for: seconds an open breaker waits before probing (default 30).
        half_open_probes: concurrent probe calls allowed when half-open (default 1).
        close_after: successful probes that close it again (default 1).
        clock: monotonic seconds (injected in tests).
        hooks: event hooks.
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
        clock: Callable[[], float] | None = None,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        if not 0.0 < failure_rate <= 1.0:
            raise ValueError(f"failure_rate must be in (0, 1] (got {failure_rate})")
        if min_calls < 1 or buckets < 1 or half_open_probes < 1 or close_after < 1:
            raise ValueError("min_calls, buckets, half_open_probes and close_after must be >= 1")
        if window <= 0 or open_for < 0:
            raise ValueError("window must be positive and open_for not negative")
        self.name = name
        self.failure_rate = failure_rate
        self.min_calls = min_calls
        self.open_for = open_for
        self.half_open_probes = half_open_probes
        self.close_after = close_after
        self._width = window / buckets
        self._buckets = buckets
        self._clock = clock or _clock.monotonic
        self._emitter = Emitter(hooks)
        # (bucket index, successes, failures), oldest first
        self._window: collections.deque[list[int]] = collections.deque()
        self._calls = 0  # running totals of the window, so a decision is O(1)
        self._failures = 0
        self._state = BreakerState.CLOSED
        self._retry_at: float | None = None
        self._in_flight = 0
        self._probe_successes = 0

    # -- window ---------------------------------------------------------------------------------

    def _bucket(self, now: float) -> list[int]:
        index = int(now // self._width)
        self._prune(index)
        if not self._window or self._window[-1][0] != index:
            self._window.append([index, 0, 0])
        return self._window[-1]

    def _prune(self, index: int) -> None:
        while self._window and self._window[0][0] <= index - self._buckets:
            _, ok, bad = self._window.popleft()
            self._calls -= ok + bad
            self._failures -= bad

    def _count(self, ok: int, bad: int) -> None:
        bucket = self._bucket(self._clock())
        bucket[1] += ok
        bucket[2] += bad
        self._calls += ok + bad
        self._failures += bad

    def _counts(self) -> tuple[int, int]:
        self._prune(int(self._clock() // self._width))
        return self._calls, self._failures

    # -- state ----------------------------------------------------------------------------------

    def _move(self, state: BreakerState) -> None:
        previous, self._state = self._state, state
        if state == BreakerState.OPEN:
            self._retry_at = self._clock() + self.open_for
        elif state == BreakerState.CLOSED:
            self._retry_at = None
            self._window.clear()
            self._calls = self._failures = 0
        self._in_flight = 0
        self._probe_successes = 0
        calls, failures = self._counts()
        self._emitter.emit(
            BreakerStateChanged(
                name=self.name,
                previous=previous.value,
                state=state.value,
                failure_rate=failures / calls if calls else 0.0,
                retry_at=self._retry_at,
            )
        )

    @property
    def state(self) -> BreakerState:
        """The current state (an open breaker whose wait is over reads as half-open)."""
        if (
            self._state == BreakerState.OPEN
            and self._retry_at is not None
            and self._clock() >= self._retry_at
        ):
            self._move(BreakerState.HALF_OPEN)
        return self._state

    def allow(self) -> BreakerDecision:
        """May a call go ahead now? A half-open breaker hands out a limited number of probes."""
        state = self.state
        if state == BreakerState.CLOSED:
            return BreakerDecision(True, state)
        if state == BreakerState.OPEN:
            return BreakerDecision(False, state, retry_at=self._retry_at)
        if self._in_flight < self.half_open_probes:
            self._in_flight += 1
            return BreakerDecision(True, state, probe=True)
        return BreakerDecision(False, state, retry_at=self._retry_at)

    def record_success(self) -> None:
        """Report a call that succeeded."""
        state = self.state
        if state == BreakerState.HALF_OPEN:
            self._in_flight = max(0, self._in_flight - 1)
            self._probe_successes += 1
            if self._probe_successes >= self.close_after:
                self._move(BreakerState.CLOSED)
            return
        if state == BreakerState.OPEN:
            return
        self._count(1, 0)
        self._trip_if_over()

    def record_failure(self, classification: Classification | None = None) -> None:
        """Report a call that failed; client errors and cancellations are ignored."""
        state = self.state
        ignored = classification is not None and classification.error_class in _IGNORED
        if state == BreakerState.HALF_OPEN:
            self._in_flight = max(0, self._in_flight - 1)
            if not ignored:
                self._move(BreakerState.OPEN)
            return
        if ignored or state == BreakerState.OPEN:
            return
        self._count(0, 1)
        self._trip_if_over()

    def _trip_if_over(self) -> None:
        # judged after every counted call, so the window never rests closed above the rate
        calls, failures = self._calls, self._failures
        if failures and calls >= self.min_calls and failures >= self.failure_rate * calls:
            self._move(BreakerState.OPEN)

    def snapshot(self) -> BreakerSnapshot:
        """The state and the window's counts."""
        state = self.state
        calls, failures = self._counts()
        rate = failures / calls if calls else 0.0
        return BreakerSnapshot(self.name, state, calls, failures, rate, self._retry_at)

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self._state.value})"
