"""httpx's transport interface over aiohttp's client: the server's pooled upstream connections.

The server reaches its upstreams through httpx's request and response objects (``Pool`` and the
model transport are written against them, and tests give an ``httpx.MockTransport``). Under
them, aiohttp's client does the HTTP: its connection pool and C parser run straight on the
event loop, where httpcore's pure-Python HTTP/1.1 runs through anyio's streams and cancel
scopes — measured through real sockets, about a third of a proxied request's CPU on the server
at one client, and more than half of a guarded request's at 16 (``docs/benchmarks.md``).

The mapping keeps the request as httpx built it — method, URL exactly as encoded (aiohttp would
otherwise re-quote it: ``%2f`` in a query became ``/``), headers in their order and case, body
— and adds nothing to it: no cookie jar, no default ``User-Agent``, ``Accept``,
``Accept-Encoding`` or ``Content-Type``, no decompression, no redirects. The answer's bytes are
left as received, streamed as they arrive. aiohttp's errors are raised as the httpx errors they
are (a refused connection is a ``ConnectError``, not a timeout), so callers handle one family.

The ``httpx-aiohttp`` package does the same mapping, but re-quotes URLs, reports a refused or
dropped connection as a ``ConnectTimeout``, and adds aiohttp's default headers.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator

import aiohttp
import httpx
import yarl

__all__ = ["AiohttpTransport", "ssl_context"]

# The request's own headers only: aiohttp adds these when the request does not name them.
_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An ``httpx`` transport whose connections are aiohttp's (HTTP/1.1, keep-alive, pooled).

    Args:
        max_connections: connections open at once, to all hosts together.
        keepalive_expiry: seconds an idle connection is kept for reuse: less than the 5 s
            after which uvicorn, Node.js and httpx's own pool close an idle connection, so that
            a request is not sent on a connection the upstream is closing at that moment
            (aiohttp retries such a request only for idempotent methods, and model calls are
            POSTs).
    """

    def __init__(self, *, max_connections: int = 512, keepalive_expiry: float = 4.0) -> None:
        self._max_connections = max_connections
        self._keepalive = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        # per request, the same few of each: made once (the model paths, the tiers' timeouts)
        self._limits: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}
        self._urls: dict[str, yarl.URL] = {}

    def _opened(self) -> aiohttp.ClientSession:
        # made on first use: an aiohttp session belongs to the event loop that runs it
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                keepalive_timeout=self._keepalive,
                ssl=ssl_context(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # one caller's cookies never reach another
                skip_auto_headers=_AUTO_HEADERS,
                auto_decompress=False,
                trust_env=False,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; its answer's body is left to stream."""
        timeout = request.extensions.get("timeout") or {}
        seconds = (timeout.get("pool"), timeout.get("connect"), timeout.get("read"))
        limits = self._limits.get(seconds)
        if limits is None:
            limits = aiohttp.ClientTimeout(
                total=None, connect=seconds[0], sock_connect=seconds[1], sock_read=seconds[2]
            )
            if len(self._limits) < 64:
                self._limits[seconds] = limits
        target = str(request.url)
        url = self._urls.get(target)
        if url is None:
            url = yarl.URL(target, encoded=True)
            if len(self._urls) < 1024:  # the model paths, not every forwarded query
                self._urls[target] = url
        headers = [(k.decode("latin-1"), _text(v)) for k, v in request.headers.raw]
        try:
            response = await self._opened().request(
                request.method,
                url,
                headers=headers,
                data=request.content or None,
                allow_redirects=False,
                timeout=limits,
            )
        except BaseException as exc:
            error = _httpx_error(exc, request)
            if error is exc:
                raise
            raise error from exc
        extensions = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", "replace")
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        """Close every connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The CAs httpx's own transport trusts, read once per process (about 20 ms: ``agentguard
    serve`` reads them at start-up, not on its first upstream call)."""
    return httpx.create_ssl_context()


def _text(value: bytes) -> str:
    """A header value as aiohttp takes it: aiohttp writes header values as UTF-8, so a value
    that is UTF-8 goes out as the bytes it came as (any other as its Latin-1 reading)."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.decode("latin-1")


class _Body(httpx.AsyncByteStream):
    """An aiohttp answer's body, piece by piece as it arrives."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._response.content.iter_any():
                yield piece
        except BaseException as exc:
            error = _httpx_error(exc, self._request, reading=True)
            if error is exc:
                raise
            raise error from exc

    def _coded(self) -> bool:
        """Whether the body has a content coding (which httpx's reading undoes)."""
        codings = ",".join(self._response.headers.getall("Content-Encoding", ())).split(",")
        return any(c.strip().lower() not in ("", "identity") for c in codings)

    def direct_pieces(self) -> AsyncIterator[bytes] | None:
        """The body's pieces as they arrive, straight from aiohttp (``None`` when it has a
        content coding: see :func:`agentguard.serve._upstream.body_pieces`)."""
        return None if self._coded() else self.__aiter__()

    async def read_whole(self) -> bytes | None:
        """The whole body in one read (``None`` when it has a content coding, which httpx's
        reading undoes: see :func:`agentguard.serve._upstream.read_whole`)."""
        if self._coded():
            return None
        response = self._response
        try:
            return await response.read()
        except BaseException as exc:
            error = _httpx_error(exc, self._request, reading=True)
            if error is exc:
                raise
            raise error from exc

    async def aclose(self) -> None:
        # back to the pool when read to its end, else the connection is closed
        self._response.release()


def _httpx_error(
    exc: BaseException, request: httpx.Request, *, reading: bool = False
) -> BaseException:
    """The httpx error an aiohttp error is (anything else, a cancellation included, as is)."""
    message = f"{type(exc).__name__}: {exc}"
    kind: type[httpx.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(exc, asyncio.TimeoutError):  # a read, or the wait for a free connection
        waited = not reading and not isinstance(exc, aiohttp.ServerTimeoutError)
        kind = httpx.PoolTimeout if waited else httpx.ReadTimeout
    elif isinstance(exc, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)):
        kind = httpx.ReadError if reading else httpx.RemoteProtocolError
    elif isinstance(exc, aiohttp.ClientError):
        kind = httpx.RemoteProtocolError
    else:
        return exc
    return kind(message, request=request)
