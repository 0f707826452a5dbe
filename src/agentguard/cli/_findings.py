"""What ``agentguard scan`` reports: findings, what each one cost, per-tool tallies.

A finding says where the live guard would have acted (the model call, counted from 1, that
first sees the message: an answer is judged in the call that produced it, a tool result in the
next call, before the model is asked) and what it would have done there:

- a loop: what the guard's recovery ladder does (:mod:`._ladder`). A loop in the results a
  request brings climbs a rung: ``hint``, ``summary``, ``prune``, ``force``, then ``escalate``
  (``stop`` when no stronger tier takes it) and ``stop``; an answer judged at BREAK is asked
  again a rung higher; an answer below BREAK passes with a warning in the report (``warn``);
- ``repair``: broken JSON, a near-miss tool name or a call written as text, mended locally;
- ``recovery``: a tool call that breaks the tool's schema, or names no tool; the guard sends a
  corrective re-ask (and escalates after ``tool_validation.max_retries`` of them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from agentguard._redact import MAX_JSON_CHARS, redact, redact_content
from agentguard.types import Severity

__all__ = ["SEVERITY_NAMES", "Issue", "ToolStats", "context_line", "make_issue"]

_CONTEXT_CHARS = 400
#: ``str(severity)`` looked up once: the enum's name property costs microseconds per finding
SEVERITY_NAMES: dict[Severity, str] = {s: str(s) for s in Severity}


class Issue(NamedTuple):
    """A finding in a session: a loop or a bad tool call (a named tuple: a trace may hold
    many findings, and a tuple is made in a fifth of a frozen dataclass's time).

    Attributes:
        index: the message (0-based, within the session) where it was found.
        severity: how bad.
        category: ``loop`` or ``tool_call``.
        detector: the loop detector, or the tool-call error (``invalid_json``,
            ``unknown_tool``, ``text_tool_call``, ``missing_required``, ``type_mismatch`` ...).
        tool: the tool concerned, ``None`` for text.
        count: the repetition count behind a loop's severity (1 for tool calls).
        message: what is wrong, in words.
        step: the model call (from 1) at which the live guard would have acted.
        action: what it would have done (see the module docstring).
        tokens: tokens burnt: for a loop, the model calls in the loop from here until the next
            loop finding; for a bad call, the call that must be made again.
        cost: their price under the price table (0.0 for unpriced models).
        context: the messages around it, ``(index, role, text)``, for the HTML report.
    """

    # ``index`` and ``count`` stand in for the tuple methods of those names
    index: int  # type: ignore[assignment]
    severity: Severity
    category: str
    detector: str
    tool: str | None
    count: int  # type: ignore[assignment]
    message: str
    step: int = 0
    action: str = ""
    tokens: int = 0
    cost: float = 0.0
    context: tuple[tuple[int, str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (the context is for the HTML report only)."""
        return {
            "index": self.index,
            "step": self.step,
            "severity": SEVERITY_NAMES[self.severity],
            "category": self.category,
            "detector": self.detector,
            "count": self.count,
            "tool": self.tool,
            "action": self.action,
            "tokens": self.tokens,
            "cost": round(self.cost, 6),
            "message": self.message,
        }


#: an :class:`Issue` of all its fields, in order, made in C (``Issue._make`` without its Python
#: frames: a loop's finding is made twice, found and then settled at the end of its trace)
make_issue: Callable[[Iterable[Any]], Issue] = partial(tuple.__new__, Issue)


@dataclass
class ToolStats:
    """One tool's tally in a session (or over a file): calls, failed results, findings."""

    calls: int = 0
    errors: int = 0
    findings: int = 0
    tokens: int = 0
    cost: float = 0.0

    def add(self, other: ToolStats) -> None:
        """Add ``other``'s counts to these."""
        self.calls += other.calls
        self.errors += other.errors
        self.findings += other.findings
        self.tokens += other.tokens
        self.cost += other.cost

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "calls": self.calls,
            "errors": self.errors,
            "findings": self.findings,
            "tokens": self.tokens,
            "cost": round(self.cost, 6),
        }


def context_line(message: Any) -> tuple[str, str]:
    """``(role, text)`` of a message for the report: its text, then its calls, shortened, with
    anything that looks like a secret (provider keys, bearer credentials, the values of
    secret-looking keys) redacted."""
    role = str(message.get("role") or "?")
    content = message.get("content")
    # a result or arguments that are a JSON object: the values of its secret-looking keys
    # masked before it is printed (see redact_content)
    parts = [_keys_hidden(content) if isinstance(content, str) else ""]
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            arguments = fn.get("arguments")
            shown = _keys_hidden(arguments) if isinstance(arguments, str) else _text(arguments)
            parts.append(f"→ {fn.get('name')}({shown})")
    # redacted before it is cut (a key cut in two would escape the pattern), but only the head
    text = redact("\n".join(p for p in parts if p)[: 2 * _CONTEXT_CHARS])
    if len(text) > _CONTEXT_CHARS:
        text = text[:_CONTEXT_CHARS] + " …"
    return role, text


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(redact_content(value))


def _keys_hidden(text: str) -> str:
    """``text`` with the values of its secret-looking keys masked when it is a JSON object or
    array (parsed once, up to ``MAX_JSON_CHARS``); other text as it is (the context's own
    :func:`redact`, on the part shown, takes care of it)."""
    if text.lstrip()[:1] in ("{", "[") and len(text) <= MAX_JSON_CHARS:
        return str(redact_content(text))
    return text
