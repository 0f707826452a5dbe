"""The plan of one guarded tool call (:meth:`ToolGuard.call` / :meth:`ToolGuard.acall`).

A sans-I/O plan, the shape of the model pipeline's (see ``agentguard._engine``): loop check →
approval of a high-risk tool → idempotency key → attempts through the tool's breaker, each under
its timeout, retried with full-jitter backoff while the turn's retry budget lasts → the fallback
chain → dead letter → loop record. The plan yields what it wants done (run an attempt, sleep, a
store or breaker :class:`~agentguard._engine.Call`, ask a person) and the guard's sync and async
drivers carry it out. Each function takes the guard whose registrations and state it reads.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentguard._engine import Plan, Sleep
from agentguard._fingerprint import safe_canonical_text
from agentguard.events import (
    ToolCallFailed,
    ToolCallRefused,
    ToolCallRetried,
    ToolCallStarted,
    ToolCallSucceeded,
    ToolFallbackUsed,
)
from agentguard.resilience import Classification, ErrorClass, RetryDecision, classify
from agentguard.types import Severity

from . import _breakers as breakers
from . import _idempotency as idempotency
from . import _letters as letters
from . import _turns as turns
from ._errors import checked, classify_failure, describe
from ._model import (
    Criticality,
    Default,
    GuardedTool,
    ToolError,
    ToolOutcome,
    TraceEntry,
    decode_arguments,
)
from ._run import Invoke
from ._turns import Turn

if TYPE_CHECKING:
    from ._guard import ToolGuard

__all__ = ["Result", "plan"]

_NO_FALLBACK = {ErrorClass.CLIENT_ERROR.value, "loop_detected", "not_approved"}
_NO_FALLBACK |= {"duplicate_in_flight", "idempotency_conflict", "unknown_tool"}
_DEAD_LETTER = {c.value for c in ErrorClass} - {"client_error", "cancelled"} | {"breaker_open"}


@dataclass(slots=True)
class Result:
    """What a run of one tool (its attempts, without fallbacks) came to."""

    ok: bool
    value: Any = None
    error: ToolError | None = None
    attempts: int = 0
    errors: list[Classification] = field(default_factory=list)


def plan(
    g: ToolGuard,
    name: str,
    raw: Mapping[str, Any] | str | None,
    key: str | None,
    run: str | None = None,
) -> Plan[ToolOutcome]:
    """The plan of ``g.call(name, raw, idempotency_key=key, run=run)``: it never raises for the
    tool."""
    turn = g.current_turn
    start = g._clock()
    g._emit(ToolCallStarted(tool=name, turn=turn.id, session=g.session))
    try:
        arguments = decode_arguments(raw)
    except (TypeError, ValueError) as exc:
        error = ToolError("client_error", name, f"The arguments are not a JSON object: {exc}.")
        return _finish(g, turn, {}, ToolOutcome(name, False, error=error), start)
    tool = g._tools.get(name)
    if tool is None:
        return _refuse(g, turn, name, arguments, start, why=_unknown(g, name))
    if not g.config.enabled:
        return (yield from _unguarded(g, turn, tool, arguments, start))
    # JSON text: the detector memoises its fingerprint, so check and record compute it once
    checking = g._detector.config.enabled
    seen = raw if isinstance(raw, str) or not checking else _text(arguments)
    with g._detector_lock:
        verdict = g._loop_detector(run).check_tool_call(name, seen)
    if verdict.severity is Severity.BREAK:
        return _refuse(g, turn, name, arguments, start, why=("loop_detected", verdict.message))
    if tool.high_risk:
        approved = None
        if g.on_hand_off is not None:
            approved = yield from turns.hand_off(
                g, "high_risk", tool, arguments, error=None, turn=turn
            )
        if not approved:
            why = "no person approved it" if g.on_hand_off else "no approver is configured"
            message = f"`{name}` is a high-risk tool and was not run: {why}."
            return _refuse(g, turn, name, arguments, start, why=("not_approved", message))
    if tool.side_effecting:
        # a key the caller (or the model) supplied in the arguments is the key of the operation
        key = (
            key or idempotency.supplied_key(arguments) or idempotency.derive_key(g, name, arguments)
        )
        claimed = yield from idempotency.claim(g, tool, arguments, key)
        if isinstance(claimed, ToolOutcome):
            return _finish(g, turn, arguments, claimed, start)
    outcome = yield from _run_chain(g, turn, tool, arguments, key if tool.side_effecting else None)
    if tool.side_effecting and key is not None:
        yield from idempotency.settle(g, key, arguments, outcome)
    with g._detector_lock:
        # (looked up again: the run may have been forgotten, and made afresh, meanwhile)
        after = g._loop_detector(run).record_tool_result(
            name,
            seen,
            outcome.value if outcome.ok else (outcome.error.kind if outcome.error else ""),
            error=not outcome.ok,
        )
    # the verdict after the result is the one that knows whether the call made progress
    hint = after.message if after.severity >= Severity.WARNING else ""
    return _finish(g, turn, arguments, outcome, start, hint=hint)


def _unguarded(
    g: ToolGuard, turn: Turn, tool: GuardedTool, arguments: dict[str, Any], start: float
) -> Plan[ToolOutcome]:
    try:
        value = yield Invoke(tool, arguments, None, None)
    except Exception as exc:
        c = classify(exc, classifiers=tool.classifiers + g._classifiers, now=g._clock())
        error = ToolError(c.error_class.value, tool.name, describe(tool, c, 1), c.retryable)
        return _finish(
            g, turn, arguments, ToolOutcome(tool.name, False, error=error, attempts=1), start
        )
    return _finish(g, turn, arguments, ToolOutcome(tool.name, True, value, attempts=1), start)


def _run_chain(
    g: ToolGuard,
    turn: Turn,
    tool: GuardedTool,
    arguments: dict[str, Any],
    key: str | None,
) -> Plan[ToolOutcome]:
    """The tool's attempts, then its fallbacks; a dead letter when all failed."""
    result = yield from _attempts(g, turn, tool, arguments, key)
    if result.ok:
        return ToolOutcome(tool.name, True, result.value, attempts=result.attempts)
    error = result.error
    assert error is not None
    attempts = result.attempts
    if error.kind not in _NO_FALLBACK and not turn.exhausted:
        for fallback in tool.fallbacks:
            if isinstance(fallback, Default):
                g._emit(
                    ToolFallbackUsed(
                        tool=tool.name,
                        fallback="default",
                        error=error.kind,
                        session=g.session,
                    )
                )
                return ToolOutcome(
                    tool.name, True, fallback.value, attempts=attempts, fallback="default"
                )
            other = g._tools.get(fallback)
            if other is None:
                continue
            sub = yield from _attempts(g, turn, other, arguments, None)
            attempts += sub.attempts
            if sub.ok:
                g._emit(
                    ToolFallbackUsed(
                        tool=tool.name,
                        fallback=fallback,
                        error=error.kind,
                        session=g.session,
                    )
                )
                return ToolOutcome(tool.name, True, sub.value, attempts=attempts, fallback=fallback)
    if error.kind == "breaker_open" and tool.criticality is Criticality.BLOCKING:
        yield from turns.hand_off(g, "breaker_open", tool, arguments, error=error, turn=turn)
    if error.kind in _DEAD_LETTER:
        yield from letters.record(g, turn, tool, arguments, key=key, result=result)
    return ToolOutcome(tool.name, False, error=error, attempts=attempts)


def _attempts(
    g: ToolGuard, turn: Turn, tool: GuardedTool, arguments: dict[str, Any], key: str | None
) -> Plan[Result]:
    """Attempts of one tool through its breaker, retried while policy and budget allow."""
    breaker = g._breakers[tool.name]
    policy = g._policies[tool.name]
    result = Result(False)
    first = g._clock()
    while True:
        # a breaker kept in memory answers at once: no store step, no generator to run
        local = breaker.store is None
        decision = breaker.allow() if local else (yield from breakers.allow(g, breaker))
        if not decision.allowed:
            result.error = breakers.open_error(g, tool, decision)
            g._emit(
                ToolCallRefused(
                    tool=tool.name,
                    reason="breaker_open",
                    message=result.error.message,
                    session=g.session,
                )
            )
            return result
        result.attempts += 1
        try:
            value = yield Invoke(tool, arguments, key, tool.timeout)
            if tool.validate_result is not None:
                value = checked(tool, value)
        except Exception as exc:
            c = classify_failure(tool, exc, g._classifiers, now=g._clock())
            result.errors.append(c)
            yield from breakers.record(g, breaker, c)
            retry = policy.decide(result.attempts - 1, c, elapsed=g._clock() - first)
            if (
                retry.retry
                and not tool.retries_safely
                and c.error_class is not ErrorClass.RATE_LIMITED
            ):
                retry = RetryDecision(
                    False, 0.0, "side-effecting tool: not retried", retry.retry_after
                )
            if retry.retry:
                if turn.budget.try_acquire():
                    g._emit(
                        ToolCallRetried(
                            tool=tool.name,
                            attempt=result.attempts,
                            error=c.error_class.value,
                            delay=retry.delay,
                            retry_after=retry.retry_after,
                            session=g.session,
                        )
                    )
                    yield Sleep(retry.delay)
                    continue
                yield from turns.budget_exhausted(g, turn, tool, arguments, c)
            state = breaker.state.value if breaker.store is None else "closed"
            result.error = ToolError(
                c.error_class.value,
                tool.name,
                describe(
                    tool,
                    c,
                    result.attempts,
                    retry,
                    exhausted=turn.exhausted,
                    alternatives=tool.fallback_names(),
                ),
                retryable=c.retryable,
                retry_after=retry.retry_after if retry.retry_after is not None else c.retry_after,
                status_code=c.status_code,
                breaker=state,
                alternatives=tool.fallback_names(),
                budget_exhausted=turn.exhausted,
            )
            return result
        except BaseException:  # cancellation: never swallowed, never counted
            if decision.probe and breaker.store is None:
                breaker.record_failure(Classification.of(ErrorClass.CANCELLED))
            raise
        if local:
            breaker.record_success()
        else:
            yield from breakers.record(g, breaker, None)
        result.ok, result.value = True, value
        return result


def _unknown(g: ToolGuard, name: str) -> tuple[str, str]:
    close = difflib.get_close_matches(name, list(g._tools), n=3, cutoff=0.5)
    known = close or sorted(g._tools)[:10]
    label = "Closest tools" if close else "Available tools"
    return "unknown_tool", f"There is no tool `{name}`. {label}: {', '.join(known) or 'none'}."


def _refuse(
    g: ToolGuard,
    turn: Turn,
    name: str,
    arguments: Mapping[str, Any],
    start: float,
    *,
    why: tuple[str, str],
) -> ToolOutcome:
    """Answer without running the tool; ``why`` is the reason and the message."""
    reason, message = why
    g._emit(ToolCallRefused(tool=name, reason=reason, message=message, session=g.session))
    tool = g._tools.get(name)
    alternatives = tool.fallback_names() if tool is not None else ()
    error = ToolError(reason, name, message, alternatives=alternatives)
    return _finish(g, turn, arguments, ToolOutcome(name, False, error=error), start)


def _finish(
    g: ToolGuard,
    turn: Turn,
    arguments: Mapping[str, Any],
    done: ToolOutcome,
    start: float,
    *,
    hint: str = "",
) -> ToolOutcome:
    elapsed = g._clock() - start
    outcome = ToolOutcome(
        done.tool,
        done.ok,
        done.value,
        done.error,
        done.attempts,
        elapsed,
        done.fallback,
        done.replayed,
        hint,
    )
    error = outcome.error
    turn.trace.append(
        TraceEntry(
            outcome.tool,
            arguments,
            outcome.ok,
            None if error is None else error.kind,
            outcome.attempts,
            elapsed,
            outcome.fallback,
        )
    )
    if error is None:
        g._emit(
            ToolCallSucceeded(
                tool=outcome.tool,
                attempts=outcome.attempts,
                elapsed=elapsed,
                fallback=outcome.fallback,
                session=g.session,
            )
        )
    else:
        g._emit(
            ToolCallFailed(
                tool=outcome.tool,
                error=error.kind,
                retryable=error.retryable,
                attempts=outcome.attempts,
                elapsed=elapsed,
                session=g.session,
            )
        )
    return outcome


def _text(arguments: Mapping[str, Any]) -> str:
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # not JSON data (objects, bytes keys, a
        return safe_canonical_text(arguments)  # number too long): its safe canonical form
