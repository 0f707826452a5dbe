"""RetryPolicy decisions, the retry drivers and the per-turn retry budget (no real waiting)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard.exceptions import ModelError
from agentguard.resilience import (
    Classification,
    ErrorClass,
    RetryBudget,
    RetryPolicy,
    aretry_call,
    retry_call,
)
from agentguard.testing import FakeClock

TRANSIENT = Classification.of(ErrorClass.TRANSIENT)


def test_full_jitter_stays_under_the_exponential_ceiling() -> None:
    """Each delay is uniform in [0, min(cap, base * 2**retry)]."""
    policy = RetryPolicy(max_attempts=10, base=0.5, cap=4.0, rng=random.Random(1))
    for retry in range(8):
        delay = policy.decide(retry, TRANSIENT).delay
        assert 0.0 <= delay <= min(4.0, 0.5 * 2**retry)


def test_seeded_jitter_is_reproducible() -> None:
    """The same seed gives the same delays."""
    a = RetryPolicy(rng=random.Random(7))
    b = RetryPolicy(rng=random.Random(7))
    assert [a.backoff(i) for i in range(5)] == [b.backoff(i) for i in range(5)]


def test_client_errors_are_never_retried() -> None:
    """A 4xx is the request's fault: retrying cannot help."""
    decision = RetryPolicy().decide(0, Classification.of(ErrorClass.CLIENT_ERROR))
    assert not decision.retry
    assert "not retried" in decision.reason


def test_attempts_are_bounded() -> None:
    """max_attempts counts the first attempt."""
    policy = RetryPolicy(max_attempts=3)
    assert policy.decide(0, TRANSIENT).retry
    assert policy.decide(1, TRANSIENT).retry
    assert not policy.decide(2, TRANSIENT).retry


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    """A server's Retry-After replaces backoff; beyond the cap the policy gives up and says why."""
    policy = RetryPolicy(max_retry_after=10)
    short = policy.decide(0, Classification.of(ErrorClass.RATE_LIMITED, retry_after=4))
    assert (short.retry, short.delay) == (True, 4)
    long = policy.decide(0, Classification.of(ErrorClass.RATE_LIMITED, retry_after=120))
    assert not long.retry
    assert long.retry_after == 120
    assert "max_retry_after" in long.reason


def test_max_elapsed_stops_retrying() -> None:
    """No retry whose wait would pass the total time limit."""
    policy = RetryPolicy(max_attempts=10, max_elapsed=5)
    decision = policy.decide(
        0, Classification.of(ErrorClass.RATE_LIMITED, retry_after=3), elapsed=3
    )
    assert not decision.retry


def test_bad_policy_arguments() -> None:
    """Nonsense settings fail at construction."""
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="negative"):
        RetryPolicy(cap=-1)


def test_retry_call_retries_transient_then_succeeds() -> None:
    """The sync driver sleeps through the injected sleep and returns the result."""
    clock = FakeClock(0)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ModelError("busy", status_code=503)
        return "ok"

    result = retry_call(
        flaky, RetryPolicy(max_attempts=5, rng=random.Random(0)), sleep=clock.sleep, clock=clock
    )
    assert result == "ok"
    assert len(calls) == 3
    assert len(clock.sleeps) == 2


def test_retry_call_reraises_client_errors_at_once() -> None:
    """No sleep, no second call for a client error."""
    clock = FakeClock(0)
    calls: list[int] = []

    def bad() -> str:
        calls.append(1)
        raise ModelError("bad request", status_code=400)

    with pytest.raises(ModelError):
        retry_call(bad, RetryPolicy(), sleep=clock.sleep, clock=clock)
    assert calls == [1]
    assert clock.sleeps == []


def test_budget_caps_retries_across_calls() -> None:
    """A shared per-turn budget stops retries across tools once spent."""
    clock = FakeClock(0)
    budget = RetryBudget(2)

    def down() -> str:
        raise ConnectionResetError

    policy = RetryPolicy(max_attempts=10, rng=random.Random(0))
    with pytest.raises(ConnectionResetError):
        retry_call(down, policy, sleep=clock.sleep, clock=clock, budget=budget)
    assert budget.exhausted
    assert len(clock.sleeps) == 2
    with pytest.raises(ConnectionResetError):
        retry_call(down, policy, sleep=clock.sleep, clock=clock, budget=budget)
    assert len(clock.sleeps) == 2  # nothing left for the second tool
    budget.reset()
    assert budget.remaining == 2


@pytest.mark.anyio
async def test_async_retry_call() -> None:
    """The async driver behaves like the sync one."""
    clock = FakeClock(0)
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise TimeoutError
        return "ok"

    assert (
        await aretry_call(flaky, RetryPolicy(rng=random.Random(0)), sleep=clock.asleep, clock=clock)
        == "ok"
    )
    assert len(clock.sleeps) == 1


@given(
    retries=st.integers(min_value=0, max_value=100),
    retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=1000)),
    kind=st.sampled_from(list(ErrorClass)),
)
def test_decisions_are_always_bounded(
    retries: int, retry_after: float | None, kind: ErrorClass
) -> None:
    """Whatever the input, a retry waits no longer than the larger of cap and max_retry_after."""
    policy = RetryPolicy(max_attempts=1000, cap=8, max_retry_after=30, rng=random.Random(0))
    decision = policy.decide(retries, Classification.of(kind, retry_after=retry_after))
    if decision.retry:
        assert 0 <= decision.delay <= 30
        assert kind in (ErrorClass.TRANSIENT, ErrorClass.RATE_LIMITED, ErrorClass.TIMEOUT)
    else:
        assert decision.delay == 0
