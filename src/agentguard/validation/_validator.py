"""ToolCallValidator: extract, parse, repair, match names, validate, and write the correction.

The pipeline, in order, for one assistant message:

1. tool calls written as text are extracted (a repair);
2. arguments are parsed — double-encoded JSON unwrapped — and, only when parsing fails and the
   answer was not cut off (``finish_reason == "length"``), repaired with ``json_repair``;
3. the tool name is matched: exact, then case/separator-insensitive, then fuzzy with synonyms,
   auto-corrected only when unambiguous and the tool is not side-effecting;
4. the arguments are validated against the tool's schema, every error at once, with lossless
   coercions ("5" → 5) as repairs;
5. placeholder and empty values are flagged.

A valid call comes back untouched, byte for byte. What cannot be repaired without guessing
becomes an error with its location, the offending value and suggestions, and
:meth:`ValidationReport.corrective_messages` turns the errors into a re-ask the model can act on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import json_repair
from jsonschema import Draft202012Validator

from agentguard._fingerprint import canonical_json, fingerprint_bytes
from agentguard._redact import redact
from agentguard.config import GuardConfig, ToolValidationConfig
from agentguard.events import Emitter, Hook, ToolCallRejected, ToolCallRepaired
from agentguard.types import ToolCall

from ._extract import extract_calls
from ._fast import compile_check
from ._names import NameMatcher
from ._tools import ToolSpec, specs_from

__all__ = ["ErrorKind", "Repair", "ToolCallError", "ToolCallValidator", "ValidationReport"]

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
]

FEEDBACK_MARK = "[agentguard: automated feedback on your tool call]"
_VALUE_LIMIT = 80
_BUILTIN_PLACEHOLDERS = (
    r"<[^<>\s]{1,40}>",  # <query>
    r"\{[A-Za-z_][A-Za-z0-9_ ]{0,40}\}",  # {city}
    r"\[[A-Z_ ]{2,40}\]",  # [FILE NAME]
    r"(?i:string|str|text|value|placeholder|example|sample|null|none|undefined|n/a|tbd|todo|fixme)",
    r"\.{3}|…",  # ...
    r"(?i:your[_ \-]?\w{1,30}[_ \-]?here)",  # YOUR_KEY_HERE, your api key here
    r"(?i:xxx+|foo|bar|lorem ipsum.*)",
)
_SCHEMA_CACHE: dict[str, Draft202012Validator] = {}


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
            ``double_encoded``, ``tool_name``, ``coerced``, ``dropped_argument``).
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

    def corrective_text(self, tool_call_id: str | None = None) -> str:
        """The correction as plain text (for one call id, or for every failing call)."""
        errors = [e for e in self.errors if tool_call_id is None or e.tool_call_id == tool_call_id]
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
        calls = [c.to_openai() for c in self._sent_calls()]
        if calls:
            assistant["tool_calls"] = calls
        else:
            assistant.pop("tool_calls", None)
        out: list[dict[str, Any]] = [assistant]
        ids = {c["id"] for c in calls if c.get("id")}
        answered: set[str] = set()
        for e in self.errors:
            if (
                e.tool_call_id is not None
                and e.tool_call_id in ids
                and e.tool_call_id not in answered
            ):
                answered.add(e.tool_call_id)
                text = self.corrective_text(e.tool_call_id)
                out.append({"role": "tool", "tool_call_id": e.tool_call_id, "content": text})
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

    def _sent_calls(self) -> list[ToolCall]:
        calls = self.message.get("tool_calls") or []
        sent = []
        for i, c in enumerate(calls):
            fn = c.get("function") or {}
            args = fn.get("arguments")
            text = args if isinstance(args, str) else json.dumps(args)
            sent.append(ToolCall(str(fn.get("name", "")), text, c.get("id") or f"call_{i}"))
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


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = redact(text)
    return text if len(text) <= _VALUE_LIMIT else text[: _VALUE_LIMIT - 1] + "…"


def _path(parts: Iterable[Any]) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _as_message(message: Any) -> dict[str, Any]:
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        data = dump()
        if isinstance(data, Mapping):
            return dict(data)
    raise TypeError(f"cannot read an assistant message from {type(message).__name__}")


def _from_responses_items(items: Sequence[Any]) -> dict[str, Any]:
    """Responses API output items as one chat-format assistant message."""
    calls, texts = [], []
    for item in items:
        data = _as_message(item)
        if data.get("type") == "function_call":
            calls.append(
                {
                    "id": data.get("call_id") or data.get("id"),
                    "type": "function",
                    "function": {
                        "name": data.get("name", ""),
                        "arguments": data.get("arguments", ""),
                    },
                }
            )
        elif data.get("type") == "message":
            for part in data.get("content") or []:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


class ToolCallValidator:
    """Checks, repairs and corrects the tool calls of assistant messages.

    Args:
        tools: the tools: OpenAI ``tools`` entries, bare function specs, pydantic models,
            typed Python functions or :class:`ToolSpec` values.
        config: a :class:`GuardConfig`, its ``tool_validation`` section, or ``None``.
        hooks: event hooks.

    Raises:
        ToolSchemaError: a tool definition is unusable (checked once, here).
    """

    def __init__(
        self,
        tools: Iterable[Any],
        config: GuardConfig | ToolValidationConfig | None = None,
        *,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        if isinstance(config, ToolValidationConfig):
            self.config = config
        else:
            self.config = (config or GuardConfig()).tool_validation
        self.specs = specs_from(tools, self.config.side_effecting)
        self._validators = {name: _compiled(spec.parameters) for name, spec in self.specs.items()}
        # a sound shortcut for the common case (a valid call against a simple schema)
        self._fast = {name: compile_check(spec.parameters) for name, spec in self.specs.items()}
        self._names = NameMatcher(
            self.specs,
            min_score=self.config.name_min_score,
            min_gap=self.config.name_min_gap,
        )
        patterns = [*_BUILTIN_PLACEHOLDERS, *self.config.placeholders]
        self._placeholder = re.compile("|".join(f"(?:{p})" for p in patterns))
        self._emitter = Emitter(hooks)

    def validate(self, message: Any, finish_reason: str | None = None) -> ValidationReport:
        """Validate the tool calls of one assistant message.

        Args:
            message: a dict, an openai ``ChatCompletionMessage`` (2.x or 3.x), or a list of
                Responses API output items.
            finish_reason: the choice's finish reason; ``"length"`` means the answer was cut
                off, and cut-off arguments are reported, never completed.
        """
        if isinstance(message, (list, tuple)):
            msg = _from_responses_items(message)
        else:
            msg = _as_message(message)
        cfg = self.config
        raw_calls = list(msg.get("tool_calls") or [])
        repairs: list[Repair] = []
        errors: list[ToolCallError] = []
        extracted = False
        content = msg.get("content") if isinstance(msg.get("content"), str) else None
        if not raw_calls and content and cfg.repair:
            found = extract_calls(content)
            if found is not None:
                extracted = True
                content = found.remaining
                for i, (name, args) in enumerate(found.calls):
                    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                    raw_calls.append(
                        {
                            "id": f"call_ag{i}",
                            "type": "function",
                            "function": {"name": name, "arguments": text},
                        }
                    )
                    repairs.append(
                        Repair("extracted_from_text", f"call_ag{i}", "$", found.style, name)
                    )
        calls: list[ToolCall] = []
        for i, raw in enumerate(raw_calls):
            call, call_errors, call_repairs = self._one(raw, i, finish_reason)
            errors += call_errors
            repairs += call_repairs
            if call is not None:
                calls.append(call)
        if not self.config.enabled:
            errors = []
        report = ValidationReport(
            ok=not errors,
            tool_calls=tuple(calls),
            errors=tuple(errors),
            repairs=tuple(repairs),
            message=msg,
            specs=self.specs,
            extracted=extracted,
            content=content,
        )
        for r in repairs:
            self._emitter.emit(
                ToolCallRepaired(repair=r.kind, tool_call_id=r.tool_call_id, path=r.path)
            )
        for e in errors:
            self._emitter.emit(
                ToolCallRejected(
                    error=e.kind,
                    tool_call_id=e.tool_call_id,
                    tool_name=_short(e.tool_name),
                    path=e.path,
                )
            )
        return report

    # -- one call -------------------------------------------------------------------------------

    def _one(
        self, raw: Mapping[str, Any], index: int, finish_reason: str | None
    ) -> tuple[ToolCall | None, list[ToolCallError], list[Repair]]:
        cfg = self.config
        inner = raw.get("function")
        fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else raw
        raw_id = raw.get("id")
        call_id = raw_id if isinstance(raw_id, str) else None
        raw_name = fn.get("name")
        name: str = raw_name if isinstance(raw_name, str) else ""
        arguments = fn.get("arguments", "{}")
        errors: list[ToolCallError] = []
        repairs: list[Repair] = []

        # 2. arguments
        original_text = arguments if isinstance(arguments, str) else None
        parsed, problem, how = self._parse(arguments, finish_reason)
        if problem is not None:
            kind: ErrorKind = "truncated" if problem == "truncated" else "invalid_json"
            message = (
                "the arguments were cut off (finish_reason=length); they were not completed"
                if kind == "truncated"
                else f"the arguments are not a JSON object: {problem}"
            )
            errors.append(ToolCallError(kind, call_id, name, "$", message, _short(arguments)))
        elif how is not None:
            repairs.append(Repair(how, call_id, "$", _short(arguments), _short(parsed)))

        # 3. the tool name
        if cfg.validate_tool_names:
            match = self._names.match(name)
            if match.name is not None and match.name != name and cfg.repair and match.safe:
                repairs.append(Repair("tool_name", call_id, "$.name", name, match.name))
                name = match.name
            elif match.name != name:  # no match, or one that must not be applied unasked
                errors.append(
                    ToolCallError(
                        "unknown_tool",
                        call_id,
                        name,
                        "$.name",
                        f"there is no tool named {name!r}",
                        _short(name),
                        match.suggestions,
                    )
                )

        # 4 and 5. schema and plausibility
        spec = self.specs.get(name)
        if parsed is not None and spec is not None:
            parsed, schema_errors, schema_repairs = self._check(spec, parsed, call_id)
            errors += schema_errors
            repairs += schema_repairs

        if parsed is None:
            text = original_text if original_text is not None else json.dumps(arguments)
        elif not repairs and original_text is not None:
            text = original_text  # a valid call comes back byte for byte
        else:
            text = json.dumps(parsed, ensure_ascii=False)
        return ToolCall(name, text, call_id or f"call_{index}"), errors, repairs

    def _parse(
        self, arguments: Any, finish_reason: str | None
    ) -> tuple[Any, str | None, str | None]:
        """``(object, problem, repair kind)``."""
        cfg = self.config
        if isinstance(arguments, Mapping):
            return dict(arguments), None, None
        if arguments is None or arguments == "":
            return {}, None, None
        if not isinstance(arguments, str):
            return None, f"expected a JSON object, got {type(arguments).__name__}", None
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            if finish_reason == "length" or _ends_inside_a_string(arguments):
                # cut off mid-value: a repair would invent the rest of it
                return None, "truncated", None
            if not (cfg.repair and 0 < len(arguments) <= cfg.max_repair_bytes):
                return None, f"invalid JSON ({exc.msg} at position {exc.pos})", None
            try:
                repaired = json_repair.repair_json(arguments, return_objects=True)
            except Exception:  # the repair library must never crash the validator
                repaired = None
            if isinstance(repaired, str):  # a JSON-encoded object inside the repaired text
                try:
                    repaired = json.loads(repaired)
                except ValueError:
                    repaired = None
            if isinstance(repaired, dict) and repaired:
                return repaired, None, "json_repaired"
            return None, f"invalid JSON ({exc.msg} at position {exc.pos})", None
        how = None
        if isinstance(value, str) and cfg.repair:  # double-encoded: a JSON string holding JSON
            try:
                inner = json.loads(value)
            except ValueError:
                inner = None
            if isinstance(inner, dict):
                value, how = inner, "double_encoded"
        if not isinstance(value, dict):
            return None, f"expected a JSON object, got {type(value).__name__}", None
        return value, None, how

    def _check(
        self, spec: ToolSpec, args: dict[str, Any], call_id: str | None
    ) -> tuple[dict[str, Any], list[ToolCallError], list[Repair]]:
        cfg = self.config
        errors: list[ToolCallError] = []
        repairs: list[Repair] = []
        declared = spec.properties
        name = spec.name
        if declared and cfg.unexpected_arguments != "allow":
            for key in [k for k in args if k not in declared]:
                if cfg.unexpected_arguments == "drop" and cfg.repair:
                    repairs.append(
                        Repair(
                            "dropped_argument", call_id, f"$.{key}", _short(args[key]), "(removed)"
                        )
                    )
                    args = {k: v for k, v in args.items() if k != key}
                else:
                    close = self._names.closest(key, list(declared))
                    errors.append(
                        ToolCallError(
                            "unexpected_argument",
                            call_id,
                            name,
                            f"$.{key}",
                            f"{name} takes no argument {key!r}",
                            _short(args[key]),
                            close,
                        )
                    )
        if cfg.coerce and cfg.repair:
            args, coerced = _coerce(args, declared)
            for key, before, after in coerced:
                repairs.append(
                    Repair("coerced", call_id, f"$.{key}", _short(before), _short(after))
                )
        fast = self._fast[name]
        if cfg.validate_schema and not (fast is not None and fast(args)):
            for err in self._validators[name].iter_errors(args):
                errors.append(_schema_error(err, call_id, name))
        required = set(spec.required)
        for key, value in args.items():
            if not isinstance(value, str):
                continue
            if value.strip() == "" and key in required:
                errors.append(
                    ToolCallError(
                        "empty_argument",
                        call_id,
                        name,
                        f"$.{key}",
                        f"required {key!r} is empty",
                        '""',
                    )
                )
            elif self._placeholder.fullmatch(value.strip()) and not _allowed(
                declared.get(key), value
            ):
                errors.append(
                    ToolCallError(
                        "placeholder_argument",
                        call_id,
                        name,
                        f"$.{key}",
                        f"{key!r} holds a placeholder, not a real value",
                        _short(value),
                    )
                )
        return args, errors, repairs


def _allowed(schema: Any, value: str) -> bool:
    """A value the schema lists explicitly (an enum or const) is never a placeholder."""
    if not isinstance(schema, Mapping):
        return False
    return value in (schema.get("enum") or ()) or schema.get("const") == value


def _compiled(schema: Mapping[str, Any]) -> Draft202012Validator:
    key = fingerprint_bytes(canonical_json(schema))
    validator = _SCHEMA_CACHE.get(key)
    if validator is None:
        validator = Draft202012Validator(schema)
        if len(_SCHEMA_CACHE) > 4096:
            _SCHEMA_CACHE.clear()
        _SCHEMA_CACHE[key] = validator
    return validator


def _schema_error(err: Any, call_id: str | None, tool: str) -> ToolCallError:
    path = _path(err.absolute_path)
    if err.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", err.message)
        key = missing[0] if missing else "?"
        where = f"{path}.{key}" if path != "$" else f"$.{key}"
        return ToolCallError(
            "missing_required", call_id, tool, where, f"required argument {key!r} is missing"
        )
    if err.validator == "type":
        expected = err.validator_value
        return ToolCallError(
            "type_mismatch",
            call_id,
            tool,
            path,
            f"expected {expected if isinstance(expected, str) else ' or '.join(expected)}, "
            f"got {type(err.instance).__name__}",
            _short(err.instance),
        )
    if err.validator == "additionalProperties":
        return ToolCallError("unexpected_argument", call_id, tool, path, redact(err.message)[:200])
    suggestions: tuple[str, ...] = ()
    if err.validator == "enum":
        suggestions = tuple(_short(v) for v in err.validator_value[:8])
    return ToolCallError(
        "schema_violation",
        call_id,
        tool,
        path,
        redact(err.message)[:200],
        _short(err.instance),
        suggestions,
    )


def _coerce(
    args: dict[str, Any], declared: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, Any, Any]]]:
    """Lossless coercions of top-level scalars: "5" -> 5, "2.5" -> 2.5, "true" -> true."""
    changed: list[tuple[str, Any, Any]] = []
    out = args
    for key, value in args.items():
        schema = declared.get(key)
        if not isinstance(schema, Mapping) or not isinstance(value, str):
            continue
        kind = schema.get("type")
        new: Any = value
        text = value.strip()
        if kind == "integer" and re.fullmatch(r"-?\d{1,18}", text):
            new = int(text)
        elif kind == "number" and re.fullmatch(r"-?\d{1,18}(\.\d{1,18})?", text):
            number = float(text)
            new = int(number) if number.is_integer() and "." not in text else number
        elif kind == "boolean" and text in ("true", "false"):
            new = text == "true"
        if new is not value:
            if out is args:
                out = dict(args)
            out[key] = new
            changed.append((key, value, new))
    return out, changed


def _ends_inside_a_string(text: str) -> bool:
    """Whether JSON text stops inside an open double-quoted string (``{"path": "set``)."""
    inside = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = inside
        elif char == '"':
            inside = not inside
    return inside
