"""A provider's own fields on a tool call travel with it, whatever the guard does to the call.

Gemini 3 (through its OpenAI-compatible endpoint) puts a thought signature on every tool call it
makes, as ``extra_content.google.thought_signature``, and answers 400 ("Function call is missing a
thought_signature") when a call of the current turn comes back without it. The guard re-sends a
failed call in a correction and hands the caller repaired calls: both must keep the signature,
through the real openai client (whole answers and streams) and through ``agentguard serve``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentguard as ag
from _hostile import CONFIG, RawUpstream, chunk, completion, guarded_client, raw_client, sse
from agentguard.events import GuardInternalError
from agentguard.testing import capture_events
from test_differential import TOOLS

SIGNATURE = {"google": {"thought_signature": "c2lnbmF0dXJlLTE="}}
ASK = {"model": "small", "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
JSON, SSE = "application/json", "text/event-stream"


def _call(name: str, arguments: str) -> dict[str, Any]:
    fn = {"name": name, "arguments": arguments}
    return {"id": "call_1", "type": "function", "function": fn, "extra_content": SIGNATURE}


def _whole(name: str, arguments: str) -> tuple[int, str, bytes]:
    message = {"role": "assistant", "content": None, "tool_calls": [_call(name, arguments)]}
    return 200, JSON, json.dumps(completion(message=message, finish="tool_calls")).encode()


def _streamed(name: str, arguments: str) -> tuple[int, str, bytes]:
    delta = {"role": "assistant", "tool_calls": [{"index": 0, **_call(name, arguments)}]}
    return 200, SSE, sse([chunk(delta), chunk({}, finish="tool_calls")])


WRONG_NAME = ("delete_everything", '{"city": "Oslo"}')  # corrected: a re-ask
BROKEN_JSON = ("get_weather", '{"city": "Oslo"')  # repaired here: no re-ask
RIGHT = ("get_weather", '{"city": "Oslo"}')


def _final_message(client: Any, streamed: bool) -> Any:
    """The caller's final message: read whole, or added up by the SDK's stream helper."""
    if streamed:
        with client.chat.completions.stream(**ASK, tools=TOOLS) as stream:
            return stream.get_final_completion().choices[0].message
    return client.chat.completions.create(**ASK, tools=TOOLS).choices[0].message


def _signatures(call: Any) -> Any:
    return (call.model_extra or {}).get("extra_content")


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
def test_a_corrected_call_goes_back_with_its_signature(streamed: bool) -> None:
    """The failed call re-sent in the correction carries its ``extra_content``."""
    answer = _streamed if streamed else _whole
    upstream = RawUpstream([answer(*WRONG_NAME), answer(*RIGHT)])
    client = guarded_client(upstream)
    message = _final_message(client, streamed)
    assert len(upstream.requests) == 2
    resent = upstream.requests[1]["messages"][1]
    assert resent["role"] == "assistant"
    assert [c.get("extra_content") for c in resent["tool_calls"]] == [SIGNATURE]
    assert [_signatures(c) for c in message.tool_calls or ()] == [SIGNATURE]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
def test_a_repaired_call_reaches_the_caller_with_its_signature(streamed: bool) -> None:
    """A call the guard repaired (its arguments' JSON closed) keeps its ``extra_content``: the
    caller sends it back next turn, and Gemini wants it there."""
    answer = _streamed if streamed else _whole
    upstream = RawUpstream([answer(*BROKEN_JSON)])
    client = guarded_client(upstream)
    message = _final_message(client, streamed)
    assert len(upstream.requests) == 1
    calls = message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Oslo"}]
    assert [_signatures(c) for c in calls] == [SIGNATURE]


def test_the_call_itself_is_the_guards_whatever_the_original_held() -> None:
    """The original entry lends only its other fields: the repaired name and arguments, and
    the call's place in a stream, are the guard's."""
    original = {**_call("get_wether", "{"), "index": 7}
    call = ag.ToolCall("get_weather", '{"city": "Oslo"}', "call_1")
    assert call.to_openai(original) == {
        "extra_content": SIGNATURE,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        "id": "call_1",
    }
    assert call.to_openai() == {
        k: v for k, v in call.to_openai(original).items() if k != "extra_content"
    }


@pytest.mark.anyio
async def test_through_serve_a_corrected_call_goes_back_with_its_signature() -> None:
    """``agentguard serve`` re-sends the failed call with its ``extra_content`` too."""
    pytest.importorskip("starlette", reason="needs the serve extra")
    import httpx

    upstream = RawUpstream([_whole(*WRONG_NAME), _whole(*RIGHT)])

    def answer(request: httpx.Request) -> httpx.Response:
        status, kind, body = upstream.answers[min(len(upstream.requests), 1)]
        upstream.requests.append(json.loads(request.content))
        return httpx.Response(status, headers={"content-type": kind}, content=body)

    server, caller = _served({}, answer)
    try:
        message = (await caller.chat.completions.create(**ASK, tools=TOOLS)).choices[0].message
    finally:
        await server.aclose()
    assert len(upstream.requests) == 2
    resent = upstream.requests[1]["messages"][1]
    assert [c.get("extra_content") for c in resent["tool_calls"]] == [SIGNATURE]
    assert [_signatures(c) for c in message.tool_calls or ()] == [SIGNATURE]


def test_a_call_whose_id_is_no_string_is_repaired_all_the_same() -> None:
    """A lenient server's call id that is no string (a list) matches no entry by id: the
    repaired call takes its original's other fields by place, and nothing breaks."""
    call = {**_call("get_weather", '{"city": "Oslo"'), "id": ["call_1"]}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    body = json.dumps(completion(message=message, finish="tool_calls")).encode()
    upstream = RawUpstream([(200, JSON, body)])
    message_got = guarded_client(upstream).chat.completions.create(**ASK, tools=TOOLS)
    calls = message_got.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Oslo"}]
    assert [_signatures(c) for c in calls] == [SIGNATURE]


CUSTOM_TOOLS = [
    {"type": "custom", "custom": {"name": "code_exec", "description": "Run Python code."}},
    *TOOLS,
]
CUSTOM_CALL = {"id": "call_1", "type": "custom", "custom": {"name": "code_exec", "input": "1+1"}}


def test_custom_tools_and_their_calls_pass_through_the_guard() -> None:
    """OpenAI's ``custom`` tools (free-form input, no function) are not the guard's to judge: a
    request offering them was refused with ``ToolSchemaError`` ("a tool needs a non-empty string
    'name'"); now the function tools beside them are guarded and a custom call comes back as the
    raw client reads it."""
    message = {"role": "assistant", "content": None, "tool_calls": [CUSTOM_CALL]}
    body = json.dumps(completion(message=message, finish="tool_calls")).encode()
    raw_upstream, guarded_upstream = (
        RawUpstream([(200, JSON, body)]),
        RawUpstream([(200, JSON, body)]),
    )
    raw = raw_client(raw_upstream).chat.completions.create(**ASK, tools=CUSTOM_TOOLS)
    guarded = guarded_client(guarded_upstream).chat.completions.create(**ASK, tools=CUSTOM_TOOLS)
    assert guarded.model_dump() == raw.model_dump()
    assert guarded_upstream.requests == raw_upstream.requests
    assert ag.report_of(guarded) is not None


@pytest.mark.anyio
async def test_through_serve_a_custom_call_is_the_upstreams() -> None:
    """Through ``agentguard serve`` (which reads the upstream's JSON, not the SDK's objects), a
    custom tool's call was judged as a function call named ``''``: corrected, then a 502."""
    pytest.importorskip("starlette", reason="needs the serve extra")
    import httpx

    from agentguard.serve import GuardServer, create_app
    from test_serve import client_http, openai

    message = {"role": "assistant", "content": None, "tool_calls": [CUSTOM_CALL]}
    answer = completion(message=message, finish="tool_calls")
    server = GuardServer(
        ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}),
        "http://upstream.invalid/v1",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, json=answer)),
    )
    app = create_app(server)
    caller = openai.AsyncOpenAI(
        api_key="sk-caller",
        base_url="http://serve.invalid/v1",
        http_client=client_http.AsyncClient(transport=client_http.ASGITransport(app=app)),
        max_retries=0,
    )
    try:
        raw = await caller.chat.completions.with_raw_response.create(**ASK, tools=CUSTOM_TOOLS)
    finally:
        await server.aclose()
    assert "x-agentguard-tier" in raw.headers  # guarded, not forwarded
    assert [c.model_dump() for c in raw.parse().choices[0].message.tool_calls or ()] == [
        CUSTOM_CALL
    ]


# Tools a local server takes as they are, but the guard cannot read as JSON Schema: a type
# misspelt, a schema referring to itself forever.
TYPO_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "strin"}}},
        },
    },
    {"type": "function", "function": {"name": "lookup", "parameters": {"$ref": "#"}}},
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_tools_the_guard_cannot_read_reach_the_upstream_as_the_raw_client_sends_them(
    stream: bool,
) -> None:
    """A request whose tools are not valid JSON Schema raised ToolSchemaError out of the guarded
    client, where the raw client's call went through (llama.cpp, vLLM and Ollama take such
    schemas). Now the call is the raw client's, both ways, and the guard says what it could not
    check; with ``fail_mode: closed`` it still refuses, with the typed error, before any call."""
    calls = [("get_weather", '{"city": "Oslo"}'), ("lookup", '{"q": 1}')]
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
    }
    if stream:
        deltas = [
            chunk({"role": "assistant", "tool_calls": [{"index": i, **c}]})
            for i, c in enumerate(message["tool_calls"])
        ]
        answer = (200, SSE, sse([*deltas, chunk({}, finish="tool_calls")]))
    else:
        answer = (200, JSON, json.dumps(completion(message=message, finish="tool_calls")).encode())
    raw_upstream, guarded_upstream = RawUpstream([answer]), RawUpstream([answer])
    ask = {**ASK, "tools": TYPO_TOOLS, **({"stream": True} if stream else {})}

    def read(result: Any) -> Any:
        return [c.model_dump() for c in result] if stream else result.model_dump()

    raw = read(raw_client(raw_upstream).chat.completions.create(**ask))
    with capture_events() as events:
        guarded = read(guarded_client(guarded_upstream).chat.completions.create(**ask))
    assert guarded == raw
    assert guarded_upstream.requests == raw_upstream.requests
    said = sorted(e.message.split(":")[0] for e in events.of_type(GuardInternalError))
    assert said == ["tool 'get_weather'", "tool 'lookup'"]

    closed = CONFIG.model_copy(update={"fail_mode": "closed"})
    refused = RawUpstream([answer])
    with pytest.raises(ag.ToolSchemaError, match="get_weather"):
        read(guarded_client(refused, closed).chat.completions.create(**ask))
    assert refused.requests == []


@pytest.mark.anyio
async def test_through_serve_fail_closed_refuses_tools_it_cannot_read() -> None:
    """``agentguard serve`` with ``fail_mode: closed`` forwarded a request whose tools the guard
    could not read unguarded; now it refuses it, a 400 naming the tool, with no upstream call
    (fail-open, the default, guards it: see above)."""
    pytest.importorskip("starlette", reason="needs the serve extra")
    import httpx

    from test_serve import openai

    sent: list[Any] = []
    server, caller = _served(
        {"fail_mode": "closed"}, lambda request: sent.append(request) or httpx.Response(500)
    )
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            await caller.chat.completions.create(**ASK, tools=TYPO_TOOLS)
    finally:
        await server.aclose()
    assert refused.value.code == "tool_schema_error"
    assert "get_weather" in refused.value.message
    assert sent == []


def _served(options: dict[str, Any], answer: Any) -> tuple[Any, Any]:
    """An ``agentguard serve`` app over an upstream answering with ``answer``, and an async
    openai client calling it in-process."""
    import httpx

    from agentguard.serve import GuardServer, create_app
    from test_serve import client_http, openai

    server = GuardServer(
        ag.GuardConfig.from_dict({**options, "memory_pressure": {"enabled": False}}, env={}),
        "http://upstream.invalid/v1",
        transport=httpx.MockTransport(answer),
    )
    caller = openai.AsyncOpenAI(
        api_key="sk-caller",
        base_url="http://serve.invalid/v1",
        http_client=client_http.AsyncClient(
            transport=client_http.ASGITransport(app=create_app(server))
        ),
        max_retries=0,
    )
    return server, caller


# -- through serve: an error object in a 200 answer (see test_wrap_failures for the client) -------


@pytest.mark.anyio
@pytest.mark.parametrize("then", ["healthy", "error"])
async def test_through_serve_an_error_object_in_a_200_answer_is_retried(then: str) -> None:
    """A gateway's 200 answer whose body is ``{"error": {"code": 502, ...}}`` went to the caller
    after one try (with tools offered, it was even re-asked as an empty answer). Now it is
    retried as the 502 it reports; the next answer is the caller's, or, when every attempt
    failed so, the last error answer exactly as it came (status 200, its body)."""
    error = json.dumps({"error": {"message": "Provider returned error", "code": 502}}).encode()
    healthy = completion(message={"role": "assistant", "content": "Sunny."}, finish="stop")
    bodies = [error, json.dumps(healthy).encode() if then == "healthy" else error]
    sent, answer = _answering_200(bodies)
    server, caller = _served({}, answer)
    try:
        raw = await caller.chat.completions.with_raw_response.create(**ASK, tools=TOOLS)
    finally:
        await server.aclose()
    assert len(sent) == 2 if then == "healthy" else len(sent) > 2  # retried as configured
    assert raw.status_code == 200
    if then == "healthy":
        assert raw.parse().choices[0].message.content == "Sunny."
    else:
        assert raw.http_response.content == error


@pytest.mark.anyio
@pytest.mark.parametrize("then", ["completed", "failed"])
async def test_through_serve_a_failed_responses_answer_is_retried(then: str) -> None:
    """A whole Responses answer with ``status: "failed"`` (HTTP 200, the provider's ``error``
    inside) was handed on after one try. Now it is retried as the error its code names
    (``server_error``: the upstream failed); the next answer is the caller's, or, when every
    attempt failed so, the last one exactly as it came."""

    def body(status: str) -> bytes:
        failed = status == "failed"
        text = {"type": "output_text", "text": "Sunny.", "annotations": []}
        item = {"type": "message", "id": "msg_1", "role": "assistant", "content": [text]}
        return json.dumps(
            {
                "id": "resp_1",
                "object": "response",
                "created_at": 1764000000,
                "status": status,
                "error": {"code": "server_error", "message": "failed"} if failed else None,
                "model": "small",
                "output": [] if failed else [{**item, "status": "completed"}],
                "usage": None if failed else {"input_tokens": 5, "output_tokens": 2},
            }
        ).encode()

    bodies = [body("failed"), body(then)]
    sent, answer = _answering_200(bodies)
    server, caller = _served({}, answer)
    try:
        raw = await caller.responses.with_raw_response.create(model="small", input="Oslo?")
    finally:
        await server.aclose()
    assert len(sent) == 2 if then == "completed" else len(sent) > 2  # retried as configured
    assert raw.status_code == 200
    if then == "completed":
        assert raw.parse().output_text == "Sunny."
    else:
        assert raw.http_response.content == bodies[-1]


def _answering_200(bodies: list[bytes]) -> tuple[list[Any], Any]:
    """The requests an upstream got, and the upstream: 200 with each body in turn, the last
    one again."""
    import httpx

    sent: list[Any] = []

    def answer(request: Any) -> Any:
        sent.append(request)
        content = bodies[min(len(sent), len(bodies)) - 1]
        return httpx.Response(200, headers={"content-type": JSON}, content=content)

    return sent, answer
