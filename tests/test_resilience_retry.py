"""RetryPolicy decisions, the retry drivers and the per-turn retry budget (no real waiting)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import tenacity
from hypothesis import given
from hypothesis import strategies as st

import agentguard
from agentguard import ConfigError, GuardConfig, ToolGuard
from agentguard.config import ToolRetryConfig
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


# -- tenacity strategies ---------------------------------------------------------------------


def _delays(policy: RetryPolicy, n: int) -> list[float]:
    return [policy.decide(i, TRANSIENT).delay for i in range(n)]


def test_tenacity_wait_fixed_replaces_the_backoff() -> None:
    """wait_fixed gives the same delay before every retry."""
    policy = RetryPolicy(max_attempts=5, wait=tenacity.wait_fixed(2))
    assert _delays(policy, 4) == [2, 2, 2, 2]


def test_tenacity_wait_exponential_sees_the_attempt_number() -> None:
    """wait_exponential doubles per attempt from tenacity's own attempt count, up to its max."""
    policy = RetryPolicy(
        max_attempts=10, wait=tenacity.wait_exponential(multiplier=1, min=0, max=8)
    )
    assert _delays(policy, 6) == [1, 2, 4, 8, 8, 8]


def test_tenacity_wait_random_exponential_stays_in_its_range() -> None:
    """wait_random_exponential draws below its exponential ceiling."""
    policy = RetryPolicy(
        max_attempts=10, wait=tenacity.wait_random_exponential(multiplier=1, max=4)
    )
    for retry, delay in enumerate(_delays(policy, 6)):
        assert 0 <= delay <= min(4, 2**retry)


def test_tenacity_waits_combine_with_plus() -> None:
    """wait_fixed(1) + wait_random(0, 1) is one strategy: 1 to 2 seconds."""
    policy = RetryPolicy(max_attempts=10, wait=tenacity.wait_fixed(1) + tenacity.wait_random(0, 1))
    assert all(1 <= d <= 2 for d in _delays(policy, 5))


def test_retry_after_wins_over_a_tenacity_wait() -> None:
    """A server's Retry-After is honoured even when a wait strategy is set."""
    policy = RetryPolicy(wait=tenacity.wait_fixed(5), max_retry_after=10)
    decision = policy.decide(0, Classification.of(ErrorClass.RATE_LIMITED, retry_after=3))
    assert (decision.retry, decision.delay) == (True, 3)
    refused = policy.decide(0, Classification.of(ErrorClass.RATE_LIMITED, retry_after=60))
    assert (refused.retry, refused.retry_after) == (False, 60)


def test_tenacity_stop_after_attempt_replaces_max_attempts() -> None:
    """stop_after_attempt(5) allows four retries, not the default two."""
    policy = RetryPolicy(stop=tenacity.stop_after_attempt(5), rng=random.Random(0))
    assert [policy.decide(i, TRANSIENT).retry for i in range(5)] == [
        True,
        True,
        True,
        True,
        False,
    ]
    assert "stop strategy" in policy.decide(4, TRANSIENT).reason
    assert policy.max_attempts is None


def test_tenacity_stop_after_delay_reads_the_injected_clock() -> None:
    """stop_after_delay measures time on the caller's clock, through retry_call."""
    clock = FakeClock(1000.0)
    calls: list[float] = []

    def down() -> str:
        calls.append(clock())
        clock.advance(4)  # each attempt takes 4 s of fake time
        raise ConnectionResetError

    policy = RetryPolicy(stop=tenacity.stop_after_delay(10), wait=tenacity.wait_fixed(1))
    with pytest.raises(ConnectionResetError):
        retry_call(down, policy, sleep=clock.sleep, clock=clock)
    # failures end at 4, 9 and 14 s after the start: the third is past 10 s
    assert calls == [1000.0, 1005.0, 1010.0]
    assert clock.sleeps == [1, 1]


def test_tenacity_stop_before_delay_sees_the_upcoming_wait() -> None:
    """stop_before_delay gives up when the next wait would pass its limit."""
    policy = RetryPolicy(stop=tenacity.stop_before_delay(10), wait=tenacity.wait_fixed(3))
    assert policy.decide(0, TRANSIENT, elapsed=6).retry
    assert not policy.decide(1, TRANSIENT, elapsed=8).retry


def test_tenacity_stops_combine_with_or() -> None:
    """stop_after_attempt(3) | stop_after_delay(5): whichever comes first."""
    policy = RetryPolicy(
        stop=tenacity.stop_after_attempt(3) | tenacity.stop_after_delay(5),
        rng=random.Random(0),
    )
    assert policy.decide(0, TRANSIENT, elapsed=1).retry
    assert not policy.decide(0, TRANSIENT, elapsed=5).retry  # the delay
    assert not policy.decide(2, TRANSIENT, elapsed=1).retry  # the attempts


def test_strategies_see_the_failure_as_the_outcome() -> None:
    """The call state carries tenacity's own outcome: the exception that failed."""
    seen: list[tenacity.RetryCallState] = []

    def wait(state: tenacity.RetryCallState) -> float:
        seen.append(state)
        return 0.5

    error = ConnectionResetError("reset")
    decision = RetryPolicy(wait=wait).decide(1, TRANSIENT, elapsed=2.5, error=error)
    assert decision.delay == 0.5
    (state,) = seen
    assert isinstance(state, tenacity.RetryCallState)
    assert state.attempt_number == 2
    assert state.seconds_since_start == 2.5
    assert state.outcome is not None
    assert state.outcome.exception() is error
    assert isinstance(state.retry_object, tenacity.Retrying)


def test_non_retryable_errors_never_reach_the_strategies() -> None:
    """A client error is final whatever the strategies would say."""
    policy = RetryPolicy(stop=tenacity.stop_never, wait=tenacity.wait_fixed(1))
    assert not policy.decide(0, Classification.of(ErrorClass.CLIENT_ERROR)).retry


def test_stop_and_attempt_limits_are_not_mixed() -> None:
    """stop= replaces max_attempts/max_elapsed: passing both is an error, as is a non-callable."""
    with pytest.raises(ValueError, match="stop= or max_attempts"):
        RetryPolicy(max_attempts=3, stop=tenacity.stop_after_attempt(3))
    with pytest.raises(ValueError, match="stop= or max_attempts"):
        RetryPolicy(max_elapsed=3, stop=tenacity.stop_after_attempt(3))
    with pytest.raises(TypeError, match="wait strategy"):
        RetryPolicy(wait=5)  # type: ignore[arg-type]


# -- tenacity strategies in ToolGuard's retry settings ---------------------------------------


def _tool_guard(clock: FakeClock, retry: dict[str, object]) -> ToolGuard:
    config = GuardConfig.from_dict(
        {"tools": {"sync_timeouts": False, "retry_budget_per_turn": 10}}, env={}
    )
    config = config.model_copy(
        update={
            "tools": config.tools.model_copy(
                update={"retry": config.tools.retry.model_copy(update=retry)}
            )
        }
    )
    return ToolGuard(config, clock=clock, sleep=clock.sleep, hooks=())


def _always_down() -> str:
    raise ConnectionResetError


def test_tool_retry_settings_take_tenacity_strategies() -> None:
    """tools.retry wait/stop drive every tool's retries, on the guard's injected clock."""
    clock = FakeClock(0)
    tools = _tool_guard(
        clock, {"wait": tenacity.wait_fixed(2), "stop": tenacity.stop_after_attempt(5)}
    )
    tools.register(_always_down, name="down")
    outcome = tools.call("down", {})
    assert (outcome.ok, outcome.attempts) == (False, 5)  # not the default 3
    assert clock.sleeps == [2, 2, 2, 2]


def test_per_tool_retry_overrides_take_tenacity_strategies() -> None:
    """register(retry={...}) accepts strategies too, merged over the guard's settings."""
    clock = FakeClock(0)
    tools = _tool_guard(clock, {"wait": tenacity.wait_fixed(2)})
    tools.register(
        _always_down,
        name="down",
        retry={"stop": tenacity.stop_after_delay(5), "max_retry_after_seconds": 1},
    )
    outcome = tools.call("down", {})
    assert outcome.attempts == 4  # failures at 0, 2, 4 and 6 s: the fourth is past 5 s
    assert clock.sleeps == [2, 2, 2]
    assert tools.tools["down"].retry.wait is not None  # the guard-wide wait is kept


def test_tool_retry_strategies_are_python_only() -> None:
    """A file cannot set a strategy; an effective dump shows one as its repr, unset ones not."""
    with pytest.raises(ConfigError, match=r"tools\.retry\.wait"):
        GuardConfig.from_dict({"tools": {"retry": {"wait": 5}}}, env={})
    assert "wait" not in GuardConfig().to_dict()["reliability"]["tools"]["retry"]
    wait = tenacity.wait_fixed(1)
    retry = ToolRetryConfig(wait=wait)
    assert retry.model_dump(mode="json")["wait"] == repr(wait)
    schema = GuardConfig.model_json_schema()["$defs"]["ToolRetryConfig"]
    assert set(schema["properties"]).isdisjoint({"wait", "stop"})


def test_tenacity_is_imported_only_for_strategies() -> None:
    """The default policy, and ToolGuard with default settings, never import tenacity."""
    code = (
        "import sys\n"
        "import agentguard as ag\n"
        "from agentguard.resilience import Classification, ErrorClass, RetryPolicy\n"
        "RetryPolicy().decide(0, Classification.of(ErrorClass.TRANSIENT))\n"
        "ag.ToolGuard().register(len, name='size')\n"
        "print('tenacity' in sys.modules)"
    )
    src = str(Path(agentguard.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": src},
    ).stdout
    assert out.strip() == "False"
