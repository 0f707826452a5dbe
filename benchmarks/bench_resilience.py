"""Breaker decision cost side by side with pybreaker; classification and retry decisions."""

from __future__ import annotations

import random

import tenacity

from _harness import Table, per_call, us
from agentguard.exceptions import ModelError
from agentguard.resilience import CircuitBreaker, Classification, RetryPolicy, classify
from agentguard.storage import MemoryStore
from agentguard.testing import FakeClock


def run(quick: bool) -> list[Table]:
    repeat = 3 if quick else 7
    min_time = 0.02 if quick else 0.2
    clock = FakeClock(0)
    breaker = CircuitBreaker(clock=clock, hooks=(), min_calls=5)

    def ours() -> None:
        if breaker.allow().allowed:
            breaker.record_success()

    shared = CircuitBreaker("tool:x", clock=clock, hooks=(), min_calls=5, store=MemoryStore())

    def ours_in_store() -> None:
        if shared.allow().allowed:
            shared.record_success()

    rows: list[list[object]] = []
    mine = us(per_call(ours, repeat=repeat, min_time=min_time))
    in_store = us(per_call(ours_in_store, repeat=repeat, min_time=min_time))
    try:
        import pybreaker
    except ImportError:
        rows.append(["agentguard CircuitBreaker allow + record", mine, "pybreaker not installed"])
    else:
        theirs_breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=30)

        def noop() -> None:
            return None

        def theirs() -> None:
            theirs_breaker.call(noop)

        def bare() -> None:
            noop()

        peer = us(per_call(theirs, repeat=repeat, min_time=min_time))
        base = us(per_call(bare, repeat=repeat, min_time=min_time))
        rows.append(
            ["agentguard CircuitBreaker allow + record_success", mine, f"{mine / peer:.2f}"]
        )
        rows.append(
            [
                "agentguard CircuitBreaker in a MemoryStore (ToolGuard's shared form)",
                in_store,
                f"{in_store / peer:.2f}",
            ]
        )
        rows.append(["pybreaker CircuitBreaker.call(noop)", peer, "1.00"])
        rows.append(["bare noop() call", base, f"{base / peer:.2f}"])
    breakers = Table(
        "Circuit breaker decision cost",
        ["operation", "µs per call", "ratio to pybreaker"],
        rows,
        description="A closed breaker on the happy path; same process, same run.",
    )
    error = ModelError("busy", status_code=503, headers={"retry-after": "1"})
    policy = RetryPolicy(rng=random.Random(0))
    classification = classify(error)
    backoff = classify(ModelError("busy", status_code=503))
    # A user's tenacity strategies: each decision builds one tenacity RetryCallState.
    strategies = RetryPolicy(
        wait=tenacity.wait_exponential(multiplier=0.5, max=8),
        stop=tenacity.stop_after_attempt(5) | tenacity.stop_after_delay(30),
    )

    def decide(p: RetryPolicy, c: Classification) -> float:
        return us(per_call(lambda: p.decide(1, c, elapsed=1.0), repeat=repeat, min_time=min_time))

    other = Table(
        "Classification and retry decisions",
        ["operation", "µs per call"],
        [
            [
                "classify(ModelError 503 with Retry-After)",
                us(per_call(lambda: classify(error), repeat=repeat, min_time=min_time)),
            ],
            ["RetryPolicy.decide (Retry-After)", decide(policy, classification)],
            ["RetryPolicy.decide (full-jitter backoff, the default)", decide(policy, backoff)],
            [
                "RetryPolicy.decide (tenacity wait_exponential, stop_after_attempt | "
                "stop_after_delay)",
                decide(strategies, backoff),
            ],
        ],
    )
    return [breakers, other]
