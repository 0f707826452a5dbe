"""``FallbackStore``: the one outage policy, shared by the ``TokenLedger`` and ``ToolGuard``.

A shared store (SQLite, Redis) can become unreachable. What the components do then is decided
here, in one place, rather than by each component:

- **open** (the default): serve every operation from a local :class:`MemoryStore` and say so
  (:class:`~agentguard.events.StoreFallback`), try the shared store again every
  ``retry_seconds``, and when it answers replay into it the writes served locally (token
  commits — counted once, by event id — and record writes: idempotency results, dead letters),
  then say so (:class:`~agentguard.events.StoreRecovered`).
- **closed**: raise :class:`~agentguard.StoreUnavailable`.

An outage never hands out a fresh budget. While the shared store answers, the fallback keeps
the *last known state* of every budget it has seen: each session's committed tokens and cost
(the most recent :data:`KNOWN_SESSIONS` sessions), each scope's rolling-hour total, and the
reservations this process holds — including those sent whose answer has not arrived (the store
may have placed them). An answer that arrives after the fallback began is applied to the local
stand-in as well. When the store becomes unreachable, the local stand-in starts
from that state, so ``hard_stop`` keeps refusing a session (or an hour) that was spent, and
keeps counting this process's in-flight calls. The documented bound: during an outage a budget
can overshoot only by what *other* processes commit or hold in the meantime (they cannot be
seen), and a session this process never saw starts from zero against its session limit (the
hourly limit still starts from the last known hour). A single process sharing nothing is exact,
but for one ambiguity: an operation whose answer never came (a timeout) may have been applied by
the store all the same; it is counted locally, so the local view can then count it twice (never
less) until the store returns, and the replay counts it once there (by event id).

Otherwise local state is a stand-in, not a copy: breakers count only this process's calls, and
an idempotency key claimed in the shared store before the outage is not seen. Reservations and
breaker counts are not replayed: both are short-lived, and the shared store's own leases and
windows take over again. The seeded state is not replayed either (the shared store has it).

Only :class:`~agentguard.StoreUnavailable` is an outage; other
:class:`~agentguard.StoreError` faults pass through to the component.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from agentguard._engine import Call, Handlers, Plan, acall, arun, call, perform, run
from agentguard._redact import redact
from agentguard.events import Emitter, Hook, StoreFallback, StoreRecovered
from agentguard.exceptions import StoreUnavailable

from ._base import BudgetSpec, BudgetState, Charge, Hold, Store
from ._breaker import BreakerOutcome, BreakerSpec, BreakerView
from .memory import MemoryStore

__all__ = ["KNOWN_SESSIONS", "FallbackStore", "with_fallback"]

#: Sessions whose last known totals a fallback remembers per budget scope (least recent dropped).
KNOWN_SESSIONS = 10_000

T = TypeVar("T")

# The policy is one plan of store calls; the engine's drivers run it sync or async.
_HANDLERS: Handlers = {Call: call}
_AHANDLERS: Handlers = {Call: acall}


@dataclass(frozen=True, slots=True)
class _Op(Generic[T]):
    """One store operation, for whichever store runs it: ``sync(store)``, ``async_(store)``."""

    sync: Callable[[Store], T]
    async_: Callable[[Store], Awaitable[T]]
    # what the shared store's answer teaches the fallback (the last known budget state)
    seen: Callable[[FallbackStore, T], None] | None = None
    # a reservation this operation settles, served locally: no longer held in the shared store
    settles: str | None = None
    # a reservation this operation places: held in what an outage starts from while in flight
    places: tuple[BudgetSpec, Hold] | None = None


@dataclass
class _Outage:
    """The state kept while the shared store is unreachable."""

    since: float
    retry_at: float
    local: MemoryStore = field(default_factory=MemoryStore)
    # writes served locally, replayed into the shared store when it returns
    pending: list[_Op[Any]] = field(default_factory=list)
    # the committed tokens each session started from, per budget scope
    seeded: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class _Known:
    """The last known state of one budget scope, as the shared store last reported it."""

    spec: BudgetSpec
    hour_tokens: int = 0
    hour_cost: int = 0
    bucket: int = 0  # the window bucket the hour's totals were last seen in
    sessions: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)
    holds: dict[str, Hold] = field(default_factory=dict)  # this process's live reservations
    prune_at: int = 1_024  # expired holds are dropped when there are more than this

    def saw(self, session: str | None, state: BudgetState, now: float) -> None:
        # Answers of concurrent operations may arrive out of order: committed totals only grow
        # (a session's until it expires, the hour's within one bucket), so keep the larger.
        bucket = self.spec.bucket(now)
        if bucket == self.bucket:
            self.hour_tokens = max(self.hour_tokens, state.hour_tokens)
            self.hour_cost = max(self.hour_cost, state.hour_cost)
        else:
            self.bucket, self.hour_tokens, self.hour_cost = (
                bucket,
                state.hour_tokens,
                state.hour_cost,
            )
        if session is not None:
            sessions = self.sessions
            seen = sessions.get(session)
            if seen is None or state.session_tokens >= seen[0]:
                sessions[session] = (state.session_tokens, state.session_cost)
            sessions.move_to_end(session)
            if len(sessions) > KNOWN_SESSIONS:
                sessions.popitem(last=False)

    def seed(self, outage: _Outage, now: float) -> None:
        """Start ``outage.local`` from this state: committed totals, then this process's holds."""
        spec = _unenforced(self.spec)  # seeding never refuses
        local = outage.local
        outage.seeded[spec.scope] = {s: t for s, (t, _) in self.sessions.items()}
        tokens = cost = 0
        for session, (t, c) in self.sessions.items():
            local.commit(spec, Charge(session, "", _SEED + session, t, c), now)
            tokens, cost = tokens + t, cost + c
        if self.hour_tokens > tokens or self.hour_cost > cost:  # other sessions' hour usage
            rest = Charge(_SEED, "", _SEED, max(0, self.hour_tokens - tokens), 0)
            local.commit(spec, dataclasses.replace(rest, cost=max(0, self.hour_cost - cost)), now)
        for hold in self.holds.values():
            if hold.expires_at > now:
                local.reserve(spec, hold, now)


def _unenforced(spec: BudgetSpec) -> BudgetSpec:
    return dataclasses.replace(spec, enforce=False) if spec.enforce else spec


# Holds remembered before the expired ones are looked for (doubled while they are all live).
_PRUNE_AT = 1_024

# The event id (and pseudo-session) of the state a local stand-in starts from: never a real one.
_SEED = "\x00agentguard-seed:"


def with_fallback(
    store: Store,
    *,
    fail_mode: Literal["open", "closed"] = "open",
    retry_seconds: float = 5.0,
    hooks: Iterable[Hook] | None = None,
    session: str | None = None,
) -> Store:
    """``store`` behind the outage policy.

    A :class:`FallbackStore`, or ``store`` itself when there is no policy to apply:
    ``fail_mode: closed`` raises anyway, and a plain :class:`MemoryStore` is never unreachable.
    """
    if fail_mode == "closed" or type(store) is MemoryStore:
        return store
    return FallbackStore(store, retry_seconds=retry_seconds, hooks=hooks, session=session)


class FallbackStore:
    """A :class:`Store` that forwards to ``primary`` and serves locally while it is unreachable.

    See the module documentation for the policy and its limits.

    Args:
        primary: the shared store.
        retry_seconds: while serving locally, how often to try the shared store again.
        hooks: receive the ``store_fallback`` and ``store_recovered`` events.
        session: the session put on those events.
    """

    def __init__(
        self,
        primary: Store,
        *,
        retry_seconds: float = 5.0,
        hooks: Iterable[Hook] | None = None,
        session: str | None = None,
    ) -> None:
        self.primary = primary
        self.name = primary.name
        self._retry = retry_seconds
        self._emitter = Emitter(hooks)
        self._session = session
        self._outage: _Outage | None = None
        self._known: dict[str, _Known] = {}
        self._known_lock = threading.Lock()

    @property
    def degraded(self) -> bool:
        """Whether operations are served locally because the shared store is unreachable."""
        return self._outage is not None

    # -- the policy: one plan, run by the sync and the async driver ------------------------

    def _policy(self, now: float, op: _Op[T], write: bool) -> Plan[T]:
        """``op`` on the shared store (after replaying what an outage left), or locally."""
        outage = self._outage
        if outage is not None and now < outage.retry_at:
            return self._local(outage, op, write)
        primary = self.primary
        if op.places is not None:
            self._in_flight(*op.places)
        try:
            if outage is not None:
                for pending in outage.pending:
                    yield from perform(pending.sync, pending.async_, primary)
            result: T = yield from perform(op.sync, op.async_, primary)
        except StoreUnavailable as exc:
            return self._local(self._fall_back(exc, now), op, write)
        except BaseException:
            if op.places is not None:  # the component sees no reservation: neither does this
                self._saw_release(op.places[0], op.places[1].id, now)
            raise
        if outage is not None:
            self._recovered(outage, now)
        if op.seen is not None:
            op.seen(self, result)
        return result

    def _run(self, now: float, op: _Op[T], write: bool = False) -> T:
        return run(self._policy(now, op, write), _HANDLERS)

    async def _arun(self, now: float, op: _Op[T], write: bool = False) -> T:
        return await arun(self._policy(now, op, write), _AHANDLERS)

    def _local(self, outage: _Outage, op: _Op[T], write: bool) -> T:
        result = op.sync(outage.local)
        if op.settles is not None:
            self._forget(op.settles)
        elif op.places is not None and isinstance(result, BudgetState) and not result.applied:
            self._forget(op.places[1].id)  # refused here: not held after all
        # a duplicate commit changed nothing here, so there is nothing to replay
        if write and not (isinstance(result, BudgetState) and not result.applied):
            outage.pending.append(op)
        return result

    def _fall_back(self, exc: StoreUnavailable, now: float) -> _Outage:
        """The outage to serve ``now`` from: the current one (retried later), or a new one."""
        # Under the lock, so that each answer of the shared store is either in what the new
        # stand-in starts from or applied to it afterwards (the ``_saw_*``), never neither; and a
        # concurrent operation (another task, another thread) that fell back meanwhile keeps
        # its local state rather than seeing it replaced by a second one.
        with self._known_lock:
            outage = self._outage
            if outage is not None:
                outage.retry_at = now + self._retry
                return outage
            outage = _Outage(since=now, retry_at=now + self._retry)
            for known in self._known.values():
                known.seed(outage, now)
            self._outage = outage
        self._emitter.emit(
            StoreFallback(
                store=self.name,
                error_type=type(exc).__name__,
                message=redact(str(exc))[:200],
                session=self._session,
            )
        )
        return outage

    def _scope(self, spec: BudgetSpec) -> _Known:
        known = self._known.get(spec.scope)
        if known is None:
            known = self._known[spec.scope] = _Known(spec)
        known.spec = spec
        return known

    # Answers of the shared store. Each may arrive after a concurrent operation fell back (its
    # reply was on the way when the store went away): then it is applied to the local stand-in
    # too, unenforced and idempotently, so the stand-in stays exact.

    def _in_flight(self, spec: BudgetSpec, hold: Hold) -> None:
        """A reservation sent to the shared store: held in what an outage starts from until its
        answer says otherwise (it may be placed there even if that answer never arrives)."""
        with self._known_lock:
            self._scope(spec).holds[hold.id] = hold

    def _saw_reserve(self, spec: BudgetSpec, hold: Hold, state: BudgetState, now: float) -> None:
        with self._known_lock:
            known = self._scope(spec)
            known.saw(hold.session, state, now)
            holds = known.holds
            outage = self._outage
            if not state.applied:
                holds.pop(hold.id, None)
                if outage is not None:
                    outage.local.release(spec, hold.id, now)
                return
            holds[hold.id] = hold
            if len(holds) > known.prune_at:  # holds nobody settled: gone with their lease
                for rid in [r for r, h in holds.items() if h.expires_at <= now]:
                    del holds[rid]
                known.prune_at = max(_PRUNE_AT, 2 * len(holds))
            if outage is not None:
                outage.local.reserve(_unenforced(spec), hold, now)

    def _saw_commit(self, spec: BudgetSpec, charge: Charge, state: BudgetState, now: float) -> None:
        with self._known_lock:
            known = self._scope(spec)
            known.saw(charge.session, state, now)
            known.holds.pop(charge.reservation_id, None)
            outage = self._outage
            if outage is None:
                return
            # The stand-in's total already counts this commit when the total it started from
            # was reported after the commit was applied: totals only grow, so exactly when it
            # is at least the total this answer reports.
            seeded = outage.seeded.get(spec.scope, {}).get(charge.session, 0)
            if state.applied and state.session_tokens > seeded:
                outage.local.commit(_unenforced(spec), charge, now)
            else:
                outage.local.release(spec, charge.reservation_id, now)

    def _saw_release(self, spec: BudgetSpec, reservation_id: str, now: float) -> None:
        self._forget(reservation_id)
        outage = self._outage  # one that began since: its stand-in may hold it (seeded)
        if outage is not None:
            outage.local.release(spec, reservation_id, now)

    def _saw_renew(
        self, spec: BudgetSpec, reservation_id: str, expires_at: float, held: bool
    ) -> None:
        """A renewal's answer: what an outage would start from holds the reservation as long
        (or no longer, when it was not held)."""
        with self._known_lock:
            holds = self._scope(spec).holds
            hold = holds.get(reservation_id)
            if hold is None:
                return
            if not held:
                del holds[reservation_id]
            elif expires_at > hold.expires_at:
                holds[reservation_id] = dataclasses.replace(hold, expires_at=expires_at)

    def _forget(self, reservation_id: str) -> None:
        with self._known_lock:
            for known in self._known.values():
                known.holds.pop(reservation_id, None)

    def _saw_snapshot(
        self, spec: BudgetSpec, session: str | None, state: BudgetState, now: float
    ) -> None:
        with self._known_lock:
            self._scope(spec).saw(session, state, now)

    def _recovered(self, outage: _Outage, now: float) -> None:
        self._outage = None
        self._emitter.emit(
            StoreRecovered(
                store=self.name,
                outage_seconds=max(0.0, now - outage.since),
                resynced=len(outage.pending),
                session=self._session,
            )
        )

    # -- budgets ----------------------------------------------------------------------------

    def reserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.reserve`."""
        return self._run(now, _reserve(spec, hold, now))

    def commit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.commit` (replayed after an outage)."""
        return self._run(now, _commit(spec, charge, now), write=True)

    def release(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.release`."""
        return self._run(now, _release(spec, reservation_id, now))

    def renew(self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.renew` (served locally during an outage)."""
        held = self._run(now, _renew(spec, reservation_id, expires_at, now))
        self._saw_renew(spec, reservation_id, expires_at, held)
        return held

    def snapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.snapshot`."""
        return self._run(now, _snapshot(spec, session, now))

    async def areserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """Async twin of :meth:`reserve`."""
        return await self._arun(now, _reserve(spec, hold, now))

    async def acommit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """Async twin of :meth:`commit`."""
        return await self._arun(now, _commit(spec, charge, now), write=True)

    async def arelease(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """Async twin of :meth:`release`."""
        return await self._arun(now, _release(spec, reservation_id, now))

    async def asnapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """Async twin of :meth:`snapshot`."""
        return await self._arun(now, _snapshot(spec, session, now))

    async def arenew(
        self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float
    ) -> bool:
        """Async twin of :meth:`renew`."""
        held = await self._arun(now, _renew(spec, reservation_id, expires_at, now))
        self._saw_renew(spec, reservation_id, expires_at, held)
        return held

    # -- breakers ---------------------------------------------------------------------------

    def breaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """See :meth:`agentguard.storage.Store.breaker_allow`."""
        return self._run(now, _breaker_allow(spec, now))

    def breaker_record(self, spec: BreakerSpec, outcome: BreakerOutcome, now: float) -> BreakerView:
        """See :meth:`agentguard.storage.Store.breaker_record`."""
        return self._run(now, _breaker_record(spec, outcome, now))

    def breaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """See :meth:`agentguard.storage.Store.breaker_view`."""
        return self._run(now, _breaker_view(spec, now))

    async def abreaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_allow`."""
        return await self._arun(now, _breaker_allow(spec, now))

    async def abreaker_record(
        self, spec: BreakerSpec, outcome: BreakerOutcome, now: float
    ) -> BreakerView:
        """Async twin of :meth:`breaker_record`."""
        return await self._arun(now, _breaker_record(spec, outcome, now))

    async def abreaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_view`."""
        return await self._arun(now, _breaker_view(spec, now))

    # -- records ----------------------------------------------------------------------------

    def claim(self, namespace: str, key: str, value: str, now: float, ttl: float) -> str | None:
        """See :meth:`agentguard.storage.Store.claim`."""
        return self._run(now, _claim(namespace, key, value, now, ttl))

    def put(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """See :meth:`agentguard.storage.Store.put` (replayed after an outage)."""
        self._run(now, _put(namespace, key, value, now, ttl), write=True)

    def get(self, namespace: str, key: str, now: float) -> str | None:
        """See :meth:`agentguard.storage.Store.get`."""
        return self._run(now, _get(namespace, key, now))

    def items(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """See :meth:`agentguard.storage.Store.items`."""
        return self._run(now, _items(namespace, now))

    def delete(self, namespace: str, key: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.delete` (replayed after an outage)."""
        return self._run(now, _delete(namespace, key, now), write=True)

    async def aclaim(
        self, namespace: str, key: str, value: str, now: float, ttl: float
    ) -> str | None:
        """Async twin of :meth:`claim`."""
        return await self._arun(now, _claim(namespace, key, value, now, ttl))

    async def aput(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """Async twin of :meth:`put`."""
        await self._arun(now, _put(namespace, key, value, now, ttl), write=True)

    async def aget(self, namespace: str, key: str, now: float) -> str | None:
        """Async twin of :meth:`get`."""
        return await self._arun(now, _get(namespace, key, now))

    async def aitems(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """Async twin of :meth:`items`."""
        return await self._arun(now, _items(namespace, now))

    async def adelete(self, namespace: str, key: str, now: float) -> bool:
        """Async twin of :meth:`delete`."""
        return await self._arun(now, _delete(namespace, key, now), write=True)

    def close(self) -> None:
        """Close the shared store."""
        self.primary.close()

    def __repr__(self) -> str:
        return f"FallbackStore({self.primary!r}, degraded={self.degraded})"


# Each operation once, for whichever store runs it (the shared one, or the local stand-in).


def _reserve(spec: BudgetSpec, hold: Hold, now: float) -> _Op[BudgetState]:
    return _Op(
        lambda s: s.reserve(spec, hold, now),
        lambda s: s.areserve(spec, hold, now),
        lambda f, state: f._saw_reserve(spec, hold, state, now),
        places=(spec, hold),
    )


def _commit(spec: BudgetSpec, charge: Charge, now: float) -> _Op[BudgetState]:
    return _Op(
        lambda s: s.commit(spec, charge, now),
        lambda s: s.acommit(spec, charge, now),
        lambda f, state: f._saw_commit(spec, charge, state, now),
        charge.reservation_id,
    )


def _release(spec: BudgetSpec, rid: str, now: float) -> _Op[bool]:
    return _Op(
        lambda s: s.release(spec, rid, now),
        lambda s: s.arelease(spec, rid, now),
        lambda f, _: f._saw_release(spec, rid, now),
        rid,
    )


def _renew(spec: BudgetSpec, rid: str, expires_at: float, now: float) -> _Op[bool]:
    # An outage's stand-in renews its own copy; nothing to replay (a lease is not usage).
    return _Op(
        lambda s: s.renew(spec, rid, expires_at, now),
        lambda s: s.arenew(spec, rid, expires_at, now),
    )


def _snapshot(spec: BudgetSpec, session: str | None, now: float) -> _Op[BudgetState]:
    return _Op(
        lambda s: s.snapshot(spec, session, now),
        lambda s: s.asnapshot(spec, session, now),
        lambda f, state: f._saw_snapshot(spec, session, state, now),
    )


def _breaker_allow(spec: BreakerSpec, now: float) -> _Op[BreakerView]:
    return _Op(lambda s: s.breaker_allow(spec, now), lambda s: s.abreaker_allow(spec, now))


def _breaker_record(spec: BreakerSpec, outcome: BreakerOutcome, now: float) -> _Op[BreakerView]:
    return _Op(
        lambda s: s.breaker_record(spec, outcome, now),
        lambda s: s.abreaker_record(spec, outcome, now),
    )


def _breaker_view(spec: BreakerSpec, now: float) -> _Op[BreakerView]:
    return _Op(lambda s: s.breaker_view(spec, now), lambda s: s.abreaker_view(spec, now))


def _claim(ns: str, key: str, value: str, now: float, ttl: float) -> _Op[str | None]:
    return _Op(
        lambda s: s.claim(ns, key, value, now, ttl), lambda s: s.aclaim(ns, key, value, now, ttl)
    )


def _put(ns: str, key: str, value: str, now: float, ttl: float) -> _Op[None]:
    return _Op(
        lambda s: s.put(ns, key, value, now, ttl), lambda s: s.aput(ns, key, value, now, ttl)
    )


def _get(ns: str, key: str, now: float) -> _Op[str | None]:
    return _Op(lambda s: s.get(ns, key, now), lambda s: s.aget(ns, key, now))


def _items(ns: str, now: float) -> _Op[list[tuple[str, str]]]:
    return _Op(lambda s: s.items(ns, now), lambda s: s.aitems(ns, now))


def _delete(ns: str, key: str, now: float) -> _Op[bool]:
    return _Op(lambda s: s.delete(ns, key, now), lambda s: s.adelete(ns, key, now))
