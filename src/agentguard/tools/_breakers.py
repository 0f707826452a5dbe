"""A tool's circuit breaker inside the plan: asked in memory, or through the store it lives in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentguard._engine import Plan, perform
from agentguard.exceptions import StoreError
from agentguard.resilience import BreakerDecision, BreakerState, CircuitBreaker, Classification

from ._model import GuardedTool, ToolError

if TYPE_CHECKING:
    from ._guard import ToolGuard

__all__ = ["allow", "open_error", "record"]


def allow(g: ToolGuard, breaker: CircuitBreaker) -> Plan[BreakerDecision]:
    if breaker.store is None:
        return breaker.allow()
    try:
        decision = yield from perform(breaker.allow, breaker.aallow)
    except StoreError as exc:
        g._store_failed(exc)
        return BreakerDecision(True, BreakerState.CLOSED)
    return decision


def record(g: ToolGuard, breaker: CircuitBreaker, failure: Classification | None) -> Plan[None]:
    if breaker.store is None:
        if failure is None:
            breaker.record_success()
        else:
            breaker.record_failure(failure)
        return
    try:
        if failure is None:
            yield from perform(breaker.record_success, breaker.arecord_success)
        else:
            yield from perform(breaker.record_failure, breaker.arecord_failure, failure)
    except StoreError as exc:
        g._store_failed(exc)


def open_error(g: ToolGuard, tool: GuardedTool, decision: BreakerDecision) -> ToolError:
    now = g._clock()
    wait = None if decision.retry_at is None else max(0.0, decision.retry_at - now)
    when = "shortly" if wait is None else f"in {wait:.0f}s"
    alternatives = tool.fallback_names()
    also = f" Alternatives: {', '.join(alternatives)}." if alternatives else ""
    message = (
        f"`{tool.name}` is unavailable: its circuit breaker is {decision.state.value} after "
        f"repeated failures, so it was not called. It will be tried again {when}; do not "
        f"call it before then.{also}"
    )
    return ToolError(
        "breaker_open",
        tool.name,
        message,
        retryable=True,
        retry_after=wait,
        breaker=decision.state.value,
        retry_at=decision.retry_at,
        alternatives=alternatives,
    )
