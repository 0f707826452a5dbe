"""``wrap()``: an openai client whose ``chat.completions`` and ``responses`` run through a guard.

The wrapped client is a copy of the user's, still an instance of its class; its ``create``
methods build a neutral request, run it through the guard and hand back the SDK's own objects
(rebuilt only when the guard changed the answer), the report attached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agentguard.config import GuardConfig
from agentguard.guard import AsyncGuard, Guard, GuardReport
from agentguard.integrations._tiers import tier_api_key
from agentguard.transport import (
    ModelRequest,
    ModelResponse,
    attach_report,
    register_secret,
    report_of,
)
from agentguard.types import Tier

from ._responses import request_from_responses, response_from_responses, responses_output
from ._stream import AsyncStream, Stream
from ._transport import AsyncOpenAITransport, OpenAITransport, dump, is_async_client, sdk_message

__all__ = ["wrap"]

T = TypeVar("T")


def _request(kwargs: Mapping[str, Any], *, responses: bool = False) -> ModelRequest:
    """The neutral request of a ``create`` call (a session header stays in its headers: the
    guard reads it and never sends it upstream)."""
    params = dict(kwargs)
    headers = dict(params.pop("extra_headers", None) or {})
    timeout = params.pop("timeout", None)
    for key in ("extra_query", "extra_body"):
        if params.get(key) is None:
            params.pop(key, None)
    if responses:
        base = request_from_responses(params)
    else:
        params.pop("stream", None)
        model = params.pop("model")
        base = ModelRequest(model=str(model), messages=list(params.pop("messages")), params=params)
    seconds = float(timeout) if isinstance(timeout, (int, float)) else None
    return dataclasses.replace(base, headers=headers, timeout=seconds)


def _rebuild(raw: Any, data: Mapping[str, Any]) -> Any:
    """An SDK object of ``raw``'s type from changed data, built as leniently as the SDK parses
    (servers other than OpenAI's omit fields its types call required)."""
    return type(raw).construct(**data)


def _responses_result(response: ModelResponse, report: GuardReport | None) -> Any:
    """The Responses SDK object to hand back, rebuilt if the guard changed the answer."""
    raw = response.raw
    if raw is None or not hasattr(raw, "output"):
        return raw
    original = response_from_responses(dump(raw))
    if _same_message(
        original.message, response.message, original.finish_reason, response.finish_reason
    ):
        out = raw
    else:
        data = dict(dump(raw))
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
        original = sdk_message(first) or first.model_dump(mode="json")
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
            },
            *(data["choices"] or [])[1:],  # the other choices (n > 1) pass through unchanged
        ]
        out = _rebuild(raw, data)
    if report is not None:
        attach_report(out, report)
    return out


def _same_message(a: Mapping[str, Any], b: Mapping[str, Any], fa: Any, fb: Any) -> bool:
    keys = ("content", "tool_calls")
    return fa == fb and all((a.get(k) or None) == (b.get(k) or None) for k in keys)


class _Completions:
    def __init__(self, inner: Any, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    def create(self, **kwargs: Any) -> Any:
        request = _request(kwargs)
        if kwargs.get("stream"):
            return Stream(self._guard.stream(request), request.model)
        response = self._guard.complete(request)
        return _completion(response, report_of(response))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AsyncCompletions:
    def __init__(self, inner: Any, guard: AsyncGuard) -> None:
        self._inner = inner
        self._guard = guard

    async def create(self, **kwargs: Any) -> Any:
        request = _request(kwargs)
        if kwargs.get("stream"):
            return AsyncStream(self._guard.astream(request), request.model)
        response = await self._guard.acomplete(request)
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
        response = self._guard.complete(_request(kwargs, responses=True))
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
        response = await self._guard.acomplete(_request(kwargs, responses=True))
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
    register_secret(getattr(client, "api_key", None))  # sent with every request
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
        transports = _per_client(client_for, AsyncOpenAITransport)
        guard = AsyncGuard(config=config, tier_transport=transports, **options)
    else:
        guard = Guard(
            config=config, tier_transport=_per_client(client_for, OpenAITransport), **options
        )
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
