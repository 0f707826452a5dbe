"""Differential: healthy traffic through the real openai client, raw vs wrapped (both majors).

For every call path (``create``, ``stream=True``, ``with_raw_response``,
``with_streaming_response``, ``parse``, the ``stream`` helper, ``responses.create``), sync and
async, the same script is served to an unwrapped client and to a wrapped one. The upstream must
receive byte-identical request bodies and the same headers (the session header aside, which the
guard takes off), and the caller must receive equal answers: equal SDK objects, equal raw
responses, equal streamed chunks (text, tool-call fragments, the finish and the usage chunk:
a healthy answer streams as the upstream sent it). The guarded answer of every path carries a
report.
"""

from __future__ import annotations

import functools
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable
from importlib import import_module
from typing import Any

import pytest
from pydantic import BaseModel

import agentguard as ag
from _openai_upstream import Upstream
from agentguard._redact import redact
from agentguard.testing import Reply

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
CONFIG = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": TOOLS[0]["function"]["parameters"],
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
# headers that differ between any two clients (or runs) whatever they send
VOLATILE = {"x-stainless-read-timeout", "x-stainless-retry-count"}


class Weather(BaseModel):
    city: str
    celsius: int


Scenario = Callable[[Any], Awaitable[Any]]


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _chunks(stream: Any) -> list[Any]:
    if hasattr(stream, "__aiter__"):
        return [chunk async for chunk in stream]
    return list(stream)


def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        # the SDK's ParsedChatCompletion warns on its own dump: the same on both sides
        return (type(obj).__name__, obj.model_dump(mode="json", warnings=False))
    return obj


def _stream_view(chunks: list[Any]) -> dict[str, Any]:
    """A chat stream with tool calls as the caller reads it: the text deltas in order, and
    the answer (not chunk by chunk: the guard holds tool-call deltas until the call is valid,
    then releases it whole)."""
    texts, calls, finish, usage = [], {}, None, None
    for chunk in chunks:
        usage = chunk.usage.model_dump() if chunk.usage else usage
        for choice in chunk.choices:
            if choice.delta.content:
                texts.append(choice.delta.content)
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    ids = {(c.id, c.model) for c in chunks}
    return {"texts": texts, "calls": calls, "finish": finish, "usage": usage, "ids": ids}


# -- the scenarios: one call path each, written once for sync and async clients -------------


async def chat_text(client: Any) -> Any:
    completion = await _maybe(client.chat.completions.create(model="m", messages=MESSAGES))
    return completion, _dump(completion)


async def chat_tool_call(client: Any) -> Any:
    completion = await _maybe(
        client.chat.completions.create(
            model="m", messages=MESSAGES, tools=TOOLS, tool_choice="auto", temperature=0
        )
    )
    return completion, _dump(completion)


async def chat_explicit_values(client: Any) -> Any:
    """Explicit nulls and falses the caller wrote go upstream as written."""
    completion = await _maybe(
        client.chat.completions.create(
            model="m", messages=MESSAGES, tools=None, stream=False, max_tokens=None, user="u-1"
        )
    )
    return completion, _dump(completion)


async def chat_capped(client: Any) -> Any:
    """The caller's own cap (in either field) is theirs: unchanged without a configured one."""
    first = await _maybe(
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=300)
    )
    second = await _maybe(
        client.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=200)
    )
    return second, (_dump(first), _dump(second))


async def chat_stream_text(client: Any) -> Any:
    stream = await _maybe(
        client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    return stream, [_dump(c) for c in await _chunks(stream)]


async def chat_sdk_message_objects(client: Any) -> Any:
    """The agent loop of OpenAI's guide appends the answer's message object itself (or puts
    its ``tool_calls`` objects in a dict): the SDK sends them as their data, and so does the
    guarded client (it left them out before)."""
    first = await _maybe(client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS))
    message = first.choices[0].message
    result = {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}
    second = await _maybe(
        client.chat.completions.create(
            model="m", messages=[*MESSAGES, message, result], tools=TOOLS
        )
    )
    as_dict = {"role": "assistant", "content": None, "tool_calls": message.tool_calls}
    third = await _maybe(
        client.chat.completions.create(
            model="m", messages=[*MESSAGES, as_dict, result], tools=TOOLS
        )
    )
    return third, [_dump(first), _dump(second), _dump(third)]


async def chat_stream_response(client: Any) -> Any:
    """A stream's ``response`` is the upstream's HTTP response (status, headers) once
    ``create`` returned, as the SDK's is."""
    stream = await _maybe(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    head = (stream.response.status_code, stream.response.headers.get("content-type"))
    return stream, (head, [_dump(c) for c in await _chunks(stream)])


async def chat_stream_tool_call(client: Any) -> Any:
    stream = await _maybe(
        client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, stream=True)
    )
    chunks = await _chunks(stream)
    # a healthy call goes out as the upstream streamed it, fragment by fragment
    return stream, (_stream_view(chunks), [_dump(c) for c in chunks])


async def chat_raw_response(client: Any) -> Any:
    raw = await _maybe(
        client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, tools=TOOLS)
    )
    completion = raw.parse()
    view = (raw.status_code, raw.headers.get("content-type"), json.loads(raw.text))
    return completion, (view, _dump(completion))


async def chat_raw_response_stream(client: Any) -> Any:
    raw = await _maybe(
        client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, stream=True)
    )
    stream = raw.parse()
    return stream, (raw.status_code, [_dump(c) for c in await _chunks(stream)])


async def chat_streaming_response(client: Any) -> Any:
    manager = client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES)
    if hasattr(manager, "__aenter__"):
        async with manager as response:
            completion = await response.parse()
            body = await response.json()
    else:
        with manager as response:
            completion = response.parse()
            body = response.json()
    return completion, (response.status_code, body, _dump(completion))


async def chat_streaming_response_stream(client: Any) -> Any:
    manager = client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    if hasattr(manager, "__aenter__"):
        async with manager as response:
            stream = await response.parse()
            chunks = await _chunks(stream)
    else:
        with manager as response:
            stream = response.parse()
            chunks = await _chunks(stream)
    return stream, (response.status_code, [_dump(c) for c in chunks])


async def chat_parse(client: Any) -> Any:
    completion = await _maybe(
        client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Weather)
    )
    assert completion.choices[0].message.parsed == Weather(city="Paris", celsius=21)
    return completion, _dump(completion)


async def chat_parse_tool(client: Any) -> Any:
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    completion = await _maybe(
        client.chat.completions.parse(model="m", messages=MESSAGES, tools=[tool])
    )
    assert completion.choices[0].message.tool_calls[0].function.parsed_arguments == Weather(
        city="Paris", celsius=21
    )
    return completion, _dump(completion)


async def chat_stream_helper(client: Any) -> Any:
    manager = client.chat.completions.stream(model="m", messages=MESSAGES, response_format=Weather)
    if hasattr(manager, "__aenter__"):
        async with manager as stream:
            events = [event async for event in stream]
            final = await stream.get_final_completion()
    else:
        with manager as stream:
            events = list(stream)
            final = stream.get_final_completion()
    assert final.choices[0].message.parsed == Weather(city="Paris", celsius=21)
    return stream, ([e.type for e in events], _dump(final))


async def responses_text(client: Any) -> Any:
    response = await _maybe(client.responses.create(model="m", input="hi", temperature=0))
    return response, _dump(response)


async def responses_tool_call(client: Any) -> Any:
    response = await _maybe(
        client.responses.create(model="m", input="Weather in Paris?", tools=RESPONSES_TOOLS)
    )
    return response, _dump(response)


async def responses_tools_none(client: Any) -> Any:
    """An explicit ``tools=None`` reaches the upstream as sent."""
    response = await _maybe(client.responses.create(model="m", input="hi", tools=None))
    return response, _dump(response)


async def responses_raw(client: Any) -> Any:
    raw = await _maybe(
        client.responses.with_raw_response.create(model="m", input="hi", tools=RESPONSES_TOOLS)
    )
    response = raw.parse()
    return response, (raw.status_code, json.loads(raw.text), _dump(response))


async def responses_stream_text(client: Any) -> Any:
    stream = await _maybe(client.responses.create(model="m", input="hi", stream=True))
    return stream, [_dump(e) for e in await _chunks(stream)]


async def responses_stream_tool_call(client: Any) -> Any:
    stream = await _maybe(
        client.responses.create(
            model="m", input="Weather in Paris?", tools=RESPONSES_TOOLS, stream=True
        )
    )
    return stream, [_dump(e) for e in await _chunks(stream)]


async def responses_stream_helper(client: Any) -> Any:
    manager = client.responses.stream(model="m", input="hi")
    if hasattr(manager, "__aenter__"):
        async with manager as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
    else:
        with manager as stream:
            events = list(stream)
            final = stream.get_final_response()
    return stream, ([e.type for e in events], _dump(final))


async def responses_raw_stream(client: Any) -> Any:
    raw = await _maybe(
        client.responses.with_raw_response.create(model="m", input="hi", stream=True)
    )
    stream = raw.parse()
    return stream, (raw.status_code, [_dump(e) for e in await _chunks(stream)])


async def responses_parse(client: Any) -> Any:
    response = await _maybe(
        client.responses.parse(model="m", input="Weather in Paris?", text_format=Weather)
    )
    assert response.output_parsed == Weather(city="Paris", celsius=21)
    return response, _dump(response)


async def beta_chat_parse(client: Any) -> Any:
    """``client.beta.chat.completions`` is the same API (langchain-openai streams with it)."""
    completion = await _maybe(
        client.beta.chat.completions.parse(model="m", messages=MESSAGES, response_format=Weather)
    )
    return completion, _dump(completion)


async def chat_raw_parse(client: Any) -> Any:
    """``with_raw_response.parse``: what langchain-openai calls for structured output."""
    raw = await _maybe(
        client.chat.completions.with_raw_response.parse(
            model="m", messages=MESSAGES, response_format=Weather
        )
    )
    completion = raw.parse()
    return completion, (raw.status_code, _dump(completion))


async def responses_without_model_or_input(client: Any) -> Any:
    """The API takes a call without ``model`` (a stored prompt names it) or without ``input``
    (continuing by ``previous_response_id``): nothing is added to either."""
    prompted = await _maybe(client.responses.create(prompt={"id": "pmpt_1"}))
    continued = await _maybe(client.responses.create(model="m", previous_response_id="resp_0"))
    return continued, (_dump(prompted), _dump(continued))


async def responses_streaming_response(client: Any) -> Any:
    manager = client.responses.with_streaming_response.create(model="m", input="hi")
    if hasattr(manager, "__aenter__"):
        async with manager as response:
            answer = await response.parse()
    else:
        with manager as response:
            answer = response.parse()
    return answer, (response.status_code, _dump(answer))


WEATHER = Reply.call("get_weather", {"city": "Paris"}, id="call_1")
JSON_ANSWER = Reply.text('{"city": "Paris", "celsius": 21}')
SCENARIOS: dict[str, tuple[Scenario, list[Reply]]] = {
    "chat_text": (chat_text, [Reply.text("Sunny, 21 C.")]),
    "chat_tool_call": (chat_tool_call, [WEATHER]),
    "chat_explicit_values": (chat_explicit_values, [Reply.text("ok")]),
    "chat_capped": (chat_capped, [Reply.text("a"), Reply.text("b")]),
    "chat_stream_text": (chat_stream_text, [Reply.text("It is sunny in Paris today.")]),
    "chat_stream_tool_call": (chat_stream_tool_call, [WEATHER]),
    "chat_sdk_message_objects": (
        chat_sdk_message_objects,
        [WEATHER, Reply.text("21 C in Paris."), Reply.text("21 C in Paris.")],
    ),
    "chat_stream_response": (chat_stream_response, [Reply.text("Sunny.")]),
    "chat_raw_response": (chat_raw_response, [WEATHER]),
    "chat_raw_response_stream": (chat_raw_response_stream, [Reply.text("Sunny, 21 C.")]),
    "chat_streaming_response": (chat_streaming_response, [Reply.text("Sunny.")]),
    "chat_streaming_response_stream": (chat_streaming_response_stream, [Reply.text("Sunny.")]),
    "chat_parse": (chat_parse, [JSON_ANSWER]),
    "chat_parse_tool": (
        chat_parse_tool,
        [Reply.call("get_weather", {"city": "Paris", "celsius": 21}, id="call_1")],
    ),
    "chat_stream_helper": (chat_stream_helper, [JSON_ANSWER]),
    "responses_text": (responses_text, [Reply.text("hello")]),
    "responses_tool_call": (responses_tool_call, [WEATHER]),
    "responses_tools_none": (responses_tools_none, [Reply.text("hello")]),
    "responses_raw": (responses_raw, [WEATHER]),
    "responses_stream_text": (responses_stream_text, [Reply.text("Sunny in Paris today.")]),
    "responses_stream_tool_call": (responses_stream_tool_call, [WEATHER]),
    "responses_stream_helper": (responses_stream_helper, [Reply.text("Sunny.")]),
    "responses_raw_stream": (responses_raw_stream, [Reply.text("Sunny.")]),
    "responses_parse": (responses_parse, [JSON_ANSWER]),
    "beta_chat_parse": (beta_chat_parse, [JSON_ANSWER]),
    "chat_raw_parse": (chat_raw_parse, [JSON_ANSWER]),
    "responses_streaming_response": (responses_streaming_response, [Reply.text("hello")]),
    "responses_without_model_or_input": (
        responses_without_model_or_input,
        [Reply.text("hello"), Reply.text("again")],
    ),
}


def _wire(seen: list[tuple[str, str, bytes, dict[str, str]]]) -> list[Any]:
    return [
        (method, path, body, {k: v for k, v in headers.items() if k not in VOLATILE})
        for method, path, body, headers in seen
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_guarded_traffic_equals_raw_traffic(name: str, asynchronous: bool) -> None:
    """The upstream receives the same bytes and the caller the same answers, raw vs wrapped."""
    scenario, replies = SCENARIOS[name]
    raw_side, guarded_side = Upstream(http, replies), Upstream(http, replies)
    _, raw_view = await scenario(raw_side.client(openai, asynchronous=asynchronous))
    wrapped = ag.wrap(guarded_side.client(openai, asynchronous=asynchronous), CONFIG)
    answer, guarded_view = await scenario(wrapped)

    assert _wire(guarded_side.seen) == _wire(raw_side.seen)
    assert guarded_view == raw_view
    report = ag.report_of(answer)
    assert report is not None, f"{name}: no report on what the call path returned"
    assert not report.repairs


def test_no_cap_unless_configured() -> None:
    """Without a configured cap no output limit is added; a configured one goes in the field
    every model accepts (chat: max_completion_tokens, Responses: max_output_tokens)."""
    side = Upstream(http, [Reply.text("a"), Reply.text("b"), Reply.text("c")])
    capped = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "token_budget": {"max_output_tokens": 100}},
        env={},
    )
    ag.wrap(side.client(openai, asynchronous=False), CONFIG).chat.completions.create(
        model="m", messages=MESSAGES
    )
    client = ag.wrap(side.client(openai, asynchronous=False), capped)
    client.chat.completions.create(model="m", messages=MESSAGES)
    client.responses.create(model="m", input="hi")
    bodies = [json.loads(body) for _, _, body, _ in side.seen]
    assert not {"max_tokens", "max_completion_tokens"} & set(bodies[0])
    assert bodies[1]["max_completion_tokens"] == 100
    assert "max_tokens" not in bodies[1]
    assert bodies[2]["max_output_tokens"] == 100


def _clients(answer: Callable[[Any], Any], asynchronous: bool) -> tuple[Any, Any, list[Any]]:
    """A raw client and a wrapped one over one hand-written upstream ``answer``; the requests
    it received, in order."""
    seen: list[Any] = []

    def handler(request: Any) -> Any:
        seen.append(request)
        return answer(request)

    cls, http_client = (
        (openai.AsyncOpenAI, http.AsyncClient) if asynchronous else (openai.OpenAI, http.Client)
    )

    def make() -> Any:
        transport = http.MockTransport(handler)
        return cls(
            api_key="sk-test",
            base_url="http://upstream.invalid/v1",
            max_retries=0,
            http_client=http_client(transport=transport),
        )

    return make(), ag.wrap(make(), CONFIG), seen


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_stream_without_a_finish_gets_no_chunk_of_the_guards(asynchronous: bool) -> None:
    """A server that ends a stream without a ``finish_reason`` (cut off, or one that omits
    it): the caller gets the upstream's chunks and no empty closing chunk of the guard's."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    deltas = [{"role": "assistant", "content": ""}, {"content": "Hi there"}]
    body = "".join(
        f"data: {json.dumps({**head, 'choices': [{'index': 0, 'delta': d}]})}\n\n" for d in deltas
    )

    def answer(request: Any) -> Any:
        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    raw, wrapped, _ = _clients(answer, asynchronous)
    views = []
    for client in (raw, wrapped):
        stream = await _maybe(client.chat.completions.create(**_STREAMED))
        views.append([_dump(c) for c in await _chunks(stream)])
    assert views[1] == views[0]
    assert len(views[0]) == len(deltas)


_STREAMED: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_stream_refused_upstream_raises_from_create(api: str, asynchronous: bool) -> None:
    """``create(stream=True)`` sends the request before it returns, as the SDK's does: the
    upstream's refusal is raised by ``create`` (where callers catch it), not on iteration."""
    error = {"error": {"message": "bad key", "type": "invalid_request_error", "code": None}}

    def answer(request: Any) -> Any:
        return http.Response(401, json=error)

    raw, wrapped, seen = _clients(answer, asynchronous)
    for client in (raw, wrapped):
        before = len(seen)
        create = (
            client.chat.completions.create
            if api == "chat"
            else functools.partial(client.responses.create, input="hi")
        )
        kwargs = _STREAMED if api == "chat" else {"model": "m", "stream": True}
        with pytest.raises(openai.AuthenticationError):
            await _maybe(create(**kwargs))
        assert len(seen) == before + 1


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_an_explicit_no_timeout_goes_as_given(asynchronous: bool) -> None:
    """``timeout=None`` on a call means no timeout at all: the guarded call's request carries
    the same timeouts as the raw one's (not the client's default)."""

    def answer(request: Any) -> Any:
        return http.Response(200, json=_COMPLETION)

    raw, wrapped, seen = _clients(answer, asynchronous)
    for client in (raw, wrapped):
        await _maybe(client.chat.completions.create(model="m", messages=MESSAGES, timeout=None))
        await _maybe(client.responses.create(model="m", input="hi", timeout=None))
    raw_timeouts = [r.extensions["timeout"] for r in seen[:2]]
    assert [r.extensions["timeout"] for r in seen[2:]] == raw_timeouts
    assert raw_timeouts[0] == {"connect": None, "read": None, "write": None, "pool": None}


_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
}


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_an_error_in_a_streams_body_is_raised_on_reading(asynchronous: bool) -> None:
    """An error the upstream sends in a stream's body (after answering 200) is raised by the
    SDK's stream as it is read, not by ``create``: the same through the guard, which starts
    the call in ``create`` (after its retries, the same error)."""
    body = 'data: {"error": {"message": "the model crashed", "type": "server_error"}}\n\n'

    def answer(request: Any) -> Any:
        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    raw, wrapped, _ = _clients(answer, asynchronous)
    raised = []
    for client in (raw, wrapped):
        stream = await _maybe(client.chat.completions.create(**_STREAMED))  # (no error yet)
        with pytest.raises(openai.APIError) as error:
            await _chunks(stream)
        raised.append((type(error.value), error.value.message))
    assert raised[1] == raised[0]


# -- copies of a wrapped client: with_options() / copy() ---------------------------------------

COPIES: dict[str, Callable[[Any], Any]] = {
    "with_options": lambda c: c.with_options(
        timeout=7.0,
        default_headers={"X-Tenant": "t1"},
        default_query={"api-version": "1"},
        base_url="http://other.invalid/v2",
        api_key="sk-other",
        organization="org-1",
    ),
    "copy": lambda c: c.copy(
        timeout=http.Timeout(3.0, connect=1.0), set_default_headers={"X-Only": "1"}
    ),
    "nested": lambda c: c.with_options(default_headers={"X-A": "1"}, api_key="sk-a").copy(
        default_headers={"X-B": "2"}, default_query={"q": "2"}, timeout=5.0
    ),
}
COPY_SCENARIOS = [
    "chat_text",
    "chat_stream_text",
    "chat_raw_response",
    "chat_stream_helper",
    "responses_text",
    "responses_stream_text",
]


def _recorded(side: Upstream, asynchronous: bool) -> tuple[Any, list[Any]]:
    """A client of ``side``'s upstream; what each request it sent carries besides what ``side``
    records: its full URL (query included) and its timeouts."""
    sent: list[Any] = []

    def handler(request: Any) -> Any:
        sent.append((str(request.url), request.extensions.get("timeout")))
        return side.transport.handler(request)

    cls, http_client = (
        (openai.AsyncOpenAI, http.AsyncClient) if asynchronous else (openai.OpenAI, http.Client)
    )
    client = cls(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http_client(transport=http.MockTransport(handler)),
    )
    return client, sent


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("copy", list(COPIES))
@pytest.mark.parametrize("name", COPY_SCENARIOS)
async def test_a_guarded_copy_sends_what_the_raw_copy_sends(
    name: str, copy: str, asynchronous: bool
) -> None:
    """A copy of a wrapped client (``with_options()``, ``copy()``, one of another) sends its own
    options as the raw copy does: URL, query, headers, key, timeout; the answer is guarded."""
    scenario, replies = SCENARIOS[name]
    raw_side, guarded_side = Upstream(http, replies), Upstream(http, replies)
    raw, raw_sent = _recorded(raw_side, asynchronous)
    inner, guarded_sent = _recorded(guarded_side, asynchronous)
    _, raw_view = await scenario(COPIES[copy](raw))
    answer, guarded_view = await scenario(COPIES[copy](ag.wrap(inner, CONFIG)))

    assert _wire(guarded_side.seen) == _wire(raw_side.seen)
    assert guarded_sent == raw_sent
    assert guarded_view == raw_view
    assert ag.report_of(answer) is not None


def test_a_copy_keeps_the_tiers_own_endpoint() -> None:
    """A tier with its own ``base_url`` keeps it on a copy (and gets no key of the copy's
    origin); the copy's headers go with every tier's call, its URL and key with the others'."""
    seen: list[tuple[str, str, str | None]] = []

    def answer(request: Any) -> Any:
        seen.append(
            (str(request.url), request.headers["authorization"], request.headers.get("x-tenant"))
        )
        if request.url.host == "copy.invalid":
            return http.Response(503, json={"error": {"message": "down", "type": "server_error"}})
        return http.Response(200, json=_COMPLETION)

    config = ag.GuardConfig.from_dict(
        {
            "tiers": {
                "fast": {"model": "small"},
                "premium": {"model": "big", "base_url": "https://premium.invalid/v1"},
            },
            "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 0},
            "memory_pressure": {"enabled": False},
        },
        env={},
    )
    raw = openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http.Client(transport=http.MockTransport(answer)),
    )
    client = ag.wrap(raw, config).with_options(
        base_url="http://copy.invalid/v1", api_key="sk-copy", default_headers={"X-Tenant": "t"}
    )
    client.chat.completions.create(model="fast", messages=MESSAGES)
    assert seen == [
        ("http://copy.invalid/v1/chat/completions", "Bearer sk-copy", "t"),
        ("https://premium.invalid/v1/chat/completions", "Bearer agentguard-tier-without-key", "t"),
    ]


def test_a_copys_key_is_redacted() -> None:
    """A key given to a copy is sent upstream, so it is redacted from logs and reports too."""
    key = f"zq{uuid.uuid4().hex}"  # no pattern knows it (see test_redact)
    raw, _, _ = _clients(lambda request: http.Response(200, json=_COMPLETION), False)
    wrapped = ag.wrap(raw, CONFIG)
    assert key in redact(f"invalid key {key}")
    wrapped.with_options(api_key=key)
    assert key not in redact(f"invalid key {key}")


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_copy_shares_the_budget_of_the_original(asynchronous: bool) -> None:
    """A copy goes through the same guard: a session budget spent through the original refuses
    the same session's call made through a copy, before anything is sent."""
    long_text = " ".join(f"w{i}" for i in range(130))  # no degenerate text: the budget stops it
    side = Upstream(http, [Reply.text(long_text)] * 10)
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "token_budget": {"per_session": 300, "policy": "hard_stop", "max_output_tokens": 100},
        },
        env={},
    )
    client = ag.wrap(side.client(openai, asynchronous=asynchronous), config)
    copy = client.with_options(default_headers={"X-Tenant": "t1"})
    session = {"extra_headers": {"x-agentguard-session": "s1"}}
    with pytest.raises(ag.BudgetExceeded):  # noqa: PT012 - the loop runs until refused
        for _ in range(10):
            await _maybe(client.chat.completions.create(model="m", messages=MESSAGES, **session))
    sent = len(side.seen)
    with pytest.raises(ag.BudgetExceeded) as info:
        await _maybe(copy.chat.completions.create(model="m", messages=MESSAGES, **session))
    assert info.value.budget == "session"
    assert len(side.seen) == sent


class _Counted(http.SyncByteStream, http.AsyncByteStream):  # type: ignore[misc]
    """An SSE body read part by part, counting the parts read (sync and async)."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.read = 0

    def __iter__(self) -> Any:
        for part in self.parts:
            self.read += 1
            yield part

    async def __aiter__(self) -> Any:
        for part in self.parts:
            self.read += 1
            yield part

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_streamed_create_returns_once_the_upstream_answered(
    api: str, asynchronous: bool
) -> None:
    """``create(stream=True)`` returns once the upstream answered (its headers in), as the
    SDK's does: it does not wait for the guard to release a first chunk (a tool call is held
    until whole, so that would be the whole answer). The answer then reads as the raw one."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    call = {"index": 0, "id": "call_1", "type": "function"}
    deltas = [
        {"role": "assistant", "tool_calls": [{**call, "function": {"name": "get_weather"}}]},
        *(
            {"tool_calls": [{"index": 0, "function": {"arguments": a}}]}
            for a in ['{"city"', ': "Paris"}']
        ),
    ]
    chunks = [{**head, "choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    if api == "chat":
        parts = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
    else:
        from _openai_upstream import reasoning_answer, response_events

        call_item = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        }
        response = {**reasoning_answer("", ""), "output": [call_item]}
        parts = [
            f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
            for e in response_events(response)
        ]
    bodies: list[_Counted] = []

    def answer(request: Any) -> Any:
        bodies.append(_Counted(parts))
        return http.Response(200, headers={"content-type": "text/event-stream"}, stream=bodies[-1])

    raw, wrapped, _ = _clients(answer, asynchronous)
    read_at_create, views = [], []
    for client in (raw, wrapped):
        if api == "chat":
            made = client.chat.completions.create(**_STREAMED, tools=TOOLS)
        else:
            made = client.responses.create(
                model="m", input="hi", tools=RESPONSES_TOOLS, stream=True
            )
        stream = await _maybe(made)
        read_at_create.append(bodies[-1].read)
        views.append([_dump(c) for c in await _chunks(stream)])
    assert read_at_create[1] == read_at_create[0] < len(parts)
    assert views[1] == views[0]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_loop_broken_off_a_stream_reads_on_in_the_next(api: str) -> None:
    """Breaking out of a loop over a sync stream does not end it: the next loop reads on, as
    on the SDK's stream."""
    reply = [Reply.text("It is sunny in Paris today.")]
    raw = Upstream(http, reply).client(openai, asynchronous=False)
    wrapped = ag.wrap(Upstream(http, reply).client(openai, asynchronous=False), CONFIG)
    counts = []
    for client in (raw, wrapped):
        if api == "chat":
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        else:
            stream = client.responses.create(model="m", input="hi", stream=True)
        first = 0
        for _ in stream:
            first += 1
            break
        counts.append((first, sum(1 for _ in stream)))
    assert counts[1] == counts[0]
    assert counts[0][1] > 0


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_stream_with_no_chunk_carries_its_report(asynchronous: bool) -> None:
    """A stream whose upstream sent no chunk at all (``[DONE]`` alone) ends with the guard's
    report on it, as every guarded stream does."""

    def answer(request: Any) -> Any:
        return http.Response(
            200, headers={"content-type": "text/event-stream"}, content=b"data: [DONE]\n\n"
        )

    raw, wrapped, _ = _clients(answer, asynchronous)
    got = []
    for client in (raw, wrapped):
        stream = await _maybe(client.chat.completions.create(**_STREAMED))
        got.append(await _chunks(stream))
    assert got[1] == got[0] == []
    assert ag.report_of(stream) is not None


# -- with_streaming_response on a stream: the body as the upstream sent it -------------------


def _answering(body: bytes) -> Callable[[Any], Any]:
    """An upstream answering every request with the server-sent events ``body``."""
    return lambda request: http.Response(
        200, headers={"content-type": "text/event-stream"}, content=body
    )


_HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chat_chunk(delta: Any, finish: Any = None, **extra: Any) -> dict[str, Any]:
    return {**_HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def _sse_body(api: str, eol: str = "\n") -> bytes:
    """A healthy stream as a server writes it: compact JSON, keep-alive comments, a tool call
    in fragments (chat), ``event:`` lines and no ``[DONE]`` (Responses)."""
    if api == "chat":
        call = {"index": 0, "id": "call_1", "type": "function"}
        chunks = [
            _chat_chunk({"role": "assistant", "content": ""}),
            _chat_chunk({"content": "Checking."}),
            _chat_chunk({"tool_calls": [{**call, "function": {"name": "get_weather"}}]}),
            _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]}),
            _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ':"Paris"}'}}]}),
            _chat_chunk({}, "tool_calls"),
            {**_HEAD, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}},
        ]
        events = [f"data: {json.dumps(c, separators=(',', ':'))}" for c in chunks]
        events.insert(1, ": OPENROUTER PROCESSING")
        events.append("data: [DONE]")
    else:
        from _openai_upstream import reasoning_answer, response_events

        response = reasoning_answer("Looking it up.", "It is sunny in Paris.")
        events = [
            f"event: {e['type']}{eol}data: {json.dumps(e, separators=(',', ':'))}"
            for e in response_events(response)
        ]
        events.insert(2, ": keep-alive")
    return "".join(e + eol + eol for e in events).encode()


_ACCESSORS = ("iter_lines", "iter_text", "iter_bytes", "read", "text")


async def _body_views(
    client: Any, api: str, accessors: tuple[str, ...] = _ACCESSORS
) -> dict[str, Any]:
    """What each body accessor of ``with_streaming_response.create(stream=True)`` gives (each
    on a call of its own)."""
    resource = client.chat.completions if api == "chat" else client.responses
    kwargs: dict[str, Any] = (
        {**_STREAMED, "tools": TOOLS}
        if api == "chat"
        else {"model": "m", "input": "hi", "tools": RESPONSES_TOOLS, "stream": True}
    )
    views: dict[str, Any] = {}
    for name in accessors:
        manager = resource.with_streaming_response.create(**kwargs)
        if hasattr(manager, "__aenter__"):
            async with manager as response:
                got = getattr(response, name)()
                if inspect.isawaitable(got):
                    views[name] = await got
                else:
                    views[name] = [part async for part in got]
        else:
            with manager as response:
                got = getattr(response, name)()
                views[name] = got if name in ("read", "text") else list(got)
    # (how a body is cut up is the transport's)
    for name, empty in (("iter_text", ""), ("iter_bytes", b"")):
        if name in views:
            views[name] = empty.join(views[name])
    return views


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_streamed_body_read_as_lines_is_the_upstreams(
    api: str, eol: str, asynchronous: bool
) -> None:
    """``with_streaming_response.create(stream=True)``: where the guard changed nothing, the
    body's views (``iter_lines()``, ``iter_text()``, ``iter_bytes()``, ``read()``, ``text()``)
    give the upstream's server-sent events as sent: its ``event:`` lines, its comments, its
    JSON as written, its own end (chat's ``data: [DONE]``, none for Responses)."""
    body = _sse_body(api, eol)

    raw, wrapped, _ = _clients(_answering(body), asynchronous)
    raw_views = await _body_views(raw, api)
    assert raw_views["read"] == body  # (what the raw client gives)
    assert await _body_views(wrapped, api) == raw_views


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_error_in_a_streamed_body_read_as_lines_is_its_line(
    api: str, asynchronous: bool
) -> None:
    """An error the upstream puts in a stream's body: the raw ``iter_lines()`` gives its line
    (after the items before it), raising nothing; so does the guarded one."""
    body = _opened(api) + _ERROR_EVENT

    raw, wrapped, _ = _clients(_answering(body), asynchronous)
    views = [await _body_views(client, api) for client in (raw, wrapped)]
    assert views[1] == views[0]
    assert views[0]["read"] == body


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_streamed_body_the_guard_changed_is_in_the_upstreams_dialect(
    api: str, asynchronous: bool
) -> None:
    """Where the guard changed the stream (a tool call written as text, repaired), the body's
    lines are the guarded events as server-sent events of the upstream's API: chat's ``data:``
    lines ending with ``data: [DONE]``; Responses' ``event:`` and ``data:`` lines, no
    ``[DONE]``. They read back as the guarded stream's items."""
    embedded = Reply.embedded("get_weather", {"city": "Paris"}, style="fenced")
    client, twin = (
        ag.wrap(Upstream(http, [embedded]).client(openai, asynchronous=asynchronous), CONFIG)
        for _ in range(2)
    )
    lines = (await _body_views(client, api, ("iter_lines",)))["iter_lines"]
    events = [line for line in lines if line]
    client = twin  # the same call, read as the stream's items
    if api == "chat":
        made = client.chat.completions.create(**_STREAMED, tools=TOOLS)
    else:
        made = client.responses.create(model="m", input="hi", tools=RESPONSES_TOOLS, stream=True)
    items = await _chunks(await _maybe(made))
    read_back = [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: {")]
    dumped = [i.model_dump(mode="json", exclude_unset=True, warnings=False) for i in items]
    assert read_back == dumped
    if api == "chat":
        assert events[-1] == "data: [DONE]"
        data = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
        assert all(line.startswith("data: ") for line in events)
        calls = [
            c
            for d in data
            for choice in d["choices"]
            for c in choice["delta"].get("tool_calls") or ()
        ]
        assert calls[0]["function"]["name"] == "get_weather"
        assert data[-1]["choices"][0]["finish_reason"] == "tool_calls"
    else:
        assert "data: [DONE]" not in events
        names = [line.removeprefix("event: ") for line in events[::2]]
        data = [json.loads(line.removeprefix("data: ")) for line in events[1::2]]
        assert all(line.startswith("event: ") for line in events[::2])
        assert names == [d["type"] for d in data]
        assert names[-1] == "response.completed"
        output = data[-1]["response"]["output"]
        assert [item["name"] for item in output if item["type"] == "function_call"] == [
            "get_weather"
        ]


# -- an error in a stream's body: what came before it goes out first ---------------------------

_ERROR_EVENT = (
    b'data: {"error": {"message": "bad thing", "type": "invalid_request_error", "code": "x"}}\n\n'
)


def _opened(api: str, *, call: bool = False) -> bytes:
    """A stream's opening (chat's ``role`` chunk; Responses' ``response.created`` and
    ``response.in_progress``), and with ``call`` the first part of a tool call."""
    if api == "chat":
        chunks = [_chat_chunk({"role": "assistant", "content": ""})]
        if call:
            fn = {"name": "get_weather", "arguments": '{"ci'}
            delta = {"index": 0, "id": "call_1", "type": "function", "function": fn}
            chunks.append(_chat_chunk({"tool_calls": [delta]}))
        return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()
    from _openai_upstream import reasoning_answer

    opening = {**reasoning_answer("", ""), "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": kind, "sequence_number": n, "response": opening}
        for n, kind in enumerate(("response.created", "response.in_progress"))
    ]
    if call:
        item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather"}
        events += [
            {
                "type": "response.output_item.added",
                "sequence_number": 2,
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
            {
                "type": "response.function_call_arguments.delta",
                "sequence_number": 3,
                "output_index": 0,
                "item_id": "fc_1",
                "delta": '{"ci',
            },
        ]
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


async def _items_then_error(client: Any, api: str) -> tuple[list[Any], Any]:
    if api == "chat":
        made = client.chat.completions.create(**_STREAMED, tools=TOOLS)
    else:
        made = client.responses.create(model="m", input="hi", tools=RESPONSES_TOOLS, stream=True)
    stream = await _maybe(made)
    items: list[Any] = []
    with pytest.raises(openai.APIError) as error:
        await _read_into(stream, items)
    return [_dump(item) for item in items], (
        type(error.value),
        error.value.message,
        error.value.body,
    )


async def _read_into(stream: Any, items: list[Any]) -> None:
    """Read ``stream`` into ``items`` (kept as far as it got when it raises)."""
    if hasattr(stream, "__aiter__"):
        async for item in stream:
            items.append(item)
    else:
        items.extend(stream)


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_error_in_a_streams_body_comes_after_the_items_before_it(
    api: str, asynchronous: bool
) -> None:
    """An error in a stream's body after its opening (chat's ``role`` chunk; Responses'
    ``response.created`` with the response's id, ``response.in_progress``): the caller gets
    those items, then the SDK's error, as from the raw client."""
    body = _opened(api) + _ERROR_EVENT

    raw, wrapped, _ = _clients(_answering(body), asynchronous)
    got = [await _items_then_error(client, api) for client in (raw, wrapped)]
    assert got[1] == got[0]
    assert len(got[0][0]) == (1 if api == "chat" else 2)


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_error_in_a_streams_body_releases_no_call_unjudged(
    api: str, asynchronous: bool
) -> None:
    """An error in a stream's body in the middle of a tool call: the caller gets the opening
    as from the raw client, then the error; the call's first part, which the guard holds until
    the call is whole and valid, never goes out (the raw client hands it on)."""
    body = _opened(api, call=True) + _ERROR_EVENT

    raw, wrapped, _ = _clients(_answering(body), asynchronous)
    (raw_items, raw_error), (items, error) = [
        await _items_then_error(client, api) for client in (raw, wrapped)
    ]
    assert error == raw_error
    opening = 1 if api == "chat" else 2
    assert items == raw_items[:opening]
    assert len(raw_items) > opening


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_responses_error_event_mid_call_releases_no_call_unjudged(
    asynchronous: bool,
) -> None:
    """A Responses stream ending on its ``error`` event (which the raw client hands on as an
    event) in the middle of a tool call: the caller gets the opening and the error event as
    from the raw client; the call's part the guard held never goes out unjudged."""
    error = {"type": "error", "code": "server_error", "message": "boom", "param": None}
    body = _opened("responses", call=True) + (
        f"event: error\ndata: {json.dumps({**error, 'sequence_number': 4})}\n\n".encode()
    )
    raw, wrapped, _ = _clients(_answering(body), asynchronous)
    kinds = []
    for client in (raw, wrapped):
        stream = await _maybe(
            client.responses.create(model="m", input="hi", tools=RESPONSES_TOOLS, stream=True)
        )
        items: list[Any] = []
        await _read_into(stream, items)
        kinds.append([item.type for item in items])
    raw_kinds, got = kinds
    assert raw_kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # (the function call's item)
        "response.function_call_arguments.delta",
        "error",
    ]
    assert got == ["response.created", "response.in_progress", "error"]
