"""A fast "is it valid?" for the simple schemas tools usually declare; jsonschema does the rest.

Most tool schemas are an object of typed properties with ``required``, perhaps an enum, bounds,
or a list of strings. For those, :func:`compile_check` builds a plain-Python check that answers
the common case — a valid call — several times faster than a full jsonschema pass. The check is
*sound*, not complete: ``True`` only when jsonschema would report no error; ``False`` means "ask
jsonschema", which then also produces the error messages. A schema using anything else gets no
fast check at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["compile_check"]

Check = Callable[[Any], bool]

#: Keywords that never make a value invalid (annotations; ``format`` is not asserted by default).
_ANNOTATIONS = frozenset(
    {
        "description",
        "title",
        "default",
        "examples",
        "format",
        "$schema",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_HANDLED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "enum",
        "items",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
    }
)


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


_TYPES: dict[str, Check] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def compile_check(schema: Any) -> Check | None:
    """A sound fast check for ``schema``, or ``None`` when it uses more than the simple subset."""
    if schema is True or schema == {}:
        return lambda _value: True
    if not isinstance(schema, Mapping):
        return None
    if any(k not in _HANDLED and k not in _ANNOTATIONS for k in schema):
        return None
    checks: list[Check] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or any(k not in _TYPES for k in kinds):
            return None
        tests = [_TYPES[k] for k in kinds]
        checks.append(tests[0] if len(tests) == 1 else (lambda v: any(t(v) for t in tests)))
    if "enum" in schema:
        members = schema["enum"]
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            return None  # jsonschema's equality (1 vs True vs 1.0) is not Python's
        allowed = frozenset(members)
        checks.append(lambda v: isinstance(v, str) and v in allowed)
    for key, compare in (("minimum", "ge"), ("maximum", "le")):
        if key in schema:
            bound = schema[key]
            if isinstance(bound, bool) or not isinstance(bound, (int, float)):
                return None
            checks.append(_bound(bound, compare))
    for key, compare in (("minLength", "ge"), ("maxLength", "le")):
        if key in schema:
            size = schema[key]
            if isinstance(size, bool) or not isinstance(size, int):
                return None
            checks.append(_length(size, compare))
    if "items" in schema:
        item = compile_check(schema["items"])
        if item is None:
            return None
        checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    if {"properties", "required", "additionalProperties"} & schema.keys():
        obj = _object(schema)
        if obj is None:
            return None
        checks.append(obj)
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(check(v) for check in checks)


def _bound(bound: float, compare: str) -> Check:
    def check(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return True  # bounds only apply to numbers
        return v >= bound if compare == "ge" else v <= bound

    return check


def _length(size: int, compare: str) -> Check:
    def check(v: Any) -> bool:
        if not isinstance(v, str):
            return True  # lengths only apply to strings
        return len(v) >= size if compare == "ge" else len(v) <= size

    return check


def _object(schema: Mapping[str, Any]) -> Check | None:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        return None
    if not all(isinstance(r, str) for r in required) or not isinstance(extra, bool):
        return None
    fields: dict[str, Check] = {}
    for name, sub in properties.items():
        field_check = compile_check(sub)
        if field_check is None:
            return None
        fields[name] = field_check
    needed = tuple(required)

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True  # property keywords only apply to objects
        for name in needed:
            if name not in v:
                return False
        for name, value in v.items():
            field = fields.get(name)
            if field is None:
                if not extra:
                    return False
            elif not field(value):
                return False
        return True

    return check
