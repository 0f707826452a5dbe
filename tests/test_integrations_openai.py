"""The openai transports, through the real openai client over an HTTP mock (both majors)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

import pytest

from agentguard.integrations.openai import AsyncOpenAITransport, OpenAITransport, is_async_client
from agentguard.testing import Fault, Reply, ScriptedModel
from agentguard.transport import ModelRequest

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
REQ = ModelRequest(
    model="fast", messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 50}
)


def _client(model: ScriptedModel, **kw: Any) -> Any:
    return openai.OpenAI(
        api_key="sk-test-not-a-real-key",
        base_url="http://scripted.invalid/v1",
        http_client=http.Client(transport=model.mock_transport(http)),
        **kw,
    )


def _async_client(model: ScriptedModel) -> Any:
    return openai.AsyncOpenAI(
        api_key="sk-test-not-a-real-key",
        base_url="http://scripted.invalid/v1",
        http_client=http.AsyncClient(transport=model.mock_transport(http)),
    )


def test_send_returns_neutral_response_and_sdk_object() -> None:
    """send() gives the neutral response, with the SDK's own object as raw."""
    model = ScriptedModel([Reply.call("search", {"q": "x"}, id="c1")])
    response = OpenAITransport(_client(model)).send(REQ)
    assert response.finish_reason == "tool_calls"
    assert response.message["tool_calls"][0]["function"]["name"] == "search"
    assert response.usage is not None
    assert type(response.raw).__name__ == "ChatCompletion"
    assert model.requests[0].params["max_tokens"] == 50


def test_client_retries_are_forced_off() -> None:
    """The transport's client never retries on its own: one 429 is one HTTP request."""
    model = ScriptedModel([Fault.rate_limit(retry_after=0), Reply.text("late")])
    user_client = _client(model, max_retries=5)
    transport = OpenAITransport(user_client)
    assert transport.client.max_retries == 0
    assert user_client.max_retries == 5  # the user's own client is untouched
    with pytest.raises(openai.RateLimitError):
        transport.send(REQ)
    assert len(model.requests) == 1


def test_stream_yields_neutral_chunks() -> None:
    """stream() yields chunks whose content reassembles the reply."""
    model = ScriptedModel([Reply.text("streamed words here")], chunk_size=3)
    chunks = list(OpenAITransport(_client(model)).stream(REQ))
    assert "".join(c.content or "" for c in chunks) == "streamed words here"
    assert chunks[-1].finish_reason == "stop"


def test_headers_and_timeout_are_passed() -> None:
    """Per-request headers reach the server."""
    seen: list[Any] = []
    model = ScriptedModel([Reply.text("ok")])
    inner = model.mock_transport(http)

    def spy(request: Any) -> Any:
        seen.append(request)
        return inner.handle_request(request)

    client = openai.OpenAI(
        api_key="sk-test-not-a-real-key",
        base_url="http://scripted.invalid/v1",
        http_client=http.Client(transport=http.MockTransport(spy)),
    )
    request = ModelRequest(model="m", messages=[], headers={"x-trace": "abc"}, timeout=3.0)
    OpenAITransport(client).send(request)
    assert seen[0].headers["x-trace"] == "abc"


def test_is_async_client() -> None:
    """Sync and async clients are told apart."""
    model = ScriptedModel([])
    assert not is_async_client(_client(model))
    assert is_async_client(_async_client(model))


@pytest.mark.anyio
async def test_async_send_and_stream() -> None:
    """The async transport mirrors the sync one."""
    model = ScriptedModel([Reply.text("one"), Reply.text("two two")])
    transport = AsyncOpenAITransport(_async_client(model))
    assert (await transport.asend(REQ)).message["content"] == "one"
    chunks = [c async for c in transport.astream(REQ)]
    assert "".join(c.content or "" for c in chunks) == "two two"
