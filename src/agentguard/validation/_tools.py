"""Tool definitions from every common source, checked once."""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agentguard.exceptions import ToolSchemaError

__all__ = ["ToolSpec", "specs_from"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as the validator sees it.

    Attributes:
        name: the tool's name.
        parameters: its JSON Schema (an object schema).
        description: what it does.
        side_effecting: never auto-correct a guessed name to this tool (:func:`specs_from`
            sets it from the configured list, the tool's annotations and its name).
    """

    name: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    description: str = ""
    side_effecting: bool = False

    @property
    def properties(self) -> Mapping[str, Any]:
        """The declared arguments."""
        props = self.parameters.get("properties")
        return props if isinstance(props, Mapping) else {}

    @property
    def required(self) -> list[str]:
        """The required arguments."""
        req = self.parameters.get("required")
        return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []


_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}


def _annotation_schema(annotation: Any) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [_annotation_schema(a) for a in args if a is not type(None)]
        schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
        return schema
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset):
        return (
            {"type": "array", "items": _annotation_schema(args[0])} if args else {"type": "array"}
        )
    if origin is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    return {}


def _from_function(fn: Callable[..., Any]) -> ToolSpec:
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):
        hints = {}
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name in ("self", "cls"):
            continue
        props[name] = _annotation_schema(hints.get(name, param.annotation))
        if param.default is inspect.Parameter.empty:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    doc = inspect.getdoc(fn) or ""
    return ToolSpec(fn.__name__, schema, doc.split("\n\n")[0])


# Whole words of a tool's name that say it acts: runs code or commands, writes, changes,
# sends, deletes, pays, ships ... A guessed name must never be corrected onto such a tool (a
# made-up `run_shell` was corrected to `terminal` and executed): a false alarm costs one
# corrective re-ask, a false guess runs the wrong action.
_ACTING_WORDS = frozenset(
    {
        # code and commands
        *("shell", "bash", "sh", "zsh", "powershell", "terminal", "console", "exec", "execute"),
        *("run", "eval", "command", "cmd", "script", "python", "ipython", "sudo", "spawn"),
        *("launch", "invoke", "kill", "terminate", "restart", "reboot", "shutdown"),
        # writing and changing
        *("write", "save", "put", "store", "edit", "editor", "patch", "update", "upsert"),
        *("create", "insert", "append", "replace", "modify", "set", "reset", "apply", "delete"),
        *("del", "remove", "rm", "erase", "drop", "truncate", "move", "mv", "rename", "copy"),
        *("cp", "mkdir", "chmod", "chown", "upload", "install", "uninstall", "deploy", "publish"),
        *("commit", "push", "merge", "submit", "click", "fill"),
        # sending and paying
        *("send", "post", "email", "mail", "sms", "notify", "reply", "tweet", "pay"),
        *("payment", "transfer", "purchase", "buy", "charge", "refund", "book", "cancel"),
    }
)
_NAME_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def acts_by_name(name: str) -> bool:
    """Whether a tool's name says it acts: one of its whole words (split on case and
    separators: ``run_shell``, ``writeFile``, ``send-email``) is one like shell, exec, run,
    write, edit, delete, send, deploy or pay."""
    return any(word.lower() in _ACTING_WORDS for word in _NAME_WORDS.findall(name))


def _annotated(*sources: Mapping[str, Any]) -> bool | None:
    """What a tool's own ``annotations`` (MCP's, the OpenHands SDK's) say about acting:
    ``readOnlyHint`` true, no; ``readOnlyHint`` false or ``destructiveHint`` true, yes;
    ``None`` when they say neither."""
    for source in sources:
        hints = source.get("annotations")
        if isinstance(hints, Mapping):
            if hints.get("readOnlyHint") is True:
                return False
            if hints.get("readOnlyHint") is False or hints.get("destructiveHint") is True:
                return True
    return None


def _not_a_function(entry: Any) -> bool:
    """Whether a definition is a tool of another kind than a function, with no name of its own
    (OpenAI's ``custom`` tools, whose definition nests under ``custom``; the Responses API's
    built-in ``web_search``, ``file_search``, ``mcp`` ...): not the guard's to validate, and its
    calls are not function calls either (they pass through unjudged)."""
    return (
        isinstance(entry, Mapping)
        and entry.get("type") not in (None, "function")
        and "function" not in entry
        and not isinstance(entry.get("name"), str)
    )


def _spec(entry: Any) -> ToolSpec:
    """The spec of one definition; a :class:`ToolSpec` as given, any other says only its name and
    schema (:func:`specs_from` decides whether it acts)."""
    if isinstance(entry, ToolSpec):
        return entry
    if isinstance(entry, type) and hasattr(entry, "model_json_schema"):  # a pydantic model
        schema = dict(entry.model_json_schema())
        schema.pop("title", None)
        return ToolSpec(entry.__name__, schema, (entry.__doc__ or "").strip().split("\n\n")[0])
    if callable(entry) and not isinstance(entry, Mapping):
        return _from_function(entry)
    if not isinstance(entry, Mapping):
        raise ToolSchemaError(None, f"unsupported tool definition of type {type(entry).__name__}")
    # chat format nests the function; the Responses API's flat form ({"type": "function",
    # "name": ...}) and a bare spec carry it on the entry itself
    fn = entry.get("function") if "function" in entry else entry
    if not isinstance(fn, Mapping):
        raise ToolSchemaError(None, "'function' must be an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(None, "a tool needs a non-empty string 'name'")
    # Anthropic's definitions name the schema input_schema
    params = fn.get("parameters", fn.get("input_schema", {"type": "object", "properties": {}}))
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, Mapping):
        raise ToolSchemaError(name, "'parameters' must be a JSON Schema object")
    return ToolSpec(name, dict(params), str(fn.get("description") or ""))


def _acts(entry: Any, name: str, listed: frozenset[str], by_name: bool) -> bool:
    """Whether a tool (not a :class:`ToolSpec`) is side-effecting: listed, else as its
    annotations say, else (``by_name``) as its name says."""
    if name in listed:
        return True
    if isinstance(entry, Mapping):
        fn = entry.get("function")
        declared = _annotated(entry, *((fn,) if isinstance(fn, Mapping) else ()))
        if declared is not None:
            return declared
    return by_name and acts_by_name(name)


#: The schema a tool whose own cannot be used is checked against: any JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def specs_from(
    tools: Iterable[Any],
    side_effecting: Iterable[str] = (),
    *,
    by_name: bool = True,
    unusable: list[ToolSchemaError] | None = None,
) -> dict[str, ToolSpec]:
    """Tool specs by name from OpenAI ``tools`` entries, bare function specs, pydantic models,
    typed Python functions or :class:`ToolSpec` values.

    A tool is side-effecting (a guessed name is never corrected onto it) when it is named in
    ``side_effecting``; otherwise a :class:`ToolSpec` is taken as given, and any other tool is
    as its ``annotations`` say (``readOnlyHint`` / ``destructiveHint``, on the entry or its
    ``function``), else, with ``by_name``, as its name says (:func:`acts_by_name`).

    With ``unusable`` given, nothing is raised: each problem is appended to it instead, a tool
    whose schema is unusable is kept with :data:`ANY_OBJECT` for a schema, one defined twice
    keeps its first definition, and one with no usable name is left out.

    Raises:
        ToolSchemaError: naming the tool, when a definition or its schema is unusable, or a name
            is defined twice.
    """
    marked = frozenset(side_effecting)
    out: dict[str, ToolSpec] = {}
    for entry in tools:
        if _not_a_function(entry):
            continue
        try:
            spec = _checked(_spec(entry), out)
        except ToolSchemaError as exc:
            if unusable is None:
                raise
            unusable.append(exc)
            if exc.tool_name is None or exc.tool_name in out:
                continue
            spec = ToolSpec(exc.tool_name, dict(ANY_OBJECT), _description(entry))
        if isinstance(entry, ToolSpec):
            acts = entry.side_effecting or spec.name in marked
        else:
            acts = _acts(entry, spec.name, marked, by_name)
        if acts != spec.side_effecting:
            spec = replace(spec, side_effecting=acts)
        out[spec.name] = spec
    return out


def _checked(spec: ToolSpec, out: Mapping[str, ToolSpec]) -> ToolSpec:
    """``spec``, when its name is new and its schema a valid JSON Schema of an object."""
    # jsonschema is imported when a tool is defined: a process that never defines one (a scan
    # of traces without tool lists) does not pay its import
    from jsonschema import Draft202012Validator  # noqa: PLC0415
    from jsonschema.exceptions import SchemaError  # noqa: PLC0415

    if spec.name in out:
        raise ToolSchemaError(spec.name, "defined twice")
    schema_type = spec.parameters.get("type", "object")
    if schema_type != "object":
        raise ToolSchemaError(
            spec.name, f"parameters must be an object schema, not {schema_type!r}"
        )
    try:
        Draft202012Validator.check_schema(spec.parameters)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise ToolSchemaError(spec.name, f"invalid JSON Schema at {where}: {exc.message}") from None
    return spec


def _description(entry: Any) -> str:
    """The description of a definition whose schema is unusable, when it has one."""
    fn = entry.get("function", entry) if isinstance(entry, Mapping) else None
    return str(fn.get("description") or "") if isinstance(fn, Mapping) else ""
