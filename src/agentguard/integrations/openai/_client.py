"""``wrap()``: an openai client whose ``chat.completions`` and ``responses`` run through a guard.

The wrapped client is a copy of the user's, still an instance of its class; its ``create``,
``parse`` and ``stream`` methods build a neutral request, run it through the guard and hand
back the SDK's own objects (rebuilt only when the guard changed the answer), the report
attached. ``with_raw_response`` / ``with_streaming_response`` are the SDK's own wrappers around
the guarded resources (see ``_raw``); ``beta.chat`` is the guarded ``chat``. Whatever else the
client has passes through to it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from agentguard.config import GuardConfig
from agentguard.guard import AsyncGuard, Guard, GuardReport
from agentguard.integrations._chat import changed
from agentguard.integrations._tiers import NO_KEY, origin, tier_api_key
from agentguard.transport import (
    ModelRequest,
    ModelResponse,
    attach_report,
    register_secret,
    report_of,
)
from agentguard.types import Tier

from ._events import AsyncResponsesStream, ResponsesStream
from ._raw import AsyncStreamedResponse, RawResponse, StreamedResponse, raw_mode
from ._responses import request_from_responses, response_from_responses, responses_output
from ._stream import AsyncStream, Stream
from ._structured import AsyncStreamManager, StreamManager, parsed, parsed_response
from ._transport import (
    CALLER,
    CLIENT,
    PARSE,
    RAW,
    AnsweredWithError,
    AsyncOpenAITransport,
    OpenAITransport,
    RawCall,
    choice_of,
    dump,
    finish_of,
    is_async_client,
    reported_error,
    sdk_message,
)

__all__ = ["wrap"]

T = TypeVar("T")


def _request(
    kwargs: Mapping[str, Any],
    *,
    responses: bool = False,
    extensions: Mapping[str, Any] | None = None,
) -> ModelRequest:
    """The neutral request of a ``create`` call (a session header stays in its headers: the
    guard reads it and never sends it upstream)."""
    params = dict(kwargs)
    headers = dict(params.pop("extra_headers", None) or {})
    given = "timeout" in params
    timeout = params.pop("timeout", None)
    if (given and timeout is None) or (
        timeout is not None and not isinstance(timeout, (int, float))
    ):  # no timeout at all (``None``), an httpx Timeout (or the SDK's NOT_GIVEN): as sent
        params["timeout"] = timeout
    for key in ("extra_query", "extra_body"):
        if params.get(key) is None:
            params.pop(key, None)
    if responses:
        base = request_from_responses(params)
    else:
        if params.get("stream"):  # an explicit ``stream=False`` goes upstream as sent
            del params["stream"]
        model = params.pop("model")
        messages = _plain_messages(params.pop("messages"))
        base = ModelRequest(model=str(model), messages=messages, params=params)
    seconds = float(timeout) if isinstance(timeout, (int, float)) else None
    # the caller's own messages, told from those the guard adds (see _transport._sanitised)
    caller = frozenset(id(m) for m in base.messages)
    extensions = {**base.extensions, **(extensions or {}), CALLER: caller}
    return dataclasses.replace(base, headers=headers, timeout=seconds, extensions=extensions)


def _plain_messages(messages: Iterable[Any]) -> list[Any]:
    """A chat call's ``messages`` as a new list, the SDK's objects in it as the data the SDK
    sends for them.

    An agent loop appends the answer's message object itself (``messages.append(
    response.choices[0].message)``, as OpenAI's guide does), or its ``tool_calls`` objects in a
    dict of its own; the SDK serialises them (``model_dump(exclude_unset=True, mode="json")``),
    so the guard reads them as that data, which goes upstream as the same JSON. A history of
    plain dicts is checked by one class test per message (and per call of a message with
    calls), nothing copied but the list.
    """
    out = list(messages)
    for i, message in enumerate(out):
        if message.__class__ is dict:
            calls = message.get("tool_calls")
            if calls.__class__ is not list or all(c.__class__ is dict for c in calls):
                continue
        out[i] = _plain(message)
    return out


def _plain(value: Any) -> Any:
    """``value`` with every SDK (pydantic) object in it dumped as the SDK sends it; the same
    object when it holds none."""
    if isinstance(value, Mapping):
        items = {k: _plain(v) for k, v in value.items()}
        same = value.__class__ is dict and all(items[k] is v for k, v in value.items())
        return value if same else items
    if isinstance(value, (list, tuple)):
        entries = [_plain(v) for v in value]
        return value if all(a is b for a, b in zip(entries, value, strict=True)) else entries
    dump_of = getattr(value, "model_dump", None)
    if callable(dump_of) and not isinstance(value, type):
        exclude = getattr(value, "__api_exclude__", None)
        return dump_of(mode="json", exclude_unset=True, exclude=exclude, warnings=False)
    return value


def _rebuild(raw: Any, data: Mapping[str, Any]) -> Any:
    """An SDK object of ``raw``'s type from changed data, built as leniently as the SDK parses
    (servers other than OpenAI's omit fields its types call required)."""
    return type(raw).construct(**data)


def _responses_result(response: ModelResponse, report: GuardReport | None) -> Any:
    """The Responses SDK object to hand back, rebuilt if the guard changed the answer."""
    raw = response.raw
    if raw is None or not hasattr(raw, "output"):
        return raw
    if getattr(raw, "status", None) == "failed":  # the upstream's failure, as it answered
        if report is not None:
            attach_report(raw, report)
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


def _completion(
    response: ModelResponse,
    report: GuardReport | None,
    guard: Guard | AsyncGuard,
    request: ModelRequest,
) -> Any:
    """The SDK object to hand back: the upstream one, rebuilt if the guard changed the message;
    unchanged (the report marked ``fail_open``) when the guard could not read its message."""
    raw = response.raw
    choice = choice_of(raw)
    original = sdk_message(getattr(choice, "message", None))
    if original is None:
        if reported_error(raw) is None:
            return _unread(raw, report, guard, request)
        if report is not None:  # the upstream's error object, as the raw client returns it
            attach_report(raw, report)
        return raw
    if _same_message(original, response.message, finish_of(choice), response.finish_reason):
        out = raw
    else:
        data = dict(dump(raw))
        first = data["choices"][0]
        message = dict(response.message)
        # tool calls the guard does not judge (``custom`` ...) stay in the answer
        others = [
            c
            for c in (first.get("message") or {}).get("tool_calls") or ()
            if isinstance(c, Mapping) and c.get("type") not in (None, "function")
        ]
        if others:
            message["tool_calls"] = [*(message.get("tool_calls") or ()), *others]
        data["choices"] = [
            {**first, "message": message, "finish_reason": response.finish_reason},
            *data["choices"][1:],  # the other choices (n > 1) pass through unchanged
        ]
        out = _rebuild(raw, data)
    if report is not None:
        attach_report(out, report)
    return out


class UnreadableAnswer(Exception):
    """What the guard could not read (an answer without a message object, a request whose
    ``messages`` is no list): it judged nothing and let the call through (fail-open)."""


def _unread(
    raw: Any, report: GuardReport | None, guard: Guard | AsyncGuard, request: ModelRequest
) -> Any:
    """An answer whose message the guard could not read (a null or array body, ``choices`` an
    object or ``[null]``, ``message: null`` ...): nothing was judged, so it fails open: the
    SDK's own object, exactly as the raw client returns it, the report marked ``fail_open``
    (under ``fail_mode: closed``, a :class:`~agentguard.GuardFailure`)."""
    fault = UnreadableAnswer(f"the answer has no message the guard can read ({type(raw).__name__})")
    opened = guard._fail_open(request, None, fault, "openai")
    attach_report(raw, dataclasses.replace(report or opened, fail_open=True))
    return raw


def _readable(kwargs: Mapping[str, Any]) -> bool:
    """Whether the guard can read a chat call's conversation (``messages`` a list of messages,
    or another iterable of them: the SDK takes any); a string, an object, a number it cannot."""
    messages = kwargs.get("messages")
    return isinstance(messages, Iterable) and not isinstance(messages, (str, bytes, Mapping))


def _unguarded(
    method: Any, inner: Any, guard: Guard | AsyncGuard, kwargs: Mapping[str, Any]
) -> Any:
    """A call the guard cannot read, made as the raw client makes it (fail-open), or refused
    with a :class:`~agentguard.GuardFailure` under ``fail_mode: closed``."""
    fault = UnreadableAnswer(f"messages is a {type(kwargs.get('messages')).__name__}, not a list")
    request = ModelRequest(model=str(kwargs.get("model")), messages=[])
    report = guard._fail_open(request, None, fault, "openai")
    out = method(inner, **kwargs)
    if inspect.isawaitable(out):
        return _attached(out, report)
    attach_report(out, report)
    return out


async def _attached(answer: Any, report: GuardReport) -> Any:
    out = await answer
    attach_report(out, report)
    return out


def _check_arguments(method: Any, kwargs: Mapping[str, Any]) -> None:
    """Raise the SDK's own ``TypeError`` for a call its signature refuses (no ``model`` or no
    ``messages``), before the guard reads the call."""
    if "model" in kwargs and "messages" in kwargs:
        return
    inspect.signature(method).bind(None, **kwargs)  # the SDK's TypeError, in its words
    missing = [k for k in ("messages", "model") if k not in kwargs]
    raise TypeError(f"Missing required arguments: {', '.join(map(repr, missing))}")


def _same_message(a: Mapping[str, Any], b: Mapping[str, Any], fa: Any, fb: Any) -> bool:
    return fa == fb and not changed(a, b)


def _guarded(guard: Guard, request: ModelRequest) -> tuple[ModelResponse, GuardReport | None]:
    try:
        response = guard.complete(request)
    except AnsweredWithError as exc:  # the last answer was the upstream's error object
        return _as_answered(exc)
    return response, report_of(response)


async def _aguarded(
    guard: AsyncGuard, request: ModelRequest
) -> tuple[ModelResponse, GuardReport | None]:
    try:
        response = await guard.acomplete(request)
    except AnsweredWithError as exc:  # as in _guarded
        return _as_answered(exc)
    return response, report_of(response)


def _as_answered(exc: AnsweredWithError) -> tuple[ModelResponse, GuardReport | None]:
    """The upstream's error object, handed back as it answered (see ``_completion``)."""
    response = ModelResponse(message={"role": "assistant", "content": None}, raw=exc.answer)
    return response, exc.agentguard_report


def _call(
    kwargs: Mapping[str, Any], copy: Any, *, responses: bool = False, parse: bool = False
) -> tuple[str | None, RawCall | None, ModelRequest]:
    """A call's raw-response mode, where its upstream raw response goes, and its request (made
    on ``copy``, a copy of the wrapped client, unless ``None``)."""
    mode = raw_mode(kwargs.get("extra_headers"))
    raw = RawCall(wire=mode == "stream") if mode or kwargs.get("stream") else None
    extensions: dict[str, Any] = {} if copy is None else {CLIENT: copy}
    if raw is not None:
        extensions[RAW] = raw
    if parse:
        extensions[PARSE] = True
    return mode, raw, _request(kwargs, responses=responses, extensions=extensions)


def _served(
    mode: str | None, raw: RawCall | None, answer: Any, *, changed: bool, asynchronous: bool
) -> Any:
    """What the caller gets: the answer, or the raw response its raw-response mode asked for.

    ``changed``: whether a whole answer is not the upstream's (its body is then the answer's
    JSON); a stream's body tells the upstream's chunks from the guard's chunk by chunk (see
    ``_raw``)."""
    if mode is None or raw is None:
        return answer
    if mode == "stream":
        cls = AsyncStreamedResponse if asynchronous else StreamedResponse
        return cls(raw, answer, changed=changed)
    return RawResponse(raw, answer, changed=changed)


class _Resource:
    """A guarded resource: the SDK's raw-response wrappers around it, the rest the client's.

    ``copy``: the copy of the wrapped client it belongs to (``None``: the wrapped client), whose
    options its calls go out with (see ``_tier_client``).
    """

    def __init__(self, inner: Any, copy: Any) -> None:
        self._inner = inner
        self._copy = copy

    @functools.cached_property
    def with_raw_response(self) -> Any:
        """The SDK's ``with_raw_response`` around this guarded resource."""
        return type(self._inner.with_raw_response)(self)

    @functools.cached_property
    def with_streaming_response(self) -> Any:
        """The SDK's ``with_streaming_response`` around this guarded resource."""
        return type(self._inner.with_streaming_response)(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Completions(_Resource):
    """``client.chat.completions`` of a sync client: ``create``, ``parse`` and ``stream``."""

    def __init__(self, inner: Any, guard: Guard, copy: Any) -> None:
        super().__init__(inner, copy)
        self._guard = guard

    def create(self, **kwargs: Any) -> Any:
        _check_arguments(type(self._inner).create, kwargs)
        if not _readable(kwargs):
            return _unguarded(type(self._inner).create, self._inner, self._guard, kwargs)
        mode, raw, request = _call(kwargs, self._copy)
        if kwargs.get("stream"):
            stream = Stream(self._guard.stream(request), request.model, raw)
            # the call starts now, as the SDK's does: an upstream error is raised here, and
            # the upstream's response (its status and headers) exists once this returns
            stream.prime()
            return _served(mode, raw, stream, changed=True, asynchronous=False)
        response, report = _guarded(self._guard, request)
        out = _completion(response, report, self._guard, request)
        return _served(mode, raw, out, changed=out is not response.raw, asynchronous=False)

    def parse(self, **kwargs: Any) -> Any:
        _check_arguments(type(self._inner).parse, kwargs)
        if not _readable(kwargs):
            return _unguarded(type(self._inner).parse, self._inner, self._guard, kwargs)
        mode, raw, request = _call(kwargs, self._copy, parse=True)
        response, report = _guarded(self._guard, request)
        out = parsed(
            _completion(response, report, self._guard, request), kwargs, report, self._guard.config
        )
        return _served(mode, raw, out, changed=True, asynchronous=False)

    def stream(self, **kwargs: Any) -> Any:
        return StreamManager(type(self._inner).stream(self, **kwargs))


class _AsyncCompletions(_Resource):
    """``client.chat.completions`` of an async client: ``create``, ``parse`` and ``stream``."""

    def __init__(self, inner: Any, guard: AsyncGuard, copy: Any) -> None:
        super().__init__(inner, copy)
        self._guard = guard

    async def create(self, **kwargs: Any) -> Any:
        _check_arguments(type(self._inner).create, kwargs)
        if not _readable(kwargs):
            return await _unguarded(type(self._inner).create, self._inner, self._guard, kwargs)
        mode, raw, request = _call(kwargs, self._copy)
        if kwargs.get("stream"):
            stream = AsyncStream(self._guard.astream(request), request.model, raw)
            await stream.prime()  # (the call starts now: see _Completions.create)
            return _served(mode, raw, stream, changed=True, asynchronous=True)
        response, report = await _aguarded(self._guard, request)
        out = _completion(response, report, self._guard, request)
        return _served(mode, raw, out, changed=out is not response.raw, asynchronous=True)

    async def parse(self, **kwargs: Any) -> Any:
        _check_arguments(type(self._inner).parse, kwargs)
        if not _readable(kwargs):
            return await _unguarded(type(self._inner).parse, self._inner, self._guard, kwargs)
        mode, raw, request = _call(kwargs, self._copy, parse=True)
        response, report = await _aguarded(self._guard, request)
        out = parsed(
            _completion(response, report, self._guard, request), kwargs, report, self._guard.config
        )
        return _served(mode, raw, out, changed=True, asynchronous=True)

    def stream(self, **kwargs: Any) -> Any:
        return AsyncStreamManager(type(self._inner).stream(self, **kwargs))


class _Responses(_Resource):
    """``client.responses`` of a sync client: ``create`` (streamed too) and ``stream``."""

    def __init__(self, inner: Any, guard: Guard, copy: Any) -> None:
        super().__init__(inner, copy)
        self._guard = guard

    def create(self, **kwargs: Any) -> Any:
        mode, raw, request = _call(kwargs, self._copy, responses=True)
        if raw is not None and kwargs.get("stream"):
            stream = ResponsesStream(self._guard.stream(request), raw)
            stream.prime()  # (the call starts now: see _Completions.create)
            return _served(mode, raw, stream, changed=True, asynchronous=False)
        response, report = _guarded(self._guard, request)
        out = _responses_result(response, report)
        return _served(mode, raw, out, changed=out is not response.raw, asynchronous=False)

    def parse(self, **kwargs: Any) -> Any:
        mode, raw, request = _call(kwargs, self._copy, responses=True, parse=True)
        response, report = _guarded(self._guard, request)
        result = _responses_result(response, report)
        out = parsed_response(result, kwargs, report, self._guard.config)
        return _served(mode, raw, out, changed=True, asynchronous=False)

    def stream(self, **kwargs: Any) -> Any:
        return StreamManager(type(self._inner).stream(self, **kwargs))


class _AsyncResponses(_Resource):
    """``client.responses`` of an async client: ``create`` (streamed too) and ``stream``."""

    def __init__(self, inner: Any, guard: AsyncGuard, copy: Any) -> None:
        super().__init__(inner, copy)
        self._guard = guard

    async def create(self, **kwargs: Any) -> Any:
        mode, raw, request = _call(kwargs, self._copy, responses=True)
        if raw is not None and kwargs.get("stream"):
            stream = AsyncResponsesStream(self._guard.astream(request), raw)
            await stream.prime()  # (the call starts now: see _Completions.create)
            return _served(mode, raw, stream, changed=True, asynchronous=True)
        response, report = await _aguarded(self._guard, request)
        out = _responses_result(response, report)
        return _served(mode, raw, out, changed=out is not response.raw, asynchronous=True)

    async def parse(self, **kwargs: Any) -> Any:
        mode, raw, request = _call(kwargs, self._copy, responses=True, parse=True)
        response, report = await _aguarded(self._guard, request)
        result = _responses_result(response, report)
        out = parsed_response(result, kwargs, report, self._guard.config)
        return _served(mode, raw, out, changed=True, asynchronous=True)

    def stream(self, **kwargs: Any) -> Any:
        return AsyncStreamManager(type(self._inner).stream(self, **kwargs))


class _Chat:
    def __init__(self, inner: Any, completions: Any) -> None:
        self._inner = inner
        self.completions = completions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Beta:
    """``client.beta``: its ``chat`` (the chat completions API again) is the guarded one."""

    def __init__(self, inner: Any, chat: _Chat) -> None:
        self._inner = inner
        self.chat = chat

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def wrap(client: Any, config: GuardConfig | None = None, **options: Any) -> Any:
    """Put the guard in front of an openai client; see :func:`agentguard.wrap`."""
    register_secret(getattr(client, "api_key", None))  # sent with every request
    wrapped = client.with_options()  # the user's client itself is left as it is
    guard: Guard | AsyncGuard
    if is_async_client(client):
        transports = _per_endpoint(wrapped, AsyncOpenAITransport)
        guard = AsyncGuard(config=config, tier_transport=transports, **options)
    else:
        guard = Guard(
            config=config, tier_transport=_per_endpoint(wrapped, OpenAITransport), **options
        )
    return _install(wrapped, guard, copied=False)


def guard_of(client: Any) -> Guard | AsyncGuard | None:
    """The guard of a client :func:`wrap` made (or of a copy of one); ``None`` for any other."""
    chat = vars(client).get("chat") if hasattr(client, "__dict__") else None
    guard = getattr(getattr(chat, "completions", None), "_guard", None)
    return guard if isinstance(guard, (Guard, AsyncGuard)) else None


def _per_endpoint(wrapped: Any, make: Callable[..., T]) -> Callable[[Tier], T]:
    """A tier's transport, made once per endpoint (tiers with one endpoint share a client):
    over the wrapped client's client for it, and the same for a call made on a copy."""
    made: dict[tuple[str | None, str | None], T] = {}

    def transport_for(tier: Tier) -> T:
        transport = made.get(tier.endpoint)
        if transport is None:
            derive = functools.partial(_tier_client, tier=tier)
            transport = made[tier.endpoint] = make(
                derive(wrapped), derive=derive, max_retries=wrapped.max_retries
            )
        return transport

    return transport_for


#: Where a guarded client (the wrapped one, a copy) keeps the clients its calls go out with.
_CLIENTS = "_agentguard_clients"


def _tier_client(source: Any, tier: Tier) -> Any:
    """The client a call to ``tier`` made on ``source`` (the wrapped client or a copy of it)
    goes out with: ``source``'s options (URL, headers, query, timeout, key), the tier's own
    ``base_url`` and key on top, the SDK's retries off (the guard's are the only ones).

    Made once per endpoint and kept on ``source`` (copying a client is not free), so it lives as
    long as ``source`` does. ``source``'s ``copy`` is the SDK's own, not the guarded one.
    """
    clients: dict[tuple[str | None, str | None], Any] = source.__dict__.setdefault(_CLIENTS, {})
    made = clients.get(tier.endpoint)
    if made is None:
        overrides: dict[str, Any] = {}
        if tier.base_url:
            overrides["base_url"] = tier.base_url
        api_key = tier_api_key(tier)
        if api_key:
            overrides["api_key"] = api_key
        elif tier.base_url and origin(tier.base_url) != origin(source.base_url):
            overrides["api_key"] = NO_KEY  # the client's key is for its own endpoint
        made = type(source).copy(source, max_retries=0, **overrides)
        clients[tier.endpoint] = made
    return made


def _install(client: Any, guard: Guard | AsyncGuard, *, copied: bool) -> Any:
    """Guard ``client`` in place (a fresh copy of the user's client) and keep it guarded on copy.

    ``copied``: ``client`` is a copy of the wrapped client (``with_options()``, ``copy()``): its
    calls go out with its own options, through the same guard (one ledger, one set of sessions
    and breakers).
    """
    copy_of = client if copied else None
    inner_chat = client.chat
    responses: Any
    if isinstance(guard, AsyncGuard):
        completions: Any = _AsyncCompletions(inner_chat.completions, guard, copy_of)
        responses = _AsyncResponses(client.responses, guard, copy_of)
    else:
        completions = _Completions(inner_chat.completions, guard, copy_of)
        responses = _Responses(client.responses, guard, copy_of)
    client.__dict__["chat"] = _Chat(inner_chat, completions)
    client.__dict__["responses"] = responses
    beta = getattr(client, "beta", None)
    if beta is not None and hasattr(beta, "chat"):  # beta.chat.completions: the same API
        client.__dict__["beta"] = _Beta(beta, _Chat(beta.chat, completions))
    original_copy = client.copy

    def copy(*args: Any, **kwargs: Any) -> Any:
        copied = original_copy(*args, **kwargs)  # the SDK's: options accumulate copy on copy
        register_secret(getattr(copied, "api_key", None))  # a new key: as wrap() does
        return _install(copied, guard, copied=True)

    client.__dict__["copy"] = copy
    client.__dict__["with_options"] = copy
    client.__dict__["_agentguard_guard"] = guard
    return client
