"""The model transport: how the pipeline talks to a model, in the spirit of httpx's transports.

A transport turns one :class:`ModelRequest` into one :class:`ModelResponse` (``send`` /
``asend``) or a stream of :class:`StreamChunk` (``stream`` / ``astream``). The pipeline only ever
sees these neutral values, so the same logic drives the openai client (2.x on httpx, 3.x on
httpx2), LiteLLM, or :class:`agentguard.testing.ScriptedModel`.

Transports report upstream failures by raising: the openai client's own exceptions, or
:class:`~agentguard.exceptions.ModelError` / :class:`~agentguard.exceptions.ModelTimeout` for
transports without an SDK of their own. Every such exception exposes ``status_code`` and
``response.headers`` (or is a ``TimeoutError``), which is what error classification reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from .types import Message, Usage

__all__ = [
    "AsyncTransport",
    "ModelRequest",
    "ModelResponse",
    "StreamChunk",
    "Transport",
    "usage_from_body",
]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One chat-completion request in neutral (OpenAI chat) form.

    Attributes:
        model: the model name the request is for.
        messages: the conversation, OpenAI chat format.
        params: every other body parameter (``tools``, ``tool_choice``, ``max_tokens``,
            ``temperature``, ``stream_options`` ...), passed through untouched.
        headers: extra HTTP headers for this request (never logged or reported).
        timeout: per-attempt timeout in seconds, or ``None`` for the transport's default.
        api: ``"chat"`` (chat completions) or ``"responses"`` (the Responses API: ``messages``
            are its input items in chat form, ``params`` its other arguments, tools included,
            in Responses format).
    """

    model: str
    messages: Sequence[Message]
    params: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    api: Literal["chat", "responses"] = "chat"

    @property
    def tools(self) -> list[Mapping[str, Any]]:
        """The request's function tools in chat ``tools`` format, or an empty list."""
        tools = self.params.get("tools")
        if self.api == "responses":
            from ._responses import chat_tools  # noqa: PLC0415 - avoids an import cycle

            return chat_tools(tools)
        return list(tools) if isinstance(tools, Sequence) else []

    @property
    def output_key(self) -> str:
        """The parameter that caps this request's output tokens when it sets none."""
        return "max_output_tokens" if self.api == "responses" else "max_tokens"

    def to_body(self, *, stream: bool = False) -> dict[str, Any]:
        """The OpenAI JSON body for this request."""
        body: dict[str, Any] = {"model": self.model, "messages": list(self.messages)}
        body.update(self.params)
        if stream:
            body["stream"] = True
        else:
            body.pop("stream", None)
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


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One streamed chunk in neutral form.

    Attributes:
        content: a content delta, if any.
        tool_calls: tool-call deltas, OpenAI format (``index``, and a partial ``id``,
            ``function.name``, ``function.arguments``).
        finish_reason: set on the chunk that ends the choice.
        usage: set on the final usage chunk (the one with no choices).
        raw: the chunk object of the underlying client.
    """

    content: str | None = None
    tool_calls: Sequence[Mapping[str, Any]] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    raw: Any = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, raw: Any = None) -> StreamChunk:
        """Parse one OpenAI ``chat.completion.chunk`` JSON body."""
        choices = body.get("choices") or []
        delta: Mapping[str, Any] = {}
        finish = None
        if choices and isinstance(choices[0], Mapping):
            delta = choices[0].get("delta") or {}
            finish = choices[0].get("finish_reason")
        return cls(
            content=delta.get("content"),
            tool_calls=tuple(delta.get("tool_calls") or ()),
            finish_reason=finish,
            usage=usage_from_body(body.get("usage")),
            raw=body if raw is None else raw,
        )


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
