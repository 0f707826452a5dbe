"""Resilience components: error classification, retry decisions, circuit breakers.

Pure decisions on an injected clock; the guard's pipeline and ToolGuard carry them out.
See ``docs/resilience.md``.
"""

from __future__ import annotations

from agentguard._exports import publish

from ._breaker import BreakerDecision, BreakerSnapshot, BreakerState, CircuitBreaker
from ._classify import Classification, Classifier, ErrorClass, classify, retry_after_of
from ._retry import (
    RetryBudget,
    RetryDecision,
    RetryPolicy,
    StopStrategy,
    WaitStrategy,
    aretry_call,
    retry_call,
)

__all__ = [
    "BreakerDecision",
    "BreakerSnapshot",
    "BreakerState",
    "CircuitBreaker",
    "Classification",
    "Classifier",
    "ErrorClass",
    "RetryBudget",
    "RetryDecision",
    "RetryPolicy",
    "StopStrategy",
    "WaitStrategy",
    "aretry_call",
    "classify",
    "retry_after_of",
    "retry_call",
]

publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
