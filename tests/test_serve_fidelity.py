"""``agentguard serve``: a healthy stream reaches the caller event for event.

The stream shapes of real servers (``tests/test_stream_fidelity.py``: Azure's content filters,
refusals, logprobs, vLLM's reasoning, Ollama's finish chunk, a finish and usage in one chunk,
``n`` = 2, a call in fragments) served by an upstream to the guard server: the caller gets the
upstream's ``data:`` lines byte for byte, then the report's comment line and ``[DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("starlette", reason='needs the serve extra: pip install "agentguard[serve]"')

from _hostile import sse
from test_serve_stream import Body, _call, _sent, _server
from test_stream_fidelity import SHAPES, TOOLS

pytestmark = pytest.mark.anyio


def _data_lines(body: bytes) -> list[bytes]:
    return [line for line in body.split(b"\n\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("tools", [False, True], ids=["no tools", "tools"])
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_healthy_stream_reaches_the_caller_event_for_event(shape: str, tools: bool) -> None:
    if shape.startswith("a call") and not tools:
        pytest.skip("a call answers a request with tools")
    upstream = sse(SHAPES[shape])
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    sent = _sent(await _call(_server(Body([upstream])), **extra))
    assert _data_lines(sent) == _data_lines(upstream)
    assert b"\n\n: agentguard {" in sent


@pytest.mark.parametrize("done", [True, False], ids=["[DONE]", "no [DONE]"])
async def test_the_stream_ends_as_the_upstream_ended_it(done: bool) -> None:
    """Some servers end a chat stream without ``data: [DONE]``: the caller gets none either
    (the raw client reads both alike); with one, exactly one."""
    upstream = sse(SHAPES["usage chunk last"], done=done)
    sent = _sent(await _call(_server(Body([upstream]))))
    assert _data_lines(sent) == _data_lines(upstream)
    assert sent.count(b"data: [DONE]") == int(done)


async def test_a_repaired_call_goes_out_as_the_guard_made_it() -> None:
    """A call written as text: the caller gets the guard's call, not the upstream's text."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    sent = _sent(await _call(_server(Body([sse(chunks)])), tools=TOOLS))
    assert b"<tool_call>" not in sent
    assert b'"name": "get_weather"' in sent
    assert b'"finish_reason": "tool_calls"' in sent


async def test_parallel_calls_streamed_at_one_index_go_out_at_an_index_each() -> None:
    """Ollama streams every parallel call at index 0: the caller of ``serve`` gets them at
    index 0 and 1, as the openai transport's caller does (test_stream_fidelity)."""
    from test_stream_fidelity import OLLAMA_PARALLEL

    sent = _sent(await _call(_server(Body([sse(OLLAMA_PARALLEL)])), tools=TOOLS))
    calls = [
        (tc["index"], tc["id"], tc["function"]["arguments"])
        for line in _data_lines(sent)
        if line != b"data: [DONE]"
        for choice in json.loads(line[6:])["choices"]
        for tc in choice["delta"].get("tool_calls") or ()
    ]
    assert calls == [(0, "call_a", '{"city": "Oslo"}'), (1, "call_b", '{"city": "Rome"}')]
