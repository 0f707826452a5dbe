"""The circuit breaker's state machine, as data every store can keep.

One breaker's state is a :class:`BreakerRecord`; its settings a :class:`BreakerSpec`. The three
operations (:func:`breaker_allow`, :func:`breaker_record`, :func:`breaker_view`) change a record
in place and say what changed. The in-process :class:`~agentguard.resilience.CircuitBreaker`,
:class:`~agentguard.storage.MemoryStore` and :class:`~agentguard.storage.SQLiteStore` run exactly
this code (the SQLite store under ``BEGIN IMMEDIATE``); the Redis store's Lua script mirrors it
and the shared contract tests (a hypothesis state machine among them) hold all of them to it.

Transitions: closed → open when the failure *rate* over a rolling window of ``buckets`` time
buckets reaches ``failure_rate`` with at least ``min_calls`` calls counted; open → half-open once
``retry_at`` has passed; half-open admits ``half_open_probes`` concurrent probes, ``close_after``
probe successes close it, one counted failure re-opens it. Ignored outcomes (client errors,
cancellations) count as neither success nor failure. A probe that never reports back (its worker
died) stops counting after ``probe_lease`` seconds, so a fleet cannot wedge a breaker half-open.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BreakerOutcome",
    "BreakerRecord",
    "BreakerSpec",
    "BreakerView",
    "breaker_allow",
    "breaker_count",
    "breaker_record",
    "breaker_view",
]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

#: What a call's end means to a breaker.
BreakerOutcome = Literal["success", "failure", "ignored"]


@dataclass(frozen=True, slots=True)
class BreakerSpec:
    """The settings of one breaker (see :class:`~agentguard.resilience.CircuitBreaker`).

    Attributes:
        name: what it protects; stores keep each name's state apart.
        failure_rate: share of failed calls in the window that opens it.
        min_calls: calls the window must hold before the rate counts.
        window: seconds of history the rate is computed over.
        buckets: the window's granularity.
        open_for: seconds an open breaker waits before probing.
        half_open_probes: concurrent probe calls allowed when half-open.
        close_after: successful probes that close it again.
        probe_lease: seconds after which a probe that never reported stops counting as in flight
            (``None``: never, for a breaker in one process whose callers always report).
    """

    name: str = "breaker"
    failure_rate: float = 0.5
    min_calls: int = 5
    window: float = 60.0
    buckets: int = 12
    open_for: float = 30.0
    half_open_probes: int = 1
    close_after: int = 1
    probe_lease: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.failure_rate <= 1.0:
            raise ValueError(f"failure_rate must be in (0, 1] (got {self.failure_rate})")
        if min(self.min_calls, self.buckets, self.half_open_probes, self.close_after) < 1:
            raise ValueError("min_calls, buckets, half_open_probes and close_after must be >= 1")
        if self.window <= 0 or self.open_for < 0:
            raise ValueError("window must be positive and open_for not negative")

    @property
    def width(self) -> float:
        """Seconds per bucket."""
        return self.window / self.buckets

    @property
    def ttl(self) -> float:
        """How long a store keeps an idle breaker's state (after it, the breaker reads closed).

        Long enough that nothing it holds could still matter: the window, the open period and
        a probe lease have all passed.
        """
        return self.window + self.open_for + (self.probe_lease or 0.0) + 60.0


class BreakerRecord:
    """The mutable state of one breaker.

    Attributes:
        state: ``"closed"``, ``"open"`` or ``"half_open"``.
        retry_at: when an open breaker lets a probe through (clock seconds), else ``None``.
        in_flight: probes handed out and not yet reported.
        probe_until: when the in-flight probes stop counting (with a ``probe_lease``).
        probe_successes: successful probes since it became half-open.
        window: ``[bucket index, successes, failures]`` entries, oldest first.
        calls: calls counted in the window (a running total, so a decision is O(1)).
        failures: failures counted in the window.
    """

    __slots__ = (
        "calls", "failures", "in_flight", "probe_successes", "probe_until", "retry_at", "state",
        "window",
    )  # fmt: skip

    def __init__(self) -> None:
        self.state = CLOSED
        self.retry_at: float | None = None
        self.in_flight = 0
        self.probe_until: float | None = None
        self.probe_successes = 0
        self.window: deque[list[int]] = deque()
        self.calls = 0
        self.failures = 0

    def to_json(self) -> str:
        """The record as compact JSON (the form SQLite and Redis keep; Lua's cjson reads it)."""
        return json.dumps(
            {
                "s": self.state,
                "r": -1 if self.retry_at is None else self.retry_at,
                "f": self.in_flight,
                "u": -1 if self.probe_until is None else self.probe_until,
                "p": self.probe_successes,
                "w": list(self.window),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes | None) -> BreakerRecord:
        """A record from :meth:`to_json` output (a fresh, closed one from ``None``)."""
        record = cls()
        if not text:
            return record
        data = json.loads(text)
        record.state = data["s"]
        record.retry_at = None if data["r"] < 0 else float(data["r"])
        record.in_flight = int(data["f"])
        record.probe_until = None if data["u"] < 0 else float(data["u"])
        record.probe_successes = int(data["p"])
        # (cjson writes an empty array as {}: an empty window either way)
        window = data["w"] if isinstance(data["w"], list) else []
        record.window = deque([int(i), int(ok), int(bad)] for i, ok, bad in window)
        record.calls = sum(ok + bad for _, ok, bad in record.window)
        record.failures = sum(bad for _, _, bad in record.window)
        return record


@dataclass(frozen=True, slots=True)
class BreakerView:
    """What one breaker operation saw and did.

    Attributes:
        state: the state after the operation.
        allowed: (``breaker_allow`` only) whether the call may go ahead.
        probe: the call was admitted as a half-open probe.
        retry_at: when an open (or fully probed half-open) breaker admits a call again.
        calls: calls counted in the window.
        failures: failures counted in the window.
        changes: the transitions the operation made, as ``(previous, new)`` pairs, in order.
    """

    state: str
    allowed: bool
    probe: bool
    retry_at: float | None
    calls: int
    failures: int
    changes: tuple[tuple[str, str], ...] = ()

    @property
    def failure_rate(self) -> float:
        """Failures over calls in the window (0 when empty)."""
        return self.failures / self.calls if self.calls else 0.0


def _bucket_index(spec: BreakerSpec, now: float) -> int:
    return math.floor(now / spec.width)


def _prune(spec: BreakerSpec, record: BreakerRecord, now: float, index: int | None = None) -> None:
    oldest = (_bucket_index(spec, now) if index is None else index) - spec.buckets
    window = record.window
    while window and window[0][0] <= oldest:
        _, ok, bad = window.popleft()
        record.calls -= ok + bad
        record.failures -= bad


def _move(
    spec: BreakerSpec, record: BreakerRecord, state: str, now: float, changes: list[tuple[str, str]]
) -> None:
    changes.append((record.state, state))
    record.state = state
    if state == OPEN:
        record.retry_at = now + spec.open_for
    elif state == CLOSED:
        record.retry_at = None
        record.window.clear()
        record.calls = record.failures = 0
    record.in_flight = 0
    record.probe_until = None
    record.probe_successes = 0


def _advance(
    spec: BreakerSpec, record: BreakerRecord, now: float, changes: list[tuple[str, str]]
) -> None:
    """Let time act: an open breaker whose wait is over becomes half-open; stale probes lapse."""
    if record.state == OPEN and record.retry_at is not None and now >= record.retry_at:
        _move(spec, record, HALF_OPEN, now, changes)
    if record.probe_until is not None and now >= record.probe_until:
        record.in_flight = 0
        record.probe_until = None


def _view(
    spec: BreakerSpec,
    record: BreakerRecord,
    now: float,
    changes: list[tuple[str, str]],
    *,
    allowed: bool = False,
    probe: bool = False,
) -> BreakerView:
    _prune(spec, record, now)
    retry_at = record.retry_at
    if record.state == HALF_OPEN and not allowed:
        retry_at = record.probe_until
    return BreakerView(
        record.state, allowed, probe, retry_at, record.calls, record.failures, tuple(changes)
    )


def breaker_allow(spec: BreakerSpec, record: BreakerRecord, now: float) -> BreakerView:
    """May a call go ahead at ``now``? A half-open breaker hands out a limited number of probes."""
    changes: list[tuple[str, str]] = []
    _advance(spec, record, now, changes)
    if record.state == CLOSED:
        return _view(spec, record, now, changes, allowed=True)
    if record.state == HALF_OPEN and record.in_flight < spec.half_open_probes:
        record.in_flight += 1
        if spec.probe_lease is not None:
            record.probe_until = now + spec.probe_lease
        return _view(spec, record, now, changes, allowed=True, probe=True)
    return _view(spec, record, now, changes)


def breaker_count(
    spec: BreakerSpec, record: BreakerRecord, outcome: BreakerOutcome, now: float
) -> list[tuple[str, str]]:
    """Count a call's ``outcome`` at ``now``, moving the breaker if it must; the transitions."""
    changes: list[tuple[str, str]] = []
    _advance(spec, record, now, changes)
    if record.state == HALF_OPEN:
        record.in_flight = max(0, record.in_flight - 1)
        if outcome == "failure":
            _move(spec, record, OPEN, now, changes)
        elif outcome == "success":
            record.probe_successes += 1
            if record.probe_successes >= spec.close_after:
                _move(spec, record, CLOSED, now, changes)
        return changes
    if record.state == OPEN or outcome == "ignored":
        return changes
    index = _bucket_index(spec, now)
    _prune(spec, record, now, index)
    window = record.window
    if not window or window[-1][0] != index:
        window.append([index, 0, 0])
    bad = 1 if outcome == "failure" else 0
    window[-1][1] += 1 - bad
    window[-1][2] += bad
    record.calls += 1
    record.failures += bad
    # judged after every counted call, so the window never rests closed above the rate
    if (
        record.failures
        and record.calls >= spec.min_calls
        and record.failures >= spec.failure_rate * record.calls
    ):
        _move(spec, record, OPEN, now, changes)
    return changes


def breaker_record(
    spec: BreakerSpec, record: BreakerRecord, outcome: BreakerOutcome, now: float
) -> BreakerView:
    """Count a call's ``outcome`` at ``now``, moving the breaker if it must."""
    return _view(spec, record, now, breaker_count(spec, record, outcome, now))


def breaker_view(spec: BreakerSpec, record: BreakerRecord, now: float) -> BreakerView:
    """The breaker's state at ``now`` (time may move it open → half-open; nothing else)."""
    changes: list[tuple[str, str]] = []
    _advance(spec, record, now, changes)
    return _view(spec, record, now, changes)
