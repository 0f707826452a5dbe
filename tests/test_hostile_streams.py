"""Hostile battery: SSE streams the raw openai client reads, through the guarded client.

Property: whatever the raw client does with a stream (yields chunks, or raises its own error),
the guarded stream yields chunks or raises an ``AgentGuardError`` or that same SDK exception.
An internal fault that a plain call survives under ``fail_mode: open`` never escapes a stream.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentguard as ag
import agentguard.validation._validator as validator_module
from _hostile import (
    DEEP,
    MESSAGES,
    TOOLS,
    Outcome,
    RawUpstream,
    assert_typed,
    bulk,
    call,
    cases,
    chunk,
    completion,
    deep_json,
    encode,
    guarded_client,
    hostile_chunks,
    outcome,
    rand_stream,
    raw_client,
    sane_chunks,
    seeds,
    sse,
    tool_delta,
)

SSE = "text/event-stream"
CREATE: dict[str, Any] = {"model": "fast", "messages": MESSAGES, "tools": TOOLS, "stream": True}


def _read(client: Any) -> list[Any]:
    return list(client.chat.completions.create(**CREATE))


def _both(body: bytes) -> tuple[Outcome, Outcome]:
    raw = raw_client(RawUpstream([(200, SSE, body)]))
    guarded = guarded_client(RawUpstream([(200, SSE, body)]))
    return outcome(lambda: _read(raw)), outcome(lambda: _read(guarded))


def _both_async(body: bytes) -> tuple[Outcome, Outcome]:
    async def read(client: Any) -> list[Any]:
        return [c async for c in await client.chat.completions.create(**CREATE)]

    raw = raw_client(RawUpstream([(200, SSE, body)]), asynchronous=True)
    guarded = guarded_client(RawUpstream([(200, SSE, body)]), asynchronous=True)
    return outcome(lambda: anyio.run(read, raw)), outcome(lambda: anyio.run(read, guarded))


@cases(250)
@given(chunks=sane_chunks)
def test_well_formed_streams_end_in_chunks_or_a_typed_error(chunks: list[Any]) -> None:
    """Well-formed chunks in any order (cut-off arguments, no finish, no [DONE]...)."""
    raw, guarded = _both(sse(chunks))
    assert_typed(guarded, raw)


@cases(100)
@given(chunks=sane_chunks, done=st.booleans())
def test_well_formed_streams_through_the_async_client(chunks: list[Any], done: bool) -> None:
    """The same property through ``AsyncOpenAI``."""
    raw, guarded = _both_async(sse(chunks, done=done))
    assert_typed(guarded, raw)


@cases(60)
@given(seed=seeds)
def test_bulk_streams_end_in_chunks_or_a_typed_error(seed: int) -> None:
    """6 generated streams per seed (360 in all) through the raw and the guarded client."""

    def check(chunks: list[Any]) -> None:
        raw, guarded = _both(sse(chunks))
        assert_typed(guarded, raw)

    bulk(seed, 6, rand_stream, check)


@cases(300)
@given(chunks=hostile_chunks)
def test_every_stream_the_sdk_reads_ends_in_chunks_or_a_typed_error(chunks: list[Any]) -> None:
    """Every chunk shape, hostile ones included; the classes it finds today are pinned below."""
    raw, guarded = _both(sse(chunks))
    assert_typed(guarded, raw)


FINISH = chunk({}, finish="tool_calls")
STREAMS_TODAY = [
    pytest.param(
        sse(
            [chunk(tool_delta(..., "read_file", '{"path": "a"}', id="c1", type="function")), FINISH]
        ),
        id="tool-call-delta-without-index",
    ),
    pytest.param(
        sse([chunk(tool_delta("a", "read_file", "{}", id="c1", type="function"))]),
        id="tool-call-index-a-string",
    ),
    pytest.param(
        sse([chunk({"content": "hi"}), chunk(), chunk({}, finish="stop")]), id="chunk-without-delta"
    ),
    pytest.param(sse([chunk(None)]), id="delta-null"),
    pytest.param(sse([chunk(choices=[None])]), id="choices-[null]"),
    pytest.param(sse(["null"]), id="chunk-null"),
    pytest.param(sse(["[1]"]), id="chunk-an-array"),
    pytest.param(
        sse([chunk(tool_delta(0, "read_file", deep_json(DEEP), id="c1", type="function")), FINISH]),
        id="arguments-nested-deep",
    ),
    pytest.param(
        sse([chunk({"content": "x"}), chunk({}, finish="stop", usage="lots")]), id="usage-as-string"
    ),
    pytest.param(
        sse(
            [
                chunk({"content": "x"}),
                chunk(
                    {}, finish="stop", usage={"prompt_tokens": float("inf"), "completion_tokens": 1}
                ),
            ]
        ),
        id="usage-infinity",
    ),
    pytest.param(
        sse([chunk(tool_delta(0, "read_file", {"path": "a"}, id="c1", type="function"))]),
        id="arguments-an-object",
    ),
    pytest.param(
        sse([chunk(tool_delta(0, 5, "{}", id="c1", type="function"))]), id="name-a-number"
    ),
    pytest.param(sse([chunk({"content": [1]})]), id="content-a-list"),
    pytest.param(
        sse(
            [
                chunk({"content": "\ud800"}),
                chunk(tool_delta(0, "wipe", "{}", id="c1", type="function")),
                FINISH,
            ]
        ),
        id="lone-surrogate-in-content",
    ),
    pytest.param(sse([chunk(choices=None)]), id="choices-null"),
    pytest.param(sse([chunk({"content": "\ud800"})]), id="lone-surrogate-content"),
    pytest.param(sse([]), id="no-chunks"),
    pytest.param(sse([chunk({"content": "x"})], done=False), id="no-done"),
    pytest.param(
        sse([chunk(tool_delta(10**9, "read_file", "{}", id="c1", type="function"))]),
        id="index-a-billion",
    ),
    pytest.param(sse(["{"]), id="broken-json"),
]


@pytest.mark.parametrize("body", STREAMS_TODAY)
def test_stream_shapes_the_sdk_reads(body: bytes) -> None:
    """Each shape: what the raw client does, the guarded stream does, or a typed error."""
    raw, guarded = _both(body)
    assert_typed(guarded, raw)


def _explode(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected internal fault")


@pytest.mark.parametrize(
    "stream",
    [
        False,
        True,
    ],
)
def test_an_internal_fault_fails_open_in_streams_as_in_plain_calls(
    stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the validator raises; fail-open hands back the model's own answer."""
    monkeypatch.setattr(validator_module.ToolCallValidator, "validate", _explode)
    if stream:
        body = sse([chunk(tool_delta(0, "read_file", '{"path": "a"}', id="c1")), FINISH])
        client = guarded_client(RawUpstream([(200, SSE, body)]))
        got = outcome(lambda: _read(client))
    else:
        body = encode(completion(content=None, finish="tool_calls", tool_calls=[call()]))
        client = guarded_client(RawUpstream([(200, "application/json", body)]))
        got = outcome(lambda: client.chat.completions.create(**{**CREATE, "stream": False}))
    assert got.error is None, got


CLOSED = ag.GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}},
        "escalation": {"chain": ["fast"]},
        "memory_pressure": {"enabled": False},
        "fail_mode": "closed",
    },
    env={},
)


@pytest.mark.parametrize("stream", [False, True])
def test_fail_closed_raises_a_typed_error_with_the_cause_chained(
    stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection under ``fail_mode: closed``: a typed error, the fault as its cause."""
    monkeypatch.setattr(validator_module.ToolCallValidator, "validate", _explode)
    if stream:
        body = sse([chunk(tool_delta(0, "read_file", '{"path": "a"}', id="c1")), FINISH])
        client = guarded_client(RawUpstream([(200, SSE, body)]), CLOSED)
        got = outcome(lambda: _read(client))
    else:
        body = encode(completion(content=None, finish="tool_calls", tool_calls=[call()]))
        client = guarded_client(RawUpstream([(200, "application/json", body)]), CLOSED)
        got = outcome(lambda: client.chat.completions.create(**{**CREATE, "stream": False}))
    assert isinstance(got.error, ag.AgentGuardError), got
    assert isinstance(got.error.__cause__, RuntimeError)
