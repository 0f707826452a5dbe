"""The openai client as a model transport (openai 2.x on httpx and 3.x on httpx2, sync and async).

The transports call ``chat.completions.create`` (or ``responses.create`` for a request built
from a Responses call) on a copy of the user's client whose own retries are off
(``max_retries=0``): agentguard's retry layer is the only one, so retries never multiply. The
call the guard lets through unguarded when it fails open (``UNGUARDED``) keeps the caller's own
``max_retries``: nobody else retries it. Upstream errors are the SDK's own exceptions, passed
through untouched.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from agentguard.exceptions import ModelError
from agentguard.integrations._lazy import require
from agentguard.transport import (
    UNGUARDED,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    reasoning_of,
)
from agentguard.types import Usage

from ._responses import (
    chunk_of_event,
    failed_error,
    is_responses,
    read_usage,
    response_from_responses,
    responses_body,
)
from ._wire import Wire

__all__ = [
    "CALLER",
    "CLIENT",
    "PARSE",
    "RAW",
    "STARTED",
    "AsyncOpenAITransport",
    "OpenAITransport",
    "RawCall",
    "choice_of",
    "dump",
    "finish_of",
    "is_async_client",
    "sdk_message",
]

#: The ``ModelRequest.extensions`` key of a :class:`RawCall`: every streamed call of a wrapped
#: client, and every call made through ``with_raw_response`` / ``with_streaming_response``.
RAW = "agentguard.openai.raw"
#: The ``ModelRequest.extensions`` key of a ``parse`` call (chat completions or Responses).
PARSE = "agentguard.openai.parse"
#: What a streamed attempt yields first, once the upstream has answered (its status and headers
#: are in) and before its first chunk: a keep-alive to the guard (a chunk with a comment passes
#: through untouched and is no part of the answer), by which the wrapped client's ``create``
#: knows the call has started, as the SDK's ``create`` returns then (see ``Stream.prime``).
STARTED = StreamChunk(comment="")
#: The ``ModelRequest.extensions`` key of the ids of the caller's own messages: the others are
#: the guard's (corrections), whose text it took from an answer and sanitises before re-sending.
CALLER = "agentguard.openai.caller"
#: The ``ModelRequest.extensions`` key of the copy (``with_options()`` / ``copy()``) of a wrapped
#: client a call was made on: it goes out with that copy's options, not the transport's client's.
CLIENT = "agentguard.openai.client"


class RawCall:
    """What the transport saw of the upstream, for the wrapped client to hand on.

    ``response``: the upstream's raw response (``LegacyAPIResponse`` or ``APIResponse``:
    headers, status, request id) of a call made through ``with_raw_response`` or
    ``with_streaming_response``; the last attempt's, which is the one whose answer is served.
    ``chunk``: the last chunk a streamed call received (what the chunks the guard makes are
    dated by). ``chunks``: every chunk of the last streamed chat attempt, in order, each with
    its neutral reading (what the wrapped client's stream hands on where the guard changed
    nothing). ``events``: every event of the last streamed Responses attempt, in order.
    ``http``: the upstream's HTTP response of the last streamed attempt made without a
    raw-response mode (what the SDK's stream gives as its ``response``: status, headers).

    With ``wire`` (a stream made through ``with_streaming_response``), the upstream's bytes of
    each streamed object too, as sent (:meth:`bytes_of`), and the last streamed attempt's
    :class:`~agentguard.integrations.openai._wire.Wire` (:attr:`wire`: its bytes after the last
    object's).
    """

    __slots__ = ("_sent", "chunk", "chunks", "events", "http", "response", "wire")

    def __init__(self, *, wire: bool = False) -> None:
        self.response: Any = None
        self.http: Any = None
        self.chunk: Any = None
        self.chunks: list[tuple[Any, StreamChunk]] = []
        self.events: list[Any] = []
        self.wire: Wire | None = None
        # id of a streamed object -> (it, its bytes, its attempt's recorder, its count there)
        self._sent: dict[int, tuple[Any, bytes | None, Wire, int]] | None = {} if wire else None

    def record(self, stream: Any) -> None:
        """Record the bytes of a new streamed attempt's SDK ``stream`` (before it is read), if
        this call keeps them (the SDK's stream decodes them with its ``_decoder``)."""
        self.wire = None
        decoder = getattr(stream, "_decoder", None)
        if self._sent is not None and decoder is not None:
            self.wire = stream._decoder = Wire(decoder)

    def received(self, obj: Any) -> None:
        """The current attempt's stream yielded ``obj``: its bytes are the last read."""
        wire = self.wire
        if wire is not None and self._sent is not None:
            self._sent[id(obj)] = (obj, wire.take(), wire, wire.count)

    def bytes_of(self, obj: Any) -> tuple[bytes, Wire, int] | None:
        """The upstream's bytes of a streamed object (once), its attempt's recorder and its
        count there; ``None`` for an object not the upstream's as it came (or not recorded)."""
        sent = self._sent.pop(id(obj), None) if self._sent is not None else None
        if sent is None or sent[0] is not obj or sent[1] is None:
            return None
        return sent[1], sent[2], sent[3]


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
    request = _sanitised(request)
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


def _sanitised(request: ModelRequest) -> ModelRequest:
    """``request`` with lone surrogates replaced in the messages the guard added.

    A correction re-sends text the upstream answered with (a tool name, content); JSON lets an
    answer carry a lone surrogate the SDK decodes but cannot encode again, so the guard's own
    messages are made encodable. The caller's messages go out as given (what the raw client
    cannot send, the guarded one does not send either).
    """
    caller = request.extensions.get(CALLER)
    if not isinstance(caller, frozenset):
        return request
    messages = request.messages
    out = [m if id(m) in caller else _encodable(m) for m in messages]
    if all(a is b for a, b in zip(out, messages, strict=True)):
        return request
    return dataclasses.replace(request, messages=out)


def _encodable(value: Any) -> Any:
    """``value`` (JSON-like data) with every lone surrogate in its strings replaced by U+FFFD;
    ``value`` itself when it has none. Iterative: a deep value costs no recursion."""
    if isinstance(value, str):
        return _clean(value)
    if not isinstance(value, (dict, list)):
        return value
    # (container, copy) pairs: copies are made first, filled in as the walk reaches them
    root: Any = _shallow(value)
    stack: list[tuple[Any, Any]] = [(value, root)]
    changed = False
    while stack:
        source, copy = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in items:
            new_key = _clean(key) if isinstance(key, str) else key
            if new_key is not key:
                changed = True
                if isinstance(copy, dict):
                    del copy[key]
            if isinstance(item, str):
                new: Any = _clean(item)
                changed = changed or new is not item
            elif isinstance(item, (dict, list)):
                new = _shallow(item)
                stack.append((item, new))
            else:
                new = item
            copy[new_key] = new
    return root if changed else value


def _shallow(value: dict[Any, Any] | list[Any]) -> dict[Any, Any] | list[Any]:
    return dict(value) if isinstance(value, dict) else list(value)


def _clean(text: str) -> str:
    """``text`` with lone surrogates replaced (``text`` itself when it has none)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def dump(obj: Any) -> dict[str, Any]:
    """An SDK object as JSON-ready data (a field holding what its type does not describe, which
    the SDK accepts from lenient servers, is dumped as it is, without pydantic's warning)."""
    data: dict[str, Any] = obj.model_dump(mode="json", warnings=False)
    return data


def _watch(request: ModelRequest, holder: Any) -> Callable[[Any], StreamChunk]:
    """What turns one streamed SDK object into a neutral chunk, noting in ``holder`` (if
    any) what the wrapped client hands on: for chat, every chunk of this attempt and the last
    one; for Responses, every event of this attempt."""
    if is_responses(request):
        calls: dict[int, int] = {}
        events: list[Any] = []
        if isinstance(holder, RawCall):
            holder.events = events

        def event(raw: Any) -> StreamChunk:
            events.append(raw)
            if isinstance(holder, RawCall):
                holder.received(raw)
            return chunk_of_event(raw, calls)

        return event
    if not isinstance(holder, RawCall):
        return _chunk
    chunks: list[tuple[Any, StreamChunk]] = []
    holder.chunks = chunks

    def chunk(raw: Any) -> StreamChunk:
        holder.chunk = raw
        holder.received(raw)
        neutral = _chunk(raw)
        chunks.append((raw, neutral))
        return neutral

    return chunk


def _started(holder: Any) -> None:
    """A new streamed attempt: no upstream response yet (an earlier attempt's is not its)."""
    if isinstance(holder, RawCall):
        holder.http = holder.response = holder.wire = None


def _recorded(holder: Any, stream: Any) -> Any:
    """``stream`` (the SDK's), its bytes recorded if ``holder`` keeps them."""
    if isinstance(holder, RawCall):
        holder.record(stream)
    return stream


def _is_raw(result: Any) -> bool:
    """Whether an endpoint returned the SDK's raw response (the call carried its raw header)."""
    return hasattr(result, "http_response") and callable(getattr(result, "parse", None))


def _unwrap(request: ModelRequest, result: Any) -> Any:
    """The SDK object of an endpoint's result; a raw response is kept for the caller, parsed."""
    holder = request.extensions.get(RAW)
    if not _is_raw(result):
        if isinstance(holder, RawCall):  # a stream's HTTP response, as the SDK's stream has it
            holder.http = getattr(result, "response", None)
        return result
    if isinstance(holder, RawCall):
        holder.response = result
    return result.parse()


async def _aunwrap(request: ModelRequest, result: Any) -> Any:
    """Async twin of :func:`_unwrap` (an async client's streamed response parses async)."""
    parsed = _unwrap(request, result)
    return await parsed if inspect.isawaitable(parsed) else parsed


def _response(request: ModelRequest, raw: Any) -> ModelResponse:
    if is_responses(request):
        # a body that is no object (null, an array) has nothing to read: an empty answer
        if callable(getattr(raw, "model_dump", None)):
            body = dump(raw)
            failed = failed_error(body)
            if failed is not None:  # ``status: "failed"``: the upstream's error, in a 200
                raise AnsweredWithError(raw, failed, request.model)
            return response_from_responses(body, raw=raw)
        return dataclasses.replace(response_from_responses({}), raw=raw)
    choice = choice_of(raw)
    if choice is None:
        error = reported_error(raw)
        if error is not None:
            raise AnsweredWithError(raw, error, request.model)
    message = sdk_message(getattr(choice, "message", None))
    return ModelResponse(
        # an answer the guard cannot read is judged as an empty one (the client hands it
        # back unchanged, the report marked fail_open): never a crash in the transport
        message=message or {"role": "assistant", "content": None},
        finish_reason=finish_of(choice),
        usage=_usage(getattr(raw, "usage", None)),
        model=_text(getattr(raw, "model", None)) or "",
        id=_text(getattr(raw, "id", None)),
        raw=raw,
    )


# Everything below reads the SDK's objects as the lenient servers make them: the SDK builds
# its models without validation (a field may hold a string, a dict, None, a list ...), so
# every field is read with getattr and checked, never trusted. Reading the few fields the
# pipeline needs is also several times cheaper than model_dump(), which serialises every
# field of every nested model on every call and chunk.


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def finish_of(choice: Any) -> str | None:
    """A choice's ``finish_reason`` as the guard reads it (``None`` when it is not text)."""
    return _text(getattr(choice, "finish_reason", None))


class AnsweredWithError(ModelError):
    """A chat answer (HTTP 200) whose body is an error object, ``{"error": {...}}``, and no
    choices: gateways (OpenRouter, LiteLLM's proxy) report a provider's failure so; or a
    Responses API answer whose ``status`` is ``"failed"`` (its ``error``). It has no
    status of its own: the guard classifies it by its error object (``body``, as an SDK error
    raised from a stream's error event) and retries it as the upstream error it reports; when
    it is the last answer, the caller gets :attr:`answer`, the SDK's object, as the raw client
    returns it.

    Attributes:
        answer: the SDK's completion object, as the upstream answered.
        body: the error object (read by the classifier, as an SDK error's ``body``).
    """

    def __init__(self, answer: Any, error: Mapping[str, Any], model: str) -> None:
        super().__init__(
            "the upstream answered with an error object", status_code=None, model=model
        )
        self.answer = answer
        self.body = error


def reported_error(raw: Any) -> Mapping[str, Any] | None:
    """The error object of an SDK completion that has no choices, else ``None``."""
    if choice_of(raw) is not None:
        return None
    error = getattr(raw, "error", None)
    return error if isinstance(error, Mapping) else None


def choice_of(raw: Any) -> Any:
    """The first choice of an SDK completion (or chunk), or ``None`` when ``choices`` is not a
    list (a null or array body, ``choices`` an object) or its first item is ``None``."""
    choices = getattr(raw, "choices", None)
    if not isinstance(choices, list) or not choices:
        return None
    return choices[0]


def sdk_message(msg: Any) -> dict[str, Any] | None:
    """An SDK assistant message as the pipeline's dict (its function calls only: a ``custom``
    tool call is not the guard's to judge and passes through), or ``None`` when there is no
    message object to read (``message: null``, a string ...)."""
    if msg is None or isinstance(msg, (str, int, float, list, Mapping)):
        return None
    role = getattr(msg, "role", None)
    message: dict[str, Any] = {
        "role": role if isinstance(role, str) and role else "assistant",
        "content": getattr(msg, "content", None),
    }
    reasoning = reasoning_of(msg)  # a server's extra field: judged like the text
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    calls = getattr(msg, "tool_calls", None)
    if calls:
        out: list[Any] = []
        for call in calls if isinstance(calls, list) else [calls]:
            if not _is_function_call(call):
                continue
            fn = getattr(call, "function", None)
            out.append(
                {
                    **_extra(call),
                    "id": getattr(call, "id", None),
                    "type": "function",
                    "function": {
                        "name": getattr(fn, "name", None),
                        "arguments": getattr(fn, "arguments", None),
                    },
                }
            )
        if out:
            message["tool_calls"] = out
    return message


def _is_function_call(call: Any) -> bool:
    """Whether an SDK tool call is a function call (``custom`` and other types are not; a call
    without a type is taken for one when it carries a function, as the SDK reads it)."""
    kind = getattr(call, "type", None)
    if kind is None:
        return getattr(call, "function", None) is not None
    return bool(kind == "function")


def _usage(usage: Any) -> Usage | None:
    """The usage an SDK object reports; ``None`` (the guard estimates) when it is absent or
    not counts: a string, ``Infinity``, ``NaN``, a negative number."""
    if usage is None or isinstance(usage, (str, int, float, list, Mapping)):
        return None
    return read_usage(
        getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    )


def _first_choice(raw: Any) -> Any:
    """A chunk's choice of the first answer: the one with ``index`` 0 (a lenient server's
    choice without a number counts as it). With ``n`` > 1 a chunk may carry only another
    answer's choice: ``None``, that chunk is not the guard's to read."""
    choices = getattr(raw, "choices", None)
    if not isinstance(choices, list):
        return None
    for choice in choices:
        index = getattr(choice, "index", None)
        if index == 0 or index.__class__ is not int:
            return choice
    return None


def _chunk(raw: Any) -> StreamChunk:
    """An SDK ``ChatCompletionChunk`` as a neutral chunk (its raw object kept)."""
    usage = _usage(getattr(raw, "usage", None))
    choice = _first_choice(raw)
    if choice is None:
        return StreamChunk(usage=usage, raw=raw)
    delta = getattr(choice, "delta", None)
    calls: tuple[Mapping[str, Any], ...] = ()
    deltas = getattr(delta, "tool_calls", None)
    if deltas:
        calls = tuple(
            _call_delta(c) for c in (deltas if isinstance(deltas, list) else [deltas]) if c
        )
    return StreamChunk(
        content=getattr(delta, "content", None),
        tool_calls=calls,
        finish_reason=getattr(choice, "finish_reason", None),
        usage=usage,
        raw=raw,
        reasoning=reasoning_of(delta),
        refusal=_text(getattr(delta, "refusal", None)),
        other_output=bool(getattr(delta, "audio", None)),
    )


def _extra(obj: Any) -> dict[str, Any]:
    """The fields of an SDK object its type does not describe: a provider's own, which go back
    with it (Gemini's ``extra_content`` on a tool call holds the thought signature its API
    requires with every call of the turn)."""
    extra = getattr(obj, "model_extra", None)
    return dict(extra) if isinstance(extra, dict) else {}


def _call_delta(call: Any) -> dict[str, Any]:
    out: dict[str, Any] = {**_extra(call), "index": getattr(call, "index", None)}
    call_id = getattr(call, "id", None)
    if call_id:
        out["id"] = call_id
    kind = getattr(call, "type", None)
    if isinstance(kind, str):  # "custom": a call of another kind than a function
        out["type"] = kind
    fn = getattr(call, "function", None)
    if fn is not None:
        out["function"] = {
            "name": getattr(fn, "name", None),
            "arguments": getattr(fn, "arguments", None),
        }
    return out


def _describe(client: Any) -> dict[str, Any]:
    """The provider and server of ``client``, for telemetry (``gen_ai.provider.name`` ...):
    Azure OpenAI for an Azure client, else OpenAI, whatever server speaks its API."""
    azure = any(cls.__name__.startswith("AsyncAzure") or cls.__name__.startswith("Azure")
                for cls in type(client).__mro__)  # fmt: skip
    attrs: dict[str, Any] = {"gen_ai.provider.name": "azure.ai.openai" if azure else "openai"}
    url = getattr(client, "base_url", None)
    host = getattr(url, "host", None)
    if isinstance(host, str) and host:
        port = getattr(url, "port", None)
        if not isinstance(port, int):
            port = 443 if getattr(url, "scheme", "") == "https" else 80
        attrs["server.address"], attrs["server.port"] = host, port
    return attrs


class _Transport:
    """What both transports share: the client they call, and the client of a call made on a
    copy of a wrapped client."""

    def __init__(
        self,
        client: Any,
        *,
        derive: Callable[[Any], Any] | None = None,
        max_retries: int | None = None,
    ) -> None:
        # the caller's own retries, for the one call the guard lets through unguarded
        self._retries = getattr(client, "max_retries", 0) if max_retries is None else max_retries
        self._client = client.with_options(max_retries=0)
        self._derive = derive
        self._otel = _describe(client)

    @property
    def client(self) -> Any:
        """The retry-less client copy the transport calls."""
        return self._client

    def otel_attributes(self, request: ModelRequest) -> Mapping[str, Any]:
        """The provider and server, for telemetry (see :mod:`agentguard.telemetry`)."""
        client = self._client_for(request)
        return self._otel if client is self._client else _describe(client)

    def _client_for(self, request: ModelRequest) -> Any:
        """The client ``request`` goes out with: the one its copy of a wrapped client derives
        (``derive``), else the transport's own; for a call the guard lets through unguarded,
        a copy of it with the caller's retries (the copy's, else ``max_retries``)."""
        copy = request.extensions.get(CLIENT)
        if copy is None or self._derive is None:
            client, retries = self._client, self._retries
        else:
            client, retries = self._derive(copy), getattr(copy, "max_retries", 0)
        if retries and request.extensions.get(UNGUARDED):  # the guard failed open: the call
            return client.with_options(max_retries=retries)  # goes out as the caller's would
        return client


class OpenAITransport(_Transport):
    """A synchronous transport over an ``openai.OpenAI`` client.

    Args:
        client: the user's client; a copy with ``max_retries=0`` is used, the original is not
            changed.
        derive: for :func:`agentguard.wrap`: the client to send a call with that was made on a
            copy of the wrapped client (the request's ``CLIENT`` extension), given that copy.
        max_retries: the retries of a call the guard lets through unguarded (it failed open:
            the request's :data:`~agentguard.transport.UNGUARDED` extension); default
            ``client``'s own.
    """

    def send(self, request: ModelRequest) -> ModelResponse:
        """One ``chat.completions.create`` (or ``responses.create``) call."""
        endpoint, kwargs = _call(self._client_for(request), request, stream=False)
        return _response(request, _unwrap(request, endpoint.create(**kwargs)))

    def stream(self, request: ModelRequest) -> Iterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        endpoint, kwargs = _call(self._client_for(request), request, stream=True)
        holder = request.extensions.get(RAW)
        _started(holder)
        see = _watch(request, holder)
        with _recorded(holder, _unwrap(request, endpoint.create(**kwargs))) as stream:
            yield STARTED
            for chunk in stream:
                yield see(chunk)


class AsyncOpenAITransport(_Transport):
    """An asynchronous transport over an ``openai.AsyncOpenAI`` client.

    Args:
        client: the user's async client; a copy with ``max_retries=0`` is used.
        derive: as :class:`OpenAITransport`'s.
    """

    async def asend(self, request: ModelRequest) -> ModelResponse:
        """One ``chat.completions.create`` (or ``responses.create``) call."""
        endpoint, kwargs = _call(self._client_for(request), request, stream=False)
        return _response(request, await _aunwrap(request, await endpoint.create(**kwargs)))

    async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """One streamed ``chat.completions.create`` call, chunk by chunk."""
        endpoint, kwargs = _call(self._client_for(request), request, stream=True)
        holder = request.extensions.get(RAW)
        _started(holder)
        see = _watch(request, holder)
        stream = _recorded(holder, await _aunwrap(request, await endpoint.create(**kwargs)))
        async with stream:
            yield STARTED
            async for chunk in stream:
                yield see(chunk)
