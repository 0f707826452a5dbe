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
becomes an error with its location, the offending value and suggestions, collected in a
:class:`~agentguard.validation.ValidationReport` (``_report.py``), whose
``corrective_messages()`` turn the errors into a re-ask the model can act on. JSON Schema
errors are mapped to error kinds and paths in ``_schema.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agentguard._fingerprint import (
    MAX_DEPTH,
    decode_arguments,
    fingerprint_text,
    too_deep,
)
from agentguard.config import GuardConfig, ToolValidationConfig
from agentguard.events import Emitter, GuardInternalError, Hook, ToolCallRejected, ToolCallRepaired
from agentguard.exceptions import ToolSchemaError
from agentguard.transport import message_from_items
from agentguard.types import ToolCall

from ._extract import extract_calls
from ._fast import compile_check
from ._names import NameMatcher
from ._report import ErrorKind, Repair, ToolCallError, ValidationReport, json_text, short
from ._schema import compiled, schema_error
from ._tools import ANY_OBJECT, ToolSpec, _not_a_function, specs_from

__all__ = ["ToolCallValidator"]

#: Marks arguments not decoded yet (``None`` is a value: JSON ``null``).
_UNDECODED: Any = object()
_BUILTIN_PLACEHOLDERS = (
    r"<[^<>\s]{1,40}>",  # <query>
    r"\{[A-Za-z_][A-Za-z0-9_ ]{0,40}\}",  # {city}
    r"\[[A-Z_ ]{2,40}\]",  # [FILE NAME]
    r"(?i:string|str|text|value|placeholder|example|sample|null|none|undefined|n/a|tbd|todo|fixme)",
    r"\.{3}|…",  # ...
    r"(?i:your[_ \-]?\w{1,30}[_ \-]?here)",  # YOUR_KEY_HERE, your api key here
    r"(?i:xxx+|foo|bar|lorem ipsum.*)",
)


def _as_message(message: Any) -> dict[str, Any]:
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        data = dump()
        if isinstance(data, Mapping):
            return dict(data)
    raise TypeError(f"cannot read an assistant message from {type(message).__name__}")


class ToolCallValidator:
    """Checks, repairs and corrects the tool calls of assistant messages.

    Args:
        tools: the tools: OpenAI ``tools`` entries, bare function specs, pydantic models,
            typed Python functions or :class:`ToolSpec` values.
        config: a :class:`GuardConfig`, its ``tool_validation`` section, or ``None``.
        hooks: event hooks.
        lenient: a tool definition the validator cannot use does not raise: the tool is kept by
            name (when it has one) and its calls are checked only for being a JSON object, and a
            ``guard_internal_error`` event says so, once per tool. This is how the guard reads
            the tools of a request, which are the caller's to send, not the guard's to refuse.

    Raises:
        ToolSchemaError: a tool definition is unusable, checked here (a schema that is not
            valid JSON Schema, a name defined twice ...) or, for a schema that cannot be applied
            (a ``$ref`` that cannot be resolved, or one that refers to itself forever), by
            :meth:`validate`. Never with ``lenient``.
    """

    def __init__(
        self,
        tools: Iterable[Any],
        config: GuardConfig | ToolValidationConfig | None = None,
        *,
        hooks: Iterable[Hook] | None = None,
        lenient: bool = False,
    ) -> None:
        if isinstance(config, ToolValidationConfig):
            self.config = config
        else:
            self.config = (config or GuardConfig()).tool_validation
        tools = list(tools)
        #: tools of other kinds are offered too (custom, web_search ...): their calls, which
        #: an answer may hold beside or instead of function calls, are not the guard's to read
        self._other_tools = any(_not_a_function(t) for t in tools)
        self._emitter = Emitter(hooks)
        self._lenient = lenient
        unusable: list[ToolSchemaError] | None = [] if lenient else None
        self.specs = specs_from(
            tools,
            self.config.side_effecting,
            by_name=self.config.side_effecting_by_name,
            unusable=unusable,
        )
        for problem in unusable or ():
            self._unusable(problem)
        self._validators = {name: compiled(spec.parameters) for name, spec in self.specs.items()}
        # a sound shortcut for the common case (a valid call against a simple schema)
        self._fast = {name: compile_check(spec.parameters) for name, spec in self.specs.items()}
        self._names = NameMatcher(
            self.specs,
            min_score=self.config.name_min_score,
            min_gap=self.config.name_min_gap,
        )
        patterns = [*_BUILTIN_PLACEHOLDERS, *self.config.placeholders]
        self._placeholder = re.compile("|".join(f"(?:{p})" for p in patterns))

    def validate(
        self,
        message: Any,
        finish_reason: str | None = None,
        *,
        tool_choice: Any = None,
        parallel_tool_calls: Any = None,
    ) -> ValidationReport:
        """Validate the tool calls of one assistant message.

        Args:
            message: a dict, an openai ``ChatCompletionMessage`` (2.x or 3.x), or a list of
                Responses API output items.
            finish_reason: the choice's finish reason; ``"length"`` means the answer was cut
                off, and cut-off arguments are reported, never completed.
            tool_choice: the request's ``tool_choice`` (chat or Responses form): with
                ``enforce_tool_choice``, text where it asks for a call, or a call to another
                tool than the one it names, is an error.
            parallel_tool_calls: the request's ``parallel_tool_calls``: ``False`` keeps an
                answer's first call only (with ``enforce_tool_choice``).
        """
        if isinstance(message, (list, tuple)):
            msg = message_from_items(message)
        else:
            msg = _as_message(message)
        cfg = self.config
        # each call with its decoded arguments when they are known already (extracted calls)
        raw_calls: list[tuple[Mapping[str, Any], Any]] = []
        repairs: list[Repair] = []
        # calls run together in one are read as those calls (``split_calls``) when repairing
        errors = _read_calls(msg.get("tool_calls"), raw_calls, repairs, cfg.repair, self.specs)
        extracted = False
        content = msg.get("content") if isinstance(msg.get("content"), str) else None
        # under tool_choice "none" a call written as text stays text: no call was allowed
        if not raw_calls and content and cfg.repair and tool_choice != "none":
            found = extract_calls(content, self.specs)
            if found is not None:
                extracted = True
                text_of_calls = content
                content = found.remaining
                if found.dropped is not None:
                    repairs.append(
                        Repair("dropped_invented_result", None, "$", short(found.dropped), "")
                    )
                for i, (name, args) in enumerate(found.calls):
                    # a value the extraction decoded is passed on, not encoded and parsed again
                    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                    value = _UNDECODED if isinstance(args, str) else args
                    fn = {"name": name, "arguments": text}
                    made = _made_id(text_of_calls, i)
                    raw_calls.append(({"id": made, "type": "function", "function": fn}, value))
                    repairs.append(Repair("extracted_from_text", made, "$", found.style, name))
        calls: list[ToolCall] = []
        for i, (raw_call, value) in enumerate(raw_calls):
            call, call_errors, call_repairs = self._one(raw_call, i, finish_reason, value)
            errors += call_errors
            repairs += call_repairs
            if call is not None:
                calls.append(call)
        if not raw_calls and not errors and cfg.empty_answer_is_failure and self.specs:
            errors = _unanswered(content, finish_reason, cut_off=cfg.cut_off_text_is_failure)
        if cfg.enforce_tool_choice and self.specs:
            # without a function call, where calls of other kinds may be what answered
            # tool_choice (tools of other kinds offered, or such a call made), it is not judged
            other = not raw_calls and (self._other_tools or _other_calls(msg.get("tool_calls")))
            if tool_choice is not None and not errors and not other:
                errors = _unchosen(calls, raw_calls, content, tool_choice)
            if parallel_tool_calls is False and len(calls) > 1 and not errors:
                dropped = ", ".join(c.name for c in calls[1:])
                repairs.append(Repair("dropped_parallel_calls", calls[1].id, "$", dropped, ""))
                calls = calls[:1]
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
        # One event per rejected call, its first error (the report holds them all): a call with
        # a hundred unknown arguments is one warning, not a hundred.
        rejected: set[tuple[str | None, str]] = set()
        for e in errors:
            if (e.tool_call_id, e.tool_name) in rejected:
                continue
            rejected.add((e.tool_call_id, e.tool_name))
            self._emitter.emit(
                ToolCallRejected(
                    error=e.kind,
                    tool_call_id=e.tool_call_id,
                    tool_name=short(e.tool_name),
                    path=e.path,
                )
            )
        return report

    # -- one call -------------------------------------------------------------------------------

    def _one(
        self, raw: Mapping[str, Any], index: int, finish_reason: str | None, value: Any
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
        parsed, problem, how = self._parse(arguments, finish_reason, value)
        if problem is not None:
            kind: ErrorKind = "truncated" if problem == "truncated" else "invalid_json"
            message = (
                "the arguments were cut off (finish_reason=length); they were not completed"
                if kind == "truncated"
                else f"the arguments are not a JSON object: {problem}"
            )
            errors.append(ToolCallError(kind, call_id, name, "$", message, short(arguments)))
        elif how is not None:
            repairs.append(Repair(how, call_id, "$", short(arguments), short(parsed)))

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
                        short(name),
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
            text = original_text if original_text is not None else json_text(arguments)
        elif not repairs and original_text is not None:
            text = original_text  # a valid call comes back byte for byte
        else:
            text = json.dumps(parsed, ensure_ascii=False)
        return ToolCall(name, text, call_id or f"call_{index}"), errors, repairs

    def _schema_errors(
        self, name: str, args: dict[str, Any], call_id: str | None
    ) -> list[ToolCallError]:
        """The JSON Schema errors of ``args``; a schema jsonschema cannot apply is unusable."""
        try:
            return [
                schema_error(err, call_id, name) for err in self._validators[name].iter_errors(args)
            ]
        except Exception as exc:  # a $ref it cannot resolve, or one into itself (RecursionError)
            problem = ToolSchemaError(
                name, f"the schema cannot be applied: {type(exc).__name__}: {exc}"[:300]
            )
            if not self._lenient:
                raise problem from None
            self._unusable(problem)
            spec = self.specs[name] = replace(self.specs[name], parameters=dict(ANY_OBJECT))
            self._validators[name] = compiled(spec.parameters)
            self._fast[name] = compile_check(spec.parameters)
            return []

    def _unusable(self, problem: ToolSchemaError) -> None:
        """Say that a tool's definition cannot be used, and its calls are read as JSON objects."""
        self._emitter.emit(
            GuardInternalError(
                session=None,
                component="tool_validation",
                error_type="ToolSchemaError",
                message=f"{problem}; its calls are checked only for being a JSON object",
            )
        )

    def _parse(
        self, arguments: Any, finish_reason: str | None, value: Any = _UNDECODED
    ) -> tuple[Any, str | None, str | None]:
        """``(object, problem, repair kind)``; ``value``: the arguments decoded, when known."""
        cfg = self.config
        if value is not _UNDECODED:
            if too_deep(value):
                return None, f"the arguments nest deeper than {MAX_DEPTH} levels", None
        elif arguments is not None and not isinstance(arguments, (str, Mapping)):
            return None, f"expected a JSON object, got {type(arguments).__name__}", None
        else:
            try:
                value = decode_arguments(arguments)
            except json.JSONDecodeError as exc:
                return self._repaired(str(arguments), finish_reason, exc)
            except ValueError as exc:  # UndecodableArguments: too deep, a number too long
                return None, str(exc), None
        if value is None:  # JSON null: no arguments (Groq's for a tool without parameters)
            value = {}
        how = None
        if isinstance(value, str) and value and cfg.repair:
            # double-encoded: a JSON string holding JSON
            try:
                inner = decode_arguments(value)
            except ValueError:
                inner = None
            if isinstance(inner, dict):
                value, how = inner, "double_encoded"
        if not isinstance(value, dict):
            return None, f"expected a JSON object, got {type(value).__name__}", None
        return value, None, how

    def _repaired(
        self, arguments: str, finish_reason: str | None, exc: json.JSONDecodeError
    ) -> tuple[Any, str | None, str | None]:
        """Arguments that are not JSON: truncated, or repaired when a repair guesses nothing."""
        cfg = self.config
        if finish_reason == "length" or _ends_inside_a_string(arguments):
            # cut off mid-value: a repair would invent the rest of it
            return None, "truncated", None
        if not (cfg.repair and 0 < len(arguments) <= cfg.max_repair_bytes):
            return None, f"invalid JSON ({exc.msg} at position {exc.pos})", None
        import json_repair  # noqa: PLC0415 - most runs never repair: not imported at start-up

        try:
            repaired = json_repair.repair_json(arguments, return_objects=True)
        except Exception:  # the repair library must never crash the validator
            repaired = None
        if isinstance(repaired, str):  # a JSON-encoded object inside the repaired text
            try:
                repaired = decode_arguments(repaired) if repaired else None
            except ValueError:
                repaired = None
        if isinstance(repaired, dict) and repaired and not too_deep(repaired):
            return _joined_surrogates(repaired), None, "json_repaired"
        return None, f"invalid JSON ({exc.msg} at position {exc.pos})", None

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
                # dropped only when it is no misspelling of a declared argument the call left
                # out: ``limt`` for an absent ``limit`` would run the call on its default
                if (
                    cfg.unexpected_arguments == "drop"
                    and cfg.repair
                    and not self._names.misspells(key, [d for d in declared if d not in args])
                ):
                    repairs.append(
                        Repair(
                            "dropped_argument", call_id, f"$.{key}", short(args[key]), "(removed)"
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
                            short(args[key]),
                            close,
                        )
                    )
        if cfg.coerce and cfg.repair:
            args, coerced = _coerce(args, declared, spec.parameters)
            for key, before, after in coerced:
                repairs.append(Repair("coerced", call_id, f"$.{key}", short(before), short(after)))
        fast = self._fast[name]
        if cfg.validate_schema and not (fast is not None and fast(args)):
            errors += self._schema_errors(name, args, call_id)
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
                        short(value),
                    )
                )
        return args, errors, repairs


def chosen_tool(tool_choice: Any) -> str | None:
    """The function a ``tool_choice`` names (chat's ``{"type": "function", "function":
    {"name": ...}}`` or the Responses API's ``{"type": "function", "name": ...}``), else
    ``None``."""
    if not isinstance(tool_choice, Mapping) or tool_choice.get("type") != "function":
        return None
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
    return name if isinstance(name, str) and name else None


def allowed_tools(tool_choice: Any) -> frozenset[str] | None:
    """The functions an ``allowed_tools`` choice lets the model call (chat's ``{"type":
    "allowed_tools", "allowed_tools": {"mode": ..., "tools": [...]}}``, the Responses API's
    ``{"type": "allowed_tools", "mode": ..., "tools": [...]}``), else ``None`` (also when it
    lists no function the guard can read: then it is not judged)."""
    if not isinstance(tool_choice, Mapping) or tool_choice.get("type") != "allowed_tools":
        return None
    inner = tool_choice.get("allowed_tools")
    listed = (inner if isinstance(inner, Mapping) else tool_choice).get("tools")
    names = {chosen_tool(t) for t in listed} if isinstance(listed, list) else set()
    return frozenset(n for n in names if n is not None) or None


def asks_for_call(tool_choice: Any) -> bool:
    """Whether a ``tool_choice`` asks for a call: ``"required"``, a function named, or
    ``allowed_tools`` in ``required`` mode."""
    if tool_choice == "required" or chosen_tool(tool_choice) is not None:
        return True
    if allowed_tools(tool_choice) is None:
        return False
    inner = tool_choice.get("allowed_tools")
    return (inner if isinstance(inner, Mapping) else tool_choice).get("mode") == "required"


def _unchosen(
    calls: Sequence[ToolCall],
    raw_calls: Sequence[Any],
    content: str | None,
    tool_choice: Any,
) -> list[ToolCallError]:
    """What of an answer breaks the request's ``tool_choice``: text where it asks for a call
    (``"required"``, a function named, ``allowed_tools`` required), a call to another tool than
    the one named or those allowed, any call where it is ``"none"``."""
    named = chosen_tool(tool_choice)
    allowed = allowed_tools(tool_choice) if named is None else frozenset((named,))
    if raw_calls:
        if tool_choice == "none":
            wrong = "tool_choice is 'none': answer in text, without calling a tool"
            return [ToolCallError("not_chosen", c.id, c.name, "$", wrong) for c in calls]
        if allowed is None:
            return []
        which = named if named is not None else "one of " + ", ".join(sorted(allowed))
        return [
            ToolCallError(
                "not_chosen",
                c.id,
                c.name,
                "$",
                f"tool_choice asks for a call to {which}, not to {c.name}",
                None,
                tuple(sorted(allowed)),
            )
            for c in calls
            if c.name not in allowed
        ]
    if content is None or not asks_for_call(tool_choice):
        return []  # no text at all (a refusal, speech): not an answer to correct
    if allowed is None:
        wanted = "a tool call"
    elif len(allowed) == 1:
        wanted = f"a call to {next(iter(allowed))}"
    else:
        wanted = "a call to one of " + ", ".join(sorted(allowed))
    return [
        ToolCallError(
            "call_required",
            None,
            named or "",
            "$",
            f"tool_choice asks for {wanted}: answer with the call, not with text",
            short(content or ""),
            tuple(sorted(allowed or ())),
        )
    ]


#: llama.cpp's function-calling wire syntax cut short: a tool named, no arguments written
_HALF_WRITTEN = re.compile(r"\s*functions\.([\w.\-]+)\s*:?\s*")
#: the same wire syntax begun, with text after it that no call could be read from
_BEGUN = re.compile(r"\s*functions\.([\w.\-]+)\s*:")


def _unanswered(
    content: str | None, finish_reason: str | None, *, cut_off: bool = False
) -> list[ToolCallError]:
    """An answer that is neither a call nor text, although tools were offered: an empty text
    that says it is complete (``finish_reason: "stop"``: with ``tool_calls`` it holds calls of
    other kinds), or only the wire syntax of a call (``functions.NAME:``) with no arguments;
    with ``cut_off``, also a text the output cap cut off (a small model that wandered off
    instead of calling: ``tool_validation.cut_off_text_is_failure``)."""
    if content is None:
        return []  # no text at all: a message the transport could not read is judged so too
    if cut_off and finish_reason == "length" and content.strip():
        message = "the answer was cut off at the token cap without a tool call: call a tool"
        return [ToolCallError("truncated", None, "", "$", message, short(content))]
    if not content.strip():
        if finish_reason != "stop":
            return []
        message = "the answer was empty: call a tool, or answer in text"
        return [ToolCallError("empty_answer", None, "", "$", message, json.dumps(content))]
    half = _HALF_WRITTEN.fullmatch(content)
    if half is not None:
        name = half.group(1)
        message = f"the call to {name} was begun but has no arguments"
        return [ToolCallError("incomplete_call", None, name, "$", message, short(content))]
    begun = _BEGUN.match(content)
    if begun is not None:
        # ``functions.read_file:\n{&#34;error&#34;}`` (SmolLM2 in llama-cpp-python's
        # function-calling format, which HTML-escapes the prompt): a call, not an answer
        name = begun.group(1)
        message = f"the call to {name} was begun but its arguments cannot be read"
        return [ToolCallError("incomplete_call", None, name, "$", message, short(content))]
    return []


def other_kind(call: Mapping[str, Any]) -> bool:
    """Whether a ``tool_calls`` entry is a call of another kind than a function (OpenAI's
    ``custom`` tools: ``{"type": "custom", "custom": {...}}``). An entry without a type is taken
    for a function call, as the SDK reads it."""
    return call.get("type") not in (None, "function") and "function" not in call


def _other_calls(tool_calls: Any) -> bool:
    """Whether a message's ``tool_calls`` hold a call of another kind than a function."""
    if not isinstance(tool_calls, (list, tuple)):
        return False
    return any(isinstance(c, Mapping) and other_kind(c) for c in tool_calls)


def _read_calls(
    tool_calls: Any,
    out: list[tuple[Mapping[str, Any], Any]],
    repairs: list[Repair],
    split: bool,
    specs: Mapping[str, ToolSpec],
) -> list[ToolCallError]:
    """Append the message's call objects to ``out``; what is not one is an error. With
    ``split``, a call that is several run together is appended as those calls, its repair to
    ``repairs`` (:func:`_split_run_together`)."""
    if tool_calls is None or (isinstance(tool_calls, (list, tuple, str)) and not tool_calls):
        return []
    if not isinstance(tool_calls, (list, tuple)):
        got = type(tool_calls).__name__
        message = f"tool_calls must be a list of call objects, got {got}"
        return [ToolCallError("malformed_call", None, "", "$", message, short(tool_calls))]
    errors = []
    for i, raw in enumerate(tool_calls):
        if isinstance(raw, Mapping):
            if other_kind(raw):
                continue  # a call of a custom tool: not the guard's to judge (it passes as is)
            out.append((raw, _UNDECODED))
        else:
            message = f"tool call {i} is not a call object: got {type(raw).__name__}"
            errors.append(ToolCallError("malformed_call", None, "", f"$[{i}]", message, short(raw)))
    if split and out:
        out[:] = _split_run_together(out, specs, repairs)
    return errors


#: where two JSON objects may meet with nothing between them but white space
_MEETING = re.compile(r"\}\s*\{")
#: an answer's arguments are read as this many calls at most (beyond: not split, invalid)
_MOST_SPLIT = 32


def _split_run_together(
    raw_calls: list[tuple[Mapping[str, Any], Any]],
    specs: Mapping[str, ToolSpec],
    repairs: list[Repair],
) -> list[tuple[Mapping[str, Any], Any]]:
    """Each call whose arguments are two or more JSON objects run together (``{"city":
    "Oslo"}{"city": "Rome"}``) as that many calls, in order, with a ``split_calls`` repair.

    Several calls joined into one, which a JSON repair would turn into one of them (the others
    dropped): a client or proxy that joins streamed fragments by ``index`` when a server
    streams parallel calls at one index (Ollama), or a model that writes its calls back to
    back. The name is the one tool's when it is a tool's, or the names it is made of when it is
    that many tools' names run together (``get_weatherget_time``). The first call keeps the
    call's ``id``; the others get ``{id}_1``, ``{id}_2`` ... A call repeated among them (the
    same tool, the same arguments) is kept once (``repeated_arguments`` when one call is left):
    a stream that sends a call's arguments again at its end joins them to themselves.
    Arguments with anything else between or after the objects (or past :data:`_MOST_SPLIT` of
    them) are left as they are."""
    out: list[tuple[Mapping[str, Any], Any]] = []
    for raw, value in raw_calls:
        fn = raw.get("function")
        arguments = fn.get("arguments") if isinstance(fn, Mapping) else None
        parts = (
            _objects(arguments)
            if isinstance(arguments, str) and _MEETING.search(arguments)
            else None
        )
        name = fn.get("name") if isinstance(fn, Mapping) else None
        names = _names_of(name, len(parts), specs) if parts is not None else None
        if parts is None or names is None or not isinstance(fn, Mapping):
            out.append((raw, value))
            continue
        call_id = raw.get("id") if isinstance(raw.get("id"), str) else None
        # one call sent twice over (a stream that repeats a call's arguments at its end) is
        # that call once: two would run it twice
        seen: set[tuple[str, str]] = set()
        kept = []
        for name_n, (text, decoded) in zip(names, parts, strict=True):
            key = (name_n, json.dumps(decoded, sort_keys=True, default=str))
            if key not in seen:
                seen.add(key)
                kept.append((name_n, text, decoded))
        for n, (name_n, text, decoded) in enumerate(kept):
            made = call_id if n == 0 or call_id is None else f"{call_id}_{n}"
            piece = {**fn, "name": name_n, "arguments": text}
            out.append(({**raw, "id": made, "function": piece}, decoded))
        if len(kept) > 1:
            after = f"{len(kept)} calls" + (" (repeats dropped)" if len(kept) < len(parts) else "")
            repairs.append(Repair("split_calls", call_id, "$", short(arguments), after))
        else:
            repairs.append(
                Repair("repeated_arguments", call_id, "$", short(arguments), short(kept[0][1]))
            )
    return out


def _objects(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The JSON objects ``text`` is made of, each with its text, when it is two or more run
    together with nothing but white space around them; else ``None``."""
    decoder = json.JSONDecoder()
    found: list[tuple[str, dict[str, Any]]] = []
    at, end = 0, len(text)
    while at < end:
        while at < end and text[at] in " \t\r\n":
            at += 1
        if at == end:
            break
        if len(found) == _MOST_SPLIT or text[at] != "{":
            return None
        try:
            value, stop = decoder.raw_decode(text, at)
        except ValueError:
            return None
        if not isinstance(value, dict) or too_deep(value):
            return None
        found.append((text[at:stop], value))
        at = stop
    return found if len(found) > 1 else None


def _names_of(name: Any, n: int, specs: Mapping[str, ToolSpec]) -> list[str] | None:
    """The name of each of ``n`` calls joined under ``name``: the tool's own ``n`` times when
    it names one (or no tool is declared to tell), the tools' names it is made of when it is
    exactly ``n`` of them run together, else ``None`` (not split)."""
    if not isinstance(name, str):
        return None
    if name in specs or not specs:
        return [name] * n
    if len(name) > _MOST_SPLIT * max(map(len, specs)):
        return None
    # names run together: a way to read each prefix as tool names (the first found to each
    # length is kept: O(len(name) x tools))
    ways: dict[int, list[str]] = {0: []}
    for at in range(len(name)):
        before = ways.get(at)
        if before is None or len(before) == n:
            continue
        for known in specs:
            if known and name.startswith(known, at) and at + len(known) not in ways:
                ways[at + len(known)] = [*before, known]
    found = ways.get(len(name))
    return found if found is not None and len(found) == n else None


def _joined_surrogates(value: Any) -> Any:
    """``value`` with every escaped surrogate pair a repair decoded as two lone surrogates
    (``"\\ud83d\\ude00"``) joined into the one character it encodes; lone ones are kept."""
    if isinstance(value, str):
        if not any("\ud800" <= c <= "\udfff" for c in value):
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
    if isinstance(value, dict):
        return {_joined_surrogates(k): _joined_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_joined_surrogates(v) for v in value]
    return value


def _allowed(schema: Any, value: str) -> bool:
    """A value the schema lists explicitly (an enum or const) is never a placeholder."""
    if not isinstance(schema, Mapping):
        return False
    return value in (schema.get("enum") or ()) or schema.get("const") == value


def _coerce(
    args: dict[str, Any], declared: Mapping[str, Any], root: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, Any, Any]]]:
    """Lossless coercions of top-level arguments given as text: "5" -> 5, "2.5" -> 2.5,
    "true" -> true, and an object or list written as JSON text (``"{\"city\": \"Oslo\"}"``,
    as models write a nested argument) where the schema (``root``: its ``$defs``) takes that and
    no string."""
    changed: list[tuple[str, Any, Any]] = []
    out = args
    for key, value in args.items():
        schema = declared.get(key)
        if not isinstance(schema, Mapping) or not isinstance(value, str):
            continue
        kind = schema.get("type")
        new: Any = value
        text = value.strip()
        if text[:1] in ("{", "[") and kind != "string":
            new = _encoded_json(text, _accepted(schema, root))
        elif kind == "integer" and re.fullmatch(r"-?\d{1,18}", text):
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


def _encoded_json(text: str, accepted: frozenset[str]) -> Any:
    """The object or list ``text`` encodes when the schema takes it and no string, else
    ``text`` itself."""
    if "string" in accepted or not accepted & {"object", "array"}:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    kind = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else ""
    if kind not in accepted or too_deep(value):
        return text
    return value


#: Every JSON type: what a schema takes when it does not say.
_EVERY_TYPE = frozenset(["object", "array", "string", "number", "integer", "boolean", "null"])


def _accepted(schema: Mapping[str, Any], root: Mapping[str, Any]) -> frozenset[str]:
    """The JSON types a (sub)schema takes: its ``type``, through a local ``$ref`` and the
    branches of ``anyOf`` / ``oneOf`` (a pydantic model's nested field, an ``Optional``);
    every type when it does not say, or when finding out would take more than 64 steps (a
    schema's ``$ref`` cycles and nested branches are bounded so)."""
    found: set[str] = set()
    todo: list[Any] = [schema]
    for _ in range(64):
        if not todo:
            return frozenset(found)
        node = todo.pop()
        if not isinstance(node, Mapping):
            return _EVERY_TYPE
        ref = node.get("$ref")
        if isinstance(ref, str):
            target: Any = root if ref.startswith("#/") else None
            for part in ref[2:].split("/"):
                target = target.get(part) if isinstance(target, Mapping) else None
            todo.append(target)
            continue
        kind = node.get("type")
        branches = node.get("anyOf") or node.get("oneOf")
        if isinstance(kind, str):
            found.add(kind)
        elif isinstance(kind, list):
            found.update(k for k in kind if isinstance(k, str))
        elif isinstance(branches, list) and branches:
            todo.extend(branches)
        elif "properties" in node:
            found.add("object")
        else:
            return _EVERY_TYPE
    return _EVERY_TYPE


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


def _made_id(text: str, index: int) -> str:
    """The id of the ``index``-th call taken out of an answer's ``text``: nine letters and
    digits, the one form every server takes. Mistral's API and its models' chat templates refuse
    any other (a local Mistral writes ``[TOOL_CALLS]`` as text: exactly the calls taken out),
    and ids differ from one answer to the next, since frameworks refuse a call id their history
    already holds (the OpenAI Agents SDK ends the run)."""
    return fingerprint_text(f"{text}\x00{index}")[:9]
