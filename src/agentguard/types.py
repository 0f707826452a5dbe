"""Neutral types shared by every layer: severities, tool calls, usage, and small protocols.

The lingua franca is the OpenAI chat format: a message is a plain ``dict`` with ``role``,
``content`` and, for assistant tool calls, ``tool_calls``. Adapters translate other shapes into it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

__all__ = ["Clock", "Message", "Severity", "ToolCall", "Usage"]

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

    def to_openai(self) -> dict[str, Any]:
        """This call as an entry of an OpenAI ``tool_calls`` list."""
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if self.id is not None:
            out["id"] = self.id
        return out


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
