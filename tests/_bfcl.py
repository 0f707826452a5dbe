"""Real tool schemas and ground-truth calls from the Berkeley Function Calling Leaderboard.

The ``bfcl-eval`` package (Apache-2.0) ships the data; BFCL writes schemas in its own dialect
("dict", "float", "tuple", "any"), converted here to JSON Schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

_TYPES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "int": "integer",
    "bool": "boolean",
    "str": "string",
}


def data_dir() -> Path:
    bfcl = pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by the tests session")
    return Path(bfcl.__file__).parent / "data"


def to_json_schema(schema: Any) -> Any:
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value == "any":
                continue
            out["type"] = _TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = to_json_schema(value)
        elif key in ("required", "enum", "description", "default", "format", "maximum", "minimum"):
            out[key] = value
    return out


def _pick_dict(params: dict[str, Any]) -> dict[str, Any]:
    """Ground truth lists acceptable values per key; "" means "may be omitted"."""
    out = {}
    for key, options in params.items():
        if not isinstance(options, list) or not options:
            out[key] = options
            continue
        if options[0] == "":
            continue
        out[key] = _pick_value(options[0])
    return out


def _pick_value(value: Any) -> Any:
    if isinstance(value, dict):
        return _pick_dict(value)
    if isinstance(value, list):
        return [_pick_value(v) for v in value]
    return value


def cases(name: str) -> list[tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]]:
    """``(tools, ground-truth calls)`` for each test case of one BFCL file."""
    base = data_dir()
    answers = {}
    for line in (base / "possible_answer" / name).read_text().splitlines():
        row = json.loads(line)
        answers[row["id"]] = row["ground_truth"]
    out = []
    for line in (base / name).read_text().splitlines():
        row = json.loads(line)
        if row["id"] not in answers:
            continue
        tools = [
            {
                "type": "function",
                "function": {**f, "parameters": to_json_schema(f.get("parameters", {}))},
            }
            for f in row["function"]
        ]
        calls = []
        for truth in answers[row["id"]]:
            ((fname, params),) = truth.items()
            calls.append((fname, _pick_dict(params)))
        out.append((tools, calls))
    return out
