"""The ``Store`` protocol and the logic every store shares.

A store keeps shared state (token budgets, circuit breakers, idempotency keys, dead letters)
where several workers can reach it: in the process
(:class:`~agentguard.storage.MemoryStore`), in a file shared by the processes of one host
(:class:`~agentguard.storage.SQLiteStore`) or on a server shared by a fleet
(:class:`~agentguard.storage.RedisStore`).

The protocol is deliberately made of *whole* budget operations (reserve, commit, release,
snapshot), each atomic in the store, rather than of generic get/set primitives: "check the limit
and reserve" must be one indivisible step, or concurrent workers admit more than the budget
(the check-then-act race). Each store therefore runs an operation as one transaction (a lock,
``BEGIN IMMEDIATE``, a Lua script). The arithmetic they share lives here, so the three stores
cannot drift apart; the Redis Lua script mirrors it and the shared contract tests hold all three
to it.

State of one budget scope (all integers, so sums are exact)::

    session counters   session -> committed tokens, committed cost     expire when idle
    hour window        bucket index -> committed tokens, cost          expire with the window
    reservations       id -> session, tokens, lease expiry             expire with the lease
    events             committed event id                              expire after a day

Money is counted in integer *nano-units* (1e-9 of the price table's currency) for the same
reason: exact totals however many workers add to them.

Circuit breakers are whole operations too (allow, record, view), each a read-modify-write of
one :class:`BreakerRecord` by the shared state machine in ``storage/_breaker.py``. Idempotency
keys and dead letters use *records*: small JSON texts under a namespace and a key, each with a
TTL, where :meth:`Store.claim` (store unless present, else return what is there) is the atomic
step an idempotency key needs.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from agentguard._frozen import fast_init

from ._breaker import (
    BreakerOutcome,
    BreakerRecord,
    BreakerSpec,
    BreakerView,
    breaker_allow,
    breaker_record,
    breaker_view,
)

__all__ = [
    "MAX_COST",
    "MAX_TOKENS",
    "NANOS",
    "BudgetSpec",
    "BudgetState",
    "Charge",
    "Hold",
    "Store",
    "SyncBackedStore",
    "bounded",
    "refusal",
    "window_resets_at",
]

#: Money is stored in integer units of ``1 / NANOS`` of the price table's currency.
NANOS = 1_000_000_000

#: The most tokens one reservation or one commit may count (a billion: far past any model's
#: context). The ledger refuses a caller's larger number and clamps an upstream's to it; every
#: store clamps again, so no counter can overflow SQLite's 64-bit integers, Redis's ``HINCRBY``
#: or the exact range of the Lua scripts' numbers (2**53), however many commits add up.
MAX_TOKENS = 1_000_000_000

#: The most nano-units one commit may cost (10,000 units of the price table's currency).
MAX_COST = 10_000 * NANOS


def bounded(value: int, top: int) -> int:
    """``value`` clamped to ``[0, top]``: what a store counts, whatever it was handed."""
    return 0 if value < 0 else min(value, top)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """What a store needs to know about one budget scope to run an operation on it.

    Attributes:
        scope: the budget's name; stores keep each scope's state apart.
        session_limit: tokens per session, or ``None``.
        hour_limit: tokens per rolling window, or ``None``.
        enforce: refuse a reservation that would pass a limit (``hard_stop``); otherwise
            reservations are always granted and the caller reads the state.
        bucket_seconds: granularity of the rolling window.
        span_seconds: length of the rolling window (an hour).
        session_ttl: seconds an idle session's counters are kept.
        event_ttl: seconds a committed event id is remembered.
    """

    scope: str = "default"
    session_limit: int | None = None
    hour_limit: int | None = None
    enforce: bool = False
    bucket_seconds: int = 60
    span_seconds: int = 3600
    session_ttl: float = 7 * 86_400.0
    event_ttl: float = 86_400.0

    @property
    def buckets(self) -> int:
        """How many buckets make up the window."""
        return math.ceil(self.span_seconds / self.bucket_seconds)

    def bucket(self, now: float) -> int:
        """The index of the bucket that ``now`` falls in."""
        return int(now // self.bucket_seconds)

    def first_live(self, now: float) -> int:
        """The oldest bucket index still inside the window at ``now``."""
        return self.bucket(now) - self.buckets + 1

    def expires(self, bucket: int) -> float:
        """When tokens counted in ``bucket`` leave the window."""
        return float((bucket + self.buckets) * self.bucket_seconds)


@fast_init
@dataclass(frozen=True, slots=True)
class Hold:
    """A reservation to place: ``tokens`` held for ``session`` until ``expires_at``.

    Attributes:
        session: the session charged.
        id: the reservation's id (placing the same id again replaces the earlier hold).
        tokens: tokens to hold.
        expires_at: wall-clock end of the lease.
        headroom: tokens that must fit beside the hold for it to be granted, without being held
            (the rest of the request's worst case when only a learned estimate is held): the
            limit check counts ``tokens + headroom``.
    """

    session: str
    id: str
    tokens: int
    expires_at: float
    headroom: int = 0


@fast_init
@dataclass(frozen=True, slots=True)
class Charge:
    """Usage to commit: counted once per ``event_id``, replacing the reservation's hold.

    Attributes:
        session: the session charged.
        reservation_id: the hold this usage settles (dropped even for a duplicate event).
        event_id: the idempotency key.
        tokens: tokens used.
        cost: their cost in nano-units.
    """

    session: str
    reservation_id: str
    event_id: str
    tokens: int
    cost: int


@fast_init
@dataclass(frozen=True, slots=True)
class BudgetState:
    """The state of a budget scope as one atomic operation saw it (after the operation).

    Attributes:
        session_tokens: tokens committed by the session.
        session_cost: their cost, in nano-units.
        session_held: tokens the session holds in live reservations.
        hour_tokens: tokens committed in the rolling window, by every session.
        hour_cost: their cost, in nano-units.
        hour_held: tokens held in live reservations, by every session.
        refused: ``"session"`` or ``"hour"`` when a reservation was refused, else ``None``.
        applied: whether the operation changed anything: a reservation was granted, a commit
            was counted (``False`` for a duplicate event id), a reservation was released.
        buckets: on an ``"hour"`` refusal, the live ``(bucket, tokens)`` pairs oldest first,
            from which the ledger computes when the window has room again.
    """

    session_tokens: int = 0
    session_cost: int = 0
    session_held: int = 0
    hour_tokens: int = 0
    hour_cost: int = 0
    hour_held: int = 0
    refused: str | None = None
    applied: bool = True
    buckets: tuple[tuple[int, int], ...] = ()

    @property
    def session_used(self) -> int:
        """Committed plus held tokens of the session: what its limit is checked against."""
        return self.session_tokens + self.session_held

    @property
    def hour_used(self) -> int:
        """Committed plus held tokens in the window: what the hourly limit is checked against."""
        return self.hour_tokens + self.hour_held


def refusal(spec: BudgetSpec, session_used: int, hour_used: int, tokens: int) -> str | None:
    """Which budget a reservation of ``tokens`` would pass under ``spec``, or ``None``.

    Only an enforcing spec refuses; the session budget is checked first.
    """
    if not spec.enforce:
        return None
    if spec.session_limit is not None and session_used + tokens > spec.session_limit:
        return "session"
    if spec.hour_limit is not None and hour_used + tokens > spec.hour_limit:
        return "hour"
    return None


def window_resets_at(spec: BudgetSpec, state: BudgetState, tokens: int, now: float) -> float | None:
    """When enough of the window's committed tokens will have left it for ``tokens`` to fit.

    Held tokens are not counted as leaving: they are freed by a commit, a release or a lease
    expiry, which the window cannot predict. ``None`` when the window alone cannot make room.
    """
    if spec.hour_limit is None:
        return None
    excess = state.hour_used + tokens - spec.hour_limit
    if excess <= 0:
        return now
    freed = 0
    for bucket, count in state.buckets:
        freed += count
        if freed >= excess:
            return spec.expires(bucket)
    return None


@runtime_checkable
class Store(Protocol):
    """Where budget state lives. Every operation is atomic with respect to every other one.

    Methods take ``now``, the caller's wall-clock time: the ledger injects its clock so that
    leases, windows and expiries are testable, and so that all workers sharing a store agree on
    time as far as their clocks agree (keep hosts NTP-synchronised).

    Each method has an async twin with an ``a`` prefix and the same semantics. Stores raise
    :class:`~agentguard.StoreUnavailable` when the backend cannot be reached (the outage policy
    of :class:`~agentguard.storage.FallbackStore` then applies) and
    :class:`~agentguard.StoreError` for other faults.
    """

    #: Short name of the backend, for events and reports (``"memory"``, ``"sqlite"``, ``"redis"``).
    name: str

    def reserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """Drop expired reservations, then check ``hold.tokens`` against the limits and hold them.

        Refused (``state.refused`` set, nothing held) only when ``spec.enforce`` and a limit
        would be passed; the returned state counts the new reservation when granted.
        """
        ...

    def commit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """Drop the reservation (if still held) and count the charge once per event id.

        A second commit with an event id already counted changes no counter
        (``state.applied`` is ``False``) but still drops its reservation.
        """
        ...

    def release(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """Drop a reservation without counting anything; ``False`` when it was not held."""
        ...

    def renew(self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float) -> bool:
        """Move a held reservation's lease end to ``expires_at`` (never earlier).

        ``False`` when it is not held (settled, released, or its lease already ended).
        """
        ...

    def snapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """The current state (session fields are zero when ``session`` is ``None``)."""
        ...

    async def areserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """Async twin of :meth:`reserve`."""
        ...

    async def acommit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """Async twin of :meth:`commit`."""
        ...

    async def arelease(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """Async twin of :meth:`release`."""
        ...

    async def asnapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """Async twin of :meth:`snapshot`."""
        ...

    async def arenew(
        self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float
    ) -> bool:
        """Async twin of :meth:`renew`."""
        ...

    def breaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """May a call through breaker ``spec.name`` go ahead? Hands out half-open probes."""
        ...

    def breaker_record(self, spec: BreakerSpec, outcome: BreakerOutcome, now: float) -> BreakerView:
        """Count an outcome (``success``, ``failure``, ``ignored``) in breaker ``spec.name``."""
        ...

    def breaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """The state of breaker ``spec.name``."""
        ...

    def claim(self, namespace: str, key: str, value: str, now: float, ttl: float) -> str | None:
        """Store ``value`` unless a live record holds ``key``; return that record's value then.

        ``None`` means the claim succeeded (the caller owns the key for ``ttl`` seconds).
        """
        ...

    def put(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """Store ``value`` under ``key`` for ``ttl`` seconds, replacing any earlier record."""
        ...

    def get(self, namespace: str, key: str, now: float) -> str | None:
        """The live record under ``key``, or ``None``."""
        ...

    def items(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """Every live ``(key, value)`` of ``namespace``, sorted by key."""
        ...

    def delete(self, namespace: str, key: str, now: float) -> bool:
        """Drop the record under ``key``; ``False`` when there was none."""
        ...

    async def abreaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_allow`."""
        ...

    async def abreaker_record(
        self, spec: BreakerSpec, outcome: BreakerOutcome, now: float
    ) -> BreakerView:
        """Async twin of :meth:`breaker_record`."""
        ...

    async def abreaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_view`."""
        ...

    async def aclaim(
        self, namespace: str, key: str, value: str, now: float, ttl: float
    ) -> str | None:
        """Async twin of :meth:`claim`."""
        ...

    async def aput(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """Async twin of :meth:`put`."""
        ...

    async def aget(self, namespace: str, key: str, now: float) -> str | None:
        """Async twin of :meth:`get`."""
        ...

    async def aitems(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """Async twin of :meth:`items`."""
        ...

    async def adelete(self, namespace: str, key: str, now: float) -> bool:
        """Async twin of :meth:`delete`."""
        ...

    def close(self) -> None:
        """Release connections and files (the store is unusable afterwards)."""
        ...


class SyncBackedStore(abc.ABC):
    """Gives a store with blocking methods its async twins.

    The twins run the blocking method through :meth:`_offload`: directly for a store that never
    blocks (memory), on a worker thread for one that does (SQLite), so the event loop never
    waits on a file lock. Subclasses implement the blocking operations of :class:`Store`; the
    breaker operations come from :meth:`_breaker`, a read-modify-write of one record under the
    store's own transaction.
    """

    name: str = "store"

    @abc.abstractmethod
    def reserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """See :meth:`Store.reserve`."""

    @abc.abstractmethod
    def commit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """See :meth:`Store.commit`."""

    @abc.abstractmethod
    def release(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """See :meth:`Store.release`."""

    @abc.abstractmethod
    def renew(self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float) -> bool:
        """See :meth:`Store.renew`."""

    @abc.abstractmethod
    def snapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """See :meth:`Store.snapshot`."""

    @abc.abstractmethod
    def _breaker(self, spec: BreakerSpec, now: float, step: Callable[[BreakerRecord], T]) -> T:
        """Run ``step`` on breaker ``spec.name``'s record atomically and keep what it changed."""

    def breaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """See :meth:`Store.breaker_allow`."""
        return self._breaker(spec, now, lambda record: breaker_allow(spec, record, now))

    def breaker_record(self, spec: BreakerSpec, outcome: BreakerOutcome, now: float) -> BreakerView:
        """See :meth:`Store.breaker_record`."""
        return self._breaker(spec, now, lambda record: breaker_record(spec, record, outcome, now))

    def breaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """See :meth:`Store.breaker_view`."""
        return self._breaker(spec, now, lambda record: breaker_view(spec, record, now))

    @abc.abstractmethod
    def claim(self, namespace: str, key: str, value: str, now: float, ttl: float) -> str | None:
        """See :meth:`Store.claim`."""

    @abc.abstractmethod
    def put(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """See :meth:`Store.put`."""

    @abc.abstractmethod
    def get(self, namespace: str, key: str, now: float) -> str | None:
        """See :meth:`Store.get`."""

    @abc.abstractmethod
    def items(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """See :meth:`Store.items`."""

    @abc.abstractmethod
    def delete(self, namespace: str, key: str, now: float) -> bool:
        """See :meth:`Store.delete`."""

    def close(self) -> None:  # noqa: B027 - optional: most stores hold nothing to release
        """Release resources (nothing by default)."""

    async def _offload(self, fn: Callable[..., T], *args: object) -> T:
        return fn(*args)

    async def areserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """Async twin of :meth:`reserve`."""
        return await self._offload(self.reserve, spec, hold, now)

    async def acommit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """Async twin of :meth:`commit`."""
        return await self._offload(self.commit, spec, charge, now)

    async def arelease(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """Async twin of :meth:`release`."""
        return await self._offload(self.release, spec, reservation_id, now)

    async def asnapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """Async twin of :meth:`snapshot`."""
        return await self._offload(self.snapshot, spec, session, now)

    async def arenew(
        self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float
    ) -> bool:
        """Async twin of :meth:`renew`."""
        return await self._offload(self.renew, spec, reservation_id, expires_at, now)

    async def abreaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_allow`."""
        return await self._offload(self.breaker_allow, spec, now)

    async def abreaker_record(
        self, spec: BreakerSpec, outcome: BreakerOutcome, now: float
    ) -> BreakerView:
        """Async twin of :meth:`breaker_record`."""
        return await self._offload(self.breaker_record, spec, outcome, now)

    async def abreaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_view`."""
        return await self._offload(self.breaker_view, spec, now)

    async def aclaim(
        self, namespace: str, key: str, value: str, now: float, ttl: float
    ) -> str | None:
        """Async twin of :meth:`claim`."""
        return await self._offload(self.claim, namespace, key, value, now, ttl)

    async def aput(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """Async twin of :meth:`put`."""
        await self._offload(self.put, namespace, key, value, now, ttl)

    async def aget(self, namespace: str, key: str, now: float) -> str | None:
        """Async twin of :meth:`get`."""
        return await self._offload(self.get, namespace, key, now)

    async def aitems(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """Async twin of :meth:`items`."""
        return await self._offload(self.items, namespace, now)

    async def adelete(self, namespace: str, key: str, now: float) -> bool:
        """Async twin of :meth:`delete`."""
        return await self._offload(self.delete, namespace, key, now)
