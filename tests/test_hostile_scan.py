"""Hostile battery: traces for ``agentguard scan``.

Properties: any file gets a report (exit 0 or 1) or a one-line error (exit 2), never a
traceback; the JSON report is valid JSON; the work done is linear in the file's size, however
its items are laid out.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _hostile import (
    DEEP,
    Scratch,
    assert_only,
    bulk,
    cases,
    deep_json,
    finishes,
    nested,
    rand_message,
    seeds,
    trace_lines,
)
from agentguard import cli

WORK = Scratch("ag-hostile-scan-")


@pytest.fixture(scope="module", autouse=True)
def _remove_scratch() -> Iterator[None]:
    yield
    WORK.cleanup()


CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
GOOD = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
]


def _scan(content: bytes | str, name: str = "t.jsonl", *extra: str) -> tuple[int, str, str]:
    path = WORK / name
    data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
    path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = finishes(lambda: cli.main(["scan", str(path), "--no-progress", *extra]))
    return code, out.getvalue(), err.getvalue()


def _assert_scanned(content: bytes | str, name: str = "t.jsonl") -> None:
    code, out, err = _scan(content, name, "--json")
    assert code in (0, 1, 2), code
    if code == 2:
        assert err.startswith("agentguard scan: "), err
        assert err.count("\n") == 1, err
    else:
        json.loads(out)


@cases(300)
@given(
    records=st.lists(
        st.fixed_dictionaries(
            {"messages": st.lists(seeds.map(lambda s: rand_message(random.Random(s))), max_size=4)}
        ),
        max_size=4,
    ),
    name=st.sampled_from(["t.jsonl", "t.json"]),
)
def test_well_shaped_traces_get_a_report(records: list[Any], name: str) -> None:
    """JSONL of transcripts of well-shaped messages (any field values): a report."""
    _assert_scanned("\n".join(json.dumps(r, allow_nan=True) for r in records), name)


@cases(100)
@given(seed=seeds)
def test_bulk_transcripts_get_a_report(seed: int) -> None:
    """5 generated trace files per seed (500 files, 40 messages each): a report each."""

    def make(rng: random.Random) -> str:
        lines = []
        for s in range(4):
            messages = [rand_message(rng) for _ in range(10)]
            lines.append(json.dumps({"session": f"s{s}", "messages": messages}, allow_nan=True))
        return "\n".join(lines)

    bulk(seed, 5, make, _assert_scanned)


@cases(300, shrink=False)
@given(lines=trace_lines, name=st.sampled_from(["t.jsonl", "t.json"]))
def test_any_file_gets_a_report_or_a_one_line_error(lines: list[str], name: str) -> None:
    """Any lines (malformed JSON, hostile records and messages): a report or exit 2."""
    try:
        _assert_scanned("\n".join(lines), name)
    except Exception as exc:
        assert_only(exc, AssertionError)


def _line(messages: Any) -> str:
    return json.dumps({"messages": messages})


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(
            _line([{"role": "assistant", "tool_calls": "x"}]),
            id="tool-calls-a-string",
        ),
        pytest.param(
            _line([{"role": "assistant", "tool_calls": [None]}]),
            id="tool-calls-[null]",
        ),
        pytest.param(
            "[" * 100_000 + "]" * 100_000,
            id="nested-100000-deep",
        ),
        pytest.param(
            _line(
                [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": deep_json(DEEP)}}],
                    }
                ]
            ),
            id="arguments-nested-deep",
        ),
        pytest.param(b"\xff\xfe\n", id="not-utf8"),
        pytest.param("null\n", id="null"),
        pytest.param("{\n", id="broken-json"),
        pytest.param("[\nnull\n]", id="array-of-null"),
        pytest.param(_line("text"), id="messages-a-string"),
        pytest.param(_line([None]), id="messages-[null]"),
        pytest.param(
            _line([{"role": "assistant", "tool_calls": [{"function": None}]}]), id="fn-null"
        ),
        pytest.param(json.dumps({"messages": GOOD, "usage": "lots"}), id="usage-a-string"),
        pytest.param(json.dumps({"messages": GOOD, "tools": [None]}), id="tools-[null]"),
        pytest.param(
            '{"messages": [], "usage": {"total_tokens": ' + "9" * 5_000 + "}}", id="5000-digits"
        ),
        pytest.param(
            _line(
                [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"function": {"name": "f", "arguments": nested(900, 1, "dict")}}
                        ],
                    }
                ]
            ),
            id="decoded-arguments-900-deep",
        ),
    ],
)
def test_malformed_traces_get_a_report_or_a_one_line_error(content: str | bytes) -> None:
    """Each malformed trace: exit 0/1 with a JSON report, or exit 2 with one line."""
    _assert_scanned(content)


class _Decoded:
    """Counts the characters the JSON decoder goes through (a deterministic measure of work):
    an item's length when it decodes, the rest of the buffer when it fails (it read to there)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.chars = 0
        original = json.JSONDecoder.raw_decode

        def raw_decode(decoder: Any, s: str, idx: int = 0) -> Any:
            try:
                value, end = original(decoder, s, idx)
            except ValueError:
                self.chars += len(s) - idx
                raise
            self.chars += end - idx
            return value, end

        monkeypatch.setattr(json.JSONDecoder, "raw_decode", raw_decode)


def _one_big_item(size: int) -> str:
    messages = [{"role": "user", "content": "x" * size}, {"role": "assistant", "content": "ok"}]
    return "[\n" + ",\n".join(json.dumps(m) for m in messages) + "\n]\n"


def test_a_json_array_with_one_huge_item_is_decoded_in_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 4 MB item in a multi-line JSON array: at most a few passes over the file."""
    content = _one_big_item(4_000_000)
    decoded = _Decoded(monkeypatch)
    code, _, err = _scan(content, "big.json")
    assert code == 0, err
    assert decoded.chars <= 3 * len(content), f"{decoded.chars} chars decoded for {len(content)}"


def test_a_json_array_of_many_small_items_is_decoded_in_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many small items in a multi-line JSON array: at most a few passes over the file."""
    messages = [{"role": "user", "content": f"message {i}"} for i in range(20_000)]
    content = "[\n" + ",\n".join(json.dumps(m) for m in messages) + "\n]\n"
    decoded = _Decoded(monkeypatch)
    code, _, err = _scan(content, "many.json")
    assert code == 0, err
    assert decoded.chars <= 3 * len(content), f"{decoded.chars} chars decoded for {len(content)}"
