"""The openai client as a model transport (openai 2.x on httpx and 3.x on httpx2, sync and async).

The transports call ``chat.completions.create`` on a copy of the user's client whose own
retries are off (``max_retries=0``): agentguard's retry layer is the only one, so retries never
multiply. Upstream errors are the SDK's own exceptions, passed through untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from agentguard.transport import ModelRequest, ModelResponse, StreamChunk

from ._lazy import require

__all__ = ["AsyncOpenAITransport", "OpenAITransport", "is_async_client"]


def is_async_client(client: Any) -> bool:
    """Whether ``client`` is an ``openai.AsyncOpenAI`` (or a subclass such as Azure's)."""
    openai = require("openai", "openai")
    return isinstance(client, openai.AsyncOpenAI)


def _call_kwargs(request: ModelRequest, *, stream: bool) -> dict[str, Any]:
    kwargs = request.to_body(stream=stream)
    if request.headers:
        kwargs["extra_headers"] = dict(request.headers)
    if request.timeout is not None:
        kwargs["timeout"] = request.timeout
    return kwargs


def _dump(obj: Any) -> Mapping[str, Any]:
    data: Mapping[str, Any] = obj.model_dump(mode="json")
    return data


class OpenAITransport:
    """A synchronous transport over an ``openai.OpenAI`` client.

    Args:
        client: the user's client; a copy with ``max_retries=0`` is used, the original is not
            changed.
    """

    def __init__(self, client: Any) -> None:
        self._client = client.with_options(max_retries=0)

    @property
    def client(self) -> Any:
        """The retry-less client copy the transport calls."""
        return self._client

    def send(self, request: ModelRequest) -> ModelResponse:
        """One ``chat.completions.create`` call."""
        raw = self._client.chat.completions.create(**_call_kwargs(request, stream=False))
        return ModelResponse.from_body(_dump(raw), raw=raw)

    def stream(self, request: ModelRequest) -> Iterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        stream = self._client.chat.completions.create(**_call_kwargs(request, stream=True))
        with stream:
            for chunk in stream:
                yield StreamChunk.from_body(_dump(chunk), raw=chunk)


class AsyncOpenAITransport:
    """An asynchronous transport over an ``openai.AsyncOpenAI`` client.

    Args:
        client: the user's async client; a copy with ``max_retries=0`` is used.
    """

    def __init__(self, client: Any) -> None:
        self._client = client.with_options(max_retries=0)

    @property
    def client(self) -> Any:
        """The retry-less client copy the transport calls."""
        return self._client

    async def asend(self, request: ModelRequest) -> ModelResponse:
        """One ``chat.completions.create`` call."""
        raw = await self._client.chat.completions.create(**_call_kwargs(request, stream=False))
        return ModelResponse.from_body(_dump(raw), raw=raw)

    async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        stream = await self._client.chat.completions.create(**_call_kwargs(request, stream=True))
        async with stream:
            async for chunk in stream:
                yield StreamChunk.from_body(_dump(chunk), raw=chunk)
