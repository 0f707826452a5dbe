"""The argument decoder and the canonical form never raise what they cannot read (issue 15).

Properties: :func:`safe_canonical_text` writes exactly the canonical text of every value the
fast paths can encode, and some text for every other value (deep, cyclic, a huge int, objects);
:func:`decode_arguments` returns a value or raises a ``ValueError``, never a ``RecursionError``;
:func:`too_deep` is exact around :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentguard._fingerprint import (
    MAX_DEPTH,
    UndecodableArguments,
    canonical_text,
    decode_arguments,
    fingerprint,
    safe_canonical_text,
    too_deep,
)

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


def _nested(depth: int, leaf: Any = 1, kind: str = "list") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(st.lists(json_values, max_size=4), st.dictionaries(st.text(), json_values)))
def test_the_safe_form_is_the_canonical_form(value: Any) -> None:
    """Where the fast paths work, the safe form is the very same text (same fingerprints)."""
    assert safe_canonical_text(value) == canonical_text(value)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=60), st.builds(json.dumps, json_values)))
def test_decoding_any_text_returns_a_value_or_raises_a_value_error(text: str) -> None:
    """Any text: a value, or ``ValueError`` (a ``JSONDecodeError`` or ``UndecodableArguments``)."""
    with contextlib.suppress(ValueError):
        decode_arguments(text)


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_too_deep_is_exact_at_the_limit(kind: str) -> None:
    """``MAX_DEPTH`` levels pass, one more is too deep; text and decoded values alike."""
    assert not too_deep(_nested(MAX_DEPTH, kind=kind))
    assert too_deep(_nested(MAX_DEPTH + 1, kind=kind))
    text = "[" * MAX_DEPTH + "1" + "]" * MAX_DEPTH
    assert decode_arguments(text) == _nested(MAX_DEPTH)
    with pytest.raises(UndecodableArguments, match="deeper than"):
        decode_arguments("[" + text + "]")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5_000, 100_000])
def test_deep_text_is_undecodable_not_a_recursion_error(depth: int) -> None:
    """Nesting past the limit, however far: the decoder's own error, in bounded time."""
    with pytest.raises(UndecodableArguments):
        decode_arguments('{"a":' * depth + "1" + "}" * depth)


def test_a_number_too_long_is_undecodable() -> None:
    """Over 4,300 digits: ``UndecodableArguments``; exactly 4,300 decode."""
    with pytest.raises(UndecodableArguments, match="number too long"):
        decode_arguments('{"n": ' + "9" * 4_301 + "}")
    assert decode_arguments('{"n": ' + "9" * 4_300 + "}")["n"] > 0


def _cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {"k": [1]}
    value["k"].append(value)
    return value


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(_nested(100_000, kind="dict"), id="deep-dict"),
        pytest.param(_nested(100_000), id="deep-list"),
        pytest.param(_cyclic(), id="cyclic"),
        pytest.param(10**5_000, id="5000-digit-int"),
        pytest.param({b"x": {1, 2}, 3: None}, id="odd-keys-and-sets"),
        pytest.param([math.nan, math.inf, -0.0, 1.0], id="floats"),
    ],
)
def test_any_value_has_a_stable_fingerprint(value: Any) -> None:
    """A fingerprint for every value, the same twice (an object: its type's text)."""
    first = fingerprint(value)
    assert fingerprint(value) == first
    assert isinstance(safe_canonical_text(value), str)


def test_a_cycle_is_written_as_a_marker() -> None:
    """A container inside itself is written once, then ``"<cycle>"``."""
    assert safe_canonical_text(_cyclic()) == '{"k":[1,"<cycle>"]}'


def test_a_huge_int_is_exact() -> None:
    """Two different huge ints never share a text (hexadecimal is exact)."""
    assert safe_canonical_text(10**5_000) != safe_canonical_text(10**5_000 + 1)
