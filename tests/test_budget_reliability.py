"""Budgets under concurrency, outages and dead processes, on real SQLite and real Redis.

The promises of docs/reliability.md ("Budgets"): totals exact, ``hard_stop`` never overshot
(beyond the documented bound), nothing lost — with 1,000 asyncio tasks, 16 processes opening a
new SQLite file at once, a store outage mid-run and a process killed with SIGKILL while it holds
reservations. Also the learned reservation, untrusted numbers and abandoned async streams.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

import agentguard as ag
from _hostile import (
    MESSAGES,
    STREAM_CONFIG,
    RawUpstream,
    bulk,
    cases,
    chunk,
    guarded_client,
    seeds,
    sse,
)
from _stores import SRC, RedisServer
from agentguard.budget import InvalidTokenCount
from agentguard.config import GuardConfig, StorageConfig, TokenBudgetConfig
from agentguard.events import StoreFallback, UsageCorrected
from agentguard.storage import FallbackStore, MemoryStore, RedisStore, SQLiteStore
from agentguard.storage._base import MAX_TOKENS
from agentguard.testing import FakeClock, capture_events


def _config(limit: int | None, **budget: Any) -> TokenBudgetConfig:
    return TokenBudgetConfig(
        **{
            "per_session": limit,
            "per_hour": None,
            "max_output_tokens": None,
            "policy": "hard_stop",
            **budget,
        }
    )


# -- 16 processes open a brand-new SQLite file at the same instant ------------------------------


def _first_open_worker(path: str, barrier: Any, results: Any, rounds: int, limit: int) -> None:
    from agentguard import BudgetExceeded
    from agentguard.budget import TokenLedger

    barrier.wait()  # every process opens the (new) file at once
    try:
        ledger = TokenLedger(_config(limit), store=SQLiteStore(path))
        granted = 0
        for _ in range(rounds):
            try:
                res = ledger.reserve("shared", 7)
            except BudgetExceeded:
                continue
            ledger.commit(res, 7)
            granted += 1
        results.put(("ok", granted))
    except BaseException as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def test_16_processes_opening_a_new_sqlite_file_at_once(tmp_path: Path) -> None:
    """No process fails at start-up; committed totals exact; the hard_stop holds."""
    # fork: each child starts at once with agentguard already imported (spawn would spend
    # seconds re-importing the test module in 16 processes on a small machine)
    ctx = multiprocessing.get_context("fork")
    workers, rounds, limit = 16, 20, 7 * 200  # 320 wanted, 200 fit
    path = str(tmp_path / "new.db")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(target=_first_open_worker, args=(path, barrier, results, rounds, limit))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [kind for kind, _ in outcomes] == ["ok"] * workers, outcomes
    granted = sum(n for _, n in outcomes)
    assert granted == limit // 7  # every token the budget has, and not one more
    store = SQLiteStore(path)
    ledger = ag.TokenLedger(_config(limit), store=store)
    assert ledger.usage("shared").session_tokens == granted * 7
    store.close()


def test_sqlite_first_open_retries_a_locked_file_on_the_injected_sleep(tmp_path: Path) -> None:
    """The file is locked when the store opens: it waits (injected sleep), never raises."""
    path = str(tmp_path / "locked.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 1:
            holder.execute("COMMIT")  # the other process is done

    store = SQLiteStore(path, busy_timeout=0.01, sleep=sleep)
    assert len(slept) == 1
    ledger = ag.TokenLedger(_config(100), store=store)
    ledger.commit(ledger.reserve("s", 10), 10)
    assert ledger.usage("s").session_tokens == 10
    store.close()
    holder.close()


def test_sqlite_locked_past_every_retry_opens_and_sets_up_on_first_use(tmp_path: Path) -> None:
    """Still locked after the retries: the constructor returns; the first operation is the
    outage (StoreUnavailable, so fail_mode applies); once free, the schema is created."""
    path = str(tmp_path / "busy.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    store = SQLiteStore(path, busy_timeout=0.01, sleep=lambda _: None)
    with pytest.raises(ag.StoreUnavailable):
        store.snapshot(ag.TokenLedger(_config(100)).spec, "s", 0.0)
    holder.execute("COMMIT")
    ledger = ag.TokenLedger(_config(100), store=store)
    ledger.commit(ledger.reserve("s", 10), 10)
    assert ledger.usage("s").session_tokens == 10
    store.close()
    holder.close()


# -- outages: the local stand-in starts from the last known state -------------------------------


def test_sqlite_lock_wait_past_busy_timeout_keeps_hard_stop(tmp_path: Path) -> None:
    """Another process holds the write lock past busy_timeout: a spent session stays refused."""
    path = str(tmp_path / "wait.db")
    store = SQLiteStore(path, busy_timeout=0.05)
    ledger = ag.TokenLedger(
        GuardConfig(token_budget=_config(100), storage=StorageConfig(retry_seconds=5)),
        store=store,
        clock=FakeClock(),
    )
    ledger.commit(ledger.reserve("s", 60), 60)
    held = ledger.reserve("s", 30)  # in flight when the lock wait starts
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    with capture_events() as events, pytest.raises(ag.BudgetExceeded):
        ledger.reserve("s", 20)  # 60 committed + 30 held + 20 > 100
    assert events.of_type(StoreFallback)
    assert ledger.degraded
    ledger.commit(held, 30)  # settles the seeded hold locally: counted once, not twice
    snap = ledger.usage("s")
    assert (snap.session_tokens, snap.session_reserved) == (90, 0)
    ledger.reserve("s", 10)  # exactly what is left
    with pytest.raises(ag.BudgetExceeded):
        ledger.reserve("s", 1)
    holder.execute("COMMIT")
    holder.close()
    store.close()


def test_the_fallback_seeds_the_hour_and_other_sessions() -> None:
    """The hourly total last seen (all sessions) carries into the outage too."""

    class Flaky(MemoryStore):
        down = False

        def reserve(self, *a: Any) -> Any:
            if self.down:
                raise ag.StoreUnavailable("down")
            return super().reserve(*a)

        def snapshot(self, *a: Any) -> Any:
            if self.down:
                raise ag.StoreUnavailable("down")
            return super().snapshot(*a)

    store = Flaky()
    config = _config(None, per_hour=1_000)
    fallback = FallbackStore(store)
    ledger = ag.TokenLedger(config, store=store, clock=FakeClock())
    ledger._store = fallback  # the plain MemoryStore is never wrapped: force the policy
    for i in range(9):
        ledger.commit(ledger.reserve(f"s{i}", 100), 100)
    store.down = True
    with pytest.raises(ag.BudgetExceeded):
        ledger.reserve("never-seen", 200)  # 900 of the hour's 1,000 were spent
    ledger.reserve("never-seen", 100)


@pytest.mark.redis
def test_1000_tasks_with_a_redis_outage_mid_run(redis_server: RedisServer) -> None:
    """Redis stops answering mid-run (SIGSTOP): no overshoot; after it returns, exact totals."""
    tasks, hold, limit = 1_000, 60, 50_000
    clock = FakeClock()
    # A timeout long enough that a busy machine's stalls are not taken for the outage: a call
    # that times out on a live server may have been applied, and such a call is ambiguous.
    store = RedisStore(redis_server.url, key_prefix="reliability-outage", timeout=2.0)
    config = GuardConfig(token_budget=_config(limit), storage=StorageConfig(retry_seconds=5))
    ledger = ag.TokenLedger(config, store=store, clock=clock)
    pid = redis_server.process.pid if redis_server.process is not None else 0
    committed = 0

    async def one(i: int) -> bool:
        nonlocal committed
        try:
            res = await ledger.areserve("shared", hold)
        except ag.BudgetExceeded:
            return False
        await asyncio.sleep(0)
        await ledger.acommit(res, hold)
        committed += 1
        if committed == 300:
            os.kill(pid, signal.SIGSTOP)  # the server hangs: every call now times out
        return True

    async def main() -> list[bool]:
        try:
            return await asyncio.gather(*(one(i) for i in range(tasks)))
        finally:
            await store.aclose()

    try:
        granted = sum(asyncio.run(main()))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ledger.degraded
    assert granted * hold <= limit, f"{granted * hold} admitted under {limit}"
    assert ledger.usage("shared").session_tokens == granted * hold  # local view: exact
    # the resumed server first works through the connections and calls the timed-out ones
    # left queued (its accept backlog may be full for a moment): wait until it answers a PING
    # on a blocking read, retrying a refused connect (no sleep), then let the ledger retry
    import redis

    probe = redis.Redis.from_url(redis_server.url, socket_timeout=60)
    for _ in range(1_000_000):
        try:
            probe.ping()
            break
        except redis.ConnectionError:
            continue
    probe.close()
    for _ in range(20):
        clock.advance(6)
        ledger.usage("shared")  # the store answers again: the outage's commits are replayed
        if not ledger.degraded:
            break
    assert not ledger.degraded
    shared = store.snapshot(ledger.spec, "shared", clock())
    assert shared.session_tokens == granted * hold  # nothing lost, nothing counted twice
    store.close()


# -- operations in flight when the shared store goes away -----------------------------------------


class _Gated(MemoryStore):
    """A shared store that applies an operation, then answers it only when its gate opens (a reply
    still on its way); once ``down``, every new operation is unreachable."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.gates: dict[str, asyncio.Event] = {}

    async def _answer(self, key: str, result: Any) -> Any:
        gate = self.gates.get(key)
        if gate is not None:
            await gate.wait()
        return result

    def _check(self) -> None:
        if self.down:
            raise ag.StoreUnavailable("down")

    async def areserve(self, spec: Any, hold: Any, now: float) -> Any:
        self._check()
        return await self._answer(hold.id, self.reserve(spec, hold, now))

    async def acommit(self, spec: Any, charge: Any, now: float) -> Any:
        self._check()
        return await self._answer(charge.event_id, self.commit(spec, charge, now))

    async def arelease(self, spec: Any, rid: str, now: float) -> Any:
        self._check()
        return await self._answer("release:" + rid, self.release(spec, rid, now))

    async def asnapshot(self, spec: Any, session: Any, now: float) -> Any:
        self._check()
        return self.snapshot(spec, session, now)


def _spec(limit: int) -> Any:
    from agentguard.storage._base import BudgetSpec

    return BudgetSpec(scope="in-flight", session_limit=limit, enforce=True)


def test_a_reservation_in_flight_when_the_store_goes_away_is_held_locally() -> None:
    """The shared store placed A's hold but its answer is still on the way when B's call finds
    the store gone: the local stand-in counts A's hold, so B cannot take the same tokens (before,
    both were granted: 120 of a 100-token session)."""
    from agentguard.storage._base import Hold

    async def main() -> None:
        primary = _Gated()
        fallback = FallbackStore(primary)
        spec = _spec(100)
        primary.gates["a"] = gate = asyncio.Event()
        a = asyncio.ensure_future(fallback.areserve(spec, Hold("s", "a", 60, 1e9), 1.0))
        await asyncio.sleep(0)  # A's hold is placed in the shared store; its answer waits
        primary.down = True
        b = await fallback.areserve(spec, Hold("s", "b", 60, 1e9), 1.0)
        assert fallback.degraded
        assert b.refused == "session"
        gate.set()
        assert (await a).applied
        local = await fallback.asnapshot(spec, "s", 1.0)
        assert (local.session_tokens, local.session_held) == (0, 60)

    asyncio.run(main())


def test_answers_arriving_during_an_outage_reach_the_local_stand_in() -> None:
    """A commit, a release and a refusal the shared store answers after the fallback began are
    applied to the local stand-in too: its totals stay exact (before, the committed tokens were
    missing and the settled holds stayed held)."""
    from agentguard.storage._base import Charge, Hold

    async def main() -> None:
        primary = _Gated()
        fallback = FallbackStore(primary)
        spec = _spec(100)
        for rid in ("a", "b"):
            assert (await fallback.areserve(spec, Hold("s", rid, 40, 1e9), 1.0)).applied
        primary.gates["ev-a"] = commit_gate = asyncio.Event()
        primary.gates["release:b"] = release_gate = asyncio.Event()
        primary.gates["c"] = refusal_gate = asyncio.Event()
        commit = asyncio.ensure_future(fallback.acommit(spec, Charge("s", "a", "ev-a", 30, 0), 1.0))
        release = asyncio.ensure_future(fallback.arelease(spec, "b", 1.0))
        refused = asyncio.ensure_future(fallback.areserve(spec, Hold("s", "c", 71, 1e9), 1.0))
        await asyncio.sleep(0)  # all three applied in the shared store, answers on the way
        primary.down = True
        seeded = await fallback.asnapshot(spec, "s", 1.0)
        assert fallback.degraded
        assert (seeded.session_tokens, seeded.session_held) == (0, 151)
        for gate in (commit_gate, release_gate, refusal_gate):
            gate.set()
        assert (await commit).applied
        assert await release
        assert (await refused).refused
        local = await fallback.asnapshot(spec, "s", 1.0)
        assert (local.session_tokens, local.session_held) == (30, 0)
        assert (await fallback.areserve(spec, Hold("s", "d", 70, 1e9), 1.0)).applied

    asyncio.run(main())


def test_an_answer_the_stand_in_started_from_is_not_counted_twice() -> None:
    """Answers may arrive out of order: the store applied A's commit, then B's, but B's answer
    (whose total includes A) came first and is what the fallback starts from. A's late answer
    is then already counted; a commit the starting total does not include is counted once."""
    from agentguard.storage._base import Charge, Hold

    async def main() -> None:
        primary = _Gated()
        fallback = FallbackStore(primary)
        spec = _spec(1_000)
        for rid in ("a", "b", "c"):
            assert (await fallback.areserve(spec, Hold("s", rid, 100, 1e9), 1.0)).applied
        primary.gates["ev-a"] = a_gate = asyncio.Event()
        primary.gates["ev-c"] = c_gate = asyncio.Event()
        a = asyncio.ensure_future(fallback.acommit(spec, Charge("s", "a", "ev-a", 10, 0), 1.0))
        await asyncio.sleep(0)
        assert (await fallback.acommit(spec, Charge("s", "b", "ev-b", 20, 0), 1.0)).applied
        c = asyncio.ensure_future(fallback.acommit(spec, Charge("s", "c", "ev-c", 40, 0), 1.0))
        await asyncio.sleep(0)
        primary.down = True
        seeded = await fallback.asnapshot(spec, "s", 1.0)  # 30 seen (A and B), A and C held
        assert (seeded.session_tokens, seeded.session_held) == (30, 200)
        a_gate.set()
        c_gate.set()
        assert (await a).applied
        assert (await c).applied
        local = await fallback.asnapshot(spec, "s", 1.0)
        assert (local.session_tokens, local.session_held) == (70, 0)
        assert local.session_tokens == primary.snapshot(spec, "s", 1.0).session_tokens

    asyncio.run(main())


# -- kill -9 of a process holding reservations --------------------------------------------------

HOLDER = """
import sys
sys.path.insert(0, {src!r})
from agentguard.budget import TokenLedger
from agentguard.config import TokenBudgetConfig
from agentguard.storage import RedisStore, SQLiteStore
kind, where = sys.argv[1:3]
store = SQLiteStore(where) if kind == "sqlite" else RedisStore(where, key_prefix="kill9")
config = TokenBudgetConfig(per_session=100, per_hour=None, max_output_tokens=None,
                           policy="hard_stop", lease_seconds=600)
ledger = TokenLedger(config, store=store)
ledger.commit(ledger.reserve("s", 10), 10)
held = [ledger.reserve("s", 30) for _ in range(3)]  # 90 held: the session is full
print("ready", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "sqlite":
        yield "sqlite", str(tmp_path / "kill.db")
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield "redis", server.url


def test_kill_9_of_a_process_holding_reservations(shared_store: tuple[str, str]) -> None:
    """Its commit counted exactly once; its holds block until their lease ends, then return."""
    kind, where = shared_store
    code = HOLDER.format(src=SRC)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, kind, where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stdin.close()
    store: Any = SQLiteStore(where) if kind == "sqlite" else RedisStore(where, key_prefix="kill9")
    now = time.time()  # noqa: TID251 - the dead process's leases were taken on the wall clock
    clock = FakeClock(now)
    ledger = ag.TokenLedger(_config(100, lease_seconds=600), store=store, clock=clock)
    snap = ledger.usage("s")
    assert (snap.session_tokens, snap.session_reserved) == (10, 90)
    with pytest.raises(ag.BudgetExceeded):
        ledger.reserve("s", 1)  # the dead process's holds still count: no overshoot
    clock.advance(601)
    snap = ledger.usage("s")
    assert (snap.session_tokens, snap.session_reserved) == (10, 0)  # the lease freed them
    ledger.commit(ledger.reserve("s", 90), 90)
    assert ledger.usage("s").session_tokens == 100
    store.close()


# -- no false refusals: the learned hold ----------------------------------------------------------


def test_learned_reservation_holds_the_observed_output_and_checks_the_worst_case() -> None:
    """After short answers a call holds about what they used, yet is admitted only if its
    whole worst case (prompt + cap) fits."""
    ledger = ag.TokenLedger(
        _config(10_000, max_output_tokens=4_000, reserve_floor=100), clock=FakeClock()
    )
    for _ in range(20):
        res = ledger.reserve("s", 10, model="m")
        ledger.commit(res, ag.Usage(10, 120))
    res = ledger.reserve("s", 10, model="m")
    assert res.output_tokens == 4_000  # what the call may use (its max_tokens)
    assert res.tokens == 10 + 120  # what is held: the learned 95th percentile
    ledger.release(res)
    used = ledger.usage("s").session_tokens  # 20 x 130 = 2,600
    assert used == 2_600
    # 10,000 - 2,600 = 7,400 left: a second concurrent call fits (130 + 4,010 <= 7,400 - 130)
    first = ledger.reserve("s", 10, model="m")
    second = ledger.reserve("s", 10, model="m")
    # a worst case that no longer fits is refused, even though its hold would fit
    ledger.commit(first, ag.Usage(10, 3_500))
    with pytest.raises(ag.BudgetExceeded):
        ledger.reserve("s", 10, model="m")  # 6,110 + 130 held + 4,010 > 10,000
    ledger.release(second)


def test_strict_reservation_holds_the_whole_cap() -> None:
    """``reserve: strict`` holds prompt + cap, whatever was observed."""
    ledger = ag.TokenLedger(
        _config(10_000, max_output_tokens=4_000, reserve="strict"), clock=FakeClock()
    )
    for _ in range(5):
        ledger.commit(ledger.reserve("s", 10, model="m"), ag.Usage(10, 120))
    res = ledger.reserve("s", 10, model="m")
    assert (res.tokens, res.output_tokens) == (4_010, 4_000)


def test_a_cold_model_holds_a_few_floors_at_most_the_cap() -> None:
    """Before a model's first answer, a learned hold is four floors (capped)."""
    ledger = ag.TokenLedger(_config(None, max_output_tokens=4_000), clock=FakeClock())
    assert ledger.reserve("s", 0, model="new").tokens == 4 * 256
    small = ag.TokenLedger(_config(None, max_output_tokens=300), clock=FakeClock())
    assert small.reserve("s", 0, model="new").tokens == 300


# -- untrusted numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, 1.5, True, MAX_TOKENS + 1])
def test_a_callers_absurd_number_is_a_typed_error(bad: Any) -> None:
    """``reserve(s, nan)`` and friends: InvalidTokenCount (an AgentGuardError and a ValueError);
    nothing held."""
    ledger = ag.TokenLedger(_config(100), clock=FakeClock())
    with pytest.raises(InvalidTokenCount) as caught:
        ledger.reserve("s", bad)
    assert isinstance(caught.value, ag.AgentGuardError)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(InvalidTokenCount):
        ledger.reserve("s", 1, max_output_tokens=bad)
    res = ledger.reserve("s", 10)
    if bad != MAX_TOKENS + 1:  # a huge commit is counted, clamped (the call happened)
        with pytest.raises(InvalidTokenCount):
            ledger.commit(res, bad)
    assert ledger.usage("s").session_reserved in (0, 10)
    assert ledger.usage("s").session_tokens == 0


def test_a_huge_caller_commit_is_counted_clamped_and_said() -> None:
    """Usage of 10^20 (the call happened): counted as MAX_TOKENS, with an event."""
    ledger = ag.TokenLedger(_config(None), clock=FakeClock())
    with capture_events() as events:
        settled = ledger.commit(ledger.reserve("s", 10), 10**20)
    assert settled.usage.total_tokens == MAX_TOKENS
    assert ledger.usage("s").session_tokens == MAX_TOKENS
    assert events.of_type(UsageCorrected)


@pytest.mark.parametrize(
    ("usage", "counted"),
    [
        (ag.Usage(-500, -500), (10, 0)),
        (ag.Usage(10, -5), (10, 0)),
        (ag.Usage(float("nan"), 5), (10, 5)),  # type: ignore[arg-type]
        (ag.Usage(10, float("inf")), (10, 0)),  # type: ignore[arg-type]
        (ag.Usage(10, 2.5), (10, 0)),  # type: ignore[arg-type]
        (ag.Usage(10**20, 5), (MAX_TOKENS, 0)),
    ],
)
def test_an_upstreams_absurd_usage_is_replaced_by_the_estimate(
    usage: ag.Usage, counted: tuple[int, int]
) -> None:
    """Each absurd part becomes the reservation's estimate (or the maximum); an event says so."""
    ledger = ag.TokenLedger(_config(None), clock=FakeClock())
    with capture_events() as events:
        settled = ledger.commit(ledger.reserve("s", 10), usage)
    assert (settled.usage.prompt_tokens, settled.usage.completion_tokens) == counted
    assert settled.usage.estimated
    assert ledger.usage("s").session_tokens == sum(counted)
    assert events.of_type(UsageCorrected)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_stores_clamp_what_they_count(kind: str, tmp_path: Path, request: Any) -> None:
    """A store handed a huge charge directly clamps it (never raises, never drops it)."""
    from agentguard.storage._base import Charge, Hold

    if kind == "sqlite":
        store: Any = SQLiteStore(str(tmp_path / "clamp.db"))
    else:
        store = RedisStore(request.getfixturevalue("redis_server").url, key_prefix="clamp")
    spec = ag.TokenLedger(_config(None)).spec
    store.reserve(spec, Hold("s", "r", 10**20, 100.0), 1.0)
    state = store.commit(spec, Charge("s", "r", "e", 10**20, 10**30), 1.0)
    assert state.session_tokens == MAX_TOKENS
    assert state.applied
    store.close()


# -- abandoned async streams (the configuration of the sync twins in test_hostile_budget) ------------


@pytest.mark.parametrize("how", ["aclose", "break"])
def test_an_abandoned_async_stream_settles_what_was_streamed(how: str) -> None:
    """``ag.wrap`` on an async client: a stream closed after one chunk releases its hold and
    counts what it delivered."""
    ledger = ag.TokenLedger(STREAM_CONFIG, store=MemoryStore(), clock=FakeClock())
    body = sse([chunk({"content": "hello "}) for _ in range(5)] + [chunk({}, finish="stop")])
    upstream = RawUpstream([(200, "text/event-stream", body)])
    client = guarded_client(upstream, STREAM_CONFIG, ledger=ledger, asynchronous=True)

    async def main() -> None:
        with ag.session("s"):
            stream = await client.chat.completions.create(
                model="fast", messages=MESSAGES, stream=True
            )
            if how == "aclose":
                chunks = stream.__aiter__()
                await chunks.__anext__()
                await stream.close()
                await chunks.aclose()
            else:
                async with stream:
                    async for _ in stream:
                        break

    asyncio.run(main())
    gc.collect()
    snap = ledger.usage("s")
    assert snap.session_reserved == 0
    assert snap.session_tokens > 0


@pytest.mark.parametrize("asynchronous", [False, True])
def test_guard_stream_closed_mid_answer_settles(asynchronous: bool) -> None:
    """The core ``Guard.stream`` / ``AsyncGuard.astream`` (no adapter): closed after one chunk,
    the hold is settled."""
    from agentguard.testing import Reply, ScriptedModel
    from agentguard.transport import ModelRequest

    ledger = ag.TokenLedger(STREAM_CONFIG, store=MemoryStore(), clock=FakeClock())
    model = ScriptedModel([Reply(content="one two three four five six " * 4)], chunk_size=4)
    request = ModelRequest(model="fast", messages=MESSAGES)
    clock = FakeClock()
    if asynchronous:
        aguard = ag.AsyncGuard(model, STREAM_CONFIG, clock=clock, sleep=clock.asleep, ledger=ledger)

        async def main() -> None:
            astream = aguard.astream(request, session="s")
            await astream.__anext__()
            await astream.aclose()

        asyncio.run(main())
    else:
        guard = ag.Guard(model, STREAM_CONFIG, clock=clock, sleep=clock.sleep, ledger=ledger)
        stream = guard.stream(request, session="s")
        next(stream)
        stream.close()
    snap = ledger.usage("s")
    assert snap.session_reserved == 0
    assert snap.session_tokens > 0


def test_the_replay_meets_its_goals() -> None:
    """benchmarks/bench_budget_replay.py, small: no refusal under half the cap with learned
    holds (strict refuses there at 128 in flight), no overshoot with strict, at most one
    request's output with learned."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_budget_replay as bench

    learned = bench.replay("learned", 128, 2_000_000, calls=3_000)
    strict = bench.replay("strict", 128, 2_000_000, calls=3_000)
    assert learned["false_refusals"] == 0
    assert learned["overshoot"] <= learned["largest_output"]
    assert strict["overshoot"] == 0
    assert strict["false_refusals"] > 0  # the problem the learned hold solves


def test_the_fallback_forgets_holds_whose_lease_ended() -> None:
    """Holds nobody settles are dropped from the remembered state once their lease is over, so
    it stays bounded; live ones are kept."""
    from agentguard.storage._base import Hold
    from agentguard.storage._fallback import _PRUNE_AT

    fallback = FallbackStore(SQLiteStore(":memory:"))
    spec = ag.TokenLedger(_config(None)).spec
    for i in range(_PRUNE_AT):
        fallback.reserve(spec, Hold("s", f"old-{i}", 1, 10.0), 1.0)
    fallback.reserve(spec, Hold("s", "live", 1, 1_000.0), 20.0)
    assert list(fallback._known[spec.scope].holds) == ["live"]
    fallback.close()


UPSTREAM_NUMBERS = [0, 1, 57, 10**6, MAX_TOKENS, MAX_TOKENS + 1, 10**20, -1, -(10**20), 0.5]
UPSTREAM_NUMBERS += [float("nan"), float("inf"), -float("inf"), 2**63, True, None, "12"]


def _upstream_usage_case(rng: Any) -> list[tuple[Any, Any]]:
    return [(rng.choice(UPSTREAM_NUMBERS), rng.choice(UPSTREAM_NUMBERS)) for _ in range(8)]


def _check_upstream_usage(parts: list[tuple[Any, Any]]) -> None:
    """Whatever an upstream reports, the ledger counts whole, bounded, non-negative tokens and
    never goes down; the hard_stop still refuses once the session is spent."""
    ledger = ag.TokenLedger(_config(None), clock=FakeClock(), hooks=())
    total = 0
    for prompt, completion in parts:
        settled = ledger.commit(ledger.reserve("s", 10), ag.Usage(prompt, completion))
        used = settled.usage
        assert isinstance(used.prompt_tokens, int)
        assert isinstance(used.completion_tokens, int)
        assert 0 <= used.total_tokens <= MAX_TOKENS
        after = ledger.usage("s").session_tokens
        assert after == total + used.total_tokens
        total = after


@cases(50)
@given(seed=seeds)
def test_bulk_upstream_usage_never_corrupts_the_ledger(seed: int) -> None:
    """20 sequences of 8 commits per seed, each part drawn from hostile numbers."""
    bulk(seed, 20, _upstream_usage_case, _check_upstream_usage)


def test_a_garbage_collected_async_stream_settles() -> None:
    """An async stream dropped mid-answer: the event loop finalizes it, and that settles."""
    ledger = ag.TokenLedger(STREAM_CONFIG, store=MemoryStore(), clock=FakeClock())
    body = sse([chunk({"content": "hello "}) for _ in range(5)] + [chunk({}, finish="stop")])
    upstream = RawUpstream([(200, "text/event-stream", body)])
    client = guarded_client(upstream, STREAM_CONFIG, ledger=ledger, asynchronous=True)

    async def main() -> None:
        with ag.session("s"):
            stream = await client.chat.completions.create(
                model="fast", messages=MESSAGES, stream=True
            )
            chunks = stream.__aiter__()
            await chunks.__anext__()
            del stream, chunks
            gc.collect()
            for _ in range(5):  # the loop runs the async generators' finalizers
                await asyncio.sleep(0)

    asyncio.run(main())
    snap = ledger.usage("s")
    assert snap.session_reserved == 0
    assert snap.session_tokens > 0
