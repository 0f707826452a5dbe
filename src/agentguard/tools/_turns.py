"""Turns: the retry budget and trace of one agent turn, and the hand-off to a person."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentguard._engine import Plan
from agentguard.events import HandOffRequested, RetryBudgetExhausted
from agentguard.resilience import Classification, RetryBudget

from ._errors import describe
from ._model import GuardedTool, HandOff, ToolError, TraceEntry

if TYPE_CHECKING:
    from ._guard import ToolGuard

__all__ = ["Consult", "Turn", "budget_exhausted", "hand_off"]


@dataclass(frozen=True, slots=True)
class Consult:
    """Hand a decision to the person behind ``on_hand_off``; the result is their answer."""

    hand_off: HandOff


class Turn:
    """One agent turn: its retry budget, the trace of its tool calls and the model's reasoning.

    Attributes:
        id: the turn's id.
        budget: retries left across all tools in this turn.
        trace: every guarded call of the turn, in order.
        reasoning: the model's last reasoning (shown to a person on hand-off).
    """

    __slots__ = ("budget", "exhausted", "id", "reasoning", "trace")

    def __init__(
        self, retries: int, *, id: str | None = None, reasoning: str | None = None
    ) -> None:
        self.id = id or uuid.uuid4().hex[:12]
        self.budget = RetryBudget(retries)
        self.trace: list[TraceEntry] = []
        self.reasoning = reasoning
        self.exhausted = False  # the budget ran out: the guard stops intervening

    def __repr__(self) -> str:
        return f"Turn({self.id!r}, calls={len(self.trace)}, retries_left={self.budget.remaining})"


def budget_exhausted(
    g: ToolGuard, turn: Turn, tool: GuardedTool, arguments: Mapping[str, Any], c: Classification
) -> Plan[None]:
    if turn.exhausted:
        return
    turn.exhausted = True
    g._emit(
        RetryBudgetExhausted(
            turn=turn.id, total=turn.budget.total, tool=tool.name, session=g.session
        )
    )
    error = ToolError(
        c.error_class.value,
        tool.name,
        describe(tool, c, 0, exhausted=True),
        c.retryable,
        budget_exhausted=True,
    )
    yield from hand_off(g, "retry_budget_exhausted", tool, arguments, error=error, turn=turn)


def hand_off(
    g: ToolGuard,
    reason: str,
    tool: GuardedTool,
    arguments: Mapping[str, Any],
    *,
    error: ToolError | None,
    turn: Turn,
) -> Plan[Any]:
    g._emit(HandOffRequested(reason=reason, tool=tool.name, turn=turn.id, session=g.session))
    if g.on_hand_off is None:
        return None
    payload = HandOff(
        reason,
        tool.name,
        arguments,
        error,
        tuple(turn.trace),
        turn.reasoning,
        turn.id,
        g.session,
    )
    return (yield Consult(payload))
