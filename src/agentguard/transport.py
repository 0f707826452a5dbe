"""The model transport: how the pipeline talks to a model, in the spirit of httpx's transports.

A transport turns one :class:`ModelRequest` into one :class:`ModelResponse` (``send`` /
``asend``) or a stream of :class:`StreamChunk` (``stream`` / ``astream``). The pipeline only ever
sees these neutral values, so the same logic drives the openai client (2.x on httpx, 3.x on
httpx2), LiteLLM, or :class:`agentguard.testing.ScriptedModel`.

Transports report upstream failures by raising: the openai client's own exceptions, or
:class:`~agentguard.exceptions.ModelError` / :class:`~agentguard.exceptions.ModelTimeout` for
transports without an SDK of their own. Every such exception exposes ``status_code`` and
``response.headers`` (or is a ``TimeoutError``), which is what error classification reads.

This module is also everything an adapter (``agentguard.integrations.*``) needs from the core
besides the guards themselves: the values above, :func:`attach_report` / :func:`report_of`,
the session header (:data:`SESSION_HEADER`, :func:`split_session_header`), the
:data:`ORIGINAL` marker of translated messages and :func:`register_secret` (a key an adapter
sends upstream is never shown).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._fingerprint import arguments_object, fingerprint, safe_canonical_text
from ._frozen import fast_init
from ._redact import register_secret
from .types import CALL_FIELDS, Message, Usage

if TYPE_CHECKING:
    from .guard import GuardReport

__all__ = [
    "ORIGINAL",
    "SCOPE",
    "SESSION_HEADER",
    "TRACE_PARENT",
    "UNGUARDED",
    "Accumulator",
    "AsyncTransport",
    "ModelRequest",
    "ModelResponse",
    "StreamChunk",
    "Transport",
    "attach_report",
    "caller_key",
    "caller_scope",
    "message_from_items",
    "reasoning_of",
    "register_secret",
    "report_of",
    "split_session_header",
    "tool_arguments",
    "usage_from_body",
    "write_output_cap",
]

#: The request header that names a session (never sent upstream: the guard takes it off).
SESSION_HEADER = "x-agentguard-session"

#: The :attr:`ModelRequest.extensions` key an adapter sets to the caller's identity (e.g. a hash
#: of the API key a proxy was called with): conversations found without a named session are
#: never matched across scopes.
SCOPE = "agentguard.scope"

#: The :attr:`ModelRequest.extensions` key an adapter sets to where the guarded call's span
#: belongs when that is not the current OpenTelemetry context: a span (a proxy's own request
#: span), a context, or the W3C trace-context headers the caller sent (``traceparent``,
#: ``tracestate``). Only telemetry reads it; nothing of it goes upstream.
TRACE_PARENT = "agentguard.trace_parent"

#: The :attr:`ModelRequest.extensions` key the guard sets (to ``True``) on the call it lets
#: through unguarded when it fails open: a transport whose client has retries of its own (the
#: openai client's ``max_retries``, which it turns off for guarded calls, the guard being the
#: one retry layer) makes this call with them, as the caller's client would.
UNGUARDED = "agentguard.unguarded"


#: Tool-call arguments (JSON text, UTF-8 bytes, a mapping, or nothing) as a ``dict``: the one
#: argument decoder the guard itself uses. Raises ``ValueError`` for text that is not JSON and
#: ``TypeError`` for JSON that is not an object.
tool_arguments = arguments_object


def message_from_items(items: Any) -> dict[str, Any]:
    """Responses API output items (JSON data or SDK objects) as one chat-format assistant
    message: the text parts of its ``message`` items as ``content``, its ``function_call`` items
    as ``tool_calls``, the text of its ``reasoning`` items (summary, then reasoning text) as
    ``reasoning_content``, which the loop checks judge as a streamed answer's reasoning. Other
    items are not part of it; an item that cannot be read is left out."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in items if isinstance(items, (list, tuple)) else ():
        data = _item_data(item)
        if data.get("type") == "function_call":
            calls.append(
                {
                    "id": data.get("call_id") or data.get("id"),
                    "type": "function",
                    "function": {
                        "name": data.get("name", ""),
                        "arguments": data.get("arguments", ""),
                    },
                }
            )
        elif data.get("type") == "message":
            parts = data.get("content")
            for part in parts if isinstance(parts, (list, tuple)) else ():
                text = _item_data(part).get("text")
                if isinstance(text, str):
                    texts.append(text)
        elif data.get("type") == "reasoning":
            for key in ("summary", "content"):
                parts = data.get(key)
                for part in parts if isinstance(parts, (list, tuple)) else ():
                    text = _item_data(part).get("text")
                    if isinstance(text, str):
                        thoughts.append(text)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if thoughts:  # as a stream's reasoning deltas add up (see Accumulator.response)
        message["reasoning_content"] = "".join(thoughts)
    return message


def _item_data(item: Any) -> Mapping[str, Any]:
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    data = dump(warnings=False) if callable(dump) else None
    return data if isinstance(data, Mapping) else {}


_BEARER = re.compile(r"bearer[ \t]+", re.IGNORECASE)


def caller_key(header: str) -> str:
    """The API key an ``Authorization`` / ``api-key`` header value carries: without a
    ``Bearer`` scheme (any case) and the spaces around it, so one key spelled two ways is one
    caller (``Bearer K``, ``bearer  K``, ``K``); the value itself when nothing else is left."""
    key = header.strip()
    scheme = _BEARER.match(key)
    if scheme:
        key = key[scheme.end() :].strip()
    return key or header


def caller_scope(*identity: str) -> str:
    """The value for :data:`SCOPE` that names a caller by ``identity`` (an API key, a user id
    ...): a short fingerprint, so the key itself is never kept."""
    return fingerprint(["caller", *identity])[:16]


#: The key under which a message translated from another wire form (a Responses API item ...)
#: keeps the object it came from, so the transport can send an unchanged message back exactly as
#: received. Whoever changes such a message drops the key: the original no longer stands for it.
ORIGINAL = "x-agentguard-original"

# The chat-completions body fields that cap a request's output, newest first.
_CHAT_OUTPUT_KEYS = ("max_completion_tokens", "max_tokens")
_REPORT_ATTR = "_agentguard_report"


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model request in neutral (OpenAI chat) form.

    Attributes:
        model: the model name the request is for.
        messages: the conversation, OpenAI chat format.
        params: every other body parameter of the caller's wire form (``tool_choice``,
            ``temperature``, ``stream_options`` ...), passed through untouched.
        headers: extra HTTP headers for this request (never logged or reported).
        timeout: per-attempt timeout in seconds, or ``None`` for the transport's default.
        tools: the request's function tools, chat ``tools`` format.
        max_output_tokens: the cap on the answer's tokens, or ``None`` for none. Adapters read
            it from whichever wire field the caller used; each transport writes it to its own.
        extensions: per-call context of the adapter that built the request, for its transport
            (like httpx's ``Request.extensions``); the guard passes it through untouched.

    For requests built from a chat body (:meth:`from_body`, or ``params`` holding ``tools``,
    ``max_tokens`` / ``max_completion_tokens``), ``tools`` and ``max_output_tokens`` are read
    from ``params`` when not given.
    """

    model: str
    messages: Sequence[Message]
    params: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    timeout: float | None = None
    tools: Sequence[Mapping[str, Any]] = ()
    max_output_tokens: int | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        params = self.params
        if "tools" in params and not self.tools and isinstance(params["tools"], Sequence):
            # anything else (an explicit ``None``) stays in params and goes upstream as sent
            object.__setattr__(self, "tools", list(params["tools"]))
            object.__setattr__(self, "params", {k: v for k, v in params.items() if k != "tools"})
        if self.max_output_tokens is None:
            for key in _CHAT_OUTPUT_KEYS:
                value = params.get(key)
                if isinstance(value, int):
                    object.__setattr__(self, "max_output_tokens", value)
                    break

    def to_body(self, *, stream: bool = False) -> dict[str, Any]:
        """The OpenAI chat-completions JSON body for this request.

        Nothing the caller did not send is added: ``max_output_tokens`` lowers the cap where
        the caller put it (``max_tokens`` or ``max_completion_tokens``); a cap the caller did not
        ask for (the configured one) goes in ``max_completion_tokens``, the field every current
        model accepts (OpenAI's reasoning models reject ``max_tokens``). ``stream`` is only
        written when streaming; an explicit ``"stream": false`` in ``params`` is kept.
        """
        body: dict[str, Any] = {"model": self.model, "messages": list(self.messages)}
        body.update(self.params)
        if self.tools:
            body["tools"] = list(self.tools)
        write_output_cap(body, self.max_output_tokens, _CHAT_OUTPUT_KEYS, "max_completion_tokens")
        if stream:
            body["stream"] = True
        elif body.get("stream"):
            del body["stream"]
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ModelRequest:
        """Build a request from an OpenAI chat-completions JSON body."""
        params = {k: v for k, v in body.items() if k not in {"model", "messages", "stream"}}
        return cls(
            model=str(body.get("model", "")),
            messages=list(body.get("messages") or []),
            params=params,
        )


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """One complete model answer in neutral form.

    Attributes:
        message: the assistant message (OpenAI format: ``role``, ``content``, ``tool_calls``).
        finish_reason: why generation stopped (``stop``, ``tool_calls``, ``length`` ...).
        usage: token usage as reported, or ``None`` when the response carried none.
        model: the model that answered.
        id: the response id, when given.
        raw: the object the underlying client returned (e.g. an openai ``ChatCompletion``),
            which the pipeline hands back to the caller.
        headers: response headers worth keeping (never auth headers).
        report: the :class:`~agentguard.GuardReport` of a guarded call, else ``None``.
    """

    message: Mapping[str, Any]
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str = ""
    id: str | None = None
    raw: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    report: Any = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, raw: Any = None) -> ModelResponse:
        """Parse an OpenAI chat-completion JSON body (its first choice)."""
        choices = body.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], Mapping) else {}
        message = choice.get("message") or {"role": "assistant", "content": None}
        return cls(
            message=dict(message),
            finish_reason=choice.get("finish_reason"),
            usage=usage_from_body(body.get("usage")),
            model=str(body.get("model", "")),
            id=body.get("id"),
            raw=body if raw is None else raw,
        )


@fast_init  # a few built per streamed chunk
@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One streamed chunk in neutral form.

    Attributes:
        content: a content delta, if any.
        tool_calls: tool-call deltas, OpenAI format (``index``, and a partial ``id``,
            ``function.name``, ``function.arguments``).
        finish_reason: set on the chunk that ends the choice.
        usage: the usage count the chunk carries. The answer's is the one on its finish chunk
            or after it (the usage chunk: ``choices == []``, or OpenRouter's with an empty
            delta); a count before the finish is a running one (vLLM's
            ``continuous_usage_stats`` puts one on every chunk, the opening ``role`` chunk
            included): the latest is the answer's so far, and no chunk is held back for it.
        raw: the chunk object of the underlying client.
        reasoning: a reasoning delta, if any (``reasoning_content`` from llama.cpp, vLLM and
            DeepSeek, ``reasoning`` from OpenRouter and Ollama).
        refusal: a refusal delta, if any (OpenAI's ``refusal``: the model declined, an answer
            of its own, never an empty one).
        other_output: the chunk carries output that is neither text, reasoning, a refusal
            nor a function call: an audio model's speech (``delta.audio``: its transcript or
            data), a Responses API output item of another kind (a hosted tool's call, a
            generated image, a custom tool's input). An answer, though it has no text.
        comment: a keep-alive the upstream sent while the answer was on its way (the text of
            a server-sent events comment, after its ``:``, e.g. ``" OPENROUTER PROCESSING"``).
            A chunk with a comment carries nothing else: it is no part of the answer, and the
            guard hands it on at once, unread.
    """

    content: str | None = None
    tool_calls: Sequence[Mapping[str, Any]] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    raw: Any = None
    reasoning: str | None = None
    refusal: str | None = None
    other_output: bool = False
    comment: str | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, raw: Any = None) -> StreamChunk:
        """Parse one OpenAI ``chat.completion.chunk`` JSON body: the first answer's choice
        (``index`` 0, or none given). With ``n`` > 1 a chunk may carry only another answer's
        choice: then it holds nothing of the first answer."""
        choices = body.get("choices")
        delta: Mapping[str, Any] = {}
        finish = None
        for choice in choices if isinstance(choices, list) else ():
            # a dict first: the ABC's check is slow, and this runs per streamed chunk
            mapping = choice.__class__ is dict or isinstance(choice, Mapping)
            index = choice.get("index") if mapping else 1
            if index == 0 or index.__class__ is not int:  # no number: the first answer's
                found = choice.get("delta")
                delta = found if found.__class__ is dict or isinstance(found, Mapping) else {}
                finish = choice.get("finish_reason")
                break
        return cls(
            content=delta.get("content"),
            tool_calls=tuple(delta.get("tool_calls") or ()),
            finish_reason=finish,
            usage=usage_from_body(body.get("usage")),
            raw=body if raw is None else raw,
            reasoning=reasoning_of(delta),
            refusal=refusal if isinstance(refusal := delta.get("refusal"), str) else None,
            other_output=bool(delta.get("audio")),
        )


class Accumulator:
    """Assembles a streamed answer into one message (tool-call fragments joined by index): feed
    it every :class:`StreamChunk` of one answer with :meth:`add`, read it with :meth:`response`.

    Reads what the raw client reads without raising: a fragment without a usable ``index``
    continues the last call (or starts the next one when it brings a new ``id``); a name,
    arguments or content that are not text are taken as their JSON text.

    A fragment that opens a call (an ``id`` and a name) at an ``index`` a call with another
    ``id`` and a name already holds is a new call, not more of that one: Ollama and some
    OpenAI-compatible bridges stream every parallel call at ``index`` 0, which clients that
    join fragments by index alone (the openai SDK's stream helper) read as one call with
    two names and two JSON objects run together. ``split`` counts the calls read so; calls
    keep the order of their ``index``, then of their arrival.
    """

    def __init__(self) -> None:
        self.content: list[str] = []
        self.chars = 0
        self.reasoning: list[str] = []
        self.reasoning_chars = 0
        self.refusal: list[str] = []
        self.other_output = False
        self.calls: dict[tuple[int, int], dict[str, Any]] = {}
        self._open: dict[int, tuple[int, int]] = {}  # an index -> the call it continues
        self.split = 0  # calls opened at an index another call held
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.id: str | None = None

    def add(self, chunk: StreamChunk) -> None:
        if chunk.content:
            content = _streamed_text(chunk.content)
            self.content.append(content)
            self.chars += len(content)
        if chunk.reasoning:
            reasoning = _streamed_text(chunk.reasoning)
            self.reasoning.append(reasoning)
            self.reasoning_chars += len(reasoning)
        if chunk.refusal:
            self.refusal.append(_streamed_text(chunk.refusal))
        if chunk.other_output:
            self.other_output = True
        deltas = chunk.tool_calls
        for delta in deltas if isinstance(deltas, (list, tuple)) else ():
            if not isinstance(delta, Mapping):
                continue  # not a fragment of a call
            call_id = delta.get("id")
            slot = self.calls.setdefault(
                self._slot(delta, call_id),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call_id:
                slot["id"] = _streamed_text(call_id)
            # a call of another kind (OpenAI's custom tools: {"type": "custom", "custom":
            # {"name", "input"}}): its object's texts joined as streamed, as a function's
            kind = delta.get("type")
            if (
                isinstance(kind, str)
                and kind not in CALL_FIELDS
                and "function" not in delta
                and slot["type"] == "function"
                and not slot["function"]["name"]
            ):
                slot["type"] = kind
                del slot["function"]
            other = slot["type"] if slot["type"] != "function" else None
            for key, value in delta.items():  # a provider's own, kept as first sent
                if key == other and isinstance(value, Mapping):
                    if not isinstance(slot.get(key), dict):
                        slot[key] = {}
                    _join_fields(slot[key], value)
                elif key not in CALL_FIELDS:
                    slot.setdefault(key, value)
            if other is not None:
                continue
            fn = delta.get("function")
            fn = fn if isinstance(fn, Mapping) else {}
            if fn.get("name"):
                slot["function"]["name"] += _streamed_text(fn["name"])
            if fn.get("arguments"):
                slot["function"]["arguments"] += _streamed_text(fn["arguments"])
        if chunk.finish_reason:
            self.finish = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage
        if self.id is None:
            self.id = _answer_id(chunk.raw)

    def _slot(self, delta: Mapping[str, Any], call_id: Any) -> tuple[int, int]:
        """The call a fragment belongs to: the one open at its ``index`` when that is a number
        (another one when the fragment opens a call there, see the class), else the last
        call's (the next one's when the fragment brings an ``id`` of its own)."""
        index = delta.get("index")
        if index.__class__ is not int:
            if not self._open:
                index = 0
            else:
                index = max(self._open)
                if call_id and self.calls[self._open[index]]["id"] not in (None, call_id):
                    index += 1
        key = self._open.get(index)
        if key is None:
            key = self._open[index] = (index, 0)
        elif call_id and _opens(delta) and self.calls[key]["id"] not in (None, call_id):
            held = self.calls[key]
            if held.get("type") != "function" or held["function"]["name"]:
                key = self._open[index] = (index, key[1] + 1)
                self.split += 1
        return key

    def response(self, *, cut: bool = False) -> ModelResponse:
        """The answer so far; a ``cut`` one keeps its text only and finishes with ``length``."""
        # no text and no call is an empty text, as a whole answer has it (judged so: an empty
        # answer where tools were offered is a failed call); beside calls, a refusal (the
        # model declined: an answer, never an empty one) or output of another kind (speech, a
        # hosted tool's call, an image), no text is None, as a whole answer has it
        content = "".join(self.content) or (
            None if self.calls or self.refusal or self.other_output else ""
        )
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.reasoning:  # judged like text by the loop checks (see LoopDetector.observe)
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls and not cut:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        finish = "length" if cut else self.finish
        return ModelResponse(message=message, finish_reason=finish, usage=self.usage, id=self.id)


def _opens(delta: Mapping[str, Any]) -> bool:
    """Whether a call fragment names its call (a function's ``name``, or another kind's
    object): what the first fragment of a call carries, and a continuation does not."""
    fn = delta.get("function")
    if isinstance(fn, Mapping):
        return bool(fn.get("name"))
    kind = delta.get("type")
    return isinstance(kind, str) and isinstance(delta.get(kind), Mapping)


def _join_fields(into: dict[str, Any], fragment: Mapping[str, Any]) -> None:
    """A streamed fragment of a call object's fields added to ``into``: texts joined in order
    (the ``input`` of a custom tool's call comes in pieces), anything else kept as first sent."""
    for key, value in fragment.items():
        if isinstance(value, str) and isinstance(into.get(key, ""), str):
            into[key] = into.get(key, "") + value
        else:
            into.setdefault(key, value)


def _answer_id(raw: Any) -> str | None:
    """The answer's id in a raw chunk: a chat chunk's ``id`` (JSON), or the ``response.id`` of
    a Responses API event that carries the response (JSON or the openai SDK's event object)."""
    if isinstance(raw, (dict, Mapping)):  # a dict (an event) first: no ABC check
        found = raw.get("id")
        if found is None:
            response = raw.get("response")
            found = response.get("id") if isinstance(response, Mapping) else None
    else:
        found = getattr(getattr(raw, "response", None), "id", None)
    return found if isinstance(found, str) else None


def _streamed_text(value: Any) -> str:
    """A streamed field as text: itself, or its JSON text when the upstream sent another type."""
    return value if isinstance(value, str) else safe_canonical_text(value)


def reasoning_of(source: Any) -> str | None:
    """The reasoning text of a message or delta (a mapping or an SDK object):
    ``reasoning_content`` (llama.cpp, vLLM, DeepSeek) or ``reasoning`` (OpenRouter, Ollama);
    ``None`` when there is none or it is not text."""
    mapping = source.__class__ is dict or isinstance(source, Mapping)  # a dict: no ABC check
    for key in ("reasoning_content", "reasoning"):
        value = source.get(key) if mapping else getattr(source, key, None)
        if isinstance(value, str) and value:
            return value
    return None


def usage_from_body(usage: Any) -> Usage | None:
    """An OpenAI ``usage`` object (dict or SDK object) as :class:`Usage`, or ``None``."""
    if usage is None:
        return None
    if not isinstance(usage, Mapping):
        dump = getattr(usage, "model_dump", None)
        usage = dump() if callable(dump) else vars(usage)
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if prompt is None and completion is None:
        return None
    return Usage(prompt_tokens=int(prompt or 0), completion_tokens=int(completion or 0))


@runtime_checkable
class Transport(Protocol):
    """A synchronous model transport."""

    def send(self, request: ModelRequest) -> ModelResponse:
        """Send one request and return the complete answer (raises on upstream errors)."""
        ...

    def stream(self, request: ModelRequest) -> Iterator[StreamChunk]:
        """Send one request and yield the answer as it streams."""
        ...


@runtime_checkable
class AsyncTransport(Protocol):
    """An asynchronous model transport (one class may implement both protocols)."""

    async def asend(self, request: ModelRequest) -> ModelResponse:
        """Async twin of :meth:`Transport.send`."""
        ...

    def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Async twin of :meth:`Transport.stream`."""
        ...


def write_output_cap(
    body: MutableMapping[str, Any], cap: int | None, keys: Sequence[str], default_key: str | None
) -> None:
    """Cap the output of a wire ``body`` at ``cap``, in place.

    Each of ``keys`` (the wire form's output-cap fields) present is lowered to ``cap`` when
    larger; when none is present, ``default_key`` (if not ``None``) is set to ``cap``. ``None``
    or ``0`` changes nothing: a request without a configured cap goes out as the caller wrote it.
    """
    if not cap:
        return
    present = False
    for key in keys:
        value = body.get(key)
        # only a number caps anything: SDK sentinels (openai's ``omit`` / ``NOT_GIVEN``, which
        # the Agents SDK sends for an unset field) mean the field is absent
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            present = True
            if value > cap:
                body[key] = cap
    if not present and default_key is not None:
        body[default_key] = cap


def split_session_header(headers: Mapping[str, str]) -> tuple[str | None, Mapping[str, str]]:
    """The session named by :data:`SESSION_HEADER` in ``headers`` (any case), and the headers
    without it (``headers`` itself when it holds none).

    The header is the guard's own: an adapter that builds requests from a caller's headers
    leaves it in ``ModelRequest.headers``; the guard reads it and never sends it upstream.
    """
    found: str | None = None
    rest: dict[str, str] | None = None
    for key, value in headers.items():
        if key.lower() == SESSION_HEADER:
            if rest is None:
                rest = {k: v for k, v in headers.items() if k.lower() != SESSION_HEADER}
            if isinstance(value, str) and value:
                found = value
    return found, (headers if rest is None else rest)


def attach_report(response: Any, report: GuardReport) -> None:
    """Attach ``report`` to ``response`` so :func:`report_of` finds it.

    Works on SDK objects (openai's pydantic models) without changing what they serialise to.
    Objects that take no attributes (``None``, tuples ...) are left alone.
    """
    try:
        object.__setattr__(response, _REPORT_ATTR, report)
    except (AttributeError, TypeError):
        return


def report_of(response: Any) -> GuardReport | None:
    """What the guard did for the call that returned ``response``, or ``None`` if unguarded."""
    if isinstance(response, ModelResponse):  # a neutral response carries it as a field
        report: GuardReport | None = response.report
        return report
    return getattr(response, _REPORT_ATTR, None)
