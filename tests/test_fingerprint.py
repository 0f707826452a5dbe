"""Canonical JSON and fingerprints."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard._fingerprint import (
    DIGEST_SIZE,
    arguments_object,
    canonical_json,
    canonical_text,
    canonical_text_of_decoded,
    compact_key,
    decode_arguments,
    fingerprint,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def test_key_order_and_whitespace_do_not_matter() -> None:
    """The same object written differently has one fingerprint."""
    a = '{"path": "/tmp/x", "opts": {"a": 1, "b": [1, 2]}}'
    b = '{ "opts":{"b":[1,2],"a":1},\n "path":"/tmp/x" }'
    assert fingerprint(a) == fingerprint(b)


def test_integral_floats_equal_ints() -> None:
    """1 and 1.0 are the same number."""
    assert fingerprint({"n": 1}) == fingerprint({"n": 1.0}) == fingerprint('{"n": 1.0}')


def test_different_values_differ() -> None:
    """Different content gives a different fingerprint."""
    assert fingerprint({"n": 1}) != fingerprint({"n": 2})
    assert fingerprint({"n": "1"}) != fingerprint({"n": 1})


def test_non_json_text_is_fingerprinted_as_text() -> None:
    """Plain text (not JSON) is fingerprinted verbatim, without error."""
    assert fingerprint("{not json") == fingerprint("{not json")
    assert fingerprint("{not json") != fingerprint("{not json!")


def test_fingerprint_size_is_bounded() -> None:
    """Huge inputs give a fixed-size fingerprint."""
    huge = {"data": "x" * 2_000_000}
    assert len(fingerprint(huge)) == 2 * DIGEST_SIZE


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6) | st.lists(json_values))
def test_object_and_its_json_text_agree(value: Any) -> None:
    """An object or array and its JSON text (compact or indented) have the same fingerprint."""
    assert fingerprint(json.dumps(value)) == fingerprint(value)
    assert fingerprint(json.dumps(value, indent=2)) == fingerprint(value)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_key_order_never_matters(value: dict[str, Any]) -> None:
    """Reversing insertion order never changes the canonical form."""
    reversed_value = dict(reversed(list(value.items())))
    assert canonical_json(value) == canonical_json(reversed_value)
    assert fingerprint(value) == fingerprint(reversed_value)


def test_decode_arguments_reads_every_form_of_arguments() -> None:
    """One decoder: mappings, JSON text, UTF-8 bytes; ``None`` and ``""`` are no arguments."""
    assert decode_arguments({"a": 1}) == {"a": 1}
    assert decode_arguments('{"a": 1.0}') == {"a": 1.0}
    assert decode_arguments(b'{"a": 1}') == {"a": 1}
    assert decode_arguments(None) == decode_arguments("") == decode_arguments(b"") == {}
    assert decode_arguments("[1, 2]") == [1, 2]  # not an object: the caller decides
    assert decode_arguments(5) == 5


def test_decode_arguments_canonical_floats() -> None:
    """``canonical=True`` writes integral floats as ints, as fingerprints compare them."""
    value = decode_arguments('{"a": 1.0, "b": 2.5, "c": NaN}', canonical=True)
    assert value == {"a": 1, "b": 2.5, "c": "nan"}
    assert isinstance(value["a"], int)


@pytest.mark.parametrize("text", ["{", "  ", "{'a': 1}", "nope"])
def test_decode_arguments_rejects_what_is_not_json(text: str) -> None:
    """Text that is not JSON (blank text included) raises ValueError with its position."""
    with pytest.raises(json.JSONDecodeError):
        decode_arguments(text)


def test_arguments_object_requires_an_object() -> None:
    """``arguments_object`` is the decoder plus the JSON-object requirement ToolGuard applies."""
    assert arguments_object('{"a": 1}') == {"a": 1}
    with pytest.raises(TypeError):
        arguments_object("[1]")


@given(json_values)
def test_canonically_decoded_values_need_no_normalising_pass(value: Any) -> None:
    """Skipping the normalising pass for canonically decoded values changes no canonical text."""
    text = json.dumps(value)
    decoded = decode_arguments(text, canonical=True)
    assert canonical_text_of_decoded(decoded) == canonical_text(value)


@given(json_values, json_values)
def test_compact_keys_are_as_exact_as_fingerprints(a: Any, b: Any) -> None:
    """Two values have one compact key exactly when they have one fingerprint."""
    same_key = compact_key(canonical_text(a)) == compact_key(canonical_text(b))
    assert same_key == (fingerprint(a) == fingerprint(b))


def test_long_texts_get_a_marked_digest_as_key() -> None:
    """A long canonical text is keyed by its digest, marked so no JSON text can equal it."""
    text = canonical_text({"blob": "x" * 1000})
    assert compact_key(text) == "#" + fingerprint({"blob": "x" * 1000})
    assert compact_key('{"a":1}') == '{"a":1}'


def test_plain_small_values_skip_the_float_search_and_keep_their_form() -> None:
    """Arguments without floats encode as they are; a float anywhere still becomes canonical."""
    plain = {"path": "src/a.py", "lines": [1, 200], "follow": True, "mode": None}
    assert canonical_json(plain) == b'{"follow":true,"lines":[1,200],"mode":null,"path":"src/a.py"}'
    assert canonical_json({"path": "a.py", "n": [1.0]}) == b'{"n":[1],"path":"a.py"}'
    big = {"items": [*range(100), 2.0]}
    assert canonical_json(big).endswith(b",99,2]}")
