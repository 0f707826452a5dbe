"""JSON Schema errors as the validator reports them: an error kind, a path, a short value."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentguard._fingerprint import canonical_json, fingerprint_bytes
from agentguard._redact import redact

from ._report import ToolCallError, short

if TYPE_CHECKING:  # imported by compiled(), when a first schema is: not at start-up
    from jsonschema import Draft202012Validator

__all__ = ["compiled", "json_path", "schema_error"]

_SCHEMA_CACHE: dict[str, Draft202012Validator] = {}


def json_path(parts: Iterable[Any]) -> str:
    """A JSON Schema error path as ``$.a[0].b``."""
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def compiled(schema: Mapping[str, Any]) -> Draft202012Validator:
    """The validator of ``schema``, shared by every tool with an equal schema."""
    key = fingerprint_bytes(canonical_json(schema))
    validator = _SCHEMA_CACHE.get(key)
    if validator is None:
        from jsonschema import Draft202012Validator  # noqa: PLC0415

        validator = Draft202012Validator(schema)
        if len(_SCHEMA_CACHE) > 4096:
            _SCHEMA_CACHE.clear()
        _SCHEMA_CACHE[key] = validator
    return validator


def schema_error(err: Any, call_id: str | None, tool: str) -> ToolCallError:
    """One jsonschema error as a :class:`ToolCallError` (kind, path, value, suggestions)."""
    path = json_path(err.absolute_path)
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
            short(err.instance),
        )
    if err.validator == "additionalProperties":
        return ToolCallError("unexpected_argument", call_id, tool, path, redact(err.message)[:200])
    suggestions: tuple[str, ...] = ()
    if err.validator == "enum":
        suggestions = tuple(short(v) for v in err.validator_value[:8])
    return ToolCallError(
        "schema_violation",
        call_id,
        tool,
        path,
        redact(err.message)[:200],
        short(err.instance),
        suggestions,
    )
