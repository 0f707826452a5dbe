"""ScriptedModel: as a transport, and behind the real openai client over an HTTP mock."""

from __future__ import annotations

import json
from importlib import import_module
from typing import Any

import pytest

from agentguard.exceptions import ModelError
from agentguard.testing import Fault, Reply, ScriptedModel, ScriptExhausted
from agentguard.transport import AsyncTransport, ModelRequest, StreamChunk, Transport
from agentguard.types import Usage

openai = pytest.importorskip("openai")
# openai 3.x runs on httpx2, openai 2.x on httpx: serve the model through whichever is in use.
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")

REQ = ModelRequest(model="fast", messages=[{"role": "user", "content": "hi"}])


def _client(model: ScriptedModel) -> Any:
    return openai.OpenAI(
        api_key="sk-test-not-a-real-key",
        base_url="http://scripted.invalid/v1",
        max_retries=0,
        http_client=http.Client(transport=model.mock_transport(http)),
    )


def _async_client(model: ScriptedModel) -> Any:
    return openai.AsyncOpenAI(
        api_key="sk-test-not-a-real-key",
        base_url="http://scripted.invalid/v1",
        max_retries=0,
        http_client=http.AsyncClient(transport=model.mock_transport(http)),
    )


def test_is_a_sync_and_async_transport() -> None:
    """One object implements both transport protocols."""
    model = ScriptedModel([])
    assert isinstance(model, Transport)
    assert isinstance(model, AsyncTransport)


def test_replies_in_order_and_records_requests() -> None:
    """Steps are answered in order; every request is recorded."""
    model = ScriptedModel([Reply.text("one"), Reply.call("search", {"q": "x"}, id="c1")])
    first = model.send(REQ)
    second = model.send(REQ)
    assert first.message["content"] == "one"
    assert first.finish_reason == "stop"
    assert second.finish_reason == "tool_calls"
    assert second.message["tool_calls"][0]["function"] == {
        "name": "search",
        "arguments": '{"q": "x"}',
    }
    assert len(model.requests) == 2


def test_exhausted_script_raises() -> None:
    """Asking for more than the script holds is a loud test failure."""
    model = ScriptedModel([Reply.text("only")])
    model.send(REQ)
    with pytest.raises(ScriptExhausted, match="no more steps"):
        model.send(REQ)


def test_cycle_repeats_the_script() -> None:
    """cycle=True loops the script: a model stuck in a loop."""
    model = ScriptedModel([Reply.call("status", {})], cycle=True)
    names = [model.send(REQ).message["tool_calls"][0]["function"]["name"] for _ in range(5)]
    assert names == ["status"] * 5


def test_per_model_scripts() -> None:
    """Each tier can have its own script; '*' covers the rest."""
    model = ScriptedModel({"fast": [Fault.server_error(503)], "*": [Reply.text("premium ok")]})
    with pytest.raises(ModelError) as info:
        model.send(REQ)
    assert info.value.status_code == 503
    assert model.send(ModelRequest(model="premium", messages=[])).message["content"] == "premium ok"


def test_faults_raise_shaped_errors() -> None:
    """429 carries its Retry-After headers; a timeout is a TimeoutError."""
    model = ScriptedModel([Fault.rate_limit(2, retry_after_ms=1500), Fault.timeout()])
    with pytest.raises(ModelError) as info:
        model.send(REQ)
    assert info.value.status_code == 429
    assert info.value.response.headers == {"retry-after": "2", "retry-after-ms": "1500"}
    with pytest.raises(TimeoutError):
        model.send(REQ)


def test_dynamic_step_sees_the_request() -> None:
    """A callable step answers from the request it receives."""
    model = ScriptedModel([lambda r: Reply.text(f"{len(r.messages)} messages")])
    assert model.send(REQ).message["content"] == "1 messages"


def test_usage_auto_explicit_and_missing() -> None:
    """Usage is estimated by default, can be given, and can be omitted like some servers do."""
    model = ScriptedModel(
        [Reply.text("hello"), Reply.text("x", usage=Usage(10, 3)), Reply.text("y", usage=None)]
    )
    auto = model.send(REQ).usage
    assert auto is not None
    assert auto.prompt_tokens > 0
    assert auto.completion_tokens > 0
    assert model.send(REQ).usage == Usage(10, 3)
    assert model.send(REQ).usage is None


@pytest.mark.parametrize(
    ("style", "marker"),
    [
        ("hermes", "<tool_call>"),
        ("hermes_unclosed", "<tool_call>"),
        ("function_tag", "<function=search>"),
        ("python_tag", "<|python_tag|>"),
        ("mistral", "[TOOL_CALLS]"),
        ("fenced", "```json"),
        ("bare", '{"name": "search"'),
    ],
)
def test_embedded_calls_land_in_content(style: Any, marker: str) -> None:
    """Text-embedded tool calls come back as content with no native tool_calls."""
    reply = ScriptedModel([Reply.embedded("search", {"q": "x"}, style=style)]).send(REQ)
    assert marker in reply.message["content"]
    assert "tool_calls" not in reply.message
    assert reply.finish_reason == "stop"


def test_stream_reassembles_to_the_reply() -> None:
    """Streamed deltas concatenate to the scripted content and tool-call arguments."""
    args = json.dumps({"path": "/tmp/a-long-file-name.txt", "content": "x" * 50})
    model = ScriptedModel(
        [Reply(content="thinking about it", tool_calls=Reply.call("write", args).tool_calls)],
        chunk_size=5,
    )
    chunks = list(model.stream(REQ))
    assert all(isinstance(c, StreamChunk) for c in chunks)
    assert "".join(c.content or "" for c in chunks) == "thinking about it"
    fragments = [tc["function"].get("arguments", "") for c in chunks for tc in c.tool_calls]
    assert "".join(fragments) == args
    assert chunks[-1].finish_reason == "tool_calls"


def test_real_openai_client_gets_replies_and_tool_calls() -> None:
    """The real openai client parses scripted answers into its own types."""
    model = ScriptedModel([Reply.call("search", {"q": "x"}, id="call_9"), Reply.text("done")])
    client = _client(model)
    first = client.chat.completions.create(
        model="fast", messages=[{"role": "user", "content": "q"}]
    )
    call = first.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_9",
        "search",
        '{"q": "x"}',
    )
    second = client.chat.completions.create(
        model="fast", messages=[{"role": "user", "content": "q"}]
    )
    assert second.choices[0].message.content == "done"
    assert second.usage is not None
    assert model.requests[0].messages == [{"role": "user", "content": "q"}]


def test_real_openai_client_sees_429_with_retry_after() -> None:
    """A scripted 429 reaches the openai client as its RateLimitError with the headers."""
    client = _client(ScriptedModel([Fault.rate_limit(retry_after=7)]))
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="fast", messages=[])
    assert info.value.response.headers["retry-after"] == "7"


def test_real_openai_client_sees_5xx_and_timeouts() -> None:
    """5xx becomes InternalServerError; a timeout becomes APITimeoutError."""
    client = _client(ScriptedModel([Fault.server_error(502), Fault.timeout()]))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="fast", messages=[])
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="fast", messages=[])


def test_real_openai_client_streams_with_usage_chunk() -> None:
    """stream=True works through the real client, ending with the usage chunk."""
    model = ScriptedModel([Reply.text("hello streaming world")], chunk_size=4)
    stream = _client(model).chat.completions.create(
        model="fast", messages=[], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hello streaming world"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None


def test_exhausted_script_over_http_is_a_clear_500() -> None:
    """Over HTTP, running out of script answers 500 naming the problem."""
    client = _client(ScriptedModel([]))
    with pytest.raises(openai.InternalServerError, match="no more steps"):
        client.chat.completions.create(model="fast", messages=[])


@pytest.mark.anyio
async def test_async_real_openai_client() -> None:
    """The async openai client works against the same mock."""
    model = ScriptedModel([Reply.text("async ok")])
    reply = await _async_client(model).chat.completions.create(model="fast", messages=[])
    assert reply.choices[0].message.content == "async ok"


@pytest.mark.anyio
async def test_async_transport_face() -> None:
    """asend and astream mirror send and stream."""
    model = ScriptedModel([Reply.text("a"), Reply.text("bc")])
    assert (await model.asend(REQ)).message["content"] == "a"
    chunks = [c async for c in model.astream(REQ)]
    assert "".join(c.content or "" for c in chunks) == "bc"


def test_serve_answers_the_real_client_over_loopback() -> None:
    """serve() is a real HTTP endpoint: replies, streams, faults with their headers."""
    model = ScriptedModel(
        [Reply.call("search", {"q": "x"}), Reply.text("streamed text"), Fault.rate_limit(3)],
        chunk_size=5,
    )
    with model.serve() as base_url:
        assert base_url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(api_key="sk-test-not-a-real-key", base_url=base_url, max_retries=0)
        reply = client.chat.completions.create(model="fast", messages=[])
        assert reply.choices[0].message.tool_calls[0].function.name == "search"
        stream = client.chat.completions.create(model="fast", messages=[], stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "streamed text"
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="fast", messages=[])
        assert info.value.response.headers["retry-after"] == "3"
        client.close()
    assert [r.model for r in model.requests] == ["fast"] * 3


def test_serve_timeout_closes_without_an_answer() -> None:
    """A scripted timeout over serve() drops the connection: the client sees no response."""
    with ScriptedModel([Fault.timeout()]).serve() as base_url:
        client = openai.OpenAI(api_key="sk-test-not-a-real-key", base_url=base_url, max_retries=0)
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="fast", messages=[])
        client.close()
