"""What validation found: the report, its errors and repairs, and the correction for the model.

:class:`ValidationReport` is the verdict on one assistant message;
:meth:`ValidationReport.corrective_messages` turns its errors into a re-ask the model can act on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentguard._fingerprint import safe_canonical_text
from agentguard._redact import redact
from agentguard.types import ToolCall

from ._tools import ToolSpec

__all__ = [
    "FEEDBACK_MARK",
    "ErrorKind",
    "Repair",
    "ToolCallError",
    "ValidationReport",
    "json_text",
    "short",
]

ErrorKind = Literal[
    "invalid_json",
    "unknown_tool",
    "missing_required",
    "type_mismatch",
    "unexpected_argument",
    "placeholder_argument",
    "empty_argument",
    "truncated",
    "schema_violation",
    "malformed_call",
    "empty_answer",
    "incomplete_call",
    "ungrounded_argument",
    "call_required",
    "not_chosen",
]

FEEDBACK_MARK = "[agentguard: automated feedback on your tool call]"
_VALUE_LIMIT = 80


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """One problem with one tool call.

    Attributes:
        kind: the error kind (see :data:`ErrorKind`).
        tool_call_id: the call's id, when it had one.
        tool_name: the tool as the model named it.
        path: JSON path of the problem within the arguments (``$`` for the whole call).
        message: what is wrong, for the model and for people.
        value: the offending value, truncated (``None`` when there is none).
        suggestions: valid alternatives (closest tool names, allowed values ...).
    """

    kind: ErrorKind
    tool_call_id: str | None
    tool_name: str
    path: str
    message: str
    value: str | None = None
    suggestions: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind} at {self.path} in {self.tool_name!r}: {self.message}"


@dataclass(frozen=True, slots=True)
class Repair:
    """One local change, made at no token cost.

    Attributes:
        kind: what was repaired (``extracted_from_text``, ``json_repaired``,
            ``double_encoded``, ``tool_name``, ``coerced``, ``dropped_argument``,
            ``dropped_parallel_calls``, ``split_calls``, ``repeated_arguments``).
        tool_call_id: the call concerned.
        path: where.
        before: the value before (truncated).
        after: the value after (truncated).
    """

    kind: str
    tool_call_id: str | None
    path: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.path}: {self.before!r} -> {self.after!r}"


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """The verdict on one assistant message.

    Attributes:
        ok: every call is valid (after repairs).
        tool_calls: the calls the agent should execute: normalised and repaired.
        errors: every problem that could not be repaired.
        repairs: every change made.
        message: the assistant message as received (for the correction).
        specs: the tools, for the correction.
        extracted: the calls came out of the text content.
        content: the text left once extracted calls are taken out.
    """

    ok: bool
    tool_calls: tuple[ToolCall, ...]
    errors: tuple[ToolCallError, ...]
    repairs: tuple[Repair, ...]
    message: Mapping[str, Any] = field(default_factory=dict, repr=False)
    specs: Mapping[str, ToolSpec] = field(default_factory=dict, repr=False)
    extracted: bool = False
    content: str | None = None

    @property
    def invented(self) -> bool:
        """The answer wrote, after its calls, a result for them (dropped: they had not run)."""
        return any(r.kind == "dropped_invented_result" for r in self.repairs)

    def cut_off(self) -> ValidationReport:
        """This report for an answer that ran past its cap: every call it holds is cut off
        (``truncated``), whatever it parsed to — a runaway is never repaired into a call."""
        if not self.tool_calls:
            return self
        errors = [
            ToolCallError(
                "truncated",
                c.id,
                c.name,
                "$",
                "the answer ran far past its token cap: the call was cut off, not completed",
                short(c.arguments),
            )
            for c in self.tool_calls
        ]
        repairs = tuple(r for r in self.repairs if r.kind == "extracted_from_text")
        return dataclasses.replace(self, ok=False, errors=(*self.errors, *errors), repairs=repairs)

    def corrective_text(self, tool_call_id: str | None = None) -> str:
        """The correction as plain text (for one call id, or for every failing call)."""
        errors = [e for e in self.errors if tool_call_id is None or e.tool_call_id == tool_call_id]
        return self._text_of(errors)

    def _text_of(self, errors: list[ToolCallError]) -> str:
        lines = [FEEDBACK_MARK]
        names = sorted({e.tool_name for e in errors})
        lines.append(
            "Your previous tool call was not executed because it is invalid."
            if len(names) <= 1
            else "Some of your previous tool calls were not executed because they are invalid."
        )
        for e in errors:
            detail = f"- {e.kind} at {e.path}: {e.message}"
            if e.value is not None:
                detail += f" (got {e.value})"
            if e.suggestions:
                detail += f"; did you mean: {', '.join(e.suggestions)}?"
            lines.append(detail)
        for name in names:
            spec = self.specs.get(name)
            if spec is not None:
                lines.append(f"Expected parameters of {name}: {_signature(spec)}")
        if any(e.kind == "unknown_tool" for e in errors):
            lines.append(f"Available tools: {', '.join(sorted(self.specs))}.")
        if any(e.kind == "truncated" for e in errors):
            lines.append("Your answer was cut off: send a shorter call.")
        lines.append("Reply with a corrected tool call that matches the schema exactly.")
        return "\n".join(lines)

    def corrective_messages(self) -> list[dict[str, Any]]:
        """Messages to append for a re-ask: the failed assistant message, then one ``tool``
        message per failing call id (a ``user`` message for errors without an id).

        The assistant message is re-sent with ``content: ""`` rather than ``null``: some
        OpenAI-compatible servers reject a null content.
        """
        assistant = dict(self.message)
        assistant["role"] = "assistant"
        if assistant.get("content") is None:
            assistant["content"] = ""
        calls = [c.to_openai(original) for original, c in self._sent_calls()]
        if calls:
            assistant["tool_calls"] = calls
        else:
            assistant.pop("tool_calls", None)
        out: list[dict[str, Any]] = [assistant]
        ids = {c["id"] for c in calls if c.get("id")}
        # the errors of each call id, grouped in one pass (linear in the number of calls)
        by_id: dict[str, list[ToolCallError]] = {}
        for e in self.errors:
            if e.tool_call_id is not None and e.tool_call_id in ids:
                by_id.setdefault(e.tool_call_id, []).append(e)
        answered: set[str] = set()
        for call_id, errors in by_id.items():
            answered.add(call_id)
            text = self._text_of(errors)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        for call in calls:  # every call in the message needs an answer
            if call.get("id") and call["id"] not in answered:
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": f"{FEEDBACK_MARK}\nNot executed: fix the other calls first.",
                    }
                )
        loose = [e for e in self.errors if e.tool_call_id not in ids]
        if loose:
            report = ValidationReport(False, (), tuple(loose), (), self.message, self.specs)
            out.append({"role": "user", "content": report.corrective_text()})
        return out

    def _sent_calls(self) -> list[tuple[Mapping[str, Any], ToolCall]]:
        """The message's calls, each as sent and in neutral form."""
        calls = self.message.get("tool_calls") or []
        if not isinstance(calls, (list, tuple)):
            return []  # not a list of calls: nothing that can be answered by id
        sent = []
        for i, c in enumerate(calls):
            if not isinstance(c, Mapping):
                continue  # not a call (a malformed_call error says so)
            fn = c.get("function")
            fn = fn if isinstance(fn, Mapping) else {}
            args = fn.get("arguments")
            text = args if isinstance(args, str) else json_text(args)
            call_id = c.get("id")
            name = fn.get("name", "")
            neutral = ToolCall(
                name if isinstance(name, str) else json_text(name),
                text,
                call_id if isinstance(call_id, str) and call_id else f"call_{i}",
            )
            sent.append((c, neutral))
        return sent


def _signature(spec: ToolSpec) -> str:
    required = set(spec.required)
    parts = []
    for name, schema in spec.properties.items():
        kind = schema.get("type", "any") if isinstance(schema, Mapping) else "any"
        if isinstance(schema, Mapping) and "enum" in schema:
            kind = " | ".join(json.dumps(v) for v in schema["enum"][:8])
        parts.append(f"{name}: {kind}{'' if name in required else ' (optional)'}")
    return "{" + ", ".join(parts) + "}" if parts else "{} (no arguments)"


def json_text(value: Any) -> str:
    """JSON text of any value: ``json.dumps``, or the safe canonical form when that fails
    (nested too deep, cyclic, a number too long)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return safe_canonical_text(value)


def short(value: Any) -> str:
    """``value`` as shown in errors and repairs: JSON, secrets redacted, truncated."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):  # deep, cyclic, a number too long
            text = safe_canonical_text(value)
    text = redact(text)
    return text if len(text) <= _VALUE_LIMIT else text[: _VALUE_LIMIT - 1] + "…"
