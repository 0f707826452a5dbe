"""The HTTP protocol ``agentguard serve`` runs uvicorn with: each answer's head is written with
its body's start, in one write (see ``agentguard.serve._protocol``); the bytes are uvicorn's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("httptools", reason='needs the serve extra: pip install "agentguard[serve]"')

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from agentguard.cli._serve import _protocol
from agentguard.serve._protocol import HeadWithBody, HttpToolsHeadWithBody

pytestmark = pytest.mark.anyio

GET = b"GET /health HTTP/1.1\r\nhost: serve\r\n\r\n"


class Transport:
    """The writes a connection's protocol makes, each as it was made."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _whole(body: bytes) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def _served(
    protocol: type[HttpToolsProtocol], app: Any, request: bytes = GET, *, turns: int = 5
) -> list[bytes]:
    """The writes of ``protocol`` serving ``app`` one ``request`` on a connection."""
    config = Config(app=app, lifespan="off", proxy_headers=False, log_level="error")
    connection = protocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(request)
    for _ in range(turns):
        await asyncio.sleep(0)
    for task in list(connection.tasks):
        await task
    connection.connection_lost(None)
    return transport.writes


async def test_an_answer_sent_whole_is_one_write() -> None:
    """uvicorn writes the head and the body apart (two TCP segments: the caller's client wakes
    for the head and waits again for the body); here they go out together, the same bytes."""
    body = b'{"status": "ok"}'
    theirs = await _served(HttpToolsProtocol, _whole(body))
    ours = await _served(HttpToolsHeadWithBody, _whole(body))
    assert len(theirs) == 2
    assert ours == [b"".join(theirs)]
    assert ours[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert ours[0].endswith(b"\r\n\r\n" + body)


async def test_a_streams_head_goes_out_with_its_first_events_and_alone_when_they_wait() -> None:
    """A stream's head goes with the events sent beside it; a head whose body is not there yet
    (a forwarded stream waiting for its upstream) goes out at the event loop's next turn, not
    with the body whenever that comes; later pieces are written as they come."""
    gate = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if scope["path"] == "/late":
            await gate.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    writes = await _served(HttpToolsHeadWithBody, stream)
    assert len(writes) == 3
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
    assert writes[1:] == [b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]

    async def later() -> None:
        for _ in range(20):  # turns of the event loop, the served app's first ones among them
            await asyncio.sleep(0)
        gate.set()

    opened = asyncio.ensure_future(later())
    late = await _served(HttpToolsHeadWithBody, stream, GET.replace(b"/health", b"/late"))
    await opened
    assert late[0].endswith(b"transfer-encoding: chunked\r\n\r\n")  # the head, alone
    assert late[1] == b"9\r\ndata: 1\n\n\r\n"


async def test_100_continue_goes_out_at_once_and_the_head_after_it() -> None:
    """uvicorn's ``100 Continue`` (written when the app reads a body the caller said it would
    send once told to) is no answer's head: it is written at once."""
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append(message["body"])
        await _whole(b"done")(scope, receive, send)

    request = (
        b"POST /v1/files HTTP/1.1\r\nhost: serve\r\nexpect: 100-continue\r\n"
        b"content-length: 4\r\n\r\n"
    )
    config = Config(app=app, lifespan="off", proxy_headers=False, log_level="error")
    connection = HttpToolsHeadWithBody(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(request)
    for _ in range(3):
        await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    connection.data_received(b"body")
    for task in list(connection.tasks):
        await task
    assert seen == [b"body"]
    assert len(transport.writes) == 2
    assert transport.writes[1].endswith(b"\r\n\r\ndone")


async def test_closing_writes_a_held_head_first() -> None:
    transport = Transport()
    held = HeadWithBody(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert transport.writes == []
    held.close()
    assert transport.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]
    assert transport.closed
    await asyncio.sleep(0)  # the held head's own turn: nothing more to write
    assert len(transport.writes) == 1


def test_the_cli_runs_uvicorn_on_this_protocol_over_httptools() -> None:
    assert _protocol("httptools") is HttpToolsHeadWithBody
    assert _protocol("h11") == "h11"


async def test_start_up_reads_what_the_first_requests_would() -> None:
    """The upstream connections' CAs are read once per process, at start-up (every pool's
    connections share them), and the JSON Schema validator is imported then."""
    import sys

    from agentguard.cli._serve import _warm
    from agentguard.serve._aiohttp import AiohttpTransport, ssl_context

    _warm()
    assert "jsonschema" in sys.modules
    assert ssl_context.cache_info().currsize == 1
    transport = AiohttpTransport()
    try:
        assert transport._opened().connector._ssl is ssl_context()  # type: ignore[union-attr]
    finally:
        await transport.aclose()


async def test_a_uvicorn_that_names_its_internals_otherwise_runs_as_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The protocol reads uvicorn's internals defensively: a connection without a ``cycle`` (or
    a cycle without a ``transport``) is left as uvicorn made it, no request fails; a uvicorn
    without the httptools protocol module runs its own protocol."""
    monkeypatch.setattr(HttpToolsProtocol, "on_headers_complete", lambda self: None)
    config = Config(app=_whole(b""), lifespan="off", proxy_headers=False, log_level="error")
    connection = HttpToolsHeadWithBody(config=config, server_state=ServerState(), app_state={})
    monkeypatch.delattr(HttpToolsProtocol, "cycle", raising=False)
    connection.__dict__.pop("cycle", None)
    connection.on_headers_complete()  # no cycle at all
    connection.cycle = object()  # type: ignore[assignment]
    connection.on_headers_complete()  # a cycle without a transport

    import builtins

    real_import = builtins.__import__

    def no_protocol(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "agentguard.serve._protocol":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_protocol)
    assert _protocol("httptools") == "httptools"
