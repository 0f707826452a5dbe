"""RetryPolicy: whether and when to try again, as a pure decision; plus thin drivers.

Full-jitter exponential backoff (``delay = uniform(0, min(cap, base * 2**retry))``), as
recommended for fleets of clients: it spreads retries out instead of synchronising them.
A server's ``Retry-After`` wins over the computed delay, up to ``max_retry_after``: beyond it
the decision is to give up *with* the requested delay, so a caller with another option (a
different model tier) takes it rather than sleeping for minutes.

Users who already have tenacity strategies pass them as ``wait=`` / ``stop=``: the policy asks
them with a real :class:`tenacity.RetryCallState` whose times come from the caller's clock, and
still only returns a decision (tenacity is imported only when a strategy is given).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from agentguard import _clock

from ._classify import Classification, classify

if TYPE_CHECKING:
    import tenacity

__all__ = [
    "RetryBudget",
    "RetryDecision",
    "RetryPolicy",
    "StopStrategy",
    "WaitStrategy",
    "aretry_call",
    "retry_call",
]

T = TypeVar("T")

#: A tenacity wait strategy (``wait_exponential(...)``, ``wait_fixed(1) + wait_random(0, 1)``
#: ...) or any callable taking a ``tenacity.RetryCallState`` and returning seconds.
WaitStrategy = Callable[["tenacity.RetryCallState"], float]
#: A tenacity stop strategy (``stop_after_attempt(5) | stop_after_delay(30)`` ...) or any
#: callable taking a ``tenacity.RetryCallState`` and returning whether to give up.
StopStrategy = Callable[["tenacity.RetryCallState"], bool]


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
        max_attempts: attempts in all, the first included (default 3: two retries; no default
            limit when ``stop`` is given).
        base: the first backoff ceiling in seconds.
        cap: the largest backoff ceiling.
        max_retry_after: the longest server-requested wait worth honouring.
        max_elapsed: give up when the next wait would pass this many seconds since the first
            attempt (``None``: no limit).
        rng: the jitter's randomness (seed it for reproducible runs).
        wait: a tenacity wait strategy used instead of the full-jitter backoff (``base`` and
            ``cap`` then do nothing); a server's ``Retry-After`` still wins over it.
        stop: a tenacity stop strategy deciding when to give up, instead of ``max_attempts``
            and ``max_elapsed`` (combine tenacity stops with ``|`` rather than mixing the two).

    Raises:
        ValueError: a limit is out of range, or ``stop`` is given with ``max_attempts`` or
            ``max_elapsed``.
        TypeError: ``wait`` or ``stop`` is not callable.
    """

    def __init__(
        self,
        *,
        max_attempts: int | None = None,
        base: float = 0.5,
        cap: float = 8.0,
        max_retry_after: float = 30.0,
        max_elapsed: float | None = None,
        rng: random.Random | None = None,
        wait: WaitStrategy | None = None,
        stop: StopStrategy | None = None,
    ) -> None:
        if stop is not None and (max_attempts is not None or max_elapsed is not None):
            raise ValueError(
                "pass stop= or max_attempts/max_elapsed, not both (combine tenacity stops "
                "with |, e.g. stop_after_attempt(5) | stop_after_delay(30))"
            )
        for label, strategy in (("wait", wait), ("stop", stop)):
            if strategy is not None and not callable(strategy):
                raise TypeError(f"{label} must be a tenacity {label} strategy (got {strategy!r})")
        if stop is None and max_attempts is None:
            max_attempts = 3
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1 (got {max_attempts})")
        if base < 0 or cap < 0 or max_retry_after < 0:
            raise ValueError("base, cap and max_retry_after must not be negative")
        self.max_attempts = max_attempts
        self.base = base
        self.cap = cap
        self.max_retry_after = max_retry_after
        self.max_elapsed = max_elapsed
        self.wait = wait
        self.stop = stop
        self._rng = rng or random.Random()
        self._retrying: tenacity.Retrying | None = None

    def backoff(self, retry: int) -> float:
        """The full-jitter delay before retry number ``retry`` (0 for the first retry)."""
        ceiling = min(self.cap, self.base * (2.0 ** min(retry, 62)))
        return self._rng.uniform(0.0, ceiling)

    def decide(
        self,
        retries: int,
        classification: Classification,
        *,
        elapsed: float = 0.0,
        error: BaseException | None = None,
    ) -> RetryDecision:
        """Whether to retry after a failure.

        Args:
            retries: retries already made (0 after the first failure).
            classification: what the failure was.
            elapsed: seconds since the first attempt.
            error: the failure itself, shown to ``wait`` / ``stop`` strategies as the outcome.
        """
        kind = classification.error_class.value
        if not classification.retryable:
            return RetryDecision(False, 0.0, f"{kind} errors are not retried")
        if self.max_attempts is not None and retries + 1 >= self.max_attempts:
            return RetryDecision(False, 0.0, f"{self.max_attempts} attempts made")
        wanted = classification.retry_after
        state = None
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
        elif self.wait is not None:
            state = self._call_state(retries, elapsed, error)
            delay = max(0.0, float(self.wait(state)))
        else:
            delay = self.backoff(retries)
        if self.stop is not None:
            state = state or self._call_state(retries, elapsed, error)
            state.upcoming_sleep = delay  # what stop_before_delay looks at
            if self.stop(state):
                return RetryDecision(
                    False, 0.0, f"stop strategy: no retry after {retries + 1} attempts", wanted
                )
        if self.max_elapsed is not None and elapsed + delay > self.max_elapsed:
            return RetryDecision(
                False, 0.0, f"would pass max_elapsed {self.max_elapsed:g}s", wanted
            )
        return RetryDecision(True, delay, f"{kind}: retry {retries + 1} in {delay:.2f}s", wanted)

    def _call_state(
        self, retries: int, elapsed: float, error: BaseException | None
    ) -> tenacity.RetryCallState:
        """Tenacity's own call state after ``retries + 1`` failed attempts, on our clock."""
        import tenacity  # noqa: PLC0415 - only policies given tenacity strategies need it

        if self._retrying is None:  # the state's owner, as strategies may inspect it
            self._retrying = tenacity.Retrying(
                wait=self.wait or tenacity.wait_none(), stop=self.stop or tenacity.stop_never
            )
        state = tenacity.RetryCallState(self._retrying, None, (), {})
        state.attempt_number = retries + 1
        # Times relative to the first attempt: seconds_since_start is then `elapsed`, measured
        # on the caller's injected clock rather than tenacity's time.monotonic().
        state.start_time = 0.0
        state.outcome_timestamp = elapsed
        if error is not None:
            outcome = tenacity.Future(state.attempt_number)
            outcome.set_exception(error)
            state.outcome = outcome
        return state


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
    """Call ``fn`` until it succeeds or ``policy`` (or ``budget``) says stop; re-raise then.

    Args:
        fn: the call.
        policy: decides each retry.
        sleep: waits (default ``time.sleep``).
        clock: seconds, for ``max_elapsed`` (default: the monotonic clock). An HTTP-date
            ``Retry-After`` is read on the wall clock: the clock's own ``wall()`` when it has
            one (``FakeClock`` does), else the real one.
        budget: retries shared with other calls (one agent turn's).
    """
    sleep = sleep or _clock.sleep
    wall = _clock.wall_of(clock)
    clock = clock or _clock.monotonic
    start = clock()
    retries = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            c = classify(exc, now=wall())
            decision = policy.decide(retries, c, elapsed=clock() - start, error=exc)
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
    wall = _clock.wall_of(clock)
    clock = clock or _clock.monotonic
    start = clock()
    retries = 0
    while True:
        try:
            return await fn()
        except Exception as exc:
            c = classify(exc, now=wall())
            decision = policy.decide(retries, c, elapsed=clock() - start, error=exc)
            if not decision.retry or (budget is not None and not budget.try_acquire()):
                raise
        await sleep(decision.delay)
        retries += 1
