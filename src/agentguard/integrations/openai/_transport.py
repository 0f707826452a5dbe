"""The openai client as a model transport (openai 2.x on httpx and 3.x on httpx2, sync and async).

The transports call ``chat.completions.create`` (or ``responses.create`` for a request built
from a Responses call) on a copy of the user's client whose own retries are off
(``max_retries=0``): agentguard's retry layer is the only one, so retries never multiply.
Upstream errors are the SDK's own exceptions, passed through untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from agentguard.integrations._lazy import require
from agentguard.transport import ModelRequest, ModelResponse, StreamChunk
from agentguard.types import Usage

from ._responses import chunk_of_event, is_responses, response_from_responses, responses_body

__all__ = [
    "PARSE",
    "RAW",
    "AsyncOpenAITransport",
    "OpenAITransport",
    "RawCall",
    "dump",
    "is_async_client",
    "sdk_message",
]

#: The ``ModelRequest.extensions`` key of a :class:`RawCall`: every streamed call of a wrapped
#: client, and every call made through ``with_raw_response`` / ``with_streaming_response``.
RAW = "agentguard.openai.raw"
#: The ``ModelRequest.extensions`` key of a ``parse`` call (chat completions or Responses).
PARSE = "agentguard.openai.parse"


class RawCall:
    """What the transport saw of the upstream, for the wrapped client to hand on.

    ``response``: the upstream's raw response (``LegacyAPIResponse`` or ``APIResponse``:
    headers, status, request id) of a call made through ``with_raw_response`` or
    ``with_streaming_response``; the last attempt's, which is the one whose answer is served.
    ``chunk``: the last chunk a streamed call received (what the chunks the guard makes are
    dated by). ``opening``: the upstream's opening chunk (``role: assistant`` and no text),
    which the guard does not pass on and the wrapped client's stream replays first.
    ``events``: every event of the last streamed Responses attempt, in order.
    """

    __slots__ = ("chunk", "events", "opening", "response")

    def __init__(self) -> None:
        self.response: Any = None
        self.chunk: Any = None
        self.opening: Any = None
        self.events: list[Any] = []


class _ParseEndpoint:
    """``parse`` (of chat completions or Responses) as an endpoint whose answer the guard
    judges before the SDK parses it.

    ``create`` runs the SDK's own ``parse`` on this object, whose ``_post`` is the resource's
    without the SDK's ``post_parser``: the request goes out exactly as the SDK builds it, and
    the answer comes back as a plain ``ChatCompletion`` (``Response``) for the guard to validate
    and repair; the caller's ``parse`` then builds the ``ParsedChatCompletion``
    (``ParsedResponse``) from the guarded answer.
    """

    def __init__(self, resource: Any) -> None:
        self._resource = resource

    def _post(self, path: str, *, options: Mapping[str, Any], **kwargs: Any) -> Any:
        options = {k: v for k, v in options.items() if k != "post_parser"}
        return self._resource._post(path, options=options, **kwargs)

    def create(self, **kwargs: Any) -> Any:
        return type(self._resource).parse(self, **kwargs)


def is_async_client(client: Any) -> bool:
    """Whether ``client`` is an ``openai.AsyncOpenAI`` (or a subclass such as Azure's)."""
    openai = require("openai", "openai")
    return isinstance(client, openai.AsyncOpenAI)


def _call(client: Any, request: ModelRequest, *, stream: bool) -> tuple[Any, dict[str, Any]]:
    """The endpoint to call for ``request``, and its keyword arguments (the wire form)."""
    if is_responses(request):
        endpoint, kwargs = client.responses, responses_body(request, stream=stream)
        if PARSE in request.extensions:
            endpoint = _ParseEndpoint(client.responses)
    elif PARSE in request.extensions:
        endpoint, kwargs = _ParseEndpoint(client.chat.completions), request.to_body()
    else:
        endpoint, kwargs = client.chat.completions, request.to_body(stream=stream)
    if request.headers:
        kwargs["extra_headers"] = dict(request.headers)
    if request.timeout is not None:
        kwargs["timeout"] = request.timeout
    return endpoint, kwargs


def dump(obj: Any) -> Mapping[str, Any]:
    """An SDK object as JSON-ready data."""
    data: Mapping[str, Any] = obj.model_dump(mode="json")
    return data


def _watch(request: ModelRequest, holder: Any) -> Callable[[Any], StreamChunk]:
    """What turns one streamed SDK object into a neutral chunk, noting in ``holder`` (if
    any) what the wrapped client hands on: for chat, the last chunk and the opening one (role
    only, no text); for Responses, every event of this attempt."""
    if is_responses(request):
        calls: dict[int, int] = {}
        events: list[Any] = []
        if isinstance(holder, RawCall):
            holder.events = events

        def event(raw: Any) -> StreamChunk:
            events.append(raw)
            return chunk_of_event(raw, calls)

        return event
    if not isinstance(holder, RawCall):
        return _chunk

    def chunk(raw: Any) -> StreamChunk:
        holder.chunk = raw
        if holder.opening is None and raw.choices:
            delta = raw.choices[0].delta
            if delta.role and not delta.content and not delta.tool_calls:
                holder.opening = raw
        return _chunk(raw)

    return chunk


def _is_raw(result: Any) -> bool:
    """Whether an endpoint returned the SDK's raw response (the call carried its raw header)."""
    return hasattr(result, "http_response") and callable(getattr(result, "parse", None))


def _unwrap(request: ModelRequest, result: Any) -> Any:
    """The SDK object of an endpoint's result; a raw response is kept for the caller, parsed."""
    if not _is_raw(result):
        return result
    holder = request.extensions.get(RAW)
    if isinstance(holder, RawCall):
        holder.response = result
    return result.parse()


async def _aunwrap(request: ModelRequest, result: Any) -> Any:
    """Async twin of :func:`_unwrap` (an async client's streamed response parses async)."""
    parsed = _unwrap(request, result)
    return await parsed if inspect.isawaitable(parsed) else parsed


def _response(request: ModelRequest, raw: Any) -> ModelResponse:
    if is_responses(request):
        return response_from_responses(dump(raw), raw=raw)
    choices: Any = getattr(raw, "choices", None)
    message = sdk_message(choices[0].message) if choices else None
    if message is None:  # something unusual: the SDK's own full dump
        return ModelResponse.from_body(dump(raw), raw=raw)
    return ModelResponse(
        message=message,
        finish_reason=choices[0].finish_reason,
        usage=_usage(raw.usage),
        model=str(raw.model or ""),
        id=raw.id,
        raw=raw,
    )


# Reading the SDK objects' few fields the pipeline needs is several times cheaper than
# model_dump(), which serialises every field of every nested model on every call and chunk.


def sdk_message(msg: Any) -> dict[str, Any] | None:
    """An SDK assistant message as the pipeline's dict, or ``None`` when it holds more than
    text and function calls (custom tool calls ...) and needs the full dump."""
    message: dict[str, Any] = {"role": msg.role or "assistant", "content": msg.content}
    calls = msg.tool_calls
    if calls:
        out = []
        for call in calls:
            fn = getattr(call, "function", None)
            if fn is None:
                return None
            out.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": fn.name, "arguments": fn.arguments},
                }
            )
        message["tool_calls"] = out
    return message


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    return Usage(int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0))


def _chunk(raw: Any) -> StreamChunk:
    """An SDK ``ChatCompletionChunk`` as a neutral chunk (its raw object kept)."""
    usage = _usage(getattr(raw, "usage", None))
    if not raw.choices:
        return StreamChunk(usage=usage, raw=raw)
    choice = raw.choices[0]
    delta = choice.delta
    calls: tuple[Mapping[str, Any], ...] = ()
    if delta.tool_calls:
        calls = tuple(_call_delta(c) for c in delta.tool_calls)
    return StreamChunk(
        content=delta.content,
        tool_calls=calls,
        finish_reason=choice.finish_reason,
        usage=usage,
        raw=raw,
    )


def _call_delta(call: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"index": call.index}
    if call.id:
        out["id"] = call.id
    fn = call.function
    if fn is not None:
        out["function"] = {"name": fn.name, "arguments": fn.arguments}
    return out


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
        """One ``chat.completions.create`` (or ``responses.create``) call."""
        endpoint, kwargs = _call(self._client, request, stream=False)
        return _response(request, _unwrap(request, endpoint.create(**kwargs)))

    def stream(self, request: ModelRequest) -> Iterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        endpoint, kwargs = _call(self._client, request, stream=True)
        holder = request.extensions.get(RAW)
        see = _watch(request, holder)
        with _unwrap(request, endpoint.create(**kwargs)) as stream:
            for chunk in stream:
                yield see(chunk)


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
        """One ``chat.completions.create`` (or ``responses.create``) call."""
        endpoint, kwargs = _call(self._client, request, stream=False)
        return _response(request, await _aunwrap(request, await endpoint.create(**kwargs)))

    async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        endpoint, kwargs = _call(self._client, request, stream=True)
        holder = request.extensions.get(RAW)
        see = _watch(request, holder)
        async with await _aunwrap(request, await endpoint.create(**kwargs)) as stream:
            async for chunk in stream:
                yield see(chunk)
