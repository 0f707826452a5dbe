"""A healthy Responses API stream reaches the caller event for event, through ``wrap()`` and
through ``agentguard serve``, whatever its output holds.

The stream shapes OpenAI documents for the Responses API beyond text and function calls: hosted
tools (web search with its citations, file search, code interpreter, MCP, image generation), a
custom tool's freeform input, a refusal, a background response opening ``queued``, reasoning
summary parts, an answer cut at ``max_output_tokens``, ``logprobs`` on its deltas, and events
without their ``event:`` lines. With function tools offered, an answer holding no text (a
refusal, an image, a custom tool's call) is an answer: it was re-asked as an empty one and
raised ``ToolValidationFailed`` once the re-asks ran out, where the raw client read it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import pytest

from _hostile import RawUpstream, guarded_client, raw_client

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
USAGE = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 15,
}


def _response(status: str, output: Iterable[Any] = (), **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "gpt-4.1",
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": USAGE if status in ("completed", "incomplete") else None,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        **extra,
    }


def _message(at: int, text: str, annotations: Iterable[Any] = (), *, logprobs: bool = False):
    """A message item's events and the item done."""
    where = {"item_id": "msg_1", "output_index": at, "content_index": 0}
    opened = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant"}
    part = {"type": "output_text", "text": text, "annotations": list(annotations)}
    item = {**opened, "status": "completed", "content": [part]}
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": at,
            "item": {**opened, "content": []},
        },
        {
            "type": "response.content_part.added",
            **where,
            "part": {**part, "text": "", "annotations": []},
        },
    ]
    for word in re.findall(r"\S+\s*", text):  # the deltas add up to the text
        lp = [{"token": word, "logprob": -0.1, "top_logprobs": []}] if logprobs else []
        events.append(
            {"type": "response.output_text.delta", **where, "delta": word, "logprobs": lp}
        )
    for i, annotation in enumerate(annotations):
        events.append(
            {
                "type": "response.output_text.annotation.added",
                **where,
                "annotation_index": i,
                "annotation": annotation,
            }
        )
    events += [
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": part},
        {"type": "response.output_item.done", "output_index": at, "item": item},
    ]
    return events, item


def _item(at: int, item: dict[str, Any], opened: dict[str, Any], *kinds: Any):
    """A hosted item's events: added (as ``opened``), its own events (a kind, or a kind and its
    fields), done; and the item done."""
    ref = {"output_index": at, "item_id": item["id"]}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": at, "item": opened}
    ]
    for kind in kinds:
        name, fields = (kind, {}) if isinstance(kind, str) else kind
        events.append({"type": name, **ref, **fields})
    events.append({"type": "response.output_item.done", "output_index": at, "item": item})
    return events, item


def _stream(
    *parts: tuple[list[dict[str, Any]], dict[str, Any]],
    opening: Iterable[str] = ("response.created", "response.in_progress"),
    end: str = "response.completed",
    **extra: Any,
) -> list[dict[str, Any]]:
    events = [
        {
            "type": kind,
            "response": _response("queued" if kind.endswith("queued") else "in_progress", **extra),
        }
        for kind in opening
    ]
    outputs = []
    for part_events, item in parts:
        events += part_events
        outputs.append(item)
    final = _response(end.split(".")[1], outputs, **extra)
    if end == "response.incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
    events.append({"type": end, "response": final})
    for i, event in enumerate(events):
        event["sequence_number"] = i
    return events


WEB_SEARCH = {
    "id": "ws_1",
    "type": "web_search_call",
    "status": "completed",
    "action": {"type": "search", "query": "oslo"},
}
FILE_SEARCH = {
    "id": "fs_1",
    "type": "file_search_call",
    "status": "completed",
    "queries": ["oslo"],
    "results": None,
}
CODE = {
    "id": "ci_1",
    "type": "code_interpreter_call",
    "status": "completed",
    "code": "print(2+2)",
    "container_id": "cntr_1",
    "outputs": [{"type": "logs", "logs": "4"}],
}
MCP_LIST = {
    "id": "mcpl_1",
    "type": "mcp_list_tools",
    "server_label": "dice",
    "tools": [{"name": "roll", "input_schema": {"type": "object"}}],
}
MCP_CALL = {
    "id": "mcp_1",
    "type": "mcp_call",
    "server_label": "dice",
    "name": "roll",
    "arguments": '{"d":6}',
    "output": "4",
    "error": None,
}
IMAGE = {
    "id": "ig_1",
    "type": "image_generation_call",
    "status": "completed",
    "result": "iVBORw0KGgo=",
}
CUSTOM = {
    "id": "ctc_1",
    "type": "custom_tool_call",
    "status": "completed",
    "call_id": "call_9",
    "name": "code_exec",
    "input": "print('hi')",
}
REASONING = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Thinking about it"}],
    "encrypted_content": "gAAAA",
}
REFUSAL = {"type": "refusal", "refusal": "I can't help with that."}
CALL = {
    "id": "fc_1",
    "type": "function_call",
    "status": "completed",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Oslo"}',
}
SUMMARY = {"item_id": "rs_1", "summary_index": 0}


def _refusal() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    opened = {
        "id": "msg_1",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    item = {**opened, "status": "completed", "content": [REFUSAL]}
    return [
        {"type": "response.output_item.added", "output_index": 0, "item": opened},
        {"type": "response.content_part.added", **where, "part": {**REFUSAL, "refusal": ""}},
        {"type": "response.refusal.delta", **where, "delta": "I can't "},
        {"type": "response.refusal.delta", **where, "delta": "help with that."},
        {"type": "response.refusal.done", **where, "refusal": REFUSAL["refusal"]},
        {"type": "response.content_part.done", **where, "part": REFUSAL},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
    ], item


SHAPES: dict[str, list[dict[str, Any]]] = {
    "web search with citations": _stream(
        _item(
            0,
            WEB_SEARCH,
            {"id": "ws_1", "type": "web_search_call", "status": "in_progress"},
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
            "response.web_search_call.completed",
        ),
        _message(
            1,
            "Oslo is cold today",
            [
                {
                    "type": "url_citation",
                    "start_index": 0,
                    "end_index": 4,
                    "url": "https://example.com",
                    "title": "Ex",
                }
            ],
        ),
    ),
    "file search with citations": _stream(
        _item(
            0,
            FILE_SEARCH,
            {**FILE_SEARCH, "status": "in_progress", "queries": []},
            "response.file_search_call.in_progress",
            "response.file_search_call.searching",
            "response.file_search_call.completed",
        ),
        _message(
            1,
            "Per the file Oslo is cold",
            [{"type": "file_citation", "file_id": "file-1", "filename": "a.pdf", "index": 3}],
        ),
    ),
    "code interpreter": _stream(
        _item(
            0,
            CODE,
            {**CODE, "status": "in_progress", "code": "", "outputs": None},
            "response.code_interpreter_call.in_progress",
            ("response.code_interpreter_call_code.delta", {"delta": "print(2+2)"}),
            ("response.code_interpreter_call_code.done", {"code": "print(2+2)"}),
            "response.code_interpreter_call.interpreting",
            "response.code_interpreter_call.completed",
        ),
        _message(1, "It prints 4"),
    ),
    "mcp": _stream(
        _item(
            0,
            MCP_LIST,
            {**MCP_LIST, "tools": []},
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.completed",
        ),
        _item(
            1,
            MCP_CALL,
            {**MCP_CALL, "arguments": "", "output": None},
            "response.mcp_call.in_progress",
            ("response.mcp_call_arguments.delta", {"delta": '{"d":6}'}),
            ("response.mcp_call_arguments.done", {"arguments": '{"d":6}'}),
            "response.mcp_call.completed",
        ),
        _message(2, "You rolled 4"),
    ),
    "image generation, no text": _stream(
        _item(
            0,
            IMAGE,
            {**IMAGE, "status": "in_progress", "result": None},
            "response.image_generation_call.in_progress",
            "response.image_generation_call.generating",
            (
                "response.image_generation_call.partial_image",
                {"partial_image_index": 0, "partial_image_b64": "iVBO"},
            ),
            "response.image_generation_call.completed",
        ),
    ),
    "custom tool call, no text": _stream(
        _item(
            0,
            CUSTOM,
            {**CUSTOM, "input": ""},
            ("response.custom_tool_call_input.delta", {"delta": "print("}),
            ("response.custom_tool_call_input.delta", {"delta": "'hi')"}),
            ("response.custom_tool_call_input.done", {"input": "print('hi')"}),
        ),
    ),
    "refusal, no text": _stream(_refusal()),
    "background, queued first": _stream(
        _message(0, "Hello there"),
        opening=("response.queued", "response.created", "response.in_progress"),
        background=True,
    ),
    "reasoning summary parts": _stream(
        _item(
            0,
            REASONING,
            {"id": "rs_1", "type": "reasoning", "summary": []},
            (
                "response.reasoning_summary_part.added",
                {**SUMMARY, "part": {"type": "summary_text", "text": ""}},
            ),
            ("response.reasoning_summary_text.delta", {**SUMMARY, "delta": "Thinking "}),
            ("response.reasoning_summary_text.delta", {**SUMMARY, "delta": "about it"}),
            ("response.reasoning_summary_text.done", {**SUMMARY, "text": "Thinking about it"}),
            ("response.reasoning_summary_part.done", {**SUMMARY, "part": REASONING["summary"][0]}),
        ),
        _message(1, "The answer is 4"),
    ),
    "function call": _stream(
        _item(
            0,
            CALL,
            {**CALL, "status": "in_progress", "arguments": ""},
            ("response.function_call_arguments.delta", {"delta": '{"city":'}),
            ("response.function_call_arguments.delta", {"delta": '"Oslo"}'}),
            (
                "response.function_call_arguments.done",
                {"arguments": CALL["arguments"], "name": "get_weather"},
            ),
        ),
    ),
    "cut at max_output_tokens": _stream(_message(0, "Once upon a"), end="response.incomplete"),
    "logprobs": _stream(_message(0, "Hello there friend", logprobs=True)),
    "final text trimmed": _stream(
        _message(
            0,
            "Oslo is cold today.\n",
            [
                {
                    "type": "url_citation",
                    "start_index": 0,
                    "end_index": 4,
                    "url": "https://example.com",
                    "title": "Ex",
                }
            ],
        )
    ),
}


def _trimmed(events: list[dict[str, Any]]) -> None:
    """A server whose final text is not exactly its deltas': whitespace trimmed."""
    for event in events:
        for holder in (event, event.get("part"), event.get("item"), event.get("response")):
            if not isinstance(holder, dict):
                continue
            if (
                isinstance(holder.get("text"), str)
                and event["type"] != "response.content_part.added"
            ):
                holder["text"] = holder["text"].strip()
            for item in holder.get("output") or [holder]:
                for part in item.get("content") or []:
                    if isinstance(part.get("text"), str) and part["text"]:
                        part["text"] = part["text"].strip()


_trimmed(SHAPES["final text trimmed"])


def _sse(events: list[dict[str, Any]], *, named: bool = True) -> bytes:
    return "".join(
        (f"event: {e['type']}\n" if named else "") + f"data: {json.dumps(e)}\n\n" for e in events
    ).encode()


def _ask(tools: bool) -> dict[str, Any]:
    return {
        "model": "gpt-4.1",
        "input": "hi",
        "stream": True,
        **({"tools": TOOLS} if tools else {}),
    }


def _events(stream: Any) -> list[dict[str, Any]]:
    out = []
    for event in stream:
        data = event.model_dump()
        data.pop("agentguard_report", None)
        if isinstance(data.get("response"), dict):
            data["response"].pop("agentguard_report", None)
        out.append(data)
    return out


async def _aevents(stream: Any) -> list[dict[str, Any]]:
    return _events([event async for event in stream])


CASES = [
    pytest.param(
        shape,
        tools,
        named,
        id=f"{shape}{', tools' if tools else ''}{'' if named else ', data lines only'}",
    )
    for shape in SHAPES
    for tools in (False, True)
    for named in (True, False)
    if named or shape == "background, queued first"
]


@pytest.mark.parametrize(("shape", "tools", "named"), CASES)
def test_a_healthy_responses_stream_reaches_the_caller_event_for_event(
    shape: str, tools: bool, named: bool
) -> None:
    answers = [(200, "text/event-stream", _sse(SHAPES[shape], named=named))]
    raw = _events(raw_client(RawUpstream(answers)).responses.create(**_ask(tools)))
    upstream = RawUpstream(answers)
    guarded = _events(guarded_client(upstream).responses.create(**_ask(tools)))
    assert guarded == raw
    assert len(upstream.requests) == 1  # nothing re-asked


@pytest.mark.anyio
@pytest.mark.parametrize(("shape", "tools", "named"), CASES)
async def test_a_healthy_responses_stream_reaches_an_async_caller_event_for_event(
    shape: str, tools: bool, named: bool
) -> None:
    answers = [(200, "text/event-stream", _sse(SHAPES[shape], named=named))]
    raw_stream = await raw_client(RawUpstream(answers), asynchronous=True).responses.create(
        **_ask(tools)
    )
    raw = await _aevents(raw_stream)
    upstream = RawUpstream(answers)
    stream = await guarded_client(upstream, asynchronous=True).responses.create(**_ask(tools))
    assert await _aevents(stream) == raw
    assert len(upstream.requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("tools", [False, True], ids=["no tools", "tools"])
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_healthy_responses_stream_reaches_the_caller_through_serve(
    shape: str, tools: bool
) -> None:
    """Through ``agentguard serve``: the upstream's events, byte for byte, then the report."""
    pytest.importorskip(
        "starlette", reason='needs the serve extra: pip install "agentguard[serve]"'
    )
    from test_serve_stream import Body, _call, _sent, _server

    upstream = _sse(SHAPES[shape])
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    sent = _sent(await _call(_server(Body([upstream])), path="/v1/responses", **extra))
    assert sent[: sent.index(b": agentguard ")] == upstream
