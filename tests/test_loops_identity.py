"""Identity of calls and results: canonical fingerprints without volatile noise."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard.loops import ToolLoopPolicy, call_fingerprint, result_fingerprint

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=10))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
arg_dicts = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=6)


@given(arg_dicts)
def test_key_order_does_not_change_identity(args: dict[str, Any]) -> None:
    """Reversing the key order of the arguments gives the same fingerprint."""
    reordered = dict(reversed(list(args.items())))
    assert call_fingerprint("t", args) == call_fingerprint("t", reordered)


@given(arg_dicts, st.sampled_from([None, 2, 4]))
def test_json_string_and_dict_are_one_identity(args: dict[str, Any], indent: int | None) -> None:
    """Arguments as a dict or as JSON text (any whitespace) are the same call."""
    text = json.dumps(args, indent=indent)
    assert call_fingerprint("t", text) == call_fingerprint("t", args)


@given(st.integers(-(10**9), 10**9))
def test_integral_float_equals_int(n: int) -> None:
    """``1`` and ``1.0`` are the same argument value, also when nested."""
    assert call_fingerprint("t", {"a": {"b": [n]}}) == call_fingerprint(
        "t", {"a": {"b": [float(n)]}}
    )


@given(arg_dicts, arg_dicts)
def test_different_arguments_differ(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Arguments that are different JSON values have different fingerprints."""
    if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
        assert call_fingerprint("t", a) != call_fingerprint("t", b)


def test_tool_name_is_part_of_identity() -> None:
    """The same arguments to two tools are two calls."""
    assert call_fingerprint("a", {"x": 1}) != call_fingerprint("b", {"x": 1})


def test_fingerprint_is_bounded_for_huge_arguments() -> None:
    """A megabyte of arguments still gives a 32-character fingerprint."""
    fp = call_fingerprint("write", {"content": "x" * 1_000_000})
    assert len(fp) == 32


def test_default_volatile_fields_are_ignored_in_results() -> None:
    """Request ids, timestamps and durations at any depth do not make a result new."""
    a = {"status": "done", "request_id": "r1", "meta": {"timestamp": 1, "durationMs": 5}}
    b = {"status": "done", "requestId": "r2", "meta": {"timestamp": 2, "duration_ms": 9}}
    assert result_fingerprint(a) == result_fingerprint(b)
    assert result_fingerprint(a) != result_fingerprint({**a, "status": "failed"})


def test_timestamps_and_uuids_in_text_results_are_ignored() -> None:
    """Free-text results differing only by an ISO timestamp or a UUID are the same result."""
    a = "checked at 2026-11-20T09:14:01Z: build failed (trace 0b7d7e4e-6f54-4a5e-9a4f-3b8c1f0d2a11)"
    b = "checked at 2026-11-20T09:15:44Z: build failed (trace 9c1e5d7a-1111-4a5e-9a4f-3b8c1f0d2a11)"
    assert result_fingerprint(a) == result_fingerprint(b)


def test_json_text_result_equals_structured_result() -> None:
    """A tool message's JSON text and the decoded object are one result."""
    assert result_fingerprint('{"b": 1, "a": 2}') == result_fingerprint({"a": 2, "b": 1.0})


def test_policy_volatile_fields_extend_the_defaults() -> None:
    """A tool's declared volatile result and argument fields are ignored for that tool only."""
    policy = ToolLoopPolicy("fetch", volatile_arguments={"Nonce"}, volatile_results={"etag2"})
    assert call_fingerprint("fetch", {"u": 1, "nonce": 1}, policy) == call_fingerprint(
        "fetch", {"u": 1, "nonce": 2}, policy
    )
    assert call_fingerprint("fetch", {"u": 1, "nonce": 1}) != call_fingerprint(
        "fetch", {"u": 1, "nonce": 2}
    )
    assert result_fingerprint({"v": 1, "etag2": "a"}, policy) == result_fingerprint(
        {"v": 1, "etag2": "b"}, policy
    )


def test_policy_custom_fingerprint_selects_what_signals_progress() -> None:
    """A custom fingerprint function decides which part of a result is progress."""
    policy = ToolLoopPolicy("job", fingerprint=lambda r: r["state"])
    assert result_fingerprint({"state": "running", "log": "a"}, policy) == result_fingerprint(
        '{"state": "running", "log": "b"}', policy
    )


@pytest.mark.parametrize("raw", ["not json {", "", "[1, 2"])
def test_non_json_text_arguments_are_fingerprinted_as_text(raw: str) -> None:
    """Arguments that are not valid JSON still get a stable identity."""
    assert call_fingerprint("t", raw) == call_fingerprint("t", raw)
