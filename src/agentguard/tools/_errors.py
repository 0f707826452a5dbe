"""ToolGuard's errors: schema drift, classification of a failed attempt, the text for the model."""

from __future__ import annotations

from typing import Any

from agentguard._redact import redact
from agentguard.resilience import (
    Classification,
    Classifier,
    ErrorClass,
    RetryDecision,
    classify,
)

from ._model import GuardedTool
from ._run import ToolTimeout

__all__ = ["checked", "classify_failure", "describe"]


def checked(tool: GuardedTool, value: Any) -> Any:
    """``value`` once the tool's result check passed; a schema failure otherwise."""
    assert tool.validate_result is not None
    try:
        return tool.validate_result(value)
    except Exception as exc:
        raise _SchemaDrift(str(exc)) from exc


class _SchemaDrift(Exception):
    """A tool's result no longer matches its schema."""


def classify_failure(
    tool: GuardedTool, exc: BaseException, classifiers: tuple[Classifier, ...], *, now: float
) -> Classification:
    """What a failed attempt means: schema drift and our own timeouts first, then the rules
    (``now``: wall-clock seconds, to read an HTTP-date ``Retry-After``)."""
    if isinstance(exc, _SchemaDrift):
        return Classification.of(ErrorClass.SCHEMA, reason=redact(str(exc))[:200])
    if isinstance(exc, ToolTimeout):
        return Classification.of(ErrorClass.TIMEOUT, reason=f"no answer within {exc.seconds:g}s")
    return classify(exc, classifiers=tool.classifiers + classifiers, now=now)


def describe(
    tool: GuardedTool,
    c: Classification,
    attempts: int,
    decision: RetryDecision | None = None,
    *,
    exhausted: bool = False,
    alternatives: tuple[str, ...] = (),
) -> str:
    """The error, written for the model: what failed, and whether trying again can help."""
    name, kind = f"`{tool.name}`", c.error_class
    if kind is ErrorClass.RATE_LIMITED:
        what = f"{name} is rate-limited ({c.reason})"
    elif kind is ErrorClass.CLIENT_ERROR:
        what = f"{name} rejected the call ({c.reason})"
    elif kind is ErrorClass.SCHEMA:
        what = f"{name} returned a result that no longer matches its schema ({c.reason})"
    else:
        what = f"{name} failed with a {kind.value.replace('_', ' ')} error ({c.reason})"
    parts = [what + (f" after {attempts} attempts." if attempts > 1 else ".")]
    wait = decision.retry_after if decision is not None else None
    if kind is ErrorClass.CLIENT_ERROR:
        parts.append("Retrying the same call will not help: fix the arguments first.")
    elif kind is ErrorClass.SCHEMA:
        parts.append("Do not rely on this tool's output for now.")
    elif wait is not None:
        parts.append(f"The service asked to wait {wait:g}s before trying again.")
    elif c.retryable:
        parts.append("Trying again later may help.")
    else:
        parts.append("Retrying will not help.")
    if exhausted:
        parts.append("The retry budget of this turn is spent: no more automatic retries.")
    if alternatives:
        parts.append(f"Alternatives: {', '.join(alternatives)}.")
    return " ".join(parts)
