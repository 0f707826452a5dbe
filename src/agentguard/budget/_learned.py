"""What a ``learned`` reservation holds for a call's output: a running high percentile.

Holding the whole output cap for every call (``reserve: strict``) refuses healthy concurrent
traffic long before a budget is spent: twenty calls in flight under a 16,384-token cap hold
330,000 tokens for answers that are mostly a few hundred tokens long. A learned reservation
holds what calls of the same model have actually produced instead — the 95th percentile of the
last :data:`WINDOW` completions, never less than the configured floor and never more than the
cap — while the store still admits a call only when its *worst case* (prompt plus the whole
cap) fits beside everything committed and held (see :attr:`~agentguard.storage.Hold.headroom`).

So one call on its own can never pass a limit, and a session's calls made one after another
never overshoot it (each commit is counted before the next check). What can overshoot is calls
in flight *together* whose outputs all run past their learned hold: by at most
``cap - hold`` each, beyond the first. ``docs/budgets.md`` states the bound;
``benchmarks/bench_budget_replay.py`` measures it.
"""

from __future__ import annotations

import math
import threading
from collections import deque

__all__ = ["OutputEstimate"]

#: Completions remembered per model.
WINDOW = 256
#: The share of remembered completions a learned hold covers.
PERCENTILE = 0.95
#: Observations between two recomputations of the percentile (sorting on every call would cost
#: the hot path; the estimate moves slowly anyway).
REFRESH = 16
#: Before a model has been seen, a learned hold is this many floors (capped).
COLD_FACTOR = 4


class OutputEstimate:
    """A running high percentile of the completion tokens observed, per model.

    Args:
        floor: the least a hold may be.
    """

    def __init__(self, floor: int) -> None:
        self._floor = floor
        self._seen: dict[str | None, deque[int]] = {}
        self._since: dict[str | None, int] = {}
        self._value: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def hold(self, model: str | None, cap: int | None) -> int:
        """Output tokens to hold for a call of ``model`` whose output may reach ``cap``."""
        value = self._value.get(model)
        if value is None:
            value = self._floor * COLD_FACTOR
        value = max(value, self._floor)
        return value if cap is None else min(value, cap)

    def observe(self, model: str | None, completion_tokens: int) -> None:
        """Remember a completed call's output."""
        with self._lock:
            seen = self._seen.get(model)
            if seen is None:
                seen = self._seen[model] = deque(maxlen=WINDOW)
                self._since[model] = REFRESH  # the first observation sets the estimate
            seen.append(completion_tokens)
            since = self._since[model] + 1
            if since < REFRESH and len(seen) > REFRESH:
                self._since[model] = since
                return
            self._since[model] = 0
            ordered = sorted(seen)
            rank = max(0, math.ceil(PERCENTILE * len(ordered)) - 1)
            self._value[model] = ordered[rank]
