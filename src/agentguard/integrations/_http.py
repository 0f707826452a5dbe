"""What the HTTP front doors share (the LiteLLM proxy route and ``agentguard serve``): a guard
decision as an HTTP answer, and a report as ``x-agentguard-*`` headers."""

from __future__ import annotations

import math
import time

from agentguard.exceptions import (
    AgentGuardError,
    BudgetExceeded,
    EscalationRequired,
    LoopDetected,
    TiersExhausted,
    ToolSchemaError,
    ToolValidationFailed,
)
from agentguard.guard import GuardReport

__all__ = ["error_answer", "headers_of"]

# Statuses an OpenAI-compatible client acts on sensibly (litellm maps them to its
# BadRequestError, PermissionDeniedError, BadGatewayError, RateLimitError and
# ServiceUnavailableError; it has no 402, 409 or 422 for custom providers).
_STATUS: dict[type[AgentGuardError], tuple[int, str]] = {
    LoopDetected: (400, "loop_detected"),
    EscalationRequired: (400, "escalation_required"),
    ToolValidationFailed: (502, "tool_validation_failed"),
    BudgetExceeded: (429, "budget_exceeded"),
    TiersExhausted: (503, "tiers_exhausted"),
    ToolSchemaError: (400, "tool_schema_error"),  # fail_mode closed: tools it cannot read
}
# Every tier failed: the last failure says what the client should make of it (tool calls that
# stayed invalid on every tier are still a 502, not an outage).
_BY_REASON: dict[str, type[AgentGuardError]] = {
    "tool_validation_failure": ToolValidationFailed,
    "loop_detected": LoopDetected,
}


def error_answer(
    exc: AgentGuardError, *, now: float | None = None
) -> tuple[int, str, dict[str, str]]:
    """The HTTP answer to a guard decision: status, error type and headers.

    The status is chosen for what an OpenAI-compatible client does with it: a budget that frees
    up within the rolling hour is a 429 with ``Retry-After`` (seconds until it does), which
    clients wait for and retry; a session budget spent for good is a 403 (and a single request
    larger than a budget a 400) with no ``Retry-After``, which the openai SDKs do not retry. The
    headers are the ``x-agentguard-*`` ones of the guard's record, plus ``x-agentguard-attempts``
    (``tier:outcome`` of each model call).

    Args:
        exc: the guard's error (it carries the record when a guarded call raised it).
        now: wall-clock seconds since the epoch (``time.time()`` when ``None``).
    """
    cls: type[AgentGuardError] = type(exc)
    if isinstance(exc, TiersExhausted):
        cls = _BY_REASON.get(exc.reason, TiersExhausted)
    status, kind = next((v for c, v in _STATUS.items() if issubclass(cls, c)), (500, "error"))
    report = exc.agentguard_report
    headers = headers_of(report) if report is not None else {}
    if isinstance(exc, BudgetExceeded):
        headers["x-agentguard-budget-exceeded"] = "true"
        if exc.resets_at is not None:
            wait = exc.resets_at - (_wall() if now is None else now)
            headers["retry-after"] = str(max(1, math.ceil(wait)))
        else:
            status = 403 if exc.budget == "session" else 400
    return status, kind, headers


def _wall() -> float:
    # Retry-After is relative to the server's own now (agentguard's clock module is private to
    # the core; tests pass ``now``)
    return time.time()  # noqa: TID251


def headers_of(report: GuardReport) -> dict[str, str]:
    """The report's ``x-agentguard-*`` headers, with what happened on each attempt."""
    headers = report.headers()
    if report.attempts:
        headers["x-agentguard-attempts"] = ",".join(
            f"{a.tier}:{a.outcome}" for a in report.attempts
        )
    return headers
