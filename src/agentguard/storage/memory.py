"""``MemoryStore``: budget state in this process (the default)."""

from __future__ import annotations

import heapq
import threading

from ._base import BudgetSpec, BudgetState, Charge, Hold, SyncBackedStore, refusal

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
        "event_heap",
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
        self.events: dict[str, float] = {}
        self.event_heap: list[tuple[float, str]] = []
        self.next_sweep = 0.0

    def advance(self, spec: BudgetSpec, now: float) -> None:
        """Forget what has expired by ``now``: old buckets, leases, event ids, idle sessions."""
        first = spec.first_live(now)
        if first > self.live_from:
            self.live_from = first
            for bucket in [b for b in self.window if b < first]:
                tokens, cost = self.window.pop(bucket)
                self.hour_tokens -= tokens
                self.hour_cost -= cost
        heap = self.lease_heap
        while heap and heap[0][0] <= now:
            expiry, rid = heapq.heappop(heap)
            held = self.reservations.get(rid)
            if held is not None and held[2] == expiry:
                self._drop(rid, held)
        events = self.event_heap
        while events and events[0][0] <= now:
            expiry, eid = heapq.heappop(events)
            if self.events.get(eid) == expiry:
                del self.events[eid]
        if now >= self.next_sweep:
            self.next_sweep = now + min(_SWEEP_EVERY, spec.session_ttl)
            horizon = now - spec.session_ttl
            idle = [k for k, s in self.sessions.items() if s.held == 0 and s.seen <= horizon]
            for key in idle:
                del self.sessions[key]

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
    """Budget state in a dict of this process: fast, shared by the ledgers of one process only.

    Thread-safe (one lock); state is lost when the process ends. Expired leases, window buckets
    and event ids are dropped as time passes, and sessions idle for ``session_ttl`` are swept,
    so memory stays bounded by the live state.
    """

    name = "memory"

    def __init__(self) -> None:
        self._scopes: dict[str, _Scope] = {}
        self._lock = threading.Lock()

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
            sess = scope.sessions.get(hold.session)
            if sess is None:
                sess = scope.sessions[hold.session] = _Session(now)
            scope.release(hold.id)  # the same id placed again replaces, never holds twice
            tokens = hold.tokens
            refused = refusal(spec, sess.tokens + sess.held, scope.hour_tokens + scope.held, tokens)
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
            sess = scope.sessions.get(charge.session)
            if sess is None:
                sess = scope.sessions[charge.session] = _Session(now)
            if charge.event_id in scope.events:
                return scope.state(sess, applied=False)
            expiry = now + spec.event_ttl
            scope.events[charge.event_id] = expiry
            heapq.heappush(scope.event_heap, (expiry, charge.event_id))
            tokens, cost = charge.tokens, charge.cost
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

    def snapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.snapshot`."""
        with self._lock:
            scope = self._scope(spec, now)
            return scope.state(None if session is None else scope.sessions.get(session) or _EMPTY)

    def __repr__(self) -> str:
        return f"MemoryStore(scopes={len(self._scopes)})"


_EMPTY = _Session(0.0)
