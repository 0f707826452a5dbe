"""agentguard.wrap(): every call path of the real openai client is guarded (both majors).

``with_raw_response``, ``with_streaming_response``, ``chat.completions.parse`` and the
``chat.completions.stream`` helper, sync and async: what the guard repairs on ``create`` it
repairs here too, and ``report_of`` works on what each path returns.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from pydantic import BaseModel

import agentguard as ag
from _openai_upstream import wrapped_client
from agentguard.testing import Fault, Reply, ScriptedModel

openai = pytest.importorskip("openai")
CONFIG = ag.GuardConfig.from_dict(
    {"memory_pressure": {"enabled": False}, "escalation": {"max_retries_before_escalate": 2}},
    env={},
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
# the SDK's helpers parse only strict tools (openai 2.x's async stream helper insists)
STRICT_TOOLS = [
    {
        "type": "function",
        "function": {
            **TOOLS[0]["function"],
            "strict": True,
            "parameters": {**TOOLS[0]["function"]["parameters"], "additionalProperties": False},
        },
    }
]
MESSAGES = [{"role": "user", "content": "show me setup.cfg"}]
EMBEDDED = Reply.embedded("read_file", {"path": "setup.cfg"}, style="fenced")


class Weather(BaseModel):
    city: str
    celsius: int


def _client(model: ScriptedModel, *, asynchronous: bool) -> Any:
    return wrapped_client(model, CONFIG, asynchronous=asynchronous)


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _chunks(stream: Any) -> list[Any]:
    if hasattr(stream, "__aiter__"):
        return [chunk async for chunk in stream]
    return list(stream)


def _streamed_calls(chunks: list[Any]) -> list[tuple[str, str]]:
    return [
        (call.function.name, call.function.arguments)
        for chunk in chunks
        for choice in chunk.choices
        for call in choice.delta.tool_calls or ()
    ]


BOTH = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])


@pytest.mark.anyio
@BOTH
async def test_with_raw_response_is_guarded(asynchronous: bool) -> None:
    """with_raw_response.create: parse() is the repaired answer with its report; the headers
    are the upstream's, of the attempt that was served (after a retry)."""
    model = ScriptedModel([Fault.server_error(503), EMBEDDED])
    raw = await _maybe(
        _client(model, asynchronous=asynchronous).chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, tools=TOOLS
        )
    )
    assert raw.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert raw.headers["x-agentguard-repairs"] == "1"  # the report, as the proxy sends it
    completion = raw.parse()
    call = completion.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "read_file",
        {"path": "setup.cfg"},
    )
    assert json.loads(raw.text)["choices"][0]["message"]["tool_calls"][0]["id"] == call.id
    report = ag.report_of(completion)
    assert report is not None
    assert (report.retries, bool(report.repairs)) == (1, True)


@pytest.mark.anyio
@BOTH
async def test_with_raw_response_stream_is_guarded(asynchronous: bool) -> None:
    """with_raw_response.create(stream=True): the stream's tool calls are repaired."""
    model = ScriptedModel([EMBEDDED])
    raw = await _maybe(
        _client(model, asynchronous=asynchronous).chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, tools=TOOLS, stream=True
        )
    )
    assert raw.headers["content-type"] == "text/event-stream"
    stream = raw.parse()
    chunks = await _chunks(stream)
    assert [name for name, _ in _streamed_calls(chunks)] == ["read_file"]
    report = ag.report_of(stream)
    assert report is not None
    assert report.repairs


@pytest.mark.anyio
@BOTH
async def test_with_streaming_response_is_guarded(asynchronous: bool) -> None:
    """with_streaming_response.create: parse() and the body accessors give the repaired
    answer; the report is on the parsed answer."""
    model = ScriptedModel([EMBEDDED])
    manager = _client(
        model, asynchronous=asynchronous
    ).chat.completions.with_streaming_response.create(model="m", messages=MESSAGES, tools=TOOLS)
    if asynchronous:
        async with manager as response:
            completion = await response.parse()
            body = await response.json()
    else:
        with manager as response:
            completion = response.parse()
            body = response.json()
    assert response.status_code == 200
    assert completion.choices[0].message.tool_calls[0].function.name == "read_file"
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    assert ag.report_of(completion).repairs


@pytest.mark.anyio
@BOTH
async def test_parse_repairs_json_against_the_response_format(asynchronous: bool) -> None:
    """chat.completions.parse on JSON the guard can repair (a fenced block with a trailing
    comma, a number as a string) gives the parsed model, not a JSONDecodeError."""
    broken = '```json\n{"city": "Paris", "celsius": "21",}\n```'
    model = ScriptedModel([Reply.text(broken)])
    completion = await _maybe(
        _client(model, asynchronous=asynchronous).chat.completions.parse(
            model="m", messages=MESSAGES, response_format=Weather
        )
    )
    assert completion.choices[0].message.parsed == Weather(city="Paris", celsius=21)
    report = ag.report_of(completion)
    assert report is not None
    assert any(r.startswith("response_format") for r in report.repairs)
    sent = model.requests[0].params["response_format"]
    assert sent["type"] == "json_schema"  # the SDK's own request, as it builds it


@pytest.mark.anyio
@BOTH
async def test_parse_unrepairable_content_raises_as_unguarded(asynchronous: bool) -> None:
    """Content that is not JSON at all reaches the SDK's parser unchanged (it raises)."""
    model = ScriptedModel([Reply.text("I cannot answer that.")])
    with pytest.raises(ValueError, match="Invalid JSON"):
        await _maybe(
            _client(model, asynchronous=asynchronous).chat.completions.parse(
                model="m", messages=MESSAGES, response_format=Weather
            )
        )


@pytest.mark.anyio
@BOTH
async def test_parse_repairs_strict_tool_arguments(asynchronous: bool) -> None:
    """parse() with a pydantic_function_tool: broken arguments are repaired before the SDK
    parses them (it raised JSONDecodeError unguarded)."""
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    bad = Reply.call("get_weather", '{"city": "Paris", "celsius": 21', id="c1")
    model = ScriptedModel([bad])
    completion = await _maybe(
        _client(model, asynchronous=asynchronous).chat.completions.parse(
            model="m", messages=MESSAGES, tools=[tool]
        )
    )
    parsed = completion.choices[0].message.tool_calls[0].function.parsed_arguments
    assert parsed == Weather(city="Paris", celsius=21)
    assert ag.report_of(completion).repairs


@pytest.mark.anyio
@BOTH
async def test_stream_helper_is_guarded(asynchronous: bool) -> None:
    """chat.completions.stream: a hallucinated tool is corrected by a re-ask; the helper's
    stream carries the report once read."""
    model = ScriptedModel(
        [Reply.call("read_fil", {"path": "a"}, id="c1"), Reply.call("read_file", {"path": "a"})]
    )
    manager = _client(model, asynchronous=asynchronous).chat.completions.stream(
        model="m", messages=MESSAGES, tools=STRICT_TOOLS
    )
    if asynchronous:
        async with manager as stream:
            [event async for event in stream]
            final = await stream.get_final_completion()
    else:
        with manager as stream:
            list(stream)
            final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "read_file"
    report = ag.report_of(stream)
    assert report is not None
    assert report.repairs or report.corrections


def test_stream_errors_surface_at_create_for_raw_responses() -> None:
    """A raw streamed call starts at create, as the SDK's does: errors raise there."""
    model = ScriptedModel([Fault.server_error(400)])
    client = _client(model, asynchronous=False)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, stream=True)


@pytest.mark.anyio
@BOTH
async def test_responses_parse_repairs_text_against_the_text_format(asynchronous: bool) -> None:
    """responses.parse on text the guard can repair gives the parsed model and a report."""
    model = ScriptedModel([Reply.text('{"city": "Paris", "celsius": "21"')])
    response = await _maybe(
        _client(model, asynchronous=asynchronous).responses.parse(
            model="m", input="Weather in Paris?", text_format=Weather
        )
    )
    assert response.output_parsed == Weather(city="Paris", celsius=21)
    assert any(r.startswith("response_format") for r in ag.report_of(response).repairs)


def test_paths_that_pass_through_are_the_documented_ones() -> None:
    """Model-calling resources other than chat completions and Responses are the client's
    own (docs/integrations.md lists them); the guarded ones are not."""
    client = _client(ScriptedModel([]), asynchronous=False)
    assert type(client.chat.completions).__module__.startswith("agentguard")
    assert type(client.beta.chat.completions).__module__.startswith("agentguard")
    assert type(client.responses).__module__.startswith("agentguard")
    assert client.with_raw_response.chat.completions._completions is client.chat.completions
    assert type(client.completions).__module__.startswith("openai")  # legacy completions
