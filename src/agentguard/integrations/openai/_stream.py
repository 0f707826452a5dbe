"""What a guarded ``chat.completions.create(stream=True)`` returns: the SDK's own chunk objects.

Where the guard changes nothing, the caller gets the upstream's chunks themselves, in order:
its text as the guard lets it through, and the chunks that carry nothing the guard judges (the
opening ``role`` chunk, Azure's ``prompt_filter_results``, a ``refusal``, another choice's
deltas when ``n`` > 1) beside it. Tool-call deltas, the finish chunk and the usage chunk wait
for the guard's verdict: when the answer it serves is the upstream's own (the same text, calls
and finish), they go out as the upstream sent them (with their ``logprobs``,
``content_filter_results`` and any other field); when the guard changed the answer (a repaired
or corrected call, another attempt), chunks made by the guard carry it, dated with the
upstream's id and model. The report is attached to the stream once it is exhausted (and to
whatever else holds it: the ``chat.completions.stream`` helper's stream).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from agentguard.guard import AsyncGuardedStream, GuardedStream, GuardReport
from agentguard.integrations._lazy import require
from agentguard.integrations._replay import ChatReplay, text_only
from agentguard.transport import StreamChunk, attach_report

from ._transport import STARTED, RawCall

__all__ = ["AsyncStream", "Stream"]


_HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")


class _ChunkMaker:
    """Turns the guard's stream chunks into the SDK's ``ChatCompletionChunk`` objects: the
    upstream's pass through; those the guard made carry the upstream's id, date and model."""

    def __init__(self, model: str, raw: RawCall | None) -> None:
        self._cls = require("openai.types.chat", "openai").ChatCompletionChunk
        self._default = {"id": "chatcmpl-agentguard", "created": 0, "model": model}
        self._raw = raw

    def _head(self) -> dict[str, Any]:
        upstream = self._raw.chunk if self._raw is not None else None
        if upstream is None:
            return self._default
        # the upstream's values where they are what the SDK's type says (a lenient server's
        # chunk may lack them, or be no object at all: the defaults stand in)
        found = {
            k: v
            for k in _HEAD
            if isinstance(v := getattr(upstream, k, None), int if k == "created" else str)
        }
        return {**self._default, **found}

    def __call__(self, chunk: StreamChunk) -> Any:
        raw = chunk.raw
        if raw is not None and not isinstance(raw, Mapping):
            return raw
        delta: dict[str, Any] = {}
        if chunk.content:
            delta["content"] = chunk.content
        if chunk.reasoning:
            delta["reasoning_content"] = chunk.reasoning
        if chunk.refusal:
            delta["refusal"] = chunk.refusal
        if chunk.tool_calls:
            delta["tool_calls"] = [dict(c) for c in chunk.tool_calls]
        return self._cls.model_validate(
            {
                **self._head(),
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": chunk.finish_reason}],
            }
        )


class _Response:
    """``stream.response`` of a guarded stream: closing it closes the guarded stream.

    The SDK's stream helpers keep their stream's ``response`` only to close it; other
    attributes are the upstream's HTTP response's (status, headers: the served attempt's, once
    the call started, which ``create`` does before it returns).
    """

    def __init__(self, stream: Any, raw: Any) -> None:
        self._stream = stream
        self._raw = raw

    def close(self) -> None:
        if not inspect.iscoroutinefunction(self._stream.close):
            self._stream.close()

    async def aclose(self) -> None:
        closed = self._stream.close()
        if inspect.isawaitable(closed):
            await closed

    def __getattr__(self, name: str) -> Any:
        upstream = getattr(self._raw, "response", None)
        http = upstream.http_response if upstream is not None else getattr(self._raw, "http", None)
        if http is None:
            raise AttributeError(f"{name!r}: the guarded stream has not reached the upstream yet")
        return getattr(http, name)


def _without_text(raw: Any, neutral: StreamChunk) -> Any:
    """An SDK chunk without the first answer's text (``None`` when nothing else is in it)."""
    choices = getattr(raw, "choices", None)
    if not isinstance(choices, list) or not hasattr(raw, "model_copy"):
        return None
    if text_only(neutral, len(choices), getattr(choices[0], "logprobs", None)):
        return None
    out = []
    for choice in choices:
        delta = getattr(choice, "delta", None)
        if delta is not None and delta.content and getattr(choice, "index", 0) in (0, None):
            update = {"delta": delta.model_copy(update={"content": None})}
            out.append(choice.model_copy(update=update))
        else:
            out.append(choice)
    return raw.model_copy(update={"choices": out})


def _usage_only(raw: Any) -> Any:
    """An SDK chunk with its usage alone (as OpenAI sends it: no choices)."""
    if not hasattr(raw, "model_copy"):
        return raw
    return raw.model_copy(update={"choices": []})


class _Base:
    def __init__(self, model: str, raw: RawCall | None) -> None:
        self._make = _ChunkMaker(model, raw)
        chunks = (lambda: raw.chunks) if raw is not None else None
        self._replay = ChatReplay(chunks, _without_text, _usage_only)
        self._raw = raw
        self._head: list[Any] = []  # chunks read ahead by prime()
        self._primed = False
        self.owners: list[Any] = []  # objects that get the report too

    @property
    def response(self) -> _Response:
        """Stands for the HTTP response (the SDK's stream helper closes it)."""
        return _Response(self, self._raw)

    def _out(self, items: list[Any]) -> list[Any]:
        """The replay's items as SDK chunks: the upstream's as they are, the guard's made."""
        return [self._make(i) if isinstance(i, StreamChunk) else i for i in items]

    def _done(self, report: GuardReport | None) -> None:
        if report is not None:
            for owner in (self, *self.owners):
                attach_report(owner, report)


class Iterating:
    """The sync stream protocol of the SDK's streams, over ``self._iterator`` (what the stream
    yields) and ``self._inner`` (the guarded stream it reads)."""

    _iterator: Iterator[Any]
    _inner: GuardedStream

    def __next__(self) -> Any:
        return next(self._iterator)

    def __iter__(self) -> Iterator[Any]:
        # (not ``yield from``: breaking out of a loop over the stream would close the stream's
        # one iterator with this generator, and a second loop would read nothing, where the
        # SDK's stream reads on)
        for item in self._iterator:  # noqa: UP028 (see above)
            yield item

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Stream(Iterating, _Base):
    """What a guarded ``create(stream=True)`` returns on a sync client."""

    def __init__(self, inner: GuardedStream, model: str, raw: RawCall | None = None) -> None:
        super().__init__(model, raw)
        self._inner = inner
        self._iterator = self._chunks()

    def prime(self) -> None:
        """Start the guarded call now, as the SDK's ``create`` does: return once the upstream
        has answered (:data:`STARTED`: its status and headers are in), raising what fails
        before (a refusal after the guard's retries, a connection never made, the guard's own
        refusal); what fails in the answer's body is raised as the stream is read, as the
        SDK's stream raises it."""
        if not self._primed:
            self._primed = True
            for chunk in self._inner:
                if chunk is not STARTED:  # (an answer the guard began with no upstream call)
                    self._head.extend(self._out(self._replay.of(chunk)))
                break

    def _chunks(self) -> Iterator[Any]:
        self._primed = True
        while self._head:
            yield self._head.pop(0)
        try:
            for chunk in self._inner:
                if chunk is STARTED:
                    continue
                yield from self._out(self._replay.of(chunk))
        except Exception:
            # what the raw stream yields before the error (the opening role chunk), then it
            yield from self._out(self._replay.failed())
            raise
        yield from self._out(self._replay.end())
        self._done(self._inner.report)


class AsyncIterating:
    """The async stream protocol of the SDK's streams, over ``self._iterator`` (what the
    stream yields) and ``self._inner`` (the guarded stream it reads)."""

    _iterator: AsyncIterator[Any]
    _inner: AsyncGuardedStream

    async def __anext__(self) -> Any:
        return await anext(self._iterator)

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for item in self._iterator:
            yield item

    async def close(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncStream(AsyncIterating, _Base):
    """What a guarded ``create(stream=True)`` returns on an async client."""

    def __init__(self, inner: AsyncGuardedStream, model: str, raw: RawCall | None = None) -> None:
        super().__init__(model, raw)
        self._inner = inner
        self._iterator = self._chunks()

    async def prime(self) -> None:
        """Async twin of :meth:`Stream.prime`."""
        if not self._primed:
            self._primed = True
            async for chunk in self._inner:
                if chunk is not STARTED:
                    self._head.extend(self._out(self._replay.of(chunk)))
                break

    async def _chunks(self) -> AsyncIterator[Any]:
        self._primed = True
        while self._head:
            yield self._head.pop(0)
        try:
            async for chunk in self._inner:
                if chunk is STARTED:
                    continue
                for out in self._out(self._replay.of(chunk)):
                    yield out
        except Exception:
            for out in self._out(self._replay.failed()):  # (see Stream._chunks)
                yield out
            raise
        for out in self._out(self._replay.end()):
            yield out
        self._done(self._inner.report)
