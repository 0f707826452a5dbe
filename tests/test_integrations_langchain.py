"""langchain-openai's ``ChatOpenAI`` over a wrapped client (real langchain, offline).

ChatOpenAI calls ``with_raw_response.create`` (and ``.parse``, and the ``beta.chat``
``stream`` helper for structured streams): every one of those goes through the guard, so its
users get repaired tool calls, and the report as ``x-agentguard-*`` response headers
(``include_response_headers=True``).
"""

from __future__ import annotations

import json
from importlib import import_module
from typing import Any

import pytest
from pydantic import BaseModel

import agentguard as ag
from _openai_upstream import answering, reasoned_calls, text_item
from agentguard.testing import Reply, ScriptedModel

openai = pytest.importorskip("openai")
langchain_openai = pytest.importorskip("langchain_openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
CONFIG = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Weather(BaseModel):
    city: str
    celsius: int


def _chat(model: ScriptedModel, **kw: Any) -> Any:
    """ChatOpenAI over wrapped sync and async clients (both serving ``model``)."""
    return _over(model.mock_transport(http), model.mock_transport(http), guarded=True, **kw)


def _over(sync: Any, aio: Any, *, guarded: bool, **kw: Any) -> Any:
    """ChatOpenAI over sync and async openai clients (wrapped when ``guarded``) on the HTTP
    transports ``sync`` and ``aio``."""

    def client(cls: Any, http_client: Any) -> Any:
        plain = cls(
            api_key="sk-test", base_url="http://scripted.invalid/v1", http_client=http_client
        )
        return ag.wrap(plain, CONFIG) if guarded else plain

    root = client(openai.OpenAI, http.Client(transport=sync))
    root_async = client(openai.AsyncOpenAI, http.AsyncClient(transport=aio))
    return langchain_openai.ChatOpenAI(
        model="m",
        api_key="sk-test",
        root_client=root,
        client=root.chat.completions,
        root_async_client=root_async,
        async_client=root_async.chat.completions,
        **kw,
    )


def test_invoke_gets_a_repaired_tool_call_and_the_report() -> None:
    """A tool call written in the text comes back as a real tool call; the report rides in
    the response headers."""
    model = ScriptedModel([Reply.embedded("read_file", {"path": "setup.cfg"}, style="fenced")])
    llm = _chat(model, include_response_headers=True).bind_tools([READ_FILE])
    message = llm.invoke("show me setup.cfg")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("read_file", {"path": "setup.cfg"})
    ]
    headers = message.response_metadata["headers"]
    assert headers["x-agentguard-repairs"] == "1"
    assert headers["x-agentguard-tier"]


@pytest.mark.anyio
async def test_ainvoke_repairs_broken_arguments() -> None:
    """Async: arguments that are not valid JSON are repaired."""
    model = ScriptedModel([Reply.call("read_file", '{"path": "a.txt",', id="c1")])
    llm = _chat(model, include_response_headers=True).bind_tools([READ_FILE])
    message = await llm.ainvoke("read a.txt")
    assert message.tool_calls[0]["args"] == {"path": "a.txt"}
    assert message.response_metadata["headers"]["x-agentguard-repairs"] == "1"


def test_stream_gets_the_corrected_tool_call() -> None:
    """Streaming: a hallucinated tool gets a corrective re-ask; the stream carries the
    corrected call only."""
    model = ScriptedModel(
        [Reply.call("wipe_disk", {"force": True}), Reply.call("read_file", {"path": "b.txt"})]
    )
    llm = _chat(model).bind_tools([READ_FILE])
    chunks = list(llm.stream("read b.txt"))
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("read_file", {"path": "b.txt"})
    ]
    assert len(model.requests) == 2


def test_structured_output_is_repaired() -> None:
    """with_structured_output (json_schema, through parse): JSON the guard can repair."""
    model = ScriptedModel([Reply.text('```json\n{"city": "Paris", "celsius": "21",}\n```')])
    llm = _chat(model).with_structured_output(Weather, method="json_schema")
    assert llm.invoke("weather in Paris?") == Weather(city="Paris", celsius=21)


def test_structured_output_by_function_calling_gets_its_call_from_a_server_that_ignores_it() -> (
    None
):
    """with_structured_output (function_calling) names its schema's tool in ``tool_choice``; a
    server that ignores it (Ollama) lets the model answer in text, and LangChain alone returns
    ``None`` (no call to parse). Through the guard the text is re-asked, the tool pinned, and the
    caller gets the structured value (its number, written as text, coerced)."""
    replies = [
        Reply.text("It is 21 degrees in Paris."),
        Reply.call("Weather", {"city": "Paris", "celsius": "21"}),
    ]
    bare = ScriptedModel(list(replies))
    alone = _over(bare.mock_transport(http), bare.mock_transport(http), guarded=False)
    assert alone.with_structured_output(Weather, method="function_calling").invoke("Paris?") is None
    model = ScriptedModel(list(replies))
    llm = _chat(model).with_structured_output(Weather, method="function_calling")
    assert llm.invoke("weather in Paris?") == Weather(city="Paris", celsius=21)
    assert model.requests[0].params["tool_choice"] == model.requests[1].params["tool_choice"]


def test_plain_text_is_unchanged() -> None:
    """Healthy text passes as it came, with langchain's own metadata."""
    model = ScriptedModel([Reply.text("Hello there.")])
    message = _chat(model).invoke("hi")
    assert message.content == "Hello there."
    assert message.response_metadata["finish_reason"] == "stop"


def _sse(*chunks: dict[str, Any]) -> bytes:
    """Chat chunks as a server's stream: ``id``, date and model as every chunk carries them."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    lines = [f"data: {json.dumps({**head, **c})}\n\n" for c in chunks]
    return "".join([*lines, "data: [DONE]\n\n"]).encode()


def _delta(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def _streaming(body: bytes, *, guarded: bool) -> Any:
    """ChatOpenAI over a client (wrapped or not) whose upstream streams ``body``."""

    def answer(request: Any) -> Any:
        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return _over(http.MockTransport(answer), http.MockTransport(answer), guarded=guarded)


def _merged(chunks: list[Any]) -> Any:
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    return message


_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _llama_cpp_call(arguments: str) -> tuple[dict[str, Any], ...]:
    """llama.cpp's stream of a call: the usage rides on the finish chunk (with ``timings``)."""
    opening = {"index": 0, "id": "t1", "type": "function"}
    return (
        _delta({"role": "assistant", "content": None}),
        _delta({"tool_calls": [{**opening, "function": {"name": "read_file", "arguments": ""}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}),
        _delta({}, "tool_calls", usage=_USAGE, timings={"prompt_n": 10}),
    )


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True])
async def test_a_repaired_stream_whose_usage_rides_on_the_finish_finishes_once(
    asynchronous: bool,
) -> None:
    """llama.cpp sends the usage on its finish chunk. When the guard repairs the call, its own
    finish chunk goes out, and the usage without a second finish: LangChain adds chunks' metadata
    up, and read ``finish_reason`` as "tool_callstool_calls" and the model as "mm"."""
    llm = _streaming(_sse(*_llama_cpp_call("{'path': 'a.txt',}")), guarded=True).bind_tools(
        [READ_FILE]
    )
    if asynchronous:
        chunks = [c async for c in llm.astream("read a.txt")]
    else:
        chunks = list(llm.stream("read a.txt"))
    message = _merged(chunks)
    assert [(c["name"], c["args"], c["id"]) for c in message.tool_calls] == [
        ("read_file", {"path": "a.txt"}, "t1")
    ]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.response_metadata["model_name"] == "m"
    assert message.usage_metadata["total_tokens"] == 15


_CALLS_WITH_TEXT = (  # OpenAI: text, then two calls in fragments, the usage apart
    _delta({"role": "assistant", "content": "", "refusal": None}),
    _delta({"content": "Let me "}),
    _delta({"content": "look."}),
    *(
        _delta({"tool_calls": [{"index": i, **part}]})
        for i, path in enumerate(("a.txt", "b.txt"))
        for part in (
            {"id": f"call_{i}", "type": "function", "function": {"name": "read_file"}},
            {"function": {"arguments": '{"path": '}},
            {"function": {"arguments": f'"{path}"}}'}},
        )
    ),
    _delta({}, "tool_calls"),
    {"choices": [], "usage": _USAGE},
)
_ROLE_IN_TEXT = (  # vLLM / Ollama: the role in every content delta, reasoning_content first
    _delta({"role": "assistant", "reasoning_content": "Hm."}),
    _delta({"role": "assistant", "content": "Hel"}),
    _delta({"role": "assistant", "content": "lo."}),
    _delta({"role": "assistant", "content": ""}, "stop"),
    {"choices": [], "usage": _USAGE},
)


@pytest.mark.parametrize(
    "shape", [_llama_cpp_call('{"path": "a.txt"}'), _CALLS_WITH_TEXT, _ROLE_IN_TEXT]
)
def test_a_healthy_stream_merges_as_the_unguarded_one(shape: tuple[dict[str, Any], ...]) -> None:
    """Real servers' stream shapes: LangChain gets the same chunks over the guarded client as
    over the plain one (text, calls merged by index, finish, model, usage)."""

    def chunks(guarded: bool) -> list[Any]:
        llm = _streaming(_sse(*shape), guarded=guarded).bind_tools([READ_FILE])
        return [c.model_dump(exclude={"id"}) for c in llm.stream("read")]

    assert chunks(guarded=True) == chunks(guarded=False)


def test_parallel_calls_streamed_at_one_index_reach_langchain_as_the_calls() -> None:
    """Ollama streams every parallel call at index 0; this langchain-core tells two calls at
    one index apart by their ids (older ones merged them into one). Over the guarded client,
    which hands them on at an index each, it reads the same two calls as over the plain one."""
    shape = (
        _delta({"role": "assistant", "content": ""}),
        *(
            _delta(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": f"call_{c}",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": json.dumps({"city": c}),
                            },
                        }
                    ]
                }
            )
            for c in ("Oslo", "Rome")
        ),
        _delta({}, "tool_calls"),
        {"choices": [], "usage": _USAGE},
    )

    def merged(guarded: bool) -> Any:
        llm = _streaming(_sse(*shape), guarded=guarded).bind_tools([WEATHER])
        return _merged(list(llm.stream("weather in Oslo and Rome")))

    calls = [
        ("get_weather", {"city": "Oslo"}, "call_Oslo"),
        ("get_weather", {"city": "Rome"}, "call_Rome"),
    ]
    for guarded in (False, True):
        message = merged(guarded=guarded)
        assert [(c["name"], c["args"], c["id"]) for c in message.tool_calls] == calls
        assert message.invalid_tool_calls == []
        assert message.usage_metadata["total_tokens"] == 15


@pytest.mark.parametrize("output_version", [None, "v1"])
def test_a_repaired_responses_stream_keeps_each_call_after_its_reasoning(
    output_version: Any,
) -> None:
    """ChatOpenAI builds a streamed Responses answer from its events in order. When the guard
    repairs a reasoning model's call, its call events go where the call is in the output (after
    the reasoning item the upstream sent before it), so what LangChain sends next keeps each
    reasoning item followed by its call, as OpenAI requires: as after a healthy answer."""
    from langchain_core.messages import HumanMessage, ToolMessage

    sent = {}
    for name, arguments, guarded in (
        ("healthy", '{"city": "Paris"}', False),
        ("broken", "{'city': 'Paris',}", True),
    ):
        client, seen = answering(
            http, [reasoned_calls(arguments), [text_item("Sunny.")]], asynchronous=False
        )
        root = ag.wrap(client, CONFIG) if guarded else client
        llm = langchain_openai.ChatOpenAI(
            model="gpt-5",
            api_key="sk-test",
            root_client=root,
            client=root.chat.completions,
            use_responses_api=True,
            output_version=output_version,
            streaming=True,
        ).bind_tools([WEATHER])
        first = _merged(list(llm.stream("Weather in Rome and Paris?")))
        assert [c["id"] for c in first.tool_calls] == ["call_1", "call_2"]
        tool_turns = [
            ToolMessage(f"sunny in {c['args']['city']}", tool_call_id=c["id"])
            for c in first.tool_calls
        ]
        llm.invoke([HumanMessage("Weather in Rome and Paris?"), first, *tool_turns])
        sent[name] = [(i.get("type"), i.get("id"), i.get("call_id")) for i in seen[1]["input"]]
    assert sent["broken"] == sent["healthy"]


def _agent_tools() -> list[Any]:
    from langchain_core.tools import tool

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return {"a.txt": "alpha"}[path]

    return [read_file]


def test_create_agent_over_a_wrapped_client() -> None:
    """A LangChain v1 agent on ChatOpenAI over a wrapped client: the broken call is repaired
    inside the client (``with_raw_response`` is guarded), the tool runs, the agent finishes."""
    agents = pytest.importorskip("langchain.agents")
    model = ScriptedModel(
        [Reply.call("read_file", '{"path": "a.txt",', id="c1"), Reply.text("It says alpha.")]
    )
    agent = agents.create_agent(_chat(model, include_response_headers=True), _agent_tools())
    messages = agent.invoke({"messages": [{"role": "user", "content": "read a.txt"}]})["messages"]
    assert [m.content for m in messages if m.type == "tool"] == ["alpha"]
    assert messages[-1].content == "It says alpha."
    assert messages[1].response_metadata["headers"]["x-agentguard-repairs"] == "1"
    assert len(model.requests) == 2


@pytest.mark.anyio
async def test_create_agent_ainvoke_over_a_wrapped_client() -> None:
    """Async: the same agent's ``ainvoke`` through the wrapped async client; a hallucinated tool
    name is corrected before the agent sees it."""
    agents = pytest.importorskip("langchain.agents")
    model = ScriptedModel(
        [Reply.call("readFile", {"path": "a.txt"}, id="c1"), Reply.text("It says alpha.")]
    )
    agent = agents.create_agent(_chat(model), _agent_tools())
    out = await agent.ainvoke({"messages": [{"role": "user", "content": "read a.txt"}]})
    assert [m.content for m in out["messages"] if m.type == "tool"] == ["alpha"]
    assert out["messages"][1].tool_calls[0]["name"] == "read_file"
