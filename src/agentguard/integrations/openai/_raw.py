"""What ``with_raw_response`` and ``with_streaming_response`` return on a guarded client.

The SDK's own ``*WithRawResponse`` / ``*WithStreamingResponse`` classes wrap the guarded
resource, so every method they offer goes through the guarded ``create`` / ``parse`` (and the
rest, ``retrieve``, ``list`` ..., through the client's own). The call carries the SDK's raw
header to the upstream, which answers with its raw response; the transport keeps it in a
:class:`~agentguard.integrations.openai._transport.RawCall` and the caller gets one of the
classes below: ``parse()`` returns the guarded answer (the report attached: ``report_of``
works on it), everything else (``headers``, ``status_code``, ``http_response``,
``request_id`` ...) is the upstream's raw response of the attempt that was served; its
``headers`` also carry the report as ``x-agentguard-*`` headers once the answer is complete.

The body accessors (``read()``, ``text``, ``json()``, ``iter_lines()`` ...) serve the guarded
answer too: the upstream's bytes when the guard changed nothing, else the answer's JSON. A
stream's are its server-sent events: each chunk (event) the guard passes on as the upstream
sent it goes out as the upstream's bytes (with the comments and lines before it), and what the
guard made or changed is written in the upstream's dialect (chat: ``data:`` lines, then
``data: [DONE]``; Responses: ``event:`` and ``data:`` lines); the end is the upstream's when
its last chunk went out as sent, and an error the upstream put in the body goes out as its
event (as the raw client's body has it), not raised.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from agentguard.integrations._lazy import require
from agentguard.transport import report_of

from ._events import AsyncResponsesStream, ResponsesStream
from ._stream import AsyncStream, Stream
from ._transport import RawCall

__all__ = ["AsyncStreamedResponse", "RawResponse", "StreamedResponse", "raw_mode"]

_RAW_HEADER = "x-stainless-raw-response"


def raw_mode(headers: Any) -> str | None:
    """The SDK's raw-response mode of a call's ``extra_headers``: ``"true"``
    (``with_raw_response``), ``"stream"`` (``with_streaming_response``) or ``None``."""
    if not headers:
        return None
    for key, value in headers.items():
        if key.lower() == _RAW_HEADER and isinstance(value, str):
            return value
    return None


class _Events:
    """A guarded stream's items as the bytes of server-sent events (see the module's doc)."""

    def __init__(self, call: RawCall, responses: bool) -> None:
        self._call = call
        self._responses = responses
        self._last: tuple[Any, int] | None = None  # the last item's recorder and count there

    def of(self, item: Any) -> bytes:
        sent = self._call.bytes_of(item)
        if sent is not None:
            data, wire, count = sent
            self._last = (wire, count)
            return data
        self._last = None
        json_data = item.model_dump_json(exclude_unset=True, warnings=False)
        if self._responses:
            return f"event: {getattr(item, 'type', None)}\ndata: {json_data}\n\n".encode()
        return f"data: {json_data}\n\n".encode()

    def end(self) -> bytes:
        """The stream's end: the upstream's (``data: [DONE]`` ...) when the last item was the
        last the upstream sent, as sent; else the dialect's."""
        rest = self._rest()
        if rest is not None:
            return rest
        return b"" if self._responses else b"data: [DONE]\n\n"

    def failed(self, exc: Exception) -> bytes:
        """The bytes to end with for the error ``exc`` the guarded stream raised: the
        upstream's error event when ``exc`` is the SDK's error for it (the raw body has it as
        one more event); else ``exc`` is raised."""
        wire = self._call.wire
        rest = wire.rest() if wire is not None else None
        if type(exc) is not require("openai", "openai").APIError or not rest:
            raise exc
        return rest

    def _rest(self) -> bytes | None:
        wire = self._call.wire
        if wire is None or self._last != (wire, wire.count):
            return None
        return wire.rest()


def _view(call: RawCall, content: Any) -> Any:
    """An HTTP response of the upstream's library over ``content`` (a stream's bytes, which
    it decodes as the raw response's own: its text, its lines), or ``None``."""
    upstream = call.response
    http = getattr(upstream, "http_response", None)
    if http is None:
        return None
    headers = {"content-type": http.headers.get("content-type", "text/event-stream")}
    return type(http)(http.status_code, headers=headers, content=content)


class _Upstream:
    """The parts common to every raw response: the upstream's attributes, the guarded answer."""

    def __init__(self, call: RawCall, answer: Any, *, changed: bool = True) -> None:
        self._call = call
        self._answer = answer
        self._changed = changed

    @property
    def upstream(self) -> Any:
        """The upstream's own raw response (of the attempt whose answer is served)."""
        return self._call.response

    @property
    def headers(self) -> Any:
        """The upstream's headers, and the report as ``x-agentguard-*`` headers (as the proxy
        sends them) once the answer is complete: clients that keep a raw response's headers
        (LiteLLM, langchain-openai's ``include_response_headers``) carry the report on."""
        headers = self._call.response.headers
        report = report_of(self._answer)
        if report is None:
            return headers
        merged = headers.copy()
        merged.update(report.headers())
        return merged

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._call.response, name)

    def _events(self) -> Any:
        raise NotImplementedError  # the guarded stream's bytes: sync or async (subclasses)

    def _writer(self) -> _Events:
        return _Events(
            self._call, isinstance(self._answer, (ResponsesStream, AsyncResponsesStream))
        )

    def _stream_view(self) -> Any:
        """The guarded stream's body as the upstream's library's response, or ``None`` when
        the answer is not a stream."""
        streams = (Stream, ResponsesStream, AsyncStream, AsyncResponsesStream)
        if isinstance(self._answer, streams):
            return _view(self._call, self._events())
        return None

    def _body(self) -> bytes:
        """The guarded (non-streamed) answer's bytes."""
        upstream = self._call.response
        if upstream is not None and not self._changed:
            return bytes(upstream.http_response.content)
        return json.dumps(
            self._answer.model_dump(mode="json", exclude_unset=True, warnings=False)
        ).encode()


class RawResponse(_Upstream):
    """``with_raw_response.create(...)`` on a guarded client (the SDK's ``LegacyAPIResponse``).

    ``parse()`` is the guarded answer (a stream, for ``stream=True``); the rest is the
    upstream's raw response.
    """

    def parse(self, *, to: Any = None) -> Any:
        """The guarded answer (``to=`` parses the upstream's raw body instead, unguarded)."""
        if to is not None:
            return self._call.response.parse(to=to)
        return self._answer

    @property
    def content(self) -> bytes:
        """The guarded answer's bytes."""
        return self._body()

    @property
    def text(self) -> str:
        """The guarded answer as text."""
        return self._body().decode()

    def __repr__(self) -> str:
        return f"<guarded {self._call.response!r}>"


class StreamedResponse(_Upstream):
    """``with_streaming_response.create(...)`` on a guarded sync client (the SDK's
    ``APIResponse``), as the context manager's value."""

    def parse(self, *, to: Any = None) -> Any:
        """The guarded answer (a stream, for ``stream=True``)."""
        if to is not None:
            return self._call.response.parse(to=to)
        return self._answer

    def _events(self) -> Iterator[bytes]:
        """A guarded stream's bytes (see the module's doc)."""
        out = self._writer()
        try:
            for item in self._answer:
                yield out.of(item)
        except Exception as exc:
            yield out.failed(exc)
            return
        yield out.end()

    def iter_lines(self) -> Iterator[str]:
        """The guarded answer's lines (server-sent events for a stream)."""
        view = self._stream_view()
        if view is not None:
            yield from view.iter_lines()
            return
        yield from self._body().decode().splitlines()

    def iter_text(self, chunk_size: int | None = None) -> Iterator[str]:
        """The guarded answer's text."""
        view = self._stream_view()
        if view is not None:
            yield from view.iter_text(chunk_size)
            return
        for line in self.iter_lines():
            yield line + "\n"

    def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """The guarded answer's bytes."""
        view = self._stream_view()
        if view is not None:
            yield from view.iter_bytes(chunk_size)
            return
        for text in self.iter_text(chunk_size):
            yield text.encode()

    def read(self) -> bytes:
        """The guarded answer's bytes, whole."""
        return b"".join(self.iter_bytes())

    def text(self) -> str:
        """The guarded answer's text, whole."""
        view = self._stream_view()
        if view is not None:
            view.read()
            return str(view.text)
        return self.read().decode()

    def json(self) -> object:
        """The guarded (non-streamed) answer as JSON data."""
        return json.loads(self._body())

    def close(self) -> None:
        """Close the upstream response (and a guarded stream)."""
        if isinstance(self._answer, (Stream, ResponsesStream)):
            self._answer.close()
        if self._call.response is not None:
            self._call.response.close()


class AsyncStreamedResponse(_Upstream):
    """``with_streaming_response.create(...)`` on a guarded async client (the SDK's
    ``AsyncAPIResponse``), as the context manager's value."""

    async def parse(self, *, to: Any = None) -> Any:
        """The guarded answer (a stream, for ``stream=True``)."""
        if to is not None:
            return await self._call.response.parse(to=to)
        return self._answer

    async def _events(self) -> AsyncIterator[bytes]:
        """Async twin of :meth:`StreamedResponse._events`."""
        out = self._writer()
        try:
            async for item in self._answer:
                yield out.of(item)
        except Exception as exc:
            yield out.failed(exc)
            return
        yield out.end()

    async def iter_lines(self) -> AsyncIterator[str]:
        """The guarded answer's lines (server-sent events for a stream)."""
        view = self._stream_view()
        if view is not None:
            async for line in view.aiter_lines():
                yield line
            return
        for line in self._body().decode().splitlines():
            yield line

    async def iter_text(self, chunk_size: int | None = None) -> AsyncIterator[str]:
        """The guarded answer's text."""
        view = self._stream_view()
        if view is not None:
            async for text in view.aiter_text(chunk_size):
                yield text
            return
        async for line in self.iter_lines():
            yield line + "\n"

    async def iter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        """The guarded answer's bytes."""
        view = self._stream_view()
        if view is not None:
            async for part in view.aiter_bytes(chunk_size):
                yield part
            return
        async for text in self.iter_text(chunk_size):
            yield text.encode()

    async def read(self) -> bytes:
        """The guarded answer's bytes, whole."""
        return b"".join([part async for part in self.iter_bytes()])

    async def text(self) -> str:
        """The guarded answer's text, whole."""
        view = self._stream_view()
        if view is not None:
            await view.aread()
            return str(view.text)
        return (await self.read()).decode()

    async def json(self) -> object:
        """The guarded (non-streamed) answer as JSON data."""
        return json.loads(self._body())

    async def close(self) -> None:
        """Close the upstream response (and a guarded stream)."""
        if isinstance(self._answer, (AsyncStream, AsyncResponsesStream)):
            await self._answer.close()
        if self._call.response is not None:
            await self._call.response.close()
