"""The store contract: MemoryStore, SQLiteStore and RedisStore (a real server) behave alike.

Budgets, circuit breakers (also as a state machine against the in-process breaker) and records
(idempotency keys, dead letters).
"""

from __future__ import annotations

import asyncio
import gc
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from _stores import RedisServer, run_workers
from agentguard import BudgetExceeded, GuardConfig, StoreUnavailable, ToolGuard
from agentguard._clock import wall
from agentguard.budget import TokenLedger
from agentguard.config import StorageConfig, TokenBudgetConfig
from agentguard.events import StoreFallback, StoreRecovered
from agentguard.resilience import CircuitBreaker, Classification, ErrorClass
from agentguard.storage import (
    BreakerSpec,
    BudgetSpec,
    Charge,
    FallbackStore,
    Hold,
    MemoryStore,
    RedisStore,
    SQLiteStore,
    Store,
    store_from_config,
    with_fallback,
)
from agentguard.testing import FakeClock, capture_events
from agentguard.tools import DeadLetter

BACKENDS = ["memory", "fallback", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


def _make_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "memory":
        return MemoryStore()
    if kind == "fallback":  # the outage wrapper must keep the contract of what it wraps
        return FallbackStore(MemoryStore())
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "budget.db")
    server: RedisServer = request.getfixturevalue("redis_server")
    # a fresh prefix per test: tests never see each other's keys
    return RedisStore(server.url, key_prefix=f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store in turn."""
    made = _make_store(request.param, tmp_path, request)
    yield made
    made.close()


def _ledger(store: Store, clock: FakeClock, **budget: object) -> TokenLedger:
    defaults: dict[str, object] = {"max_output_tokens": None}
    return TokenLedger(
        TokenBudgetConfig.model_validate({**defaults, **budget}), store=store, clock=clock
    )


SPEC = BudgetSpec(scope="c", session_limit=100, hour_limit=150, enforce=True)


def test_reserve_holds_tokens_against_session_and_hour(store: Store, clock: FakeClock) -> None:
    """A granted reservation is counted as held in the session and in the window."""
    state = store.reserve(SPEC, Hold("a", "r1", 40, clock() + 60), clock())
    assert state.applied
    assert state.refused is None
    assert (state.session_held, state.hour_held) == (40, 40)
    snap = store.snapshot(SPEC, "a", clock())
    assert (snap.session_tokens, snap.session_held, snap.hour_used) == (0, 40, 40)


def test_commit_replaces_the_hold_with_the_real_usage(store: Store, clock: FakeClock) -> None:
    """After a commit the hold is gone and the used tokens and cost are committed."""
    store.reserve(SPEC, Hold("a", "r1", 40, clock() + 60), clock())
    state = store.commit(SPEC, Charge("a", "r1", "e1", 25, 1_000), clock())
    assert state.applied
    assert (state.session_tokens, state.session_cost, state.session_held) == (25, 1_000, 0)
    assert (state.hour_tokens, state.hour_cost, state.hour_held) == (25, 1_000, 0)


def test_duplicate_event_counts_once_and_still_drops_its_hold(
    store: Store, clock: FakeClock
) -> None:
    """A second commit of the same event id adds nothing, and frees its own reservation."""
    store.reserve(SPEC, Hold("a", "r1", 10, clock() + 60), clock())
    store.reserve(SPEC, Hold("a", "r2", 10, clock() + 60), clock())
    store.commit(SPEC, Charge("a", "r1", "same", 10, 5), clock())
    again = store.commit(SPEC, Charge("a", "r2", "same", 10, 5), clock())
    assert not again.applied
    assert (again.session_tokens, again.session_cost, again.session_held) == (10, 5, 0)


def test_release_frees_a_hold_once(store: Store, clock: FakeClock) -> None:
    """release gives the tokens back; releasing again reports False."""
    store.reserve(SPEC, Hold("a", "r1", 40, clock() + 60), clock())
    assert store.release(SPEC, "r1", clock())
    assert not store.release(SPEC, "r1", clock())
    assert store.snapshot(SPEC, "a", clock()).session_used == 0


def test_enforced_session_limit_refuses_without_holding(store: Store, clock: FakeClock) -> None:
    """A reservation that would pass the session limit is refused and holds nothing."""
    store.reserve(SPEC, Hold("a", "r1", 90, clock() + 60), clock())
    state = store.reserve(SPEC, Hold("a", "r2", 11, clock() + 60), clock())
    assert state.refused == "session"
    assert not state.applied
    assert store.snapshot(SPEC, "a", clock()).session_held == 90
    assert store.reserve(SPEC, Hold("a", "r3", 10, clock() + 60), clock()).applied


def test_enforced_hour_limit_spans_sessions_and_reports_buckets(
    store: Store, clock: FakeClock
) -> None:
    """The hourly limit counts every session; a refusal lists the live buckets oldest first."""
    store.commit(SPEC, Charge("a", "-", "e1", 60, 0), clock())
    clock.advance(120)
    store.commit(SPEC, Charge("b", "-", "e2", 70, 0), clock())
    state = store.reserve(SPEC, Hold("c", "r", 30, clock() + 60), clock())
    assert state.refused == "hour"
    first, second = SPEC.bucket(clock() - 120), SPEC.bucket(clock())
    assert state.buckets == ((first, 60), (second, 70))


def test_unenforced_spec_grants_past_the_limit(store: Store, clock: FakeClock) -> None:
    """Without enforcement a reservation is always granted and the state shows the overshoot."""
    spec = BudgetSpec(scope="c", session_limit=10, enforce=False)
    state = store.reserve(spec, Hold("a", "r", 50, clock() + 60), clock())
    assert state.applied
    assert state.session_used == 50


def test_expired_lease_returns_its_tokens(store: Store, clock: FakeClock) -> None:
    """A reservation nobody settles stops counting when its lease ends."""
    store.reserve(SPEC, Hold("a", "r1", 90, clock() + 30), clock())
    clock.advance(29)
    assert store.snapshot(SPEC, "a", clock()).session_held == 90
    clock.advance(1)
    assert store.snapshot(SPEC, "a", clock()).session_held == 0
    assert not store.release(SPEC, "r1", clock())


def test_renew_moves_a_lease_end_later_never_earlier(store: Store, clock: FakeClock) -> None:
    """A renewed hold lasts until its new end; a renewal asking for an earlier end changes
    nothing; a hold no longer held (ended, settled) is not renewed."""
    start = clock()
    store.reserve(SPEC, Hold("a", "r1", 40, start + 30), start)
    clock.advance(20)
    assert store.renew(SPEC, "r1", start + 80, clock())
    clock.advance(20)  # 40 s: past the first end
    assert store.snapshot(SPEC, "a", clock()).session_held == 40
    assert store.renew(SPEC, "r1", start + 50, clock())  # earlier: the end stays at 80
    clock.advance(39)
    assert store.snapshot(SPEC, "a", clock()).session_held == 40
    clock.advance(1)
    assert store.snapshot(SPEC, "a", clock()).session_held == 0
    assert not store.renew(SPEC, "r1", clock() + 60, clock())
    store.reserve(SPEC, Hold("a", "r2", 10, clock() + 30), clock())
    store.commit(SPEC, Charge("a", "r2", "e2", 10, 0), clock())
    assert not store.renew(SPEC, "r2", clock() + 60, clock())
    assert store.snapshot(SPEC, "a", clock()).session_used == 10


def test_usage_leaves_the_window_when_its_bucket_expires(store: Store) -> None:
    """Tokens committed in bucket b count while b is one of the last 60 buckets, then not."""
    clock = FakeClock(1_699_999_980.0 + 30)  # 30 s into a 60 s bucket (1_699_999_980 = 60 * n)
    store.commit(SPEC, Charge("a", "-", "e", 50, 7), clock())
    clock.advance(3599 - 30)  # the window is the last 60 buckets, the current one included
    assert store.snapshot(SPEC, None, clock()).hour_tokens == 50
    clock.advance(1)
    snap = store.snapshot(SPEC, "a", clock())
    assert (snap.hour_tokens, snap.hour_cost) == (0, 0)
    assert snap.session_tokens == 50  # the session budget does not roll


def test_scopes_and_sessions_are_separate(store: Store, clock: FakeClock) -> None:
    """Two scopes never share counters; two sessions of a scope share only the window."""
    other = BudgetSpec(scope="other", session_limit=100, hour_limit=150, enforce=True)
    store.commit(SPEC, Charge("a", "-", "e", 30, 0), clock())
    store.commit(SPEC, Charge("b", "-", "f", 20, 0), clock())
    assert store.snapshot(SPEC, "b", clock()).session_tokens == 20
    assert store.snapshot(SPEC, "b", clock()).hour_tokens == 50
    assert store.snapshot(other, "a", clock()).hour_tokens == 0


def test_event_ids_are_forgotten_after_their_ttl(store: Store, clock: FakeClock) -> None:
    """Idempotency keys expire (no store grows for ever); after that an id counts anew."""
    if isinstance(store, RedisStore):
        pytest.skip("Redis expires keys on its own clock: test_every_redis_key_has_a_ttl")
    spec = BudgetSpec(scope="c", event_ttl=100.0)
    store.commit(spec, Charge("a", "-", "e", 5, 0), clock())
    clock.advance(99)
    assert not store.commit(spec, Charge("a", "-", "e", 5, 0), clock()).applied
    clock.advance(1)
    assert store.commit(spec, Charge("a", "-", "e", 5, 0), clock()).applied


def test_idle_sessions_are_forgotten_after_their_ttl(store: Store, clock: FakeClock) -> None:
    """A session idle for session_ttl loses its counters (no counter lives for ever)."""
    if isinstance(store, RedisStore):
        pytest.skip("Redis expires keys on its own clock: test_every_redis_key_has_a_ttl")
    spec = BudgetSpec(scope="c", session_ttl=600.0)
    store.commit(spec, Charge("a", "-", "e", 5, 0), clock())
    clock.advance(599)
    assert store.snapshot(spec, "a", clock()).session_tokens == 5
    clock.advance(2)
    assert store.snapshot(spec, "a", clock()).session_tokens == 0


def test_placing_the_same_reservation_id_again_replaces_it(store: Store, clock: FakeClock) -> None:
    """A retried reserve with the same id holds once, not twice."""
    store.reserve(SPEC, Hold("a", "r", 30, clock() + 60), clock())
    state = store.reserve(SPEC, Hold("a", "r", 40, clock() + 60), clock())
    assert state.session_held == 40


@pytest.mark.anyio
async def test_async_twins_share_state_with_the_sync_methods(
    store: Store, clock: FakeClock
) -> None:
    """areserve/acommit/arelease/asnapshot/arenew act on the same state as their sync twins."""
    await store.areserve(SPEC, Hold("a", "r1", 30, clock() + 60), clock())
    store.reserve(SPEC, Hold("a", "r2", 30, clock() + 60), clock())
    assert await store.arenew(SPEC, "r2", clock() + 90, clock())
    clock.advance(70)  # past r1's lease and r2's first one
    assert (await store.asnapshot(SPEC, "a", clock())).session_held == 30
    await store.areserve(SPEC, Hold("a", "r1", 30, clock() + 60), clock())
    await store.acommit(SPEC, Charge("a", "r1", "e", 20, 3), clock())
    assert await store.arelease(SPEC, "r2", clock())
    snap = await store.asnapshot(SPEC, "a", clock())
    assert (snap.session_tokens, snap.session_cost, snap.session_held) == (20, 3, 0)
    assert store.snapshot(SPEC, "a", clock()) == snap
    assert not await store.arenew(SPEC, "r2", clock() + 90, clock())
    aclose = getattr(store, "aclose", None)
    if aclose is not None:  # asyncio clients belong to this test's event loop
        await aclose()


def test_two_ledgers_on_one_store_share_one_budget(store: Store, clock: FakeClock) -> None:
    """Workers sharing a store see each other's holds at once (no replica lag)."""
    one = _ledger(store, clock, per_session=100, policy="hard_stop")
    two = _ledger(store, clock, per_session=100, policy="hard_stop")
    one.reserve("s", 60)
    with pytest.raises(BudgetExceeded) as info:
        two.reserve("s", 41)
    assert (info.value.budget, info.value.used, info.value.limit) == ("session", 60, 100)
    assert two.reserve("s", 40).session_used == 100


def test_hour_refusal_says_when_the_window_has_room(store: Store) -> None:
    """BudgetExceeded for the hour carries the time the oldest needed bucket leaves."""
    clock = FakeClock(1_699_999_980.0)  # on a bucket boundary (60 * n)
    ledger = _ledger(store, clock, per_session=None, per_hour=100, policy="hard_stop")
    ledger.commit(ledger.reserve("a", 40), 40)
    clock.advance(300)
    ledger.commit(ledger.reserve("b", 40), 40)
    with pytest.raises(BudgetExceeded) as info:
        ledger.reserve("c", 50)  # needs the first 40 gone: at 1_699_999_980 + 3600
    assert info.value.budget == "hour"
    assert info.value.resets_at == 1_700_003_580.0


def test_store_from_config_builds_each_backend(tmp_path: Path, redis_server: RedisServer) -> None:
    """The storage section names the backend and its options."""
    assert isinstance(store_from_config(StorageConfig()), MemoryStore)
    sqlite = store_from_config(StorageConfig(backend="sqlite", path=str(tmp_path / "x.db")))
    assert isinstance(sqlite, SQLiteStore)
    sqlite.close()
    redis = store_from_config(StorageConfig(backend="redis", url=redis_server.url, key_prefix="p"))
    assert isinstance(redis, RedisStore)
    assert redis.key_prefix == "p"
    redis.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_eight_processes_never_pass_the_cap_and_count_duplicates_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """8 processes race on one budget, each event id committed by two of them: exact totals."""
    scope = f"p{uuid.uuid4().hex[:8]}"
    if kind == "sqlite":
        where = str(tmp_path / "shared.db")
        SQLiteStore(where).close()  # create the schema once, as a deployment would
    else:
        where = request.getfixturevalue("redis_server").url
    limit, rounds = 1_001, 60  # 8 x 60 x 7 = 3,360 tokens asked for, 1,001 allowed
    reports = run_workers(kind, where, scope, workers=8, rounds=rounds, limit=limit)
    events = {(w // 2, i) for w, report in enumerate(reports) for i in report["granted"]}
    store: Store = SQLiteStore(where) if kind == "sqlite" else RedisStore(where, key_prefix=scope)
    spec = BudgetSpec(scope=scope)
    snap = store.snapshot(spec, "shared", wall())
    store.close()
    assert snap.session_tokens == 7 * len(events)  # each distinct event counted exactly once
    assert snap.session_tokens <= limit
    assert snap.session_held == 0  # every hold settled: duplicates released theirs too
    assert sum(r["refused"] for r in reports) > 0  # the cap was actually reached


# -- circuit breakers in the store -----------------------------------------------------------

BREAKER = BreakerSpec("tool:search", min_calls=4, window=60, open_for=30, probe_lease=30)


def test_breaker_opens_on_the_failure_rate_and_answers_at_once(
    store: Store, clock: FakeClock
) -> None:
    """Four failures out of four open it; an open breaker refuses with the probe time."""
    for _ in range(3):
        assert store.breaker_record(BREAKER, "failure", clock()).state == "closed"
    view = store.breaker_record(BREAKER, "failure", clock())
    assert (view.state, view.changes) == ("open", (("closed", "open"),))
    refused = store.breaker_allow(BREAKER, clock())
    assert not refused.allowed
    assert refused.retry_at == clock() + 30


def test_breaker_probes_after_open_for_and_closes_on_success(
    store: Store, clock: FakeClock
) -> None:
    """Open -> half-open after open_for: one probe at a time; its success closes the breaker."""
    for _ in range(4):
        store.breaker_record(BREAKER, "failure", clock())
    clock.advance(30)
    probe = store.breaker_allow(BREAKER, clock())
    assert (probe.allowed, probe.probe, probe.changes) == (True, True, (("open", "half_open"),))
    assert not store.breaker_allow(BREAKER, clock()).allowed  # one probe in flight
    closed = store.breaker_record(BREAKER, "success", clock())
    assert (closed.state, closed.calls, closed.changes) == ("closed", 0, (("half_open", "closed"),))


def test_breaker_probe_failure_reopens_and_ignored_outcomes_do_not_count(
    store: Store, clock: FakeClock
) -> None:
    """Ignored outcomes count neither way; a failed probe opens the breaker again."""
    for _ in range(10):
        store.breaker_record(BREAKER, "ignored", clock())
    assert store.breaker_view(BREAKER, clock()).calls == 0
    for _ in range(4):
        store.breaker_record(BREAKER, "failure", clock())
    clock.advance(31)
    store.breaker_allow(BREAKER, clock())
    view = store.breaker_record(BREAKER, "failure", clock())
    assert (view.state, view.retry_at) == ("open", clock() + 30)


def test_breaker_probe_that_never_reports_lapses(store: Store, clock: FakeClock) -> None:
    """A probe whose worker died stops counting after probe_lease: the next one is let through."""
    for _ in range(4):
        store.breaker_record(BREAKER, "failure", clock())
    clock.advance(30)
    assert store.breaker_allow(BREAKER, clock()).probe
    clock.advance(29)
    assert not store.breaker_allow(BREAKER, clock()).allowed
    clock.advance(1)
    assert store.breaker_allow(BREAKER, clock()).probe


def test_breakers_are_kept_apart_by_name(store: Store, clock: FakeClock) -> None:
    """Two names, two breakers."""
    for _ in range(4):
        store.breaker_record(BREAKER, "failure", clock())
    other = BreakerSpec("tool:other", min_calls=4)
    assert store.breaker_allow(other, clock()).allowed


# -- records: idempotency keys and dead letters ----------------------------------------------


def test_claim_stores_once_and_returns_the_holder(store: Store, clock: FakeClock) -> None:
    """The first claim wins (None); a second sees the first's value until it is replaced."""
    assert store.claim("idem", "k", "first", clock(), 60) is None
    assert store.claim("idem", "k", "second", clock(), 60) == "first"
    store.put("idem", "k", "done", clock(), 60)
    assert store.claim("idem", "k", "third", clock(), 60) == "done"
    assert store.get("idem", "k", clock()) == "done"
    assert store.get("other", "k", clock()) is None


def test_records_list_sorted_and_delete(store: Store, clock: FakeClock) -> None:
    """items lists a namespace's live records by key; delete drops one once."""
    store.put("dead", "b", "2", clock(), 60)
    store.put("dead", "a", "1", clock(), 60)
    store.put("elsewhere", "c", "3", clock(), 60)
    assert store.items("dead", clock()) == [("a", "1"), ("b", "2")]
    assert store.delete("dead", "a", clock())
    assert not store.delete("dead", "a", clock())
    assert store.items("dead", clock()) == [("b", "2")]


def test_records_expire_after_their_ttl(store: Store, clock: FakeClock) -> None:
    """A record lives for its TTL; then a claim succeeds anew."""
    if isinstance(store, RedisStore):
        pytest.skip("Redis expires keys on its own clock: test_every_tool_key_has_a_ttl")
    store.claim("idem", "k", "v", clock(), 10)
    clock.advance(9)
    assert store.get("idem", "k", clock()) == "v"
    clock.advance(1)
    assert store.get("idem", "k", clock()) is None
    assert store.items("idem", clock()) == []
    assert store.claim("idem", "k", "w", clock(), 10) is None


@pytest.mark.anyio
async def test_async_breaker_and_record_twins(store: Store, clock: FakeClock) -> None:
    """The a* twins of the breaker and record operations share state with the sync ones."""
    for _ in range(4):
        await store.abreaker_record(BREAKER, "failure", clock())
    assert not store.breaker_allow(BREAKER, clock()).allowed
    assert (await store.abreaker_view(BREAKER, clock())).state == "open"
    assert not (await store.abreaker_allow(BREAKER, clock())).allowed
    assert await store.aclaim("idem", "k", "v", clock(), 60) is None
    await store.aput("idem", "j", "w", clock(), 60)
    assert await store.aget("idem", "k", clock()) == "v"
    assert await store.aitems("idem", clock()) == [("j", "w"), ("k", "v")]
    assert await store.adelete("idem", "k", clock())
    aclose = getattr(store, "aclose", None)
    if aclose is not None:
        await aclose()


@pytest.mark.redis
def test_every_tool_key_has_a_ttl(redis_server: RedisServer, clock: FakeClock) -> None:
    """Breaker and record keys the Redis store writes all carry an expiry."""
    import redis

    store = RedisStore(redis_server.url, key_prefix="tooltll")
    store.breaker_record(BREAKER, "failure", clock())
    store.claim("idem", "k", "v", clock(), 60)
    store.put("dead", "x", "y", clock(), 60)
    client = redis.Redis(unix_socket_path=redis_server.socket)
    keys = list(client.scan_iter("tooltll*"))
    assert len(keys) == 5  # a breaker, two records, two indexes
    assert all(client.pttl(k) > 0 for k in keys), {k: client.pttl(k) for k in keys}
    client.close()
    store.close()


def _clients(admin: Any, *, settled_at: int) -> int:
    """Redis's count of connected clients, once it is down to ``settled_at``: Redis notices a
    closed connection in its own time, so it is asked again (a bounded number of times)."""
    count = len(admin.client_list())
    for _ in range(1000):
        if count <= settled_at:
            break
        count = len(admin.client_list())
    return count


@pytest.mark.redis
def test_async_clients_close_with_their_event_loop(redis_server: RedisServer) -> None:
    """A worker running ``asyncio.run`` per request on one store (a sync web view, a Celery task)
    holds the connections of one run at a time: each loop's asyncio client closes when the loop
    shuts down, and the loop goes. It used to keep every loop, its client and its connection."""
    import redis

    admin = redis.Redis(unix_socket_path=redis_server.socket)
    store = RedisStore(redis_server.url, key_prefix="perloop")
    ledger = TokenLedger(TokenBudgetConfig(per_session=10**9, scope="perloop"), store=store)
    before = len(admin.client_list())
    during: list[int] = []
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one_request(i: int) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        held = await ledger.areserve(f"s{i}", 10, max_output_tokens=10)
        await ledger.acommit(held, 10)
        during.append(len(admin.client_list()))

    for i in range(100):
        asyncio.run(one_request(i))
    gc.collect()
    after = _clients(admin, settled_at=before)
    admin.close()
    ledger.close()
    assert set(during) == {before + 1}  # each run had its connection ...
    assert after == before  # ... and closed it
    assert not any(loop() for loop in loops)


@pytest.mark.redis
@pytest.mark.filterwarnings("ignore::ResourceWarning")  # sockets of loops closed, not shut down
def test_async_clients_of_loops_closed_bare_are_dropped(redis_server: RedisServer) -> None:
    """A loop closed without shutting down (``loop.close()`` alone) cannot close its client:
    the store drops it when the next loop first uses the store, and its sockets close as they
    are collected. At most the last such loop is kept."""
    import redis

    admin = redis.Redis(unix_socket_path=redis_server.socket)
    store = RedisStore(redis_server.url, key_prefix="bareloop")
    before = len(admin.client_list())
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    for _ in range(20):
        loop = asyncio.new_event_loop()
        loops.append(weakref.ref(loop))
        loop.run_until_complete(store.aget("ns", "k", 0.0))
        loop.close()
    del loop
    gc.collect()
    kept = sum(1 for loop in loops if loop() is not None)
    asyncio.run(store.aget("ns", "k", 0.0))  # drops the last one, and closes with its loop
    gc.collect()
    after = _clients(admin, settled_at=before)
    admin.close()
    store.close()
    assert kept <= 1
    assert after == before
    assert not any(loop() for loop in loops)


class BreakerAgreement(RuleBasedStateMachine):
    """Random calls, outcomes and time: a store-backed breaker moves exactly like a local one."""

    store: Store

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        options: dict[str, Any] = {
            "min_calls": 3, "window": 10, "buckets": 5, "open_for": 5, "half_open_probes": 2,
            "probe_lease": 4, "clock": self.clock, "hooks": (),
        }  # fmt: skip
        name = f"m{uuid.uuid4().hex[:8]}"
        self.local = CircuitBreaker(name, **options)
        self.shared = CircuitBreaker(name, store=self.store, **options)

    @rule(op=st.sampled_from(["allow", "success", "failure", "client_error", "ignored"]))
    def act(self, op: str) -> None:
        for breaker in (self.local, self.shared):
            if op == "allow":
                breaker.allow()
            elif op == "success":
                breaker.record_success()
            elif op == "ignored":
                breaker.record_ignored()
            else:
                kind = ErrorClass.CLIENT_ERROR if op == "client_error" else ErrorClass.TRANSIENT
                breaker.record_failure(Classification.of(kind))

    @rule(quarters=st.integers(min_value=0, max_value=40))
    def wait(self, quarters: int) -> None:
        self.clock.advance(quarters / 4)  # exact binary fractions: no rounding anywhere

    @invariant()
    def agree(self) -> None:
        assert self.local.allow() == self.shared.allow()
        assert self.local.snapshot() == self.shared.snapshot()


def test_store_breakers_follow_the_local_state_machine(store: Store) -> None:
    """Hypothesis state machine: each store's breaker (Redis: the Lua script) agrees with memory."""
    machine = type("Machine", (BreakerAgreement,), {"store": store})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=25, stateful_step_count=30, deadline=None)
    )


# -- the outage policy (FallbackStore), shared by the ledger and ToolGuard ------------------------


class _Flaky(MemoryStore):
    """A MemoryStore that can be taken down: every operation then fails as an unreachable server."""

    down = False


def _failing_when_down(name: str) -> Any:
    op = getattr(MemoryStore, name)

    def guarded(self: _Flaky, *args: Any) -> Any:
        if self.down:
            raise StoreUnavailable("connection refused")
        return op(self, *args)

    return guarded


for _op in ("reserve", "commit", "release", "snapshot", "breaker_allow", "breaker_record"):
    setattr(_Flaky, _op, _failing_when_down(_op))
for _op in ("breaker_view", "claim", "put", "get", "items", "delete"):
    setattr(_Flaky, _op, _failing_when_down(_op))


def test_ledger_outage_serves_locally_and_replays_commits_once() -> None:
    """Down: served locally, said once; back after retry_seconds: commits replayed, said so."""
    clock, store = FakeClock(), _Flaky()
    config = GuardConfig(
        token_budget=TokenBudgetConfig(max_output_tokens=None),
        storage=StorageConfig(retry_seconds=5),
    )
    ledger = TokenLedger(config, store=store, clock=clock)
    ledger.commit(ledger.reserve("s", 10), 10, event_id="before")
    store.down = True
    with capture_events() as events:
        ledger.commit(ledger.reserve("s", 5), 5, event_id="during")
        ledger.commit(ledger.reserve("s", 5), 5, event_id="during")  # a duplicate: not replayed
        # local state starts from the last known state: never a fresh budget
        assert ledger.usage("s").session_tokens == 15
    assert len(events.of_type(StoreFallback)) == 1
    assert ledger.degraded
    store.down = False
    clock.advance(4)
    assert ledger.degraded  # not retried before retry_seconds
    assert ledger.usage("s").session_tokens == 15
    clock.advance(2)
    with capture_events() as events:
        assert ledger.usage("s").session_tokens == 15
    [recovered] = events.of_type(StoreRecovered)
    assert (recovered.resynced, recovered.outage_seconds) == (1, 6)
    assert not ledger.degraded


@pytest.mark.anyio
async def test_async_ledger_outage_follows_the_same_policy() -> None:
    """The async twins fall back and re-sync exactly as the sync ones do."""
    clock, store = FakeClock(), _Flaky()
    config = GuardConfig(storage=StorageConfig(retry_seconds=5))
    ledger = TokenLedger(config, store=store, clock=clock)
    store.down = True
    await ledger.acommit(await ledger.areserve("s", 7), 7, event_id="e")
    assert ledger.degraded
    store.down = False
    clock.advance(5)
    assert (await ledger.ausage("s")).session_tokens == 7
    assert not ledger.degraded
    assert (await store.asnapshot(ledger.spec, "s", clock())).session_tokens == 7


def test_toolguard_follows_the_ledgers_outage_policy() -> None:
    """ToolGuard on a store that goes down: idempotency and dead letters served locally, the
    dead letter written to the shared store once it returns."""
    clock, store = FakeClock(), _Flaky()
    config = GuardConfig.from_dict(
        {"storage": {"retry_seconds": 5}, "tools": {"retry": {"max_attempts": 1}}}, env={}
    )
    tools = ToolGuard(config, store=store, clock=clock, sleep=clock.sleep)
    sent: list[str] = []

    @tools.tool(side_effecting=True)
    def send(text: str) -> str:
        sent.append(text)
        return "sent"

    @tools.tool
    def flaky() -> str:
        raise ConnectionError("reset")

    store.down = True
    with capture_events() as events:
        assert tools.call("send", {"text": "hi"}).ok
        assert tools.call("send", {"text": "hi"}).replayed  # the local key still holds
        assert not tools.call("flaky", {}).ok
    assert sent == ["hi"]
    assert len(events.of_type(StoreFallback)) == 1
    assert [d.tool for d in tools.dead_letters()] == ["flaky"]  # served locally meanwhile
    store.down = False
    clock.advance(5)
    with capture_events() as events:
        letters = tools.dead_letters()
    assert [d.tool for d in letters] == ["flaky"]
    assert events.of_type(StoreRecovered)
    shared = store.items("dead_letters:default", clock())  # replayed into the shared store
    assert [DeadLetter.from_json(text).tool for _, text in shared] == ["flaky"]


def test_fail_closed_raises_and_memory_needs_no_wrapper() -> None:
    """fail_mode closed: the outage is raised; a plain MemoryStore is never wrapped."""
    store = _Flaky()
    assert with_fallback(store, fail_mode="closed") is store
    plain = MemoryStore()
    assert with_fallback(plain) is plain
    store.down = True
    ledger = TokenLedger(
        GuardConfig(storage=StorageConfig(fail_mode="closed")), store=store, clock=FakeClock()
    )
    with pytest.raises(StoreUnavailable):
        ledger.reserve("s", 1)
    tools = ToolGuard(GuardConfig(storage=StorageConfig(fail_mode="closed")), store=store)
    tools.register(lambda: "x", name="noop", side_effecting=True)
    with pytest.raises(StoreUnavailable):
        tools.call("noop", {})
