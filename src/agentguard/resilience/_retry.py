"""RetryPolicy: whether and when to try again, as a pure decision; plus thin drivers.

Full-jitter exponential backoff (``delay = uniform(0, min(cap, base * 2**retry))``), as
recommended for fleets of clients: it spreads retries out instead of synchronising them.
A server's ``Retry-After`` wins over the computed delay, up to ``max_retry_after``: beyond it
the decision is to give up *with* the requested delay, so a caller with another option (a
different model tier) takes it rather than sleeping for minutes.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from agentguard import _clock

from ._classify import Classification, classify

__all__ = ["RetryBudget", "RetryDecision", "RetryPolicy", "aretry_call", "retry_call"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """The policy's answer after a failure.

    Attributes:
        retry: whether to try again.
        delay: seconds to wait first (0 when giving up).
        reason: why, in words.
        retry_after: the server's requested delay, when it asked for one.
    """

    retry: bool
    delay: float
    reason: str
    retry_after: float | None = None


class RetryPolicy:
    """Decides retries; never sleeps itself.

    Args:
        max_attempts: attempts in all, the first included (3: two retries).
        base: the first backoff ceiling in seconds.
        cap: the largest backoff ceiling.
        max_retry_after: the longest server-requested wait worth honouring.
        max_elapsed: give up when the next wait would pass this many seconds since the first
            attempt (``None``: no limit).
        rng: the jitter's randomness (seed it for reproducible runs).
    """

    def __init__(
        self,
        *,
        max_attempts: int = 3,
        base: float = 0.5,
        cap: float = 8.0,
        max_retry_after: float = 30.0,
        max_elapsed: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1 (got {max_attempts})")
        if base < 0 or cap < 0 or max_retry_after < 0:
            raise ValueError("base, cap and max_retry_after must not be negative")
        self.max_attempts = max_attempts
        self.base = base
        self.cap = cap
        self.max_retry_after = max_retry_after
        self.max_elapsed = max_elapsed
        self._rng = rng or random.Random()

    def backoff(self, retry: int) -> float:
        """The full-jitter delay before retry number ``retry`` (0 for the first retry)."""
        ceiling = min(self.cap, self.base * (2.0 ** min(retry, 62)))
        return self._rng.uniform(0.0, ceiling)

    def decide(
        self, retries: int, classification: Classification, *, elapsed: float = 0.0
    ) -> RetryDecision:
        """Whether to retry after a failure.

        Args:
            retries: retries already made (0 after the first failure).
            classification: what the failure was.
            elapsed: seconds since the first attempt.
        """
        kind = classification.error_class.value
        if not classification.retryable:
            return RetryDecision(False, 0.0, f"{kind} errors are not retried")
        if retries + 1 >= self.max_attempts:
            return RetryDecision(False, 0.0, f"{self.max_attempts} attempts made")
        wanted = classification.retry_after
        if wanted is not None:
            if wanted > self.max_retry_after:
                return RetryDecision(
                    False,
                    0.0,
                    f"server asked to wait {wanted:g}s, more than max_retry_after "
                    f"{self.max_retry_after:g}s",
                    retry_after=wanted,
                )
            delay = wanted
        else:
            delay = self.backoff(retries)
        if self.max_elapsed is not None and elapsed + delay > self.max_elapsed:
            return RetryDecision(
                False, 0.0, f"would pass max_elapsed {self.max_elapsed:g}s", wanted
            )
        return RetryDecision(True, delay, f"{kind}: retry {retries + 1} in {delay:.2f}s", wanted)


class RetryBudget:
    """Retries shared across all tools within one agent turn.

    A per-call retry count multiplies with the agent's own retries; a budget per turn does
    not: once it is spent, failures go back to the agent as they are.

    Args:
        total: retries allowed per turn (default 5).
    """

    def __init__(self, total: int = 5) -> None:
        if total < 0:
            raise ValueError(f"a retry budget cannot be negative (got {total})")
        self.total = total
        self.used = 0

    @property
    def remaining(self) -> int:
        """Retries left in this turn."""
        return self.total - self.used

    @property
    def exhausted(self) -> bool:
        """Whether no retry is left."""
        return self.used >= self.total

    def try_acquire(self) -> bool:
        """Take one retry if any is left."""
        if self.exhausted:
            return False
        self.used += 1
        return True

    def reset(self) -> None:
        """Start a new turn."""
        self.used = 0


def retry_call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
    budget: RetryBudget | None = None,
) -> T:
    """Call ``fn`` until it succeeds or ``policy`` (or ``budget``) says stop; re-raise then."""
    sleep = sleep or _clock.sleep
    clock = clock or _clock.monotonic
    start = clock()
    retries = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            decision = policy.decide(retries, classify(exc), elapsed=clock() - start)
            if not decision.retry or (budget is not None and not budget.try_acquire()):
                raise
        sleep(decision.delay)
        retries += 1


async def aretry_call(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    clock: Callable[[], float] | None = None,
    budget: RetryBudget | None = None,
) -> T:
    """Async twin of :func:`retry_call` (cancellation is never retried)."""
    if sleep is None:
        import anyio  # noqa: PLC0415 - only the async driver needs it

        sleep = anyio.sleep
    clock = clock or _clock.monotonic
    start = clock()
    retries = 0
    while True:
        try:
            return await fn()
        except Exception as exc:
            decision = policy.decide(retries, classify(exc), elapsed=clock() - start)
            if not decision.retry or (budget is not None and not budget.try_acquire()):
                raise
        await sleep(decision.delay)
        retries += 1
