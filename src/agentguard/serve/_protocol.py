"""uvicorn's HTTP/1.1 protocol (httptools), each answer's head written with its body's start.

uvicorn writes an answer's status line and headers as soon as the app sends
``http.response.start``, and the body with the next ``http.response.body``: two writes, two
TCP segments on a connection with ``TCP_NODELAY``, and a caller whose client wakes up for the
head, finds no body and waits again. Here the head is held until the body's first write of the
same turn of the event loop and goes out with it, in one write: an answer sent whole (a
forwarded one, an error) is one segment, and a guarded stream's head goes out with its first
events. A streamed answer whose body comes later (a forwarded stream still waiting for its
upstream) has its head written at the event loop's next turn, as before. The bytes on the wire
are the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HeadWithBody", "HttpToolsHeadWithBody"]

# written by uvicorn itself when the app reads a body the caller sent ``Expect: 100-continue``
# for: it goes out at once, it is no answer's head
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class HeadWithBody:
    """The transport one request's answer is written to (see the module's doc): its first
    write, the head, is held until the next write or the event loop's next turn."""

    __slots__ = ("_head", "_loop", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif self._started or data == _CONTINUE:
            self._transport.write(data)
        else:
            self._started = True
            self._head = data
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HttpToolsHeadWithBody(HttpToolsProtocol):
    """uvicorn's httptools protocol, each request's answer written through a
    :class:`HeadWithBody` (pass the class as uvicorn's ``http``)."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # uvicorn writes the answer through the cycle's transport (an upgrade leaves the last
        # cycle in place, wrapped already); read defensively: a uvicorn that names them
        # otherwise serves as plain uvicorn does, never fails a request
        cycle: Any = getattr(self, "cycle", None)
        transport: Any = getattr(cycle, "transport", None)
        if transport is not None and not isinstance(transport, HeadWithBody):
            cycle.transport = HeadWithBody(transport, asyncio.get_running_loop())
