"""Identity of calls and results: canonical fingerprints without volatile noise."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentguard.loops import ToolLoopPolicy, call_fingerprint, is_error_result, result_fingerprint
from agentguard.loops._identity import (
    _CALL_MEMOS,
    _FAILURE_MEMOS,
    _LONG_KEPT,
    _LONG_TEXT,
    _RESULT_MEMOS,
    _SHORT_KEPT,
    _SHORT_TEXT,
    _TEXT_NOISE,
    _UNKNOWN_TOOL,
    _denoise,
    _reports_failure,
    call_key,
    forget_texts,
    result_key,
    says_unknown_tool,
    text_call_key,
    text_result_key,
)

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


def test_a_runners_header_values_are_ignored_but_its_output_is_not() -> None:
    """A command runner's header (the Codex CLI's ``exec_command``) changes on every run of the
    same command; the output under it still tells results apart."""

    def output(chunk: str, wall: str, body: str) -> str:
        return (
            f"Chunk ID: {chunk}\nWall time: {wall} seconds\nProcess exited with code 0\n"
            f"Original token count: 14\nOutput:\n{body}\n"
        )

    pending = "status: pending (deploy 4411 queued behind 3 others)"
    first = result_fingerprint(output("06cbf7", "0.1087", pending))
    again = result_fingerprint(output("127035", "0.0000", pending))
    done = result_fingerprint(output("2e6de4", "0.0999", "status: deployed"))
    assert first == again != done
    # a labelled line that is not a volatile field is output, not noise
    assert (
        _denoise("Wall time: 1 s\nExit code: 1\nStatus: 3")
        == "Wall time: <v>\nExit code: 1\nStatus: 3"
    )


@given(st.text(max_size=40), st.text(max_size=600))
def test_the_header_rule_only_looks_at_the_head(head: str, tail: str) -> None:
    """Whatever the text, the rule changes nothing past the first 512 characters."""
    text = head + "\n" + "x" * 600 + tail
    assert _denoise(text).endswith(_denoise("x" * 600 + tail)[-len(tail) :] if tail else "")


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


@given(arg_dicts, st.sampled_from([None, 2]))
def test_in_memory_keys_follow_the_fingerprints(args: dict[str, Any], indent: int | None) -> None:
    """The LoopDetector's compact keys: dict and JSON text are one call, as for fingerprints."""
    text = json.dumps(args, indent=indent)
    assert call_key("t", text) == call_key("t", args)
    assert result_key(text) == result_key(args)


def test_volatile_arguments_of_a_dict_keep_integral_floats_canonical() -> None:
    """A policy dropping fields from a dict still writes ``1.0`` as ``1`` (like the JSON text)."""
    policy = ToolLoopPolicy("t", volatile_arguments={"nonce"})
    as_dict = {"n": 1.0, "nonce": "a"}
    as_text = '{"n": 1, "nonce": "b"}'
    assert call_fingerprint("t", as_dict, policy) == call_fingerprint("t", as_text, policy)
    assert call_key("t", as_dict, policy) == call_key("t", as_text, policy)


_ORIGINAL_NOISE = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
    r"|\b[0-9a-f]{24,}\b",
    re.I,
)
_NOISY = st.lists(
    st.sampled_from(
        [
            "2026-11-20T09:01:00Z", "2026-11-20 09:01", "2026-11-20t09:01:00.5+02:00",
            "550e8400-E29B-41d4-a716-446655440000", "deadBEEF" * 4, "a" * 30, "face", "-", ":",
            " ", "_", "x", "7", "+02:00", ".123", "z", "2026-11-20", "550e8400-e29b-", "1234",
        ]
    ),
    max_size=12,
).map("".join)  # fmt: skip


@given(_NOISY)
def test_text_noise_pattern_matches_the_original_case_insensitive_one(text: str) -> None:
    """The faster noise pattern (cases spelt out, a look-ahead) replaces exactly what ``re.I`` did."""
    assert _TEXT_NOISE.sub("<v>", text) == _ORIGINAL_NOISE.sub("<v>", text)


@given(st.lists(_NOISY | st.text(max_size=20), max_size=6).map("".join))
def test_the_prefilter_never_hides_noise(text: str) -> None:
    """Texts skip the regex only when it would find nothing (long ones by the hex prefilter,
    those shorter than any timestamp or id by their length)."""
    assert _denoise(text) == _ORIGINAL_NOISE.sub("<v>", text)


@given(st.lists(_NOISY, min_size=2, max_size=30).map(" ".join))
def test_noise_is_replaced_alike_wherever_it_may_start(text: str) -> None:
    """A long ASCII text tries the pattern only where the shape of a timestamp, a UUID or a hex
    id starts (a few places, then the full scan); a year, a number or a cut-off timestamp or
    UUID is no such place: what it replaces is what the scan replaces."""
    assert _denoise(text) == _ORIGINAL_NOISE.sub("<v>", text)


def _failure_as_decoded(text: str) -> bool:
    """:func:`is_error_result`'s rule for a JSON object text, always decoding it (no prefilter)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        return False
    return (
        data.get("error") not in (None, "", False)
        or data.get("ok") is False
        or (data.get("success") is False)
    )


_FAILURE_KEYS = st.sampled_from(["error", "ok", "success", "errors", "okay", "status", "e"])
_JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.text(max_size=8)


@given(
    st.dictionaries(_FAILURE_KEYS | st.text(max_size=6), _JSON_LEAVES, max_size=5),
    st.booleans(),
)
def test_the_failure_prefilter_never_hides_a_failure(
    data: dict[str, Any], ascii_only: bool
) -> None:
    """A JSON result skips decoding only when no key could report a failure: the verdict is the
    decoded rule's, whether keys are written out or spelled with \\u escapes."""
    from agentguard.loops import is_error_result

    text = json.dumps(data, ensure_ascii=ascii_only)
    escaped = text.replace('"error"', '"\\u0065rror"').replace('"ok"', '"\\u006fk"')
    for variant in (text, escaped):
        assert is_error_result(variant) is _failure_as_decoded(variant)


_RESULT_KEYS = st.sampled_from(["id", "createdAt", "request-id", "name", "status", "items", "k"])
_RESULT_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _NOISY | st.text()
)
_RESULTS = st.recursive(
    _RESULT_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_RESULT_KEYS, inner, max_size=4),
    max_leaves=20,
)


@given(
    _RESULTS.filter(lambda v: isinstance(v, (dict, list))),
    st.sampled_from([None, 1]),
    st.sampled_from([None, ToolLoopPolicy("t", volatile_results=frozenset({"status"}))]),
)
def test_stripping_while_decoding_equals_stripping_the_decoded_value(
    value: Any, indent: int | None, policy: ToolLoopPolicy | None
) -> None:
    """A JSON result text is stripped while it is decoded; its identity is the one the walk over
    the decoded value gives (volatile fields dropped, noise in objects' and arrays' strings)."""
    from agentguard._fingerprint import canonical_text_of_decoded
    from agentguard.loops import _identity

    text = json.dumps(value, indent=indent)
    volatile = _identity.DEFAULT_VOLATILE_FIELDS | (policy.volatile_results if policy else set())
    walked = _identity._strip(_identity.decoded(text, canonical=True), volatile)
    assert _identity._stripped_json(text, volatile) == walked
    assert result_key(text, policy) == _identity.compact_key(canonical_text_of_decoded(walked))


@given(
    st.sampled_from(["{", "[", "[File: /a.py]\n", "[auth]\n"]),
    st.lists(
        _NOISY | st.sampled_from(['"', ":", ",", "]", "}", "\n", "time: 5\n", "id=", "1", "x"]),
        max_size=12,
    ).map("".join),
)
def test_a_bracketed_text_that_is_no_json_is_judged_as_text(head: str, rest: str) -> None:
    """A text that opens like JSON but is none ("[File: ...]" views) is decoded once: its
    identity is the general path's, which decodes it, fails, and judges the denoised text."""
    from agentguard._fingerprint import canonical_text
    from agentguard.loops import _identity

    text = head + rest
    volatile = _identity.DEFAULT_VOLATILE_FIELDS
    general = canonical_text(_identity._strip(_identity.decoded(text, canonical=True), volatile))
    assert _identity._result_text(text, None) == general


def _general_identity(text: str) -> str:
    """A result text's identity by the general path alone: decode (refusing more than
    ``MAX_DEPTH`` levels), then walk the value to strip it, or judge the text as text."""
    from agentguard._fingerprint import canonical_text, canonical_text_of_decoded
    from agentguard.loops import _identity

    volatile = _identity.DEFAULT_VOLATILE_FIELDS
    value = _identity.decoded(text, canonical=True)
    if value is not text:
        return canonical_text_of_decoded(_identity._strip(value, volatile))
    return canonical_text(_identity._strip(value, volatile))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(55, 70),
    st.sampled_from(["[", '{"a":', '{"id":', '{"x\\"]":']),
    st.lists(
        st.dictionaries(_RESULT_KEYS, _RESULT_LEAVES | st.just('"]]}{["'), max_size=3),
        max_size=30,
    ),
    st.sampled_from(["", "]", "}", '"', "\\"]),
)
def test_a_result_of_many_containers_is_stripped_as_the_general_path_does(
    levels: int, opener: str, records: list[dict[str, Any]], damage: str
) -> None:
    """Past ``MAX_DEPTH`` containers the nesting is counted from the brackets outside strings:
    a shallow list of records is stripped while decoded, a text nesting deeper than
    ``MAX_DEPTH`` (or broken) still goes the general path; either way the identity is its."""
    from agentguard.loops import _identity

    closer = "]" if opener == "[" else "}"
    for text in (
        json.dumps(records),
        json.dumps([records, records]) + damage,
        opener * levels + json.dumps(records) + closer * levels,
        opener * levels + json.dumps(records) + closer * (levels - 1) + damage,
    ):
        assert _identity._result_text(text, None) == _general_identity(text)


@pytest.mark.parametrize("tail", ["", "\\", "]" * 70])
def test_a_string_left_open_in_a_result_of_many_containers(tail: str) -> None:
    """A quote followed by escaped quotes to the end of a large result: the nesting count reads
    the open string to the end once (its scan from every escaped quote again was quadratic in
    the result's size: 0.75 s of CPU at 24 KB), and the identity is the general path's."""
    from agentguard.loops import _identity

    text = "[" * 70 + '"' + '\\"' * 5_000 + tail
    assert _identity._nesting(text) == 70
    assert _identity._result_text(text, None) == _general_identity(text)


_MEMO_TEXTS = st.one_of(
    st.text(max_size=40),
    st.dictionaries(st.sampled_from(["id", "q", "requestId", "n"]), st.text(max_size=30)).map(
        json.dumps
    ),
)


@given(texts=st.lists(_MEMO_TEXTS, max_size=12))
@settings(max_examples=60)
def test_the_shared_memos_give_the_identities_they_remember(texts: list[str]) -> None:
    """The process-wide memos answer what the identity functions compute, under every policy
    (a policy's volatile fields are part of the memo's key), however often a text comes back."""
    policy = ToolLoopPolicy("t", volatile_results=frozenset({"q"}), volatile_arguments={"n"})
    for text in [*texts, *texts]:
        assert is_error_result(text) is _reports_failure(text)
        for p in (None, policy):
            assert text_result_key(text, p) == result_key(text, p)
            assert text_call_key("t", text, p) == call_key("t", text, p)


def test_a_custom_fingerprint_is_always_asked() -> None:
    """A tool's own fingerprint function may depend on anything: its answer is never memoised."""
    answers = iter(["first", "second"])
    policy = ToolLoopPolicy("t", fingerprint=lambda _: next(answers))
    assert text_result_key("same", policy) != text_result_key("same", policy)


def test_the_shared_memos_keep_a_fixed_number_of_texts() -> None:
    """Each tier of each memo stays within its bound however many distinct texts pass (the
    memory they keep alive is bounded), and long texts are not kept at all."""
    forget_texts()
    for i in range(3 * max(_SHORT_KEPT, _LONG_KEPT)):
        text_result_key(f"short {i}")
        text_result_key(f"long {i} " + "x" * _SHORT_TEXT)
        text_call_key("t", json.dumps({"i": i}))
        is_error_result(f"Error {i}")
        is_error_result(f"Error {i} " + "x" * _SHORT_TEXT)
        assert all(
            len(memo) <= _SHORT_KEPT
            for memo in (_RESULT_MEMOS[0], _CALL_MEMOS[0], _FAILURE_MEMOS[0])
        )
        assert len(_RESULT_MEMOS[1]) <= _LONG_KEPT
        assert len(_FAILURE_MEMOS[1]) <= _LONG_KEPT
    huge = "y" * (_LONG_TEXT + 1)
    assert text_result_key(huge) == result_key(huge)
    assert all(huge not in key for key in _RESULT_MEMOS[1])
    assert is_error_result("Error: " + huge)
    assert not any(len(key) > _LONG_TEXT for key in _FAILURE_MEMOS[1])
    forget_texts()
    assert not any((*_RESULT_MEMOS, *_CALL_MEMOS, *_FAILURE_MEMOS))


def test_no_other_character_matches_the_letters_of_tool_and_funct_ignoring_case() -> None:
    """``says_unknown_tool`` skips texts whose lower-cased form names neither "tool" nor
    "funct": sound only while no character besides these letters' ASCII cases matches them
    under IGNORECASE (unlike "s", which the long s U+017F matches), checked over all of Unicode."""
    letters = re.compile("[tolfunc]", re.IGNORECASE)
    others = [c for c in map(chr, range(0x80, sys.maxunicode + 1)) if letters.fullmatch(c)]
    assert others == []
    assert re.fullmatch("[s]", "\u017f", re.IGNORECASE)  # (the check would see one)


_UNKNOWN_PIECES = st.sampled_from(
    [
        "Unknown tool", "unknown TOOL", "Invalid  function", "no such tool", "Tool x is not "
        "registered", "FUNCTION foo does not exist", "FunctionCallNotExists", "tool", "funct",
        "Error: ", "İ", "ſ", "K", " ", "\n", "x", "seat taken", "no such file",
    ]
)  # fmt: skip


@given(st.lists(_UNKNOWN_PIECES | st.text(max_size=8), max_size=8).map("".join))
def test_unknown_tool_is_told_as_the_pattern_tells_it(text: str) -> None:
    """The lower-case prefilter never hides a text the pattern finds."""
    assert says_unknown_tool(text) is bool(_UNKNOWN_TOOL.search(text))
