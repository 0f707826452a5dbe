"""What a guarded ``chat.completions.create(stream=True)`` returns: the SDK's own chunk objects.

Chunks the upstream sent pass through as the SDK objects they are; chunks the guard made (a
repaired or corrected tool call, released whole) become ``ChatCompletionChunk`` objects with the
upstream's id and model. The report is attached to the stream once it is exhausted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from agentguard.guard import AsyncGuardedStream, GuardedStream
from agentguard.integrations._lazy import require
from agentguard.transport import StreamChunk, attach_report

__all__ = ["AsyncStream", "Stream"]


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


class Stream:
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

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStream:
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

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
