"""Hostile battery: token budgets under untrusted numbers, reused ids and concurrency.

Invariants: committed totals exact, never negative, never NaN or infinite; ``hard_stop`` never
exceeded, whatever the store (memory, real SQLite, real Redis), however many tasks race; an
upstream that reuses one response id never hides another call's usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given

import agentguard as ag
from _hostile import (
    MESSAGES,
    STREAM_CONFIG,
    RawUpstream,
    Scratch,
    assert_only,
    bulk,
    cases,
    chunk,
    completion,
    encode,
    guarded_client,
    http,
    openai,
    outcome,
    seeds,
    sse,
)
from _stores import RedisServer
from agentguard.config import TokenBudgetConfig
from agentguard.storage import MemoryStore, RedisStore, SQLiteStore
from agentguard.testing import FakeClock

WORK = Scratch("ag-hostile-budget-")


@pytest.fixture(scope="module", autouse=True)
def _remove_scratch() -> Iterator[None]:
    yield
    WORK.cleanup()


PER_SESSION = 1_000
PER_HOUR = 5_000


def _ledger(store: Any = None, **budget: Any) -> ag.TokenLedger:
    config = TokenBudgetConfig(
        **{
            "per_session": PER_SESSION,
            "per_hour": PER_HOUR,
            "max_output_tokens": None,
            "policy": "hard_stop",
            **budget,
        }
    )
    return ag.TokenLedger(config, store=store or MemoryStore(), clock=FakeClock())


def _assert_sound(ledger: ag.TokenLedger, sessions: list[str], committed: dict[str, int]) -> None:
    """The ledger's invariants: exact, finite, non-negative totals within ``hard_stop``."""
    hour = 0
    for session in sessions:
        snap = ledger.usage(session)
        for value in (snap.session_tokens, snap.session_reserved, snap.hour_tokens):
            assert isinstance(value, int), f"corrupted total {value!r}"
            assert value >= 0, f"negative total {value!r}"
        assert snap.session_tokens == committed.get(session, 0)
        assert snap.session_tokens + snap.session_reserved <= PER_SESSION
        hour += snap.session_tokens
    snap = ledger.usage()
    assert snap.hour_tokens == hour
    assert snap.hour_tokens + snap.hour_reserved <= PER_HOUR


# -- untrusted numbers --------------------------------------------------------------------------

SANE = [0, 1, 7, 50, 99, 500, 999, 1_000, 1_001, 10**6, 10**20]
HOSTILE = [*SANE, -1, -500, 1.5, float("nan"), float("inf"), -float("inf"), 2**63, True]


def _run_ops(rng: random.Random, numbers: list[Any]) -> None:
    """A random sequence of reserve / commit / release; invariants checked after every step."""
    ledger = _ledger()
    sessions = ["a", "b", "c"]
    committed: dict[str, int] = {}
    held: list[Any] = []
    for _ in range(12):
        roll = rng.random()
        try:
            if roll < 0.5 or not held:
                session = rng.choice(sessions)
                held.append(
                    ledger.reserve(
                        session, rng.choice(numbers), max_output_tokens=rng.choice([None, 0, 50])
                    )
                )
            elif roll < 0.85:
                reservation = held.pop(rng.randrange(len(held)))
                usage = rng.choice(numbers)
                # a commit of real usage above the hold may pass the budget: keep within it
                if isinstance(usage, int) and usage > reservation.tokens:
                    usage = reservation.tokens
                settled = ledger.commit(reservation, usage)
                if settled.counted:
                    committed[reservation.session] = (
                        committed.get(reservation.session, 0) + settled.usage.total_tokens
                    )
            else:
                ledger.release(held.pop(rng.randrange(len(held))))
        except ag.BudgetExceeded:
            pass
        except Exception as exc:
            assert_only(exc, ValueError)
        _assert_sound(ledger, sessions, committed)


@cases(200)
@given(seed=seeds)
def test_bulk_sane_numbers_keep_the_ledger_sound(seed: int) -> None:
    """10 op sequences per seed (24,000 operations in all) with whole, non-negative numbers."""
    bulk(seed, 10, lambda rng: rng, lambda rng: _run_ops(rng, SANE))


@cases(100, shrink=False)
@given(seed=seeds)
def test_bulk_hostile_numbers_keep_the_ledger_sound(seed: int) -> None:
    """The same with negative, fractional, NaN and infinite numbers: refused or sound."""
    bulk(seed, 10, lambda rng: rng, lambda rng: _run_ops(rng, HOSTILE))


def test_a_negative_commit_is_refused_and_refunds_nothing() -> None:
    """A caller's negative usage: a refusal, the ledger unchanged."""
    ledger = _ledger()
    reservation = ledger.reserve("s", 10)
    ledger.commit(ledger.reserve("s", 10), 10)
    with pytest.raises((ValueError, ag.AgentGuardError)):
        ledger.commit(reservation, -500)
    assert ledger.usage("s").session_tokens == 10


def test_a_nan_reservation_never_disables_the_hourly_limit() -> None:
    """After a NaN reservation (refused or not), the hourly ``hard_stop`` still refuses."""
    ledger = _ledger()
    with contextlib.suppress(ValueError, ag.AgentGuardError):
        ledger.reserve("s", float("nan"))  # type: ignore[arg-type]
    decisions = []
    for i in range(10):  # 10 x 900 wanted under a 5,000 hourly limit
        try:
            decisions.append(ledger.reserve(f"other-{i}", 900).decision)
        except ag.BudgetExceeded:
            decisions.append("refused")
    assert "refused" in decisions, decisions


@pytest.mark.parametrize("usage", [float("inf"), float("nan"), 1.5])
def test_a_non_integer_commit_never_corrupts_the_memory_ledger(usage: float) -> None:
    """A non-integer usage: a refusal, the ledger unchanged."""
    ledger = _ledger(per_session=None, per_hour=None)
    reservation = ledger.reserve("s", 10)
    with contextlib.suppress(ValueError, ag.AgentGuardError):
        ledger.commit(reservation, usage)  # type: ignore[arg-type]
    assert ledger.usage("s").session_tokens == 0


def test_a_huge_commit_on_sqlite_is_a_typed_error_or_counted() -> None:
    """Usage of 10^20 on SQLite: counted (capped) or a typed error, never an OverflowError."""
    ledger = _ledger(SQLiteStore(str(WORK / "huge.db")), per_session=None, per_hour=None)
    try:
        ledger.commit(ledger.reserve("s", 10), 10**20)
    except Exception as exc:
        assert_only(exc)
    finally:
        ledger.close()


@pytest.mark.redis
def test_a_huge_commit_on_redis_is_a_typed_error_or_counted(redis_server: RedisServer) -> None:
    """Usage of 10^20 on Redis: counted (capped) or a typed error, never a raw redis error."""
    store = RedisStore(redis_server.url, key_prefix="hostile-huge")
    ledger = _ledger(store, per_session=None, per_hour=None)
    try:
        ledger.commit(ledger.reserve("s", 10), 10**20)
    except Exception as exc:
        assert_only(exc)
    finally:
        ledger.close()


# -- through the guarded client: upstream numbers and ids ---------------------------------------


def _budget_config(per_session: int | None = None) -> ag.GuardConfig:
    return ag.GuardConfig.from_dict(
        {
            "tiers": {"fast": {"model": "small"}},
            "escalation": {"chain": ["fast"]},
            "memory_pressure": {"enabled": False},
            "token_budget": {
                "per_session": per_session,
                "per_hour": None,
                "policy": "hard_stop",
                "max_output_tokens": 50,
            },
        },
        env={},
    )


def _ask(client: Any, session: str, text: str) -> Any:
    with ag.session(session):
        return outcome(
            lambda: client.chat.completions.create(
                model="fast", messages=[{"role": "user", "content": text}]
            )
        )


def test_a_reused_upstream_id_never_hides_usage() -> None:
    """Every answer has id ``chatcmpl-123``: each call of each session is still counted."""
    usage = {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}
    body = encode(completion(rid="chatcmpl-123", usage=usage))
    ledger = _ledger(per_session=None, per_hour=None)
    client = guarded_client(RawUpstream([(200, "application/json", body)]), ledger=ledger)
    for session in ("alice", "bob", "carol"):
        for turn in range(2):
            assert _ask(client, session, f"question {turn} from {session}").error is None
    for session in ("alice", "bob", "carol"):
        assert ledger.usage(session).session_tokens == 100, session
    assert ledger.usage().hour_tokens == 300


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_several_answers_without_usage_are_each_counted(stream: bool) -> None:
    """``n=3`` from a server that sends no usage: the guard reads the first answer only, and
    charges each of the three as long as it (charged as one, a session passed its hard_stop
    about three times over)."""
    text = " ".join(f"word{i}" for i in range(400))  # about 500 tokens at the estimate's rate
    answers = [
        {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        for i in range(3)
    ]
    opening = chunk({"role": "assistant", "content": text})
    pieces = [{**opening, "choices": [{**opening["choices"][0], "index": i}]} for i in range(3)]
    body = (
        sse([*pieces, chunk({}, finish="stop")])
        if stream
        else encode(completion(choices=answers, usage=None))
    )
    kind = "text/event-stream" if stream else "application/json"
    alone, three = (_ledger(per_session=None, per_hour=None) for _ in range(2))
    for ledger, n in ((alone, 1), (three, 3)):
        upstream = RawUpstream([(200, kind, body)])
        client = guarded_client(upstream, _budget_config(), ledger=ledger)
        with ag.session("s"):
            got = outcome(functools.partial(_ask_for, client, n, stream))
        assert_only(got.error)
    # (the prompt, a few tokens, counted once: three answers cost more than twice one)
    assert three.usage("s").session_tokens > 2 * alone.usage("s").session_tokens


def _ask_for(client: Any, n: int, stream: bool) -> Any:
    answer = client.chat.completions.create(model="fast", messages=MESSAGES, n=n, stream=stream)
    return list(answer) if stream else answer


def _long_stream(chars: int, *, usage: dict[str, int] | None = None) -> bytes:
    """An SSE answer of ``chars`` characters of prose, 400 to a chunk (no finish cut short)."""
    # prose that never repeats itself (a repeating text is cut as degenerate, budget or not)
    words = [
        "river",
        "stone",
        "quiet",
        "north",
        "bright",
        "paper",
        "window",
        "seven",
        "garden",
        "copper",
        "valley",
    ]
    pick = random.Random(0).choice
    text = " ".join(pick(words) + str(i) for i in range(chars // 6))[:chars]
    pieces = [chunk({"content": text[i : i + 400]}) for i in range(0, len(text), 400)]
    closing = [chunk({}, finish="stop")]
    if usage is not None:  # (as OpenAI sends it with include_usage: a chunk without choices)
        closing.append({**chunk({}), "choices": [], "usage": usage})
    return sse([*pieces, *closing])


@pytest.mark.parametrize("reserve", ["strict", "learned"])
@pytest.mark.parametrize("max_tokens", [None, 300], ids=["uncapped", "cap-ignored"])
def test_a_stream_past_its_admitted_output_never_passes_hard_stop(
    reserve: str, max_tokens: int | None
) -> None:
    """A server that ignores ``max_tokens``, or an uncapped answer longer than the output the
    ledger counts for it: the stream is held room for as it runs past its admitted output,
    and cut (``finish_reason: length``) where the budget has none left; the limit is never
    passed, and every extra hold is given back."""
    limit = 3_000
    config = ag.GuardConfig.from_dict(
        {
            "tiers": {"fast": {"model": "small"}},
            "escalation": {"chain": ["fast"]},
            "memory_pressure": {"enabled": False},
            "token_budget": {"per_session": limit, "per_hour": None, "policy": "hard_stop"},
        },
        env={},
    )
    ledger = _ledger(per_session=limit, per_hour=None, max_output_tokens=1_000, reserve=reserve)
    upstream = RawUpstream([(200, "text/event-stream", _long_stream(40_000))])
    client = guarded_client(upstream, config, ledger=ledger)
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    with ag.session("s"):
        stream = client.chat.completions.create(
            model="fast", messages=MESSAGES, stream=True, **extra
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    used = ledger.usage("s")
    assert used.session_tokens <= limit
    assert used.session_reserved == 0
    assert 1_000 * 4 <= len(text) < 40_000  # past its admitted output, cut before the end
    assert finishes == ["length"]
    report = ag.report_of(stream)
    assert report is not None
    assert any("budget held room for" in w for w in report.warnings)


def test_a_stream_past_its_admitted_output_runs_on_while_the_budget_has_room() -> None:
    """Room is held as the stream runs past its admitted output: with a budget that has it,
    the whole answer reaches the caller as the upstream sent it, and the holds come back."""
    config = ag.GuardConfig.from_dict(
        {
            "tiers": {"fast": {"model": "small"}},
            "escalation": {"chain": ["fast"]},
            "memory_pressure": {"enabled": False},
            "token_budget": {"per_session": 100_000, "per_hour": None, "policy": "hard_stop"},
        },
        env={},
    )
    ledger = _ledger(per_session=100_000, per_hour=None, max_output_tokens=1_000)
    usage = {"prompt_tokens": 9, "completion_tokens": 9_000, "total_tokens": 9_009}
    body = _long_stream(36_000, usage=usage)
    upstream = RawUpstream([(200, "text/event-stream", body)])
    client = guarded_client(upstream, config, ledger=ledger)
    with ag.session("s"):
        chunks = list(
            client.chat.completions.create(
                model="fast", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 36_000
    assert ledger.usage("s").session_tokens == 9_009  # the upstream's own count
    assert ledger.usage("s").session_reserved == 0


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -500, "completion_tokens": -500, "total_tokens": -1000},
        {"prompt_tokens": 10, "completion_tokens": -5, "total_tokens": 5},
        {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    ],
    ids=["all-negative", "negative-output", "zero"],
)
def test_negative_upstream_usage_never_refunds_the_budget(usage: dict[str, int]) -> None:
    """An upstream reporting negative usage: the session's total never goes down."""
    ledger = _ledger(per_session=None, per_hour=None)
    honest = encode(completion(rid="r1"))
    lying = encode(completion(rid="r2", usage=usage))
    upstream = RawUpstream([(200, "application/json", honest), (200, "application/json", lying)])
    client = guarded_client(upstream, _budget_config(), ledger=ledger)
    _ask(client, "s", "one")
    before = ledger.usage("s").session_tokens
    got = _ask(client, "s", "two")
    assert_only(got.error)
    after = ledger.usage("s").session_tokens
    assert after >= before > 0


@pytest.mark.parametrize(
    "max_tokens",
    [
        -5,
        0,
        10,
    ],
)
def test_a_request_over_budget_is_refused_whatever_its_max_tokens(max_tokens: int) -> None:
    """Session budget exhausted: the next call is refused under ``hard_stop``, any max_tokens."""
    ledger = _ledger(per_session=60, per_hour=None, max_output_tokens=50)
    usage = {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
    upstream = RawUpstream([(200, "application/json", encode(completion(usage=usage)))])
    client = guarded_client(upstream, _budget_config(60), ledger=ledger)
    assert _ask(client, "s", "one").error is None
    sent = len(upstream.requests)
    with ag.session("s"):
        got = outcome(
            lambda: client.chat.completions.create(
                model="fast", messages=MESSAGES, max_tokens=max_tokens
            )
        )
    assert isinstance(got.error, ag.BudgetExceeded), got
    assert len(upstream.requests) == sent


# -- concurrency: 1,000 asyncio tasks never overshoot hard_stop ---------------------------------

TASKS = 1_000
HOLD = 60  # 10 prompt + 50 output: 1,000 tasks want 60,000
LIMIT = 50_000


async def _race(ledger: ag.TokenLedger) -> tuple[int, int]:
    """1,000 tasks reserve and commit one session's budget at once: (granted, refused)."""
    granted = refused = 0

    async def one(i: int) -> None:
        nonlocal granted, refused
        try:
            reservation = await ledger.areserve("shared", 10, max_output_tokens=50)
        except ag.BudgetExceeded:
            refused += 1
            return
        await asyncio.sleep(0)  # let the others in between reserve and commit
        await ledger.acommit(reservation, reservation.tokens, event_id=f"event-{i}")
        granted += 1

    await asyncio.gather(*(one(i) for i in range(TASKS)))
    return granted, refused


def _assert_no_overshoot(ledger: ag.TokenLedger) -> None:
    async def main() -> tuple[int, int]:
        try:
            return await _race(ledger)
        finally:
            if isinstance(ledger.store, RedisStore):  # its asyncio client lives in this loop
                await ledger.store.aclose()

    granted, refused = asyncio.run(main())
    assert granted + refused == TASKS
    assert granted * HOLD <= LIMIT, f"{granted * HOLD} tokens admitted under {LIMIT}"
    assert ledger.usage("shared").session_tokens == granted * HOLD  # exact, nothing lost


def _concurrent_ledger(store: Any) -> ag.TokenLedger:
    return _ledger(store, per_session=LIMIT, per_hour=None, max_output_tokens=None)


def test_1000_tasks_on_the_memory_store_never_overshoot() -> None:
    """The memory store: admitted tokens within ``hard_stop``, totals exact."""
    _assert_no_overshoot(_concurrent_ledger(MemoryStore()))


def test_1000_tasks_on_sqlite_never_overshoot() -> None:
    """Real SQLite (a file): admitted tokens within ``hard_stop``, totals exact."""
    ledger = _concurrent_ledger(SQLiteStore(str(WORK / "race.db")))
    try:
        _assert_no_overshoot(ledger)
    finally:
        ledger.close()


@pytest.mark.redis
def test_1000_tasks_on_redis_never_overshoot(redis_server: RedisServer) -> None:
    """Real Redis: admitted tokens within ``hard_stop``, totals exact."""
    ledger = _concurrent_ledger(RedisStore(redis_server.url, key_prefix="hostile-race"))
    try:
        _assert_no_overshoot(ledger)
    finally:
        ledger.close()


def test_the_race_is_a_real_race() -> None:
    """The race's premise: without a limit every task is granted (60,000 wanted)."""
    ledger = _ledger(per_session=None, per_hour=None)
    granted, refused = asyncio.run(_race(ledger))
    assert (granted, refused) == (TASKS, 0)
    assert ledger.usage("shared").session_tokens == TASKS * HOLD
    assert math.isfinite(ledger.usage("shared").session_tokens)


# -- abandoned streams and outages ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "garbage-collect"])
def test_an_abandoned_stream_settles_what_was_streamed(how: str) -> None:
    """A stream closed (or dropped) after one chunk: its hold released, its tokens counted."""
    ledger = ag.TokenLedger(STREAM_CONFIG, store=MemoryStore(), clock=FakeClock())
    body = sse([chunk({"content": "hello "}) for _ in range(5)] + [chunk({}, finish="stop")])
    upstream = RawUpstream([(200, "text/event-stream", body)])
    client = guarded_client(upstream, STREAM_CONFIG, ledger=ledger)
    with ag.session("s"):
        stream = client.chat.completions.create(model="fast", messages=MESSAGES, stream=True)
        chunks = iter(stream)
        next(chunks)
        if how == "close":
            stream.close()
        else:
            del stream, chunks
            gc.collect()
    snap = ledger.usage("s")
    assert snap.session_reserved == 0
    assert snap.session_tokens > 0


def test_a_redis_outage_never_resets_hard_stop() -> None:
    """Spend the session's budget on Redis, stop Redis: the next call is still refused."""
    pytest.importorskip("redis")
    from _stores import running_redis

    with running_redis() as server:
        store = RedisStore(server.url, key_prefix="hostile-outage", timeout=0.5)
        ledger = _ledger(store, per_session=100, per_hour=None)
        try:
            ledger.commit(ledger.reserve("s", 100), 100)
            with pytest.raises(ag.BudgetExceeded):
                ledger.reserve("s", 50)
            server.stop()
            with pytest.raises((ag.BudgetExceeded, ag.StoreUnavailable)):
                ledger.reserve("s", 50)
        finally:
            store.close()


class _Unanswering(RawUpstream):
    """:class:`RawUpstream` whose first ``failures`` requests fail as ``fail`` says (after the
    request was read), then answered as usual."""

    def __init__(self, answers: Any, fail: Any, failures: int = 1) -> None:
        super().__init__(answers)
        self.fail, self.failures = fail, failures

    def _handle(self, req: Any) -> Any:
        if len(self.requests) < self.failures:
            self.requests.append(json.loads(req.content))
            return self.fail(req)
        return super()._handle(req)


def _raise(kind: str) -> Any:
    def fail(req: Any) -> Any:
        raise getattr(http, kind)(f"{kind} (test)", request=req)

    return fail


def _strict_ledger() -> ag.TokenLedger:
    return _ledger(per_session=None, per_hour=None, reserve="strict", max_output_tokens=200)


@pytest.mark.parametrize("kind", ["ReadTimeout", "RemoteProtocolError", "ReadError"])
def test_a_call_sent_and_never_answered_is_charged_its_hold(kind: str) -> None:
    """A read that timed out, a server that dropped the connection after the request went
    out: the upstream has the prompt and may go on writing the answer (and bills it). Each
    such attempt is charged what its reservation held (under ``reserve: strict`` the prompt
    and the whole cap: ``hard_stop`` holds whatever was billed), then the retry's answer its
    own usage; the report says both."""
    usage = {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}
    body = encode(completion(usage=usage))
    ledger = _strict_ledger()
    upstream = _Unanswering([(200, "application/json", body)], _raise(kind))
    client = guarded_client(upstream, _budget_config(), ledger=ledger)
    with ag.session("s"):
        answer = client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=200)
    assert len(upstream.requests) == 2
    used = ledger.usage("s")
    assert used.session_reserved == 0
    hold = used.session_tokens - 50
    assert hold > 200  # the prompt and the whole cap, held for the call that got no answer
    report = ag.report_of(answer)
    assert report is not None
    assert report.usage.total_tokens == used.session_tokens


@pytest.mark.parametrize(
    "fail",
    [_raise("ConnectError"), _raise("ConnectTimeout"), lambda req: http.Response(503)],
    ids=["connect-error", "connect-timeout", "status-503"],
)
def test_a_call_refused_or_answered_with_an_error_is_charged_nothing(fail: Any) -> None:
    """No connection made (the request never left), or an error status (the upstream answered,
    and does not bill an error): the hold is given back."""
    usage = {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}
    ledger = _strict_ledger()
    upstream = _Unanswering([(200, "application/json", encode(completion(usage=usage)))], fail)
    client = guarded_client(upstream, _budget_config(), ledger=ledger)
    with ag.session("s"):
        client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=200)
    assert len(upstream.requests) == 2
    assert ledger.usage("s").session_tokens == 50
    assert ledger.usage("s").session_reserved == 0


def test_calls_timing_out_run_into_hard_stop() -> None:
    """An agent whose framework gives up on every call before the model answers (each call
    retried once, then failing): under ``hard_stop`` the session is refused once what the
    unanswered calls held reaches the limit, instead of never moving."""
    limit = 3_000
    ledger = _ledger(per_session=limit, per_hour=None, reserve="strict", max_output_tokens=200)
    upstream = _Unanswering([], _raise("ReadTimeout"), failures=10**6)
    clock = FakeClock()
    client = guarded_client(upstream, _budget_config(limit), ledger=ledger, clock=clock)
    errors = []
    for turn in range(20):
        clock.advance(600)  # (the tier's breaker, opened by the timeouts, lets a probe through)
        got = _ask(client, "s", f"question {turn}")
        errors.append(type(got.error).__name__)
        if isinstance(got.error, ag.BudgetExceeded):
            break
    assert errors[-1] == "BudgetExceeded", errors
    assert set(errors[:-1]) == {"APITimeoutError"}, errors
    used = ledger.usage("s")
    assert used.session_tokens <= limit
    assert used.session_reserved == 0


def test_an_async_call_cancelled_while_it_waits_is_charged_its_hold() -> None:
    """``asyncio.wait_for`` around ``create`` (a framework's timeout) cancels the call after
    the request went out: it is charged what it held, not nothing."""
    sent = asyncio.Event()
    never = asyncio.Event()

    async def hang(req: Any) -> Any:
        sent.set()
        await never.wait()  # the model is still writing when the caller gives up
        raise AssertionError("not reached")

    ledger = _strict_ledger()
    client = ag.wrap(
        openai.AsyncOpenAI(
            api_key="k",
            base_url="http://hostile.invalid/v1",
            max_retries=0,
            http_client=http.AsyncClient(transport=http.MockTransport(hang)),
        ),
        _budget_config(),
        ledger=ledger,
        clock=FakeClock(),
    )

    async def main() -> None:
        with ag.session("s"):
            task = asyncio.ensure_future(
                client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=200)
            )
            await sent.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())
    used = ledger.usage("s")
    assert used.session_reserved == 0
    assert used.session_tokens > 200


def test_a_stream_that_broke_before_releasing_anything_is_charged_what_it_received() -> None:
    """A stream whose connection dropped while the guard held its tool call (nothing reached
    the caller): what it received was written, and billed; it is counted, and the retry's
    answer on top."""
    arguments = '{"city": "' + "Oslo " * 400 + '"}'
    pieces = [
        chunk({"role": "assistant", "tool_calls": [_call_delta(arguments[:10])]}),
        *(
            chunk({"tool_calls": [_call_delta(arguments[i : i + 100], head=False)]})
            for i in range(10, len(arguments), 100)
        ),
    ]
    head = sse(pieces, done=False)

    def broken(req: Any) -> Any:
        def body() -> Iterator[bytes]:
            yield head
            raise http.ReadError("connection lost (test)", request=req)

        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    usage = {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}
    answer = sse(
        [
            chunk({"role": "assistant", "content": "done"}),
            chunk({}, finish="stop"),
            {**chunk({}), "choices": [], "usage": usage},
        ]
    )
    ledger = _ledger(per_session=None, per_hour=None)
    upstream = _Unanswering([(200, "text/event-stream", answer)], broken)
    client = guarded_client(upstream, _budget_config(), ledger=ledger)
    with ag.session("s"):
        chunks = list(
            client.chat.completions.create(
                model="fast",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
                tools=[{"type": "function", "function": {"name": "weather", "parameters": {}}}],
            )
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "done"
    used = ledger.usage("s")
    assert used.session_reserved == 0
    assert used.session_tokens > 50 + 400  # the broken stream's 2,000 characters of arguments


def _call_delta(arguments: str, *, head: bool = True) -> dict[str, Any]:
    delta: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
    if head:
        delta.update(id="call_1", type="function")
        delta["function"]["name"] = "weather"
    return delta
