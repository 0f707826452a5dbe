"""``MemoryStore``: shared state in this process (the default)."""

from __future__ import annotations

import heapq
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from ._base import (
    MAX_COST,
    MAX_TOKENS,
    BudgetSpec,
    BudgetState,
    Charge,
    Hold,
    SyncBackedStore,
    bounded,
    refusal,
)
from ._breaker import BreakerRecord, BreakerSpec

T = TypeVar("T")

__all__ = ["MemoryStore"]

# Idle sessions are swept at most this often (seconds of the caller's clock): a sweep walks
# every session, so it must stay rare, while idle sessions must not pile up for ever.
_SWEEP_EVERY = 60.0


class _Session:
    __slots__ = ("cost", "held", "seen", "tokens")

    def __init__(self, now: float) -> None:
        self.tokens = 0
        self.cost = 0
        self.held = 0
        self.seen = now


class _Scope:
    """The state of one budget scope, with running totals so no operation walks it all."""

    __slots__ = (
        "event_queue",
        "events",
        "held",
        "hour_cost",
        "hour_tokens",
        "lease_heap",
        "live_from",
        "next_sweep",
        "reservations",
        "sessions",
        "window",
        "window_due",
    )

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.window: dict[int, list[int]] = {}  # bucket -> [tokens, cost]
        self.hour_tokens = 0
        self.hour_cost = 0
        self.held = 0
        self.live_from = -(2**62)
        self.reservations: dict[str, tuple[str, int, float]] = {}  # id -> session, tokens, expiry
        # Expiries in heaps: the next one to expire is always at the top, so a check is O(1).
        # Entries whose reservation was committed or released stay until they surface, then
        # are skipped (lazy deletion keeps commit and release O(1)).
        self.lease_heap: list[tuple[float, str]] = []
        # Event ids with their expiry, and the same in commit order: expiries are commit time
        # plus a fixed TTL, so the oldest is at the front and pruning is O(1) per id (a heap
        # costs O(log n) at 140,000 ids). An id committed with an older clock (a re-sync) may
        # be pruned late, never early: the duplicate check reads the expiry itself.
        self.events: dict[str, float] = {}
        self.event_queue: deque[tuple[float, str]] = deque()
        self.next_sweep = 0.0
        # The window moves only when the clock enters a new bucket: until then, nothing to do.
        self.window_due = -math.inf

    def advance(self, spec: BudgetSpec, now: float) -> None:
        """Forget what has expired by ``now``: old buckets, leases, event ids, idle sessions."""
        # Each kind of state checks its next expiry in O(1); most operations find none due.
        if now >= self.window_due:
            bucket = spec.bucket(now)
            self.window_due = (bucket + 1) * spec.bucket_seconds
            first = bucket - spec.buckets + 1
            if first > self.live_from:
                self.live_from = first
                for old in [b for b in self.window if b < first]:
                    tokens, cost = self.window.pop(old)
                    self.hour_tokens -= tokens
                    self.hour_cost -= cost
        heap = self.lease_heap
        while heap and heap[0][0] <= now:
            expiry, rid = heapq.heappop(heap)
            held = self.reservations.get(rid)
            if held is not None and held[2] == expiry:
                self._drop(rid, held)
        events = self.event_queue
        while events and events[0][0] <= now:
            expiry, eid = events.popleft()
            if self.events.get(eid) == expiry:
                del self.events[eid]
        if now >= self.next_sweep:
            self.next_sweep = now + min(_SWEEP_EVERY, spec.session_ttl)
            horizon = now - spec.session_ttl
            idle = [k for k, s in self.sessions.items() if s.held == 0 and s.seen <= horizon]
            for key in idle:
                del self.sessions[key]

    def live_session(self, spec: BudgetSpec, key: str, now: float) -> _Session | None:
        """The session's counters, or ``None`` once it has been idle for ``session_ttl``.

        Checked on access, not only by the periodic sweep, so expiry is exact (as Redis's is).
        """
        session = self.sessions.get(key)
        if session is not None and session.held == 0 and session.seen <= now - spec.session_ttl:
            del self.sessions[key]
            return None
        return session

    def _drop(self, rid: str, held: tuple[str, int, float]) -> None:
        del self.reservations[rid]
        self.held -= held[1]
        session = self.sessions.get(held[0])
        if session is not None:
            session.held -= held[1]

    def release(self, rid: str) -> bool:
        held = self.reservations.get(rid)
        if held is None:
            return False
        self._drop(rid, held)
        return True

    def renew(self, rid: str, expires_at: float) -> bool:
        held = self.reservations.get(rid)
        if held is None:
            return False
        if expires_at > held[2]:  # the old heap entry is skipped when it surfaces
            self.reservations[rid] = (held[0], held[1], expires_at)
            heapq.heappush(self.lease_heap, (expires_at, rid))
        return True

    def state(
        self,
        session: _Session | None,
        refused: str | None = None,
        applied: bool = True,
        buckets: tuple[tuple[int, int], ...] = (),
    ) -> BudgetState:
        if session is None:
            return BudgetState(
                0, 0, 0, self.hour_tokens, self.hour_cost, self.held, refused, applied
            )
        return BudgetState(
            session.tokens,
            session.cost,
            session.held,
            self.hour_tokens,
            self.hour_cost,
            self.held,
            refused,
            applied,
            buckets,
        )


class MemoryStore(SyncBackedStore):
    """State in dicts of this process: fast, shared by the components of one process only.

    Thread-safe (one lock); state is lost when the process ends. Expired leases, window buckets
    and event ids are dropped as time passes, and sessions idle for ``session_ttl`` are swept,
    so memory stays bounded by the live state; so are breakers idle for their TTL and expired
    records.
    """

    name = "memory"

    def __init__(self) -> None:
        self._scopes: dict[str, _Scope] = {}
        self._lock = threading.Lock()
        self._breakers: dict[str, tuple[BreakerRecord, float]] = {}  # name -> record, expiry
        self._records: dict[str, dict[str, tuple[str, float]]] = {}  # ns -> key -> value, expiry
        self._next_sweep = 0.0

    def _scope(self, spec: BudgetSpec, now: float) -> _Scope:
        scope = self._scopes.get(spec.scope)
        if scope is None:
            scope = self._scopes[spec.scope] = _Scope()
        scope.advance(spec, now)
        return scope

    def reserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.reserve`."""
        with self._lock:
            scope = self._scope(spec, now)
            sess = scope.live_session(spec, hold.session, now)
            if sess is None:
                sess = scope.sessions[hold.session] = _Session(now)
            scope.release(hold.id)  # the same id placed again replaces, never holds twice
            tokens = bounded(hold.tokens, MAX_TOKENS)
            refused = (
                refusal(
                    spec,
                    sess.tokens + sess.held,
                    scope.hour_tokens + scope.held,
                    tokens + bounded(hold.headroom, MAX_TOKENS),
                )
                if spec.enforce
                else None
            )
            if refused is not None:
                buckets = tuple(sorted((b, v[0]) for b, v in scope.window.items()))
                return scope.state(sess, refused, False, buckets if refused == "hour" else ())
            scope.reservations[hold.id] = (hold.session, tokens, hold.expires_at)
            heapq.heappush(scope.lease_heap, (hold.expires_at, hold.id))
            sess.held += tokens
            sess.seen = now
            scope.held += tokens
            return scope.state(sess)

    def commit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.commit`."""
        with self._lock:
            scope = self._scope(spec, now)
            scope.release(charge.reservation_id)
            sess = scope.live_session(spec, charge.session, now)
            if sess is None:
                sess = scope.sessions[charge.session] = _Session(now)
            event_id = charge.event_id
            seen = scope.events.get(event_id)
            if seen is not None and seen > now:  # expired ids may linger a little: check
                return scope.state(sess, applied=False)
            expiry = now + spec.event_ttl
            scope.events[event_id] = expiry
            scope.event_queue.append((expiry, event_id))
            tokens, cost = bounded(charge.tokens, MAX_TOKENS), bounded(charge.cost, MAX_COST)
            sess.tokens += tokens
            sess.cost += cost
            sess.seen = max(sess.seen, now)
            bucket = spec.bucket(now)
            if bucket >= scope.live_from:  # a late re-sync may bring usage already out of window
                slot = scope.window.get(bucket)
                if slot is None:
                    scope.window[bucket] = [tokens, cost]
                else:
                    slot[0] += tokens
                    slot[1] += cost
                scope.hour_tokens += tokens
                scope.hour_cost += cost
            return scope.state(sess)

    def release(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.release`."""
        with self._lock:
            return self._scope(spec, now).release(reservation_id)

    def renew(self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.renew`."""
        with self._lock:
            return self._scope(spec, now).renew(reservation_id, expires_at)

    def snapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.snapshot`."""
        with self._lock:
            scope = self._scope(spec, now)
            if session is None:
                return scope.state(None)
            return scope.state(scope.live_session(spec, session, now) or _EMPTY)

    # -- breakers and records ---------------------------------------------------------------

    def _breaker(self, spec: BreakerSpec, now: float, step: Callable[[BreakerRecord], T]) -> T:
        with self._lock:
            held = self._breakers.get(spec.name)
            record = held[0] if held is not None and held[1] > now else BreakerRecord()
            result = step(record)
            self._breakers[spec.name] = (record, now + spec.ttl)
            self._sweep(now)
            return result

    def _sweep(self, now: float) -> None:
        # Walks everything, so rarely; access checks expiry exactly in between.
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_EVERY
        for name in [n for n, (_, expiry) in self._breakers.items() if expiry <= now]:
            del self._breakers[name]
        for records in self._records.values():
            for key in [k for k, (_, expiry) in records.items() if expiry <= now]:
                del records[key]

    def _live(self, namespace: str, key: str, now: float) -> str | None:
        held = self._records.get(namespace, {}).get(key)
        return held[0] if held is not None and held[1] > now else None

    def claim(self, namespace: str, key: str, value: str, now: float, ttl: float) -> str | None:
        """See :meth:`agentguard.storage.Store.claim`."""
        with self._lock:
            existing = self._live(namespace, key, now)
            if existing is None:
                self._records.setdefault(namespace, {})[key] = (value, now + ttl)
                self._sweep(now)
            return existing

    def put(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """See :meth:`agentguard.storage.Store.put`."""
        with self._lock:
            self._records.setdefault(namespace, {})[key] = (value, now + ttl)
            self._sweep(now)

    def get(self, namespace: str, key: str, now: float) -> str | None:
        """See :meth:`agentguard.storage.Store.get`."""
        with self._lock:
            return self._live(namespace, key, now)

    def items(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """See :meth:`agentguard.storage.Store.items`."""
        with self._lock:
            records = self._records.get(namespace, {})
            return sorted((k, v) for k, (v, expiry) in records.items() if expiry > now)

    def delete(self, namespace: str, key: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.delete`."""
        with self._lock:
            live = self._live(namespace, key, now) is not None
            self._records.get(namespace, {}).pop(key, None)
            return live

    def __repr__(self) -> str:
        return f"MemoryStore(scopes={len(self._scopes)})"


_EMPTY = _Session(0.0)
