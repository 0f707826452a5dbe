"""The validator's fast path: sound against jsonschema for every simple schema and value."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from agentguard.validation._fast import compile_check

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(-5, 5, allow_nan=False)
    | st.sampled_from([1.0, 0.0, -2.0])
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)
    ),
    max_leaves=8,
)
types = st.sampled_from(["string", "integer", "number", "boolean", "object", "array", "null"])


def leaf_schemas() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "type": types | st.lists(types, min_size=1, max_size=2, unique=True),
            "enum": st.lists(st.text(max_size=3), min_size=1, max_size=3),
            "minimum": st.integers(-3, 3) | st.floats(-3, 3, allow_nan=False),
            "maximum": st.integers(-3, 3),
            "minLength": st.integers(0, 3),
            "maxLength": st.integers(0, 3),
            "description": st.text(max_size=5),
        },
    )


schemas = st.recursive(
    leaf_schemas(),
    lambda inner: (
        st.fixed_dictionaries(
            {"type": st.just("object")},
            optional={
                "properties": st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
                "required": st.lists(st.sampled_from("abcd"), max_size=3, unique=True),
                "additionalProperties": st.booleans(),
            },
        )
        | st.fixed_dictionaries({"type": st.just("array"), "items": inner})
    ),
    max_leaves=6,
)


@settings(max_examples=500)
@given(schema=schemas, value=json_values)
def test_fast_check_never_accepts_what_jsonschema_rejects(
    schema: dict[str, Any], value: Any
) -> None:
    """Sound: whenever the fast check says valid, jsonschema finds no error."""
    check = compile_check(schema)
    if check is not None and check(value):
        assert not list(jsonschema.Draft202012Validator(schema).iter_errors(value))


@settings(max_examples=300)
@given(schema=schemas, value=json_values)
def test_fast_check_accepts_most_valid_values(schema: dict[str, Any], value: Any) -> None:
    """Complete on its subset: a value jsonschema accepts is accepted by the fast check too."""
    check = compile_check(schema)
    if check is not None and not list(jsonschema.Draft202012Validator(schema).iter_errors(value)):
        assert check(value)


def test_schemas_outside_the_subset_get_no_fast_check() -> None:
    """Anything beyond the simple subset ($ref, anyOf, pattern, numeric enums) is left alone."""
    for schema in (
        {"type": "object", "properties": {"a": {"$ref": "#/defs/x"}}},
        {"anyOf": [{"type": "string"}]},
        {"type": "string", "pattern": "^a"},
        {"enum": [1, 2]},
        {"type": "strnig"},
    ):
        assert compile_check(schema) is None
