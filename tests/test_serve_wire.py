"""``agentguard serve``'s upstream connections on the wire: what reaches a real socket.

The server's app with its real pooled transport (aiohttp's connections behind httpx's
interface when aiohttp is installed, httpx's own transport otherwise: both are tested) in
front of a loopback upstream that records the raw bytes of each request and answers fixed raw
bytes. The upstream gets exactly what the caller sent (request target as encoded, headers,
body) and nothing added; the caller gets exactly what the upstream answered. Errors of the
connection are the httpx errors the server classifies (a refused connection is no timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette", reason='needs the serve extra: pip install "agentguard[serve]"')

import agentguard as ag
from _processes import free_port
from agentguard.serve import GuardServer, create_app
from agentguard.serve._upstream import DECODABLE, hop_by_hop

pytestmark = pytest.mark.anyio

KEY = "sk-wire-caller-0123456789abcdef"
ANSWER = json.dumps(
    {
        "id": "chatcmpl-wire",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Voilà: the docs  are at /docs."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17},
    },
    ensure_ascii=False,
    indent=1,  # not the server's own serialisation: a re-encoding would show
).encode()
CHUNKS = [b'{"data": [', b'{"id": "file-1"}', b"]}"]
_CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
# a streamed chat answer with an upstream's keep-alives, each in a piece of its own (one per
# gap between events: those of one read would go on as one)
THINKING = [
    b": OPENROUTER PROCESSING\n\n",
    *(
        b"data: %s\n\n"
        % json.dumps({**_CHUNK, "choices": [{"index": 0, "delta": d, "finish_reason": f}]}).encode()
        for d, f in [({"role": "assistant", "content": "Hi"}, None), ({}, "stop")]
    ),
    b"data: [DONE]\n\n",
]
THINKING.insert(2, b": keep-alive\n\n")  # between the first words and the finish
BROTLI = bytes(range(7, 40))  # what a brotli body looks like to a server that cannot undo it
MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "up"}]}'
TEAPOT = b'{"error": {"message": "short and stout", "code": "teapot"}}\n'

ANSWER_HEADERS = [
    (b"Content-Type", b"application/json"),
    (b"X-Request-Id", b"req-7 with  spaces"),
    (b"Set-Cookie", b"a=1; Path=/"),
    (b"Set-Cookie", b"b=2; Path=/"),
]


def _transports() -> list[Any]:
    out: list[Any] = [pytest.param(lambda: httpx.AsyncHTTPTransport(retries=0), id="httpx")]
    try:
        from agentguard.serve._aiohttp import AiohttpTransport
    except ImportError:
        out.append(pytest.param(None, id="aiohttp", marks=pytest.mark.skip("no aiohttp")))
    else:
        out.append(pytest.param(AiohttpTransport, id="aiohttp"))
    return out


class RawUpstream:
    """An HTTP/1.1 server on loopback that records each request's raw bytes (keep-alive)."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, list[tuple[bytes, bytes]], bytes]] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                line, *lines = head[:-4].split(b"\r\n")
                headers = [tuple(h.split(b": ", 1)) for h in lines]
                length = next((int(v) for k, v in headers if k.lower() == b"content-length"), 0)
                body = await reader.readexactly(length)
                self.requests.append((line, headers, body))  # type: ignore[arg-type]
                if line.startswith(b"HEAD "):  # the head of the answer a GET would have
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(ANSWER))
                    continue
                if b"/gzip" in line:  # a body with a content coding
                    packed = gzip.compress(ANSWER)
                    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d"
                    writer.write(head % len(packed) + b"\r\n\r\n" + packed)
                    continue
                offered = dict(headers).get(b"accept-encoding", b"")  # type: ignore[arg-type]
                if b"/models" in line and b"br" not in offered:
                    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                    writer.write(head % len(MODELS) + MODELS)
                    continue
                if b"/br/" in line or b"/models" in line:
                    # a coding the server may not undo (no brotli package)
                    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: %d"
                    writer.write(head % len(BROTLI) + b"\r\n\r\n" + BROTLI)
                    continue
                if b"/teapot" in line:  # an error, with a body and headers of its own
                    head_out = [b"HTTP/1.1 418 I'm a teapot"]
                    head_out += [k + b": " + v for k, v in ANSWER_HEADERS]
                    head_out.append(b"Content-Length: %d" % len(TEAPOT))
                    writer.write(b"\r\n".join(head_out) + b"\r\n\r\n" + TEAPOT)
                    continue
                if b"split-utf8" in body:  # a stream cut inside a character, and an event
                    event = b'data: {"choices": [{"index": 0, "delta": {"content": "d\xc3\xa9j\xc3\xa0"}}]}\n\n'
                    cut = event.index(b"\xc3") + 1  # inside the first character of two bytes
                    parts = [event[:cut], event[cut:-1], event[-1:], b"data: [DONE]\n\n"]
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for part in parts:
                        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                        await writer.drain()
                        await asyncio.sleep(0.01)  # each piece read apart, as a model's
                    writer.write(b"0\r\n\r\n")
                    continue
                chunked = b"/chunked" in line  # an answer of unknown length, in pieces
                if chunked or b'"stream":true' in body.replace(
                    b" ", b""
                ):  # a stream with keep-alives
                    parts = CHUNKS if chunked else THINKING
                    pieces = [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]
                    kind = b"" if chunked else b"Content-Type: text/event-stream\r\n"
                    writer.write(b"HTTP/1.1 200 OK\r\n%sTransfer-Encoding: chunked\r\n\r\n" % kind)
                    for piece in pieces:
                        writer.write(piece)
                        await writer.drain()
                    continue
                head_out = [b"HTTP/1.1 200 OK"]
                head_out += [k + b": " + v for k, v in ANSWER_HEADERS]
                head_out.append(b"Content-Length: %d" % len(ANSWER))
                writer.write(b"\r\n".join(head_out) + b"\r\n\r\n" + ANSWER)
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[RawUpstream, str]]:
    raw = RawUpstream()
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield raw, f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def _serving(
    upstream: str, make: Callable[[], httpx.AsyncBaseTransport], config: Any = None
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the server's app in front of ``upstream`` (its ``/v1``), on ``make()``'s
    pooled transport (``config``: the guard's, as a dict); the server is closed after the
    block."""
    guard = ag.GuardConfig.from_dict(config or {})
    server = GuardServer(guard, f"{upstream}/v1", transport=make())
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(server)), base_url="http://serve.invalid"
        ) as http:
            yield http
    finally:
        await server.aclose()


@pytest.mark.parametrize("make", _transports())
async def test_the_upstream_gets_the_callers_bytes_and_the_caller_the_upstreams(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    raw, base = upstream
    body = b'{"model": "m",  "messages": [{"role": "user", "content": "caf\xc3\xa9 docs?"}]}'
    sent = {"authorization": f"Bearer {KEY}", "content-type": "application/json", "x-trace": "t1"}
    async with _serving(base, make) as http:
        guarded = await http.post("/v1/chat/completions", content=body, headers=sent)
        forwarded = await http.post("/v1/other/path?y=%2f&z=%7e&w=a+b", content=body, headers=sent)
        again = await http.post("/v1/chat/completions", content=body, headers=sent)

    for answer in (guarded, forwarded, again):
        assert answer.status_code == 200
        assert answer.content == ANSWER  # the upstream's bytes, not a re-encoding
        assert answer.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
        assert answer.headers["x-request-id"] == "req-7 with  spaces"
    assert guarded.headers["x-agentguard-tier"]  # the guard's own headers beside them
    lines = [line for line, _, _ in raw.requests]
    assert lines == [
        b"POST /v1/chat/completions HTTP/1.1",
        b"POST /v1/other/path?y=%2f&z=%7e&w=a+b HTTP/1.1",  # the target as encoded
        b"POST /v1/chat/completions HTTP/1.1",
    ]
    port = base.rsplit(":", 1)[1]
    for answer, (_, headers, content) in zip(
        (guarded, forwarded, again), raw.requests, strict=True
    ):
        # what the caller's client sent, but the headers of its connection: the upstream's
        # own connection has its host and the body's length
        sent_raw = answer.request.headers.raw
        callers = [(k.lower(), v) for k, v in sent_raw if not hop_by_hop(k.decode())]
        host = (b"host", f"127.0.0.1:{port}".encode())
        expected = sorted([*callers, host, (b"content-length", b"%d" % len(body))])
        assert (b"authorization", f"Bearer {KEY}".encode()) in expected
        assert sorted((k.lower(), v) for k, v in headers) == expected  # nothing added
        assert content == body
    assert raw.connections == 1  # one kept-alive connection for the three


@pytest.mark.parametrize("make", _transports())
async def test_a_forwarded_request_goes_out_as_it_came_whatever_it_holds(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    """The forwarding path (the server's own, not Starlette's routing): a header sent twice
    stays two, in order; a UTF-8 header value, a body that is no UTF-8 and a query string go
    out as their bytes; a HEAD answer keeps the upstream's length; an error answer its body
    and headers; a method the server's own route does not serve is forwarded too."""
    raw, base = upstream
    body = b"\xff\xfe no UTF-8 \x00 at all"
    headers = [
        (b"Authorization", f"Bearer {KEY}".encode()),
        (b"X-Twice", b"one"),
        (b"X-Twice", b"two"),
        (b"X-Note", "café".encode()),
        (b"Content-Type", b"application/octet-stream"),
    ]
    async with _serving(base, make) as http:
        put = await http.put("/v1/files/a%20b?q=%C3%A9&q=2&empty=", content=body, headers=headers)
        head = await http.head("/v1/files")
        teapot = await http.post("/v1/teapot", content=b"{}")
        other = await http.get("/v1/chat/completions")  # the route serves POST only
    assert put.status_code == other.status_code == 200
    assert put.content == other.content == ANSWER
    assert put.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert put.headers["content-length"] == str(len(ANSWER))
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(ANSWER))  # the upstream's, not 0
    assert teapot.status_code == 418
    assert teapot.content == TEAPOT
    assert teapot.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert teapot.headers["x-request-id"] == "req-7 with  spaces"
    assert "x-agentguard-tier" not in teapot.headers  # forwarded, never guarded
    lines = [line for line, _, _ in raw.requests]
    assert lines == [
        b"PUT /v1/files/a%20b?q=%C3%A9&q=2&empty= HTTP/1.1",
        b"HEAD /v1/files HTTP/1.1",
        b"POST /v1/teapot HTTP/1.1",
        b"GET /v1/chat/completions HTTP/1.1",
    ]
    _, sent, content = raw.requests[0]
    assert content == body
    callers = [(k.lower(), v) for k, v in put.request.headers.raw if not hop_by_hop(k.decode())]
    assert [h for h in callers if b"twice" in h[0]] == [(b"x-twice", b"one"), (b"x-twice", b"two")]
    assert (b"x-note", "café".encode()) in callers
    mine = [(k.lower(), v) for k, v in sent if k.lower() not in (b"host", b"content-length")]
    assert mine == callers  # in order, each as it came


@pytest.mark.parametrize("make", _transports())
async def test_a_compressed_request_goes_up_with_its_coding(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    """A request body sent gzip-compressed goes upstream as it came, with its
    ``Content-Encoding`` (the server dropped the header and sent the bytes: unreadable
    upstream); a chat request the guard cannot read that way is forwarded the same way."""
    raw, base = upstream
    packed = gzip.compress(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    coded = {"content-encoding": "gzip", "content-type": "application/json"}
    async with _serving(base, make) as http:
        files = await http.post("/v1/files", content=packed, headers=coded)
        chat = await http.post("/v1/chat/completions", content=packed, headers=coded)
    assert files.status_code == chat.status_code == 200
    for _, sent, content in raw.requests[-2:]:
        assert content == packed
        assert [v for k, v in sent if k.lower() == b"content-encoding"] == [b"gzip"]


@pytest.mark.parametrize("make", _transports())
async def test_an_answer_with_a_content_coding_is_forwarded_decoded(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    """A whole answer is read in one piece where no content coding is to be undone; a gzip
    answer is decoded as before (its ``Content-Encoding`` and length are the connection's)."""
    raw, base = upstream
    async with _serving(base, make) as http:
        packed = await http.get("/v1/gzip")
        plain = await http.get("/v1/files")
    assert packed.content == plain.content == ANSWER
    assert "content-encoding" not in packed.headers
    assert packed.headers["content-length"] == str(len(ANSWER))
    assert raw.connections == 1


@pytest.mark.parametrize("make", _transports())
async def test_an_upstreams_keep_alives_reach_the_caller(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    """Over the network, on either transport: a guarded stream's comments (OpenRouter's
    ``: OPENROUTER PROCESSING``, ``: keep-alive``) reach the caller as they came, around the
    upstream's events."""
    _, base = upstream
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with _serving(base, make) as http:
        answer = await http.post("/v1/chat/completions", json=ask)
    items = [e for e in answer.content.split(b"\n\n") if e and not e.startswith(b": agentguard")]
    assert answer.status_code == 200
    assert items == [p.rstrip(b"\n") for p in THINKING]


@pytest.mark.parametrize("make", _transports())
async def test_a_streams_text_cut_inside_a_character_arrives_whole(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    """The pieces of a stream are read as they come (straight from aiohttp's connection,
    without httpx's reading) and decoded as one text: a character the pieces cut in two, an
    event cut in two, reach the caller whole, forwarded and guarded alike."""
    _, base = upstream
    said = [{"role": "user", "content": "split-utf8"}]
    ask = {"model": "m", "messages": said, "stream": True}
    async with _serving(base, make) as http:
        guarded = await http.post("/v1/chat/completions", json=ask)
        forwarded = await http.post("/v1/proxied/chat/completions", json=ask)
    texts = [
        json.loads(line[6:])["choices"][0]["delta"].get("content")
        for line in guarded.text.splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(t for t in texts if t) == "d\u00e9j\u00e0"
    assert "d\u00e9j\u00e0" in forwarded.text


@pytest.mark.parametrize("make", _transports())
async def test_an_answer_of_unknown_length_is_forwarded_as_it_comes(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    raw, base = upstream
    async with _serving(base, make) as http:
        answer = await http.get("/v1/chunked/files")
        again = await http.get("/v1/files")  # the connection was kept
    assert answer.status_code == again.status_code == 200
    assert answer.content == b"".join(CHUNKS)
    assert "content-length" not in answer.headers
    assert again.content == ANSWER
    assert [line for line, _, _ in raw.requests] == [
        b"GET /v1/chunked/files HTTP/1.1",
        b"GET /v1/files HTTP/1.1",
    ]
    assert raw.connections == 1


@pytest.mark.parametrize("make", _transports())
async def test_a_refused_connection_is_unreachable_not_a_timeout(
    make: Callable[[], httpx.AsyncBaseTransport],
) -> None:
    async with _serving(f"http://127.0.0.1:{free_port()}", make) as http:
        forwarded = await http.get("/v1/files")
    assert forwarded.status_code == 502
    assert forwarded.json()["error"]["code"] == "upstream_unreachable"


def test_aiohttp_errors_are_the_httpx_errors_they_are() -> None:
    """Timeouts are timeouts (the server answers 504), connection failures are not (502)."""
    aiohttp = pytest.importorskip("aiohttp")
    from agentguard.serve._aiohttp import _httpx_error

    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    refused = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 9, False, True, None, None, None),
        ConnectionRefusedError(111, "refused"),
    )
    cases: list[tuple[BaseException, bool, type[Exception]]] = [
        (aiohttp.ConnectionTimeoutError("connect"), False, httpx.ConnectTimeout),
        (aiohttp.SocketTimeoutError("read"), False, httpx.ReadTimeout),
        (asyncio.TimeoutError(), False, httpx.PoolTimeout),
        (asyncio.TimeoutError(), True, httpx.ReadTimeout),
        (refused, False, httpx.ConnectError),
        (aiohttp.ServerDisconnectedError(), False, httpx.RemoteProtocolError),
        (aiohttp.ServerDisconnectedError(), True, httpx.ReadError),
        (aiohttp.ClientPayloadError("cut"), True, httpx.ReadError),
    ]
    for exc, reading, kind in cases:
        error = _httpx_error(exc, request, reading=reading)
        assert type(error) is kind, (exc, reading)
        assert isinstance(error, httpx.TimeoutException) == issubclass(kind, httpx.TimeoutException)
    cancelled = asyncio.CancelledError()
    assert _httpx_error(cancelled, request) is cancelled


@pytest.mark.skipif("br" in DECODABLE, reason="brotli is installed: the server undoes br")
@pytest.mark.parametrize("make", _transports())
async def test_a_coding_the_server_cannot_undo_is_never_lost(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    """Node's ``fetch`` and curl offer ``br``, which the server reads only with the ``brotli``
    package. A forwarded answer in it goes on as it came, with its ``Content-Encoding`` (it went
    without it: bytes the caller took for JSON); a guarded call, whose answer the guard reads,
    and the model list the server adds its tiers to go up without ``br`` among the codings they
    accept (and as they came when they have none)."""
    raw, base = upstream
    offered = "gzip, deflate, br"
    async with _serving(base, make, {"tiers": {"fast": {"model": "m"}}}) as http:
        forwarded = await http.get("/v1/br/files", headers={"accept-encoding": offered})
        listed = await http.get("/v1/models", headers={"accept-encoding": offered})
        ask = {"model": "m", "messages": [{"role": "user", "content": "docs?"}]}
        for coding in (offered, "br", "gzip, deflate"):
            answer = await http.post(
                "/v1/chat/completions", json=ask, headers={"accept-encoding": coding}
            )
            assert answer.json()["choices"][0]["message"]["content"].startswith("Voil")
    assert forwarded.headers["content-encoding"] == "br"
    assert forwarded.content == BROTLI
    # the upstream's models beside the tiers: a list the server read
    assert {m["id"] for m in listed.json()["data"]} == {"m", "fast"}
    sent = [dict(headers).get(b"accept-encoding") for _, headers, _ in raw.requests[1:]]
    assert sent == [b"gzip, deflate", b"gzip, deflate", b"identity", b"gzip, deflate"]


@pytest.mark.parametrize("make", _transports())
async def test_a_callers_expectation_of_100_continue_is_met_here_not_upstream(
    upstream: tuple[RawUpstream, str], make: Callable[[], httpx.AsyncBaseTransport]
) -> None:
    """curl sends ``Expect: 100-continue`` with a large body: the ASGI server meets it before
    the body is read. Forwarded, aiohttp would hold the body back for the upstream's own
    ``100 Continue``, and an upstream that waits for the body (as this one does) would never
    answer: both calls go up without it and are answered."""
    import anyio

    raw, base = upstream
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]})
    expect = {"expect": "100-continue", "content-type": "application/json"}
    with anyio.fail_after(30):  # a bound on a hang, not a measure of time
        async with _serving(base, make) as http:
            guarded = await http.post("/v1/chat/completions", content=body, headers=expect)
            forwarded = await http.post("/v1/files", content=body, headers=expect)
    assert guarded.status_code == forwarded.status_code == 200
    assert [dict(headers).get(b"expect") for _, headers, _ in raw.requests] == [None, None]
