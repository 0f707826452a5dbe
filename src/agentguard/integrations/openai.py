"""The openai client as a model transport (openai 2.x on httpx and 3.x on httpx2, sync and async).

The transports call ``chat.completions.create`` on a copy of the user's client whose own
retries are off (``max_retries=0``): agentguard's retry layer is the only one, so retries never
multiply. Upstream errors are the SDK's own exceptions, passed through untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

from agentguard._responses import (
    request_from_responses,
    response_from_responses,
    responses_body,
    responses_output,
)
from agentguard.config import GuardConfig
from agentguard.guard import AsyncGuard, AsyncGuardedStream, Guard, GuardedStream
from agentguard.guard._report import GuardReport, attach_report, report_of
from agentguard.guard._session import SESSION_HEADER
from agentguard.transport import ModelRequest, ModelResponse, StreamChunk
from agentguard.types import Tier, Usage

from ._lazy import require
from ._tiers import tier_api_key

__all__ = ["AsyncOpenAITransport", "OpenAITransport", "is_async_client", "wrap"]

T = TypeVar("T")


def is_async_client(client: Any) -> bool:
    """Whether ``client`` is an ``openai.AsyncOpenAI`` (or a subclass such as Azure's)."""
    openai = require("openai", "openai")
    return isinstance(client, openai.AsyncOpenAI)


def _call_kwargs(request: ModelRequest, *, stream: bool) -> dict[str, Any]:
    if request.api == "responses":
        kwargs = responses_body(request, stream=stream)
    else:
        kwargs = request.to_body(stream=stream)
    if request.headers:
        kwargs["extra_headers"] = dict(request.headers)
    if request.timeout is not None:
        kwargs["timeout"] = request.timeout
    return kwargs


def _dump(obj: Any) -> Mapping[str, Any]:
    data: Mapping[str, Any] = obj.model_dump(mode="json")
    return data


def _response(request: ModelRequest, raw: Any) -> ModelResponse:
    if request.api == "responses":
        return response_from_responses(_dump(raw), raw=raw)
    choices: Any = getattr(raw, "choices", None)
    message = _message(choices[0].message) if choices else None
    if message is None:  # something unusual: the SDK's own full dump
        return ModelResponse.from_body(_dump(raw), raw=raw)
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


def _message(msg: Any) -> dict[str, Any] | None:
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


def _endpoint(client: Any, request: ModelRequest) -> Any:
    return client.responses if request.api == "responses" else client.chat.completions


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
        raw = _endpoint(self._client, request).create(**_call_kwargs(request, stream=False))
        return _response(request, raw)

    def stream(self, request: ModelRequest) -> Iterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        stream = self._client.chat.completions.create(**_call_kwargs(request, stream=True))
        with stream:
            for chunk in stream:
                yield _chunk(chunk)


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
        raw = await _endpoint(self._client, request).create(**_call_kwargs(request, stream=False))
        return _response(request, raw)

    async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        stream = await self._client.chat.completions.create(**_call_kwargs(request, stream=True))
        async with stream:
            async for chunk in stream:
                yield _chunk(chunk)


# -- wrap(): the drop-in client ----------------------------------------------------------------

_OWN_KWARGS = ("extra_headers", "extra_query", "extra_body", "timeout")


def _request(kwargs: Mapping[str, Any], api: str = "chat") -> tuple[ModelRequest, str | None]:
    """The neutral request of a ``create`` call, and its explicit session."""
    params = dict(kwargs)
    headers = dict(params.pop("extra_headers", None) or {})
    timeout = params.pop("timeout", None)
    session = None
    for key in list(headers):
        if key.lower() == SESSION_HEADER:
            session = str(headers.pop(key))  # ours: never sent upstream
    for key in ("extra_query", "extra_body"):
        if params.get(key) is None:
            params.pop(key, None)
    if api == "responses":
        base = request_from_responses(params)
    else:
        params.pop("stream", None)
        model = params.pop("model")
        base = ModelRequest(model=str(model), messages=list(params.pop("messages")), params=params)
    seconds = float(timeout) if isinstance(timeout, (int, float)) else None
    return dataclasses.replace(base, headers=headers, timeout=seconds), session


def _rebuild(raw: Any, data: Mapping[str, Any]) -> Any:
    """An SDK object of ``raw``'s type from changed data, built as leniently as the SDK parses
    (servers other than OpenAI's omit fields its types call required)."""
    return type(raw).construct(**data)


def _responses_result(response: ModelResponse, report: GuardReport | None) -> Any:
    """The Responses SDK object to hand back, rebuilt if the guard changed the answer."""
    raw = response.raw
    if raw is None or not hasattr(raw, "output"):
        return raw
    original = response_from_responses(_dump(raw))
    if _same_message(
        original.message, response.message, original.finish_reason, response.finish_reason
    ):
        out = raw
    else:
        data = dict(_dump(raw))
        data["output"] = responses_output(data, response.message)
        out = _rebuild(raw, data)
    if report is not None:
        attach_report(out, report)
    return out


def _completion(response: ModelResponse, report: GuardReport | None) -> Any:
    """The SDK object to hand back: the upstream one, rebuilt if the guard changed the message."""
    raw = response.raw
    if raw is None or not hasattr(raw, "choices"):
        return raw
    original = None
    if raw.choices:
        first = raw.choices[0].message
        original = _message(first) or first.model_dump(mode="json")
    if original is not None and _same_message(
        original, response.message, raw.choices[0].finish_reason, response.finish_reason
    ):
        out = raw
    else:
        data = raw.model_dump(mode="json")
        data["choices"] = [
            {
                **(data["choices"][0] if data["choices"] else {"index": 0}),
                "message": dict(response.message),
                "finish_reason": response.finish_reason,
            }
        ]
        out = _rebuild(raw, data)
    if report is not None:
        attach_report(out, report)
    return out


def _same_message(a: Mapping[str, Any], b: Mapping[str, Any], fa: Any, fb: Any) -> bool:
    keys = ("content", "tool_calls")
    return fa == fb and all((a.get(k) or None) == (b.get(k) or None) for k in keys)


class _ChunkMaker:
    """Turns the guard's stream chunks into the SDK's ``ChatCompletionChunk`` objects."""

    def __init__(self, model: str) -> None:
        self._cls = require("openai.types.chat", "openai").ChatCompletionChunk
        self._head = {"id": "chatcmpl-agentguard", "created": 0, "model": model}

    def __call__(self, chunk: StreamChunk) -> Any:
        raw = chunk.raw
        if raw is not None and not isinstance(raw, Mapping):
            self._head = {"id": raw.id, "created": raw.created, "model": raw.model}
            return raw
        delta: dict[str, Any] = {}
        if chunk.content:
            delta["content"] = chunk.content
        if chunk.tool_calls:
            delta["tool_calls"] = [dict(c) for c in chunk.tool_calls]
        return self._cls.model_validate(
            {
                **self._head,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": chunk.finish_reason}],
            }
        )


class _Stream:
    """What a guarded ``create(stream=True)`` returns on a sync client."""

    def __init__(self, inner: GuardedStream, model: str) -> None:
        self._inner = inner
        self._make = _ChunkMaker(model)

    def __iter__(self) -> Iterator[Any]:
        for chunk in self._inner:
            yield self._make(chunk)
        if self._inner.report is not None:
            attach_report(self, self._inner.report)

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncStream:
    """What a guarded ``create(stream=True)`` returns on an async client."""

    def __init__(self, inner: AsyncGuardedStream, model: str) -> None:
        self._inner = inner
        self._make = _ChunkMaker(model)

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for chunk in self._inner:
            yield self._make(chunk)
        if self._inner.report is not None:
            attach_report(self, self._inner.report)

    async def close(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Completions:
    def __init__(self, inner: Any, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    def create(self, **kwargs: Any) -> Any:
        request, session = _request(kwargs)
        if kwargs.get("stream"):
            return _Stream(self._guard.stream(request, session=session), request.model)
        response = self._guard.complete(request, session=session)
        return _completion(response, report_of(response))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AsyncCompletions:
    def __init__(self, inner: Any, guard: AsyncGuard) -> None:
        self._inner = inner
        self._guard = guard

    async def create(self, **kwargs: Any) -> Any:
        request, session = _request(kwargs)
        if kwargs.get("stream"):
            return _AsyncStream(self._guard.astream(request, session=session), request.model)
        response = await self._guard.acomplete(request, session=session)
        return _completion(response, report_of(response))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Responses:
    """``client.responses`` of a sync client: ``create`` is guarded (not yet when streaming)."""

    def __init__(self, inner: Any, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    def create(self, **kwargs: Any) -> Any:
        if kwargs.get("stream"):
            return self._inner.create(**kwargs)
        request, session = _request(kwargs, "responses")
        response = self._guard.complete(request, session=session)
        return _responses_result(response, report_of(response))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AsyncResponses:
    """``client.responses`` of an async client: ``create`` is guarded (not yet when streaming)."""

    def __init__(self, inner: Any, guard: AsyncGuard) -> None:
        self._inner = inner
        self._guard = guard

    async def create(self, **kwargs: Any) -> Any:
        if kwargs.get("stream"):
            return await self._inner.create(**kwargs)
        request, session = _request(kwargs, "responses")
        response = await self._guard.acomplete(request, session=session)
        return _responses_result(response, report_of(response))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Chat:
    def __init__(self, inner: Any, completions: Any) -> None:
        self._inner = inner
        self.completions = completions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def wrap(client: Any, config: GuardConfig | None = None, **options: Any) -> Any:
    """Put the guard in front of an openai client; see :func:`agentguard.wrap`."""
    base = client.with_options(max_retries=0)
    clients: dict[tuple[str | None, str | None], Any] = {}

    def client_for(tier: Tier) -> Any:
        key = (tier.base_url, tier.api_key_env)
        if key not in clients:
            overrides: dict[str, Any] = {}
            if tier.base_url:
                overrides["base_url"] = tier.base_url
            api_key = tier_api_key(tier)
            if api_key:
                overrides["api_key"] = api_key
            clients[key] = base.with_options(**overrides) if overrides else base
        return clients[key]

    guard: Guard | AsyncGuard
    if is_async_client(client):
        guard = AsyncGuard(_per_client(client_for, AsyncOpenAITransport), config, **options)
    else:
        guard = Guard(_per_client(client_for, OpenAITransport), config, **options)
    return _install(client.with_options(), guard)


def _per_client(client_for: Callable[[Tier], Any], make: Callable[[Any], T]) -> Callable[[Tier], T]:
    """A tier's transport, made once per distinct client (copying a client is not free)."""
    made: dict[int, T] = {}

    def transport_for(tier: Tier) -> T:
        client = client_for(tier)
        transport = made.get(id(client))
        if transport is None:
            transport = made[id(client)] = make(client)
        return transport

    return transport_for


def _install(client: Any, guard: Guard | AsyncGuard) -> Any:
    """Guard ``client`` in place (a fresh copy of the user's client) and keep it guarded on copy."""
    inner_chat = client.chat
    responses: Any
    if isinstance(guard, AsyncGuard):
        completions: Any = _AsyncCompletions(inner_chat.completions, guard)
        responses = _AsyncResponses(client.responses, guard)
    else:
        completions = _Completions(inner_chat.completions, guard)
        responses = _Responses(client.responses, guard)
    client.__dict__["chat"] = _Chat(inner_chat, completions)
    client.__dict__["responses"] = responses
    original_copy = client.copy

    def copy(*args: Any, **kwargs: Any) -> Any:
        return _install(original_copy(*args, **kwargs), guard)

    client.__dict__["copy"] = copy
    client.__dict__["with_options"] = copy
    client.__dict__["_agentguard_guard"] = guard
    return client
