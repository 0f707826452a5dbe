"""The upstream's bytes of a streamed answer, event by event (for ``with_streaming_response``).

The raw client's ``with_streaming_response.create(stream=True)`` gives the upstream's
server-sent events as sent through its body views (``iter_lines()``, ``iter_bytes()``,
``read()`` ...). The guarded client's give the guarded stream: each event the guard passes on
as the upstream sent it goes out as the upstream's bytes, and only what the guard made or
changed is written anew (see :mod:`._raw`). :class:`Wire` is what knows the upstream's bytes
of each event: it stands in for the SDK stream's SSE decoder, hands the decoder the bytes as
they come, keeps them, and cuts them where each event the decoder dispatches ends; the
transport takes each SDK object's bytes (its event's, and the comments and lines before it) as
the stream yields it.

Whatever the recorder cannot follow (a server whose events it reads otherwise than the SDK's
decoder does) leaves it without bytes to give: the views then write every event anew, as they
would for an answer the guard changed. It never stands in the stream's way.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

__all__ = ["Wire"]

_LINE_END = re.compile(b"[\r\n]")


class Wire:
    """The SDK stream's SSE decoder (``decoder``), recording the bytes it decodes event by
    event.

    ``count``: how many SDK objects took their bytes (:meth:`take`), so far.
    """

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder
        self._data = bytearray()  # the bytes from offset ``_base`` on (those before went out)
        self._base = 0
        # the events the bytes read hold, not dispatched yet: (end offset, name, data)
        self._events: deque[tuple[int, str | None, str]] = deque()
        self._line = bytearray()  # the line being read, not ended yet
        self._skip_lf = False  # a line ended with CR: an LF right after it is part of the end
        self._name: str | None = None  # the event being read: its name, data lines, whether
        self._lines: list[str] = []  # it has any field (comments are none)
        self._fields = False
        self._taken = 0  # the bytes up to here went to an SDK object
        self._upto = 0  # the end of the last event the decoder dispatched
        self.count = 0
        self._intact = True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_decoder":
            raise AttributeError(name)
        return getattr(self._decoder, name)

    def iter_bytes(self, iterator: Iterator[bytes]) -> Iterator[Any]:
        """The decoder's events of ``iterator``'s bytes, each noted where its bytes end."""
        for sse in self._decoder.iter_bytes(self._tee(iterator)):
            self._dispatched(sse)
            yield sse

    async def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        """Async twin of :meth:`iter_bytes`."""
        async for sse in self._decoder.aiter_bytes(self._atee(iterator)):
            self._dispatched(sse)
            yield sse

    def take(self) -> bytes | None:
        """The bytes of the event the SDK object just yielded comes from (and of what came
        before it since the last object's); ``None`` when the recorder lost track."""
        self.count += 1
        if not self._intact:
            return None
        out = bytes(self._data[self._taken - self._base : self._upto - self._base])
        del self._data[: self._upto - self._base]
        self._base = self._taken = self._upto
        return out

    def rest(self) -> bytes | None:
        """The bytes read after the last object's (``data: [DONE]``, an error event in the
        body); ``None`` when the recorder lost track."""
        return bytes(self._data[self._taken - self._base :]) if self._intact else None

    def _tee(self, iterator: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in iterator:
            self._feed(chunk)
            yield chunk

    async def _atee(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in iterator:
            self._feed(chunk)
            yield chunk

    def _feed(self, chunk: bytes) -> None:
        """Keep ``chunk`` and note where the events it ends end (lines end with CR, LF or
        CRLF; a blank line ends an event that has a field, as the SSE spec reads them)."""
        if not self._intact:
            return
        try:
            base = self._base + len(self._data)
            self._data += chunk
            start = 0
            for match in _LINE_END.finditer(chunk):
                end = match.start()
                if self._skip_lf and end == start and chunk[end] == 0x0A:
                    self._skip_lf = False
                    start = end + 1
                    continue
                line = bytes(self._line) + chunk[start:end]
                self._line.clear()
                self._skip_lf = chunk[end] == 0x0D
                start = end + 1
                self._read(line, base + start)
            if start < len(chunk):
                self._skip_lf = False
                self._line += chunk[start:]
        except Exception:  # (never the stream's failure: the views write events anew)
            self._intact = False

    def _read(self, line: bytes, end: int) -> None:
        if not line:
            if self._fields:
                self._events.append((end, self._name, "\n".join(self._lines)))
            self._name, self._lines, self._fields = None, [], False
            return
        text = line.decode("utf-8", "replace")
        if text.startswith(":"):
            return
        name, _, value = text.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._name = value or None
        elif name == "data":
            self._lines.append(value)
        elif name not in ("id", "retry"):
            return
        self._fields = True

    def _dispatched(self, sse: Any) -> None:
        """The decoder dispatched ``sse``: its bytes end with the first event read that is it."""
        if not self._intact:
            return
        key = (getattr(sse, "event", None) or None, getattr(sse, "data", None))
        for at, (end, name, data) in enumerate(self._events):
            if (name, data) == key:
                for _ in range(at + 1):
                    self._events.popleft()
                self._upto = end
                return
        self._intact = False
