"""Streams as real servers send them: a healthy answer reaches the caller chunk for chunk.

Each case is the byte stream of a real server's shape (Azure OpenAI's ``prompt_filter_results``
chunk with no choices and its per-choice ``content_filter_results``, OpenAI's ``refusal`` deltas,
``logprobs`` and spoken answers (``delta.audio``), vLLM's ``reasoning_content`` and ``stop_reason``, Ollama's finish chunk with
an empty ``content`` and a ``role``, a finish and usage in one chunk, ``n`` = 2 answers, a call
streamed in fragments; vLLM's running usage count on every chunk, OpenRouter's usage after the
finish, Groq's ``x_groq``, Ollama's whole call finished "stop", Gemini's call without an index) served through the real openai client to an unwrapped client and to a
wrapped one: the wrapped client's chunks must equal the raw client's, field for field, with
tools offered or not, sync and async.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentguard as ag
from _hostile import RawUpstream, guarded_client, raw_client, sse
from agentguard.integrations._replay import ChatReplay
from agentguard.transport import StreamChunk
from test_differential import TOOLS


def _chunk(**fields: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "small",
        **fields,
    }


def _choice(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": finish, **extra}


def _running(completion: int) -> dict[str, int]:
    return {"prompt_tokens": 5, "completion_tokens": completion, "total_tokens": 5 + completion}


SAFE = {"hate": {"filtered": False, "severity": "safe"}}
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
# Azure OpenAI's first chunk: the prompt's filter results, no choices
FILTERS = {
    "id": "",
    "object": "",
    "created": 0,
    "model": "",
    "choices": [],
    "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": SAFE}],
}


def _custom(*, index: int, id: str | None = None, **fields: str) -> dict[str, Any]:
    """A fragment of a custom tool's call (``name`` first, ``input`` in pieces)."""
    head: dict[str, Any] = {"id": id, "type": "custom"} if id else {}
    return {"index": index, **head, "custom": {"input": "", **fields} if id else fields}


SHAPES: dict[str, list[dict[str, Any]]] = {
    "azure content filters": [
        FILTERS,
        _chunk(choices=[_choice({"role": "assistant", "content": ""}, content_filter_results={})]),
        _chunk(choices=[_choice({"content": "Hello"}, content_filter_results=SAFE)]),
        _chunk(choices=[_choice({}, "stop", content_filter_results={})]),
    ],
    # gpt-4o-audio-preview with modalities ["text", "audio"]: speech and its transcript in
    # ``delta.audio``, no text: an answer, never re-asked as an empty one
    "openai audio answer": [
        _chunk(choices=[_choice({"role": "assistant", "content": None, "audio": {"id": "a1"}})]),
        _chunk(choices=[_choice({"audio": {"transcript": "Hello!"}})]),
        _chunk(choices=[_choice({"audio": {"data": "UklGRiQAAABX"}})]),
        _chunk(choices=[_choice({"audio": {"expires_at": 1}})]),
        _chunk(choices=[_choice({}, "stop")]),
    ],
    "openai refusal": [
        _chunk(choices=[_choice({"role": "assistant", "content": None, "refusal": ""})]),
        _chunk(choices=[_choice({"refusal": "I can't"})]),
        _chunk(choices=[_choice({"refusal": " help with that."})]),
        _chunk(choices=[_choice({}, "stop")]),
    ],
    "openai logprobs": [
        _chunk(
            choices=[
                _choice(
                    {"role": "assistant", "content": "Hi"},
                    logprobs={"content": [{"token": "Hi", "logprob": -0.1, "top_logprobs": []}]},
                )
            ]
        ),
        _chunk(
            choices=[
                _choice(
                    {"content": " there"},
                    "stop",
                    logprobs={
                        "content": [{"token": " there", "logprob": -0.2, "top_logprobs": []}]
                    },
                )
            ]
        ),
    ],
    "finish and usage in one chunk": [
        _chunk(choices=[_choice({"role": "assistant", "content": "Yes"}, "stop")], usage=USAGE),
    ],
    "usage chunk last": [
        _chunk(choices=[_choice({"role": "assistant", "content": "Yes"})]),
        _chunk(choices=[_choice({}, "stop")]),
        _chunk(choices=[], usage=USAGE),
    ],
    # vLLM with stream_options {"include_usage": true, "continuous_usage_stats": true}: a
    # running count on every chunk, the opening role chunk included (the guard held that one
    # back as the usage chunk, and the caller got it after the text)
    "vllm running usage": [
        _chunk(choices=[_choice({"role": "assistant", "content": ""})], usage=_running(0)),
        _chunk(choices=[_choice({"content": "Hello"})], usage=_running(1)),
        _chunk(choices=[_choice({"content": " there."})], usage=_running(2)),
        _chunk(choices=[_choice({"content": ""}, "stop")], usage=_running(2)),
        _chunk(choices=[], usage=_running(2)),
    ],
    # OpenRouter: the usage after the finish, on a chunk with the first answer's empty delta
    # (speakeasy-api/gram#921 shows one)
    "openrouter usage after the finish": [
        _chunk(choices=[_choice({"role": "assistant", "content": "Yes"})]),
        _chunk(choices=[_choice({"role": "assistant", "content": ""}, "stop")]),
        _chunk(choices=[_choice({"role": "assistant", "content": ""})], usage=USAGE),
    ],
    "usage on the opening chunk": [
        _chunk(choices=[_choice({"role": "assistant", "content": ""})], usage=USAGE),
        _chunk(choices=[_choice({"content": "Yes"})]),
        _chunk(choices=[_choice({}, "stop")]),
    ],
    "vllm reasoning": [
        _chunk(choices=[_choice({"role": "assistant", "reasoning_content": "think"})]),
        _chunk(choices=[_choice({"reasoning_content": " more"})]),
        _chunk(choices=[_choice({"content": "Answer"})]),
        _chunk(choices=[_choice({}, "stop", stop_reason=None)]),
    ],
    "ollama finish chunk": [
        _chunk(
            system_fingerprint="fp_ollama",
            choices=[_choice({"role": "assistant", "content": "Hi"})],
        ),
        _chunk(
            system_fingerprint="fp_ollama",
            choices=[_choice({"role": "assistant", "content": ""}, "stop")],
        ),
    ],
    "two answers (n=2)": [
        _chunk(
            choices=[
                _choice({"role": "assistant", "content": "A"}),
                {"index": 1, "delta": {"role": "assistant", "content": "B"}, "finish_reason": None},
            ]
        ),
        _chunk(choices=[{"index": 1, "delta": {"content": " and more"}, "finish_reason": None}]),
        _chunk(
            choices=[
                _choice({}, "stop"),
                {"index": 1, "delta": {}, "finish_reason": "stop"},
            ]
        ),
    ],
    # Groq: the usage in its own ``x_groq`` field on the finish chunk
    "groq usage in x_groq": [
        _chunk(choices=[_choice({"role": "assistant", "content": "Hi"})], x_groq={"id": "r1"}),
        _chunk(choices=[_choice({}, "stop")], x_groq={"id": "r1", "usage": USAGE}),
    ],
    "empty deltas between the text": [
        _chunk(choices=[_choice({"role": "assistant", "content": ""})]),
        _chunk(choices=[_choice({})]),
        _chunk(choices=[_choice({"content": "Hi"})]),
        _chunk(choices=[_choice({})]),
        _chunk(choices=[_choice({}, "stop")]),
    ],
    # Ollama: the whole call in one chunk, then a finish of "stop" with the usage
    "a call whole, finish stop (Ollama)": [
        _chunk(
            choices=[
                _choice(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_ab12cd34",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                            }
                        ],
                    }
                )
            ]
        ),
        _chunk(choices=[_choice({"role": "assistant", "content": ""}, "stop")], usage=USAGE),
    ],
    # Gemini's OpenAI-compatible endpoint: a call delta without an ``index``
    "a call without an index (Gemini)": [
        _chunk(
            choices=[
                _choice(
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "g1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                            }
                        ],
                    }
                )
            ]
        ),
        _chunk(choices=[_choice({}, "tool_calls")]),
    ],
    "a call in fragments": [
        _chunk(choices=[_choice({"role": "assistant", "content": None})]),
        _chunk(
            choices=[
                _choice(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": ""},
                            }
                        ]
                    }
                )
            ]
        ),
        _chunk(
            choices=[_choice({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]})]
        ),
        _chunk(
            choices=[
                _choice({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]})
            ]
        ),
        _chunk(choices=[_choice({}, "tool_calls")], usage=USAGE),
    ],
    # GPT-5's custom (freeform) tools: a call of another kind, its input in pieces; it was
    # assembled as a function call named '' and re-asked as a hallucinated tool
    "a call of a custom tool in pieces": [
        _chunk(choices=[_choice({"role": "assistant", "content": None})]),
        _chunk(choices=[_choice({"tool_calls": [_custom(index=0, id="call_c", name="run")]})]),
        _chunk(choices=[_choice({"tool_calls": [_custom(index=0, input="print(")]})]),
        _chunk(choices=[_choice({"tool_calls": [_custom(index=0, input="'hi')")]})]),
        _chunk(choices=[_choice({}, "tool_calls")], usage=USAGE),
    ],
    "a call of a custom tool beside a function call": [
        _chunk(choices=[_choice({"role": "assistant", "content": None})]),
        _chunk(
            choices=[_choice({"tool_calls": [_custom(index=0, id="c", name="run", input="1")]})]
        ),
        _chunk(
            choices=[
                _choice(
                    {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "f",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                            }
                        ]
                    }
                )
            ]
        ),
        _chunk(choices=[_choice({}, "tool_calls")], usage=USAGE),
    ],
}


def _read(client: Any, tools: bool, asynchronous: bool) -> list[dict[str, Any]]:
    kw: dict[str, Any] = {
        "model": "small",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "stream": True,
    }
    if tools:
        kw["tools"] = TOOLS

    async def read_async() -> list[Any]:
        return [c async for c in await client.chat.completions.create(**kw)]

    chunks = (
        asyncio.run(read_async()) if asynchronous else list(client.chat.completions.create(**kw))
    )
    return [c.model_dump() for c in chunks]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("tools", [False, True], ids=["no tools", "tools"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_healthy_stream_reaches_the_caller_chunk_for_chunk(
    shape: str, tools: bool, asynchronous: bool
) -> None:
    if shape.startswith("a call") and not tools:
        pytest.skip("a call answers a request with tools")
    body = sse(SHAPES[shape])
    raw_upstream = RawUpstream([(200, "text/event-stream", body)])
    guarded_upstream = RawUpstream([(200, "text/event-stream", body)])
    raw = _read(raw_client(raw_upstream, asynchronous=asynchronous), tools, asynchronous)
    guarded = _read(
        guarded_client(guarded_upstream, asynchronous=asynchronous), tools, asynchronous
    )
    assert guarded == raw
    assert guarded_upstream.requests == raw_upstream.requests


def test_a_streamed_refusal_is_an_answer_not_an_empty_one() -> None:
    """A refusal streams no text and no call: it is the model's answer, as a whole answer's
    ``refusal`` is, never re-asked as an empty one (which tools offered would make it)."""
    upstream = RawUpstream([(200, "text/event-stream", sse(SHAPES["openai refusal"]))])
    client = guarded_client(upstream)
    stream = client.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS,
        stream=True,
    )
    refusal = "".join(c.choices[0].delta.refusal or "" for c in stream if c.choices)
    assert refusal == "I can't help with that."
    assert len(upstream.requests) == 1


def test_a_repaired_call_still_reaches_the_caller_as_the_guard_made_it() -> None:
    """Where the guard changed the answer (a call written as text, handed over as a call), the
    caller gets the guard's chunks, not the upstream's text."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    chunks = [
        _chunk(choices=[_choice({"role": "assistant", "content": ""})]),
        _chunk(choices=[_choice({"content": text[:20]})]),
        _chunk(choices=[_choice({"content": text[20:]})]),
        _chunk(choices=[_choice({}, "stop")]),
    ]
    upstream = RawUpstream([(200, "text/event-stream", sse(chunks))])
    client = guarded_client(upstream)
    got = list(
        client.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=TOOLS,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in got if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    names = [tc.function.name for d in deltas for tc in d.tool_calls or ()]
    assert names == ["get_weather"]
    assert [c.choices[0].finish_reason for c in got if c.choices][-1] == "tool_calls"


def test_a_repaired_call_under_running_usage_opens_once_and_reports_the_final_count() -> None:
    """Every chunk carries a running count (vLLM's ``continuous_usage_stats``) and the guard
    changes the answer (a call written as text, handed over as a call): the answer opens once,
    the upstream's usage chunk comes last, and the report counts the final usage, not the
    opening chunk's zero."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    chunks = [
        _chunk(choices=[_choice({"role": "assistant", "content": ""})], usage=_running(0)),
        _chunk(choices=[_choice({"content": text[:20]})], usage=_running(6)),
        _chunk(choices=[_choice({"content": text[20:]})], usage=_running(19)),
        _chunk(choices=[_choice({"content": ""}, "stop")], usage=_running(19)),
        _chunk(choices=[], usage=_running(19)),
    ]
    upstream = RawUpstream([(200, "text/event-stream", sse(chunks))])
    stream = guarded_client(upstream).chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    got = list(stream)
    deltas = [c.choices[0].delta for c in got if c.choices]
    assert [d.role for d in deltas if d.role] == ["assistant"]
    assert [tc.function.name for d in deltas for tc in d.tool_calls or ()] == ["get_weather"]
    assert not got[-1].choices
    assert got[-1].usage.completion_tokens == 19
    report = ag.report_of(stream)
    assert report is not None
    assert report.usage.completion_tokens == 19


@pytest.mark.parametrize(
    "shape",
    ["openrouter usage after the finish", "vllm running usage", "usage on the opening chunk"],
)
def test_the_report_counts_the_usage_the_stream_reported(shape: str) -> None:
    """Wherever a server puts the count (after the finish on a chunk with an empty delta, on
    every chunk, only on the opening one), the report has it, not an estimate."""
    upstream = RawUpstream([(200, "text/event-stream", sse(SHAPES[shape]))])
    stream = guarded_client(upstream).chat.completions.create(
        model="small", messages=[{"role": "user", "content": "Oslo?"}], stream=True
    )
    list(stream)
    report = ag.report_of(stream)
    assert report is not None
    assert (report.usage.prompt_tokens, report.usage.completion_tokens) == (5, 2)
    assert not report.usage.estimated


@pytest.mark.parametrize("filters", [False, True], ids=["openai", "azure"])
def test_a_re_ask_after_live_text_does_not_open_the_answer_again(filters: bool) -> None:
    """Text went out live, then the call beside it was corrected: the re-ask's opening chunks
    (its ``role`` chunk, Azure's filter results) stay back. Sent again, the SDK's stream helper
    added the roles up to ``"assistantassistant"``."""

    def answer(name: str) -> bytes:
        call = {"index": 0, "id": "c1", "function": {"name": name, "arguments": '{"city": "Oslo"}'}}
        opening = [FILTERS] if filters else []
        return sse(
            [
                *opening,
                _chunk(choices=[_choice({"role": "assistant", "content": ""})]),
                _chunk(choices=[_choice({"content": "Let me check."})]),
                _chunk(choices=[_choice({"tool_calls": [call]})]),
                _chunk(choices=[_choice({}, "tool_calls")]),
            ]
        )

    wrong, right = answer("delete_everything"), answer("get_weather")
    sse_type = "text/event-stream"
    upstream = RawUpstream([(200, sse_type, body) for body in (wrong, right, wrong, right)])
    client = guarded_client(upstream)
    ask = {"model": "small", "messages": [{"role": "user", "content": "Oslo?"}], "tools": TOOLS}
    chunks = list(client.chat.completions.create(**ask, stream=True))
    with client.chat.completions.stream(**ask) as stream:
        final = stream.get_final_completion()
    assert len(upstream.requests) == 4  # each time, the made-up name was corrected
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]
    filtered = [c for c in chunks if (c.model_extra or {}).get("prompt_filter_results")]
    assert len(filtered) == (1 if filters else 0)
    message = final.choices[0].message
    assert message.role == "assistant"
    assert message.content == "Let me check."
    assert [c.function.name for c in message.tool_calls or ()] == ["get_weather"]


# -- any healthy stream, generated ------------------------------------------------------------

_PIECE = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_KIND = st.sampled_from(["text", "reasoning", "refusal", "filter", "role", "other answer"])


@st.composite
def _streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A stream of a healthy text answer as servers send it: pieces of several kinds in any
    order, then a finish (its usage in the same chunk or the next)."""
    chunks: list[dict[str, Any]] = []
    for kind in draw(st.lists(_KIND, max_size=12)):
        piece = draw(_PIECE)
        if kind == "text":
            extra = {"logprobs": {"content": []}} if draw(st.booleans()) else {}
            chunks.append(_chunk(choices=[_choice({"content": piece}, **extra)]))
        elif kind == "reasoning":
            chunks.append(_chunk(choices=[_choice({"reasoning_content": piece})]))
        elif kind == "refusal":
            chunks.append(_chunk(choices=[_choice({"refusal": piece})]))
        elif kind == "filter":
            chunks.append(
                _chunk(choices=[], prompt_filter_results=[{"prompt_index": 0, "x": piece}])
            )
        elif kind == "role":  # with a running usage count (vLLM's continuous_usage_stats) or not
            usage = {"usage": _running(len(chunks))} if draw(st.booleans()) else {}
            chunks.append(_chunk(choices=[_choice({"role": "assistant", "content": ""})], **usage))
        else:
            chunks.append(
                _chunk(choices=[{"index": 1, "delta": {"content": piece}, "finish_reason": None}])
            )
    if draw(st.booleans()):
        chunks.append(_chunk(choices=[_choice({}, "stop")], usage=USAGE))
    else:
        chunks += [_chunk(choices=[_choice({}, "stop")]), _chunk(choices=[], usage=USAGE)]
    return chunks


@settings(max_examples=60, deadline=None)
@given(_streams())
def test_any_healthy_text_stream_reaches_the_caller_chunk_for_chunk(
    chunks: list[dict[str, Any]],
) -> None:
    body = sse(chunks)
    raw_upstream = RawUpstream([(200, "text/event-stream", body)])
    guarded_upstream = RawUpstream([(200, "text/event-stream", body)])
    raw = _read(raw_client(raw_upstream), False, False)
    assert _read(guarded_client(guarded_upstream), False, False) == raw


def test_a_long_stream_reaches_the_caller_chunk_for_chunk() -> None:
    """Long enough for the replay to cut what it decided on from its record as it goes."""
    pieces = [_chunk(choices=[_choice({"role": "assistant", "content": ""})])]
    pieces += [_chunk(choices=[_choice({"content": f"w{i} "})]) for i in range(1200)]
    pieces.append(_chunk(choices=[_choice({}, "stop")], usage=USAGE))
    body = sse(pieces)
    raw = _read(raw_client(RawUpstream([(200, "text/event-stream", body)])), True, False)
    guarded = _read(guarded_client(RawUpstream([(200, "text/event-stream", body)])), True, False)
    assert guarded == raw


def test_the_replay_keeps_only_what_it_may_still_hand_on() -> None:
    """A record of 10,000 passed-on chunks is cut as the replay goes: what stays is bounded by
    what is still held, not by the stream's length."""
    record: list[tuple[Any, StreamChunk]] = []
    replay = ChatReplay(lambda: record, lambda raw, neutral: None)
    longest = 0
    for i in range(10_000):
        neutral = StreamChunk(content=f"w{i} ", raw=object())
        record.append((neutral.raw, neutral))
        assert replay.of(neutral) == [neutral.raw]
        longest = max(longest, len(record))
    finish = StreamChunk(finish_reason="stop", raw=object())
    record.append((finish.raw, finish))
    assert replay.of(StreamChunk(finish_reason="stop")) == []
    assert replay.end() == [finish.raw]
    assert longest <= 2 * ChatReplay._COMPACT + 1


@pytest.mark.parametrize("arguments", ["null", ""], ids=["null (Groq)", "empty"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_call_without_arguments_reaches_the_caller_as_sent(arguments: str, stream: bool) -> None:
    """Groq answers a call of a tool without parameters with ``arguments: "null"``: a healthy
    call, passed on as the raw client reads it (it was re-asked as "not a JSON object", then
    raised ``ToolValidationFailed``)."""
    tools = [{"type": "function", "function": {"name": "now", "description": "The time."}}]
    call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": arguments}}
    if stream:
        body = sse(
            [
                _chunk(
                    choices=[_choice({"role": "assistant", "tool_calls": [{"index": 0, **call}]})]
                ),
                _chunk(choices=[_choice({}, "tool_calls")], usage=USAGE),
            ]
        )
        answer = (200, "text/event-stream", body)
    else:
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        whole = _chunk(
            object="chat.completion",
            choices=[{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            usage=USAGE,
        )
        answer = (200, "application/json", json.dumps(whole).encode())
    kw: dict[str, Any] = {
        "model": "small",
        "messages": [{"role": "user", "content": "What time is it?"}],
        "tools": tools,
        "stream": stream,
    }

    def read(client: Any) -> list[dict[str, Any]]:
        answer = client.chat.completions.create(**kw)
        return [c.model_dump() for c in answer] if stream else [answer.model_dump()]

    raw = read(raw_client(RawUpstream([answer])))
    upstream = RawUpstream([answer])
    guarded = read(guarded_client(upstream))
    for item in guarded:
        item.pop("agentguard_report", None)
    assert guarded == raw
    assert len(upstream.requests) == 1


def _opening(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    fn = {"name": name, "arguments": arguments}
    call = {"index": index, "id": call_id, "type": "function", "function": fn}
    return _chunk(choices=[_choice({"tool_calls": [call]})])


# Ollama's stream of parallel calls (ollama/ollama#15457): every call at index 0, each whole
OLLAMA_PARALLEL = [
    _chunk(choices=[_choice({"role": "assistant", "content": ""})]),
    _opening(0, "call_a", "get_weather", '{"city": "Oslo"}'),
    _opening(0, "call_b", "get_weather", '{"city": "Rome"}'),
    _chunk(choices=[_choice({}, "tool_calls")], usage=USAGE),
]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_parallel_calls_streamed_at_one_index_go_out_at_an_index_each(asynchronous: bool) -> None:
    """The raw client hands on both calls at index 0, and every client that joins fragments by
    index alone (the SDK's own stream helper) reads one call, ``get_weatherget_weather``
    with two JSON objects run together. Through the guard the caller gets the two calls, at
    index 0 and 1 (the guard read them as two; it dropped the first before), and the report
    says so; one request upstream, as the caller sent it."""
    body = sse(OLLAMA_PARALLEL)
    raw_upstream = RawUpstream([(200, "text/event-stream", body)])
    guarded_upstream = RawUpstream([(200, "text/event-stream", body)])
    raw = _read(raw_client(raw_upstream, asynchronous=asynchronous), True, asynchronous)
    guarded = _read(guarded_client(guarded_upstream, asynchronous=asynchronous), True, asynchronous)

    def calls(chunks: list[dict[str, Any]]) -> list[tuple[int, str, str, str]]:
        return [
            (tc["index"], tc["id"], tc["function"]["name"], tc["function"]["arguments"])
            for c in chunks
            for choice in c["choices"]
            for tc in choice["delta"].get("tool_calls") or ()
        ]

    assert calls(raw) == [
        (0, "call_a", "get_weather", '{"city": "Oslo"}'),
        (0, "call_b", "get_weather", '{"city": "Rome"}'),
    ]
    assert calls(guarded) == [
        (0, "call_a", "get_weather", '{"city": "Oslo"}'),
        (1, "call_b", "get_weather", '{"city": "Rome"}'),
    ]
    assert guarded_upstream.requests == raw_upstream.requests
    assert guarded[-1]["usage"] == raw[-1]["usage"]


def test_the_sdk_stream_helper_reads_the_parallel_calls_through_the_guard() -> None:
    """The openai SDK's ``chat.completions.stream`` joins deltas by index: over the raw client
    the two calls come back as one broken call, through the guard as the two calls."""
    kw: dict[str, Any] = {
        "model": "small",
        "messages": [{"role": "user", "content": "Weather in Oslo and Rome?"}],
        "tools": TOOLS,
    }
    body = sse(OLLAMA_PARALLEL)
    raw = raw_client(RawUpstream([(200, "text/event-stream", body)]))
    with raw.chat.completions.stream(**kw) as stream:
        broken = stream.get_final_completion().choices[0].message.tool_calls
    assert [c.function.name for c in broken] == ["get_weatherget_weather"]
    guarded = guarded_client(RawUpstream([(200, "text/event-stream", body)]))
    with guarded.chat.completions.stream(**kw) as stream:
        calls = stream.get_final_completion().choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "get_weather", '{"city": "Oslo"}'),
        ("call_b", "get_weather", '{"city": "Rome"}'),
    ]
    stream = guarded.chat.completions.create(**kw, stream=True)
    list(stream)
    report = ag.report_of(stream)
    assert report is not None
    assert "2 tool calls streamed at 1 index(es): handed on at an index each" in report.warnings


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_calls_a_proxy_joined_into_one_reach_the_caller_as_the_calls(stream: bool) -> None:
    """A proxy that joined Ollama's parallel calls by index hands on one call whose arguments
    are two JSON objects run together: a JSON repair made it the last call (the first dropped,
    the caller none the wiser). Through the guard: the two calls, the report's repair
    ``split_calls``; one request upstream."""
    joined = '{"city": "Oslo"}{"city": "Rome"}'
    if stream:
        body = sse(
            [
                _opening(0, "call_a", "get_weather", joined),
                _chunk(choices=[_choice({}, "tool_calls")], usage=USAGE),
            ]
        )
        answer = (200, "text/event-stream", body)
    else:
        call = {"id": "call_a", "type": "function"}
        call["function"] = {"name": "get_weather", "arguments": joined}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        whole = _chunk(choices=[{"index": 0, "message": message, "finish_reason": "tool_calls"}])
        whole["object"] = "chat.completion"
        answer = (200, "application/json", json.dumps({**whole, "usage": USAGE}).encode())
    upstream = RawUpstream([answer])
    client = guarded_client(upstream)
    kw: dict[str, Any] = {
        "model": "small",
        "messages": [{"role": "user", "content": "Weather in Oslo and Rome?"}],
        "tools": TOOLS,
    }
    if stream:
        got = client.chat.completions.create(**kw, stream=True)
        chunks = list(got)
        calls = [
            (tc.index, tc.id, tc.function.arguments)
            for c in chunks
            for choice in c.choices
            for tc in choice.delta.tool_calls or ()
        ]
        assert calls == [(0, "call_a", '{"city": "Oslo"}'), (1, "call_a_1", '{"city": "Rome"}')]
    else:
        got = client.chat.completions.create(**kw)
        made = got.choices[0].message.tool_calls
        assert [(c.id, c.function.arguments) for c in made] == [
            ("call_a", '{"city": "Oslo"}'),
            ("call_a_1", '{"city": "Rome"}'),
        ]
    assert len(upstream.requests) == 1
    report = ag.report_of(got)
    assert report is not None
    assert [r.split(" ")[0] for r in report.repairs] == ["split_calls"]
