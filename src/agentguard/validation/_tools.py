"""Tool definitions from every common source, checked once."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from agentguard.exceptions import ToolSchemaError

__all__ = ["ToolSpec", "specs_from"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as the validator sees it.

    Attributes:
        name: the tool's name.
        parameters: its JSON Schema (an object schema).
        description: what it does.
        side_effecting: never auto-correct a guessed name to this tool.
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


def _spec(entry: Any, side_effecting: frozenset[str]) -> ToolSpec:
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
    fn = entry.get("function") if entry.get("type") == "function" or "function" in entry else entry
    if not isinstance(fn, Mapping):
        raise ToolSchemaError(None, "'function' must be an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(None, "a tool needs a non-empty string 'name'")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, Mapping):
        raise ToolSchemaError(name, "'parameters' must be a JSON Schema object")
    return ToolSpec(name, dict(params), str(fn.get("description") or ""), name in side_effecting)


def specs_from(tools: Iterable[Any], side_effecting: Iterable[str] = ()) -> dict[str, ToolSpec]:
    """Tool specs by name from OpenAI ``tools`` entries, bare function specs, pydantic models,
    typed Python functions or :class:`ToolSpec` values.

    Raises:
        ToolSchemaError: naming the tool, when a definition or its schema is unusable, or a name
            is defined twice.
    """
    marked = frozenset(side_effecting)
    out: dict[str, ToolSpec] = {}
    for entry in tools:
        spec = _spec(entry, marked)
        if spec.name in marked and not spec.side_effecting:
            spec = ToolSpec(spec.name, spec.parameters, spec.description, True)
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
            raise ToolSchemaError(
                spec.name, f"invalid JSON Schema at {where}: {exc.message}"
            ) from None
        out[spec.name] = spec
    return out
