"""Neutral types shared by every layer: severities, tool calls, usage, small protocols, and the
escalation data (tiers, attempts, the confirm-mode prompt and its choices).

The lingua franca is the OpenAI chat format: a message is a plain ``dict`` with ``role``,
``content`` and, for assistant tool calls, ``tool_calls``. Adapters translate other shapes into it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from agentguard._exports import publish

if TYPE_CHECKING:
    from .config import TierConfig

__all__ = [
    "Attempt",
    "Choice",
    "Clock",
    "EscalationPrompt",
    "Message",
    "Severity",
    "Tier",
    "ToolCall",
    "Usage",
]

#: One chat message in the OpenAI format (``{"role": ..., "content": ..., ...}``).
Message: TypeAlias = Mapping[str, Any]


class Clock(Protocol):
    """Anything that returns the current time in seconds when called."""

    def __call__(self) -> float: ...


class Severity(enum.IntEnum):
    """How serious a finding is. Ordered: ``OK < WARNING < CRITICAL < BREAK``.

    ``WARNING`` and ``CRITICAL`` let the call proceed with a hint for the model; ``BREAK`` means
    the guard refuses to continue the pattern.
    """

    OK = 0
    WARNING = 1
    CRITICAL = 2
    BREAK = 3

    @classmethod
    def parse(cls, value: str | int | Severity) -> Severity:
        """Parse ``"warning"``, ``"WARNING"``, ``1`` or a ``Severity`` into a ``Severity``.

        Raises:
            ValueError: naming the allowed values when ``value`` is none of them.
        """
        if isinstance(value, Severity):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        allowed = ", ".join(s.name.lower() for s in cls)
        raise ValueError(f"unknown severity {value!r}; allowed: {allowed}")

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call in neutral form.

    Attributes:
        name: the tool's name as the model wrote it (or as repaired).
        arguments: the arguments as a JSON text, exactly as they travel in the OpenAI format.
        id: the call id, when the model gave one.
    """

    name: str
    arguments: str
    id: str | None = None

    def to_openai(self, original: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """This call as an entry of an OpenAI ``tool_calls`` list.

        Args:
            original: the entry the model sent for this call, if any: its fields besides the
                call itself go along unchanged (Gemini's ``extra_content`` carries the thought
                signature its API requires back with every call of the turn, or it answers 400).
        """
        out: dict[str, Any] = {}
        if original is not None:
            out.update((k, v) for k, v in original.items() if k not in CALL_FIELDS)
        out["type"] = "function"
        out["function"] = {"name": self.name, "arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
        return out


#: The fields of a ``tool_calls`` entry that are the call itself (``index`` places a streamed
#: fragment): what :meth:`ToolCall.to_openai` writes, whatever the original held; any other is a
#: provider's own (Gemini's ``extra_content``), kept.
CALL_FIELDS = frozenset({"id", "type", "function", "index"})


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one model call.

    Attributes:
        prompt_tokens: input tokens.
        completion_tokens: output tokens.
        estimated: ``True`` when the numbers are an estimate (the response carried no usage).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.estimated or other.estimated,
        )


# -- escalation data (shared by escalation, exceptions, the guard and its report) ----------------


@dataclass(frozen=True, slots=True)
class Tier:
    """One model tier.

    Attributes:
        name: the tier's name in the chain (``"default"`` when no tiers are configured).
        model: the model name sent upstream.
        base_url: the tier's own endpoint, or ``None`` for the wrapped client's.
        api_key_env: the environment variable holding its key (the key itself is never kept).
        timeout: per-attempt timeout in seconds, or ``None``.
    """

    name: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    timeout: float | None = None

    @classmethod
    def from_config(cls, name: str, config: TierConfig) -> Tier:
        """A tier from its configuration section."""
        return cls(name, config.model, config.base_url, config.api_key_env, config.timeout)

    @property
    def endpoint(self) -> tuple[str | None, str | None]:
        """Where its calls go, and as whom: ``base_url`` (``None``: the client's own) and the
        variable of its key (``None``: the client's). Tiers with one endpoint share a client,
        and a conversation kept upstream is at one endpoint only."""
        return self.base_url, self.api_key_env


class Choice(str, enum.Enum):
    """What the user may answer in confirm mode."""

    RETRY = "retry"
    USE_BACKUP = "use_backup"
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a request on one tier, for the attempt history.

    Attributes:
        tier: the tier's name.
        model: the model tried.
        outcome: what happened: ``ok`` (the answer was used), the class of the error the call
            ended in (``transient``, ``timeout``, ``rate_limited`` ...), ``breaker_open``, or
            what was wrong with the answer (``tool_validation_failure``, ``loop_detected``).
        detail: a short, redacted description.
    """

    tier: str
    model: str
    outcome: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class EscalationPrompt:
    """What confirm mode asks the user: no silent failover, costs shown.

    Every option says what it will cost before it is chosen: one more attempt is expected to
    spend ``estimated_tokens`` (the request's prompt plus an answer as long as this call's
    answers so far, or the request's output cap before any answer), priced on the current tier
    for *retry* and on the proposed tier for *use backup*; *cancel* spends nothing more.

    Attributes:
        reason: the trigger (``timeout``, ``server_error`` ...).
        message: what happened, in words.
        current: the tier that failed.
        proposed: the tier the guard would move to, or ``None`` when there is none.
        options: the choices on offer (``use_backup`` only when there is a tier to move to).
        tokens_spent: tokens spent on this request so far, all attempts included.
        cost_spent: their cost in the price table's currency, or ``None`` when unknown.
        attempts: attempts made so far.
        estimated_tokens: tokens one more attempt is expected to spend (an estimate).
        retry_cost: their cost on ``current``, or ``None`` when its model has no price.
        backup_cost: their cost on ``proposed``, or ``None`` when it has no price (or there is
            no proposed tier).
    """

    reason: str
    message: str
    current: Tier
    proposed: Tier | None
    options: tuple[Choice, ...]
    tokens_spent: int = 0
    cost_spent: float | None = None
    attempts: int = 0
    estimated_tokens: int = 0
    retry_cost: float | None = None
    backup_cost: float | None = None

    def estimate(self, choice: Choice) -> tuple[int, float | None]:
        """What ``choice`` is expected to spend: ``(tokens, cost or None when unpriced)``."""
        if choice == Choice.RETRY:
            return self.estimated_tokens, self.retry_cost
        if choice == Choice.USE_BACKUP:
            return self.estimated_tokens, self.backup_cost
        return 0, 0.0

    def render(self) -> str:
        """The prompt as text for a terminal: what failed, what it cost, each option's cost."""
        cost = "" if self.cost_spent is None else f" (~{_money(self.cost_spent)})"
        lines = [
            f"{self.current.name} ({self.current.model}) failed: {self.message}",
            f"Used so far: {self.tokens_spent:,} tokens{cost} over {self.attempts} attempt(s).",
            "Options:",
        ]
        labels = {
            Choice.RETRY: f"Try again with {self.current.name} ({self.current.model})",
            Choice.USE_BACKUP: (
                f"Use backup: {self.proposed.name} ({self.proposed.model})"
                if self.proposed
                else "Use backup"
            ),
            Choice.CANCEL: "Cancel",
        }
        lines += [f"  [{i}] {labels[o]}: {self._spend(o)}" for i, o in enumerate(self.options, 1)]
        return "\n".join(lines)

    def _spend(self, choice: Choice) -> str:
        tokens, cost = self.estimate(choice)
        if choice == Choice.CANCEL:
            return "nothing more spent"
        money = "no price configured" if cost is None else f"~{_money(cost)}"
        return f"~{tokens:,} more tokens ({money})"


def _money(amount: float) -> str:
    """Money for a person: four decimals, more for the fractions of a cent one attempt costs."""
    if amount == 0 or amount >= 0.001:
        return f"${amount:,.4f}"
    return f"${amount:.2g}" if amount < 1e-6 else f"${amount:.6f}"


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
