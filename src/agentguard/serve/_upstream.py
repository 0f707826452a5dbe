"""The upstream as a model transport: OpenAI-compatible HTTP through one pooled httpx transport.

The request goes out as the caller sent it: when the guard did not change it, the caller's own
body bytes are forwarded (not a re-encoding); the answer comes back with its bytes kept, so
that an answer the guard did not change reaches the caller byte for byte. Streams are read as
server-sent events; each event keeps its text for the same reason.

Upstream errors are raised as :class:`UpstreamError` (a :class:`~agentguard.ModelError`: the
guard classifies it by ``status_code`` and ``response.headers``, honouring ``Retry-After``),
carrying the upstream's body so that an error the guard lets through reaches the caller as the
upstream answered it.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from httpx import _decoders as httpx_decoders

from agentguard._redact import MIN_SECRET_LENGTH, REDACTED
from agentguard.exceptions import ModelError, ModelTimeout
from agentguard.integrations.openai import request_from_responses
from agentguard.integrations.openai._responses import (
    FAILURES,
    chunk_of_event,
    failed_error,
    response_from_responses,
    responses_body,
)
from agentguard.resilience._classify import inband_status
from agentguard.transport import ModelRequest, ModelResponse, StreamChunk

__all__ = [
    "DECODABLE",
    "FORWARD",
    "HOP_BY_HOP",
    "Answer",
    "Event",
    "Forward",
    "HTTPUpstream",
    "Pool",
    "UpstreamCut",
    "UpstreamError",
    "accepted",
    "body_pieces",
    "end_to_end",
    "failure",
    "hop_by_hop",
    "json_object",
    "read_by_server",
    "read_whole",
    "readable",
]

#: The ``ModelRequest.extensions`` key of a request's :class:`Forward`.
FORWARD = "agentguard.serve.forward"

# Headers that describe one connection, not the message (RFC 9110 §7.6.1), those httpx sets
# itself for the body it sends, and ``Expect``: a caller's ``100-continue`` was met by the
# ASGI server before the body was read whole (forwarded, aiohttp would hold the body back until
# the upstream's own ``100 Continue``: a round trip more, and no answer at all from an upstream
# that waits for the body).
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
        "expect",
    }
)


#: The same names as raw lowercase header names (an ASGI request's, an answer's lowered).
HOP_BY_HOP = frozenset(name.encode() for name in _HOP)


def hop_by_hop(name: str) -> bool:
    """Whether a header belongs to one connection only (never forwarded either way)."""
    return name.lower() in _HOP


def end_to_end(
    pairs: Iterable[tuple[bytes, bytes]], *, keep: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """A message's raw header pairs that go on to the other side (names in lowercase, in
    order, a header sent twice still two): not those of :data:`HOP_BY_HOP` (but the names in
    ``keep``), nor any its ``Connection`` header names, which a proxy must remove as well
    (RFC 9110 §7.6.1: ``Connection: keep-alive, X-Hop`` makes ``X-Hop`` the connection's)."""
    lowered = [(k.lower(), v) for k, v in pairs]
    dropped = HOP_BY_HOP - keep
    for name, value in lowered:
        if name == b"connection":
            dropped = dropped | {n.strip().lower() for n in value.split(b",")}
    return [(k, v) for k, v in lowered if k not in dropped]


def json_object(content: bytes | str) -> dict[str, Any] | None:
    """The JSON object ``content`` holds, or ``None`` when it holds none the server can read:
    no JSON, JSON of another type, or JSON nested deeper than the parser goes (which raises
    ``RecursionError``, not ``ValueError``)."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


#: The content codings whose answers the server reads (httpx undoes them): ``gzip`` and
#: ``deflate``, and ``br`` / ``zstd`` when their packages are installed.
DECODABLE = frozenset(
    getattr(httpx_decoders, "SUPPORTED_DECODERS", ("identity", "gzip", "deflate"))
)


def _codings(value: str) -> list[str]:
    return [c.split(";")[0].strip().lower() for c in value.split(",") if c.strip()]


def readable(headers: httpx.Headers) -> bool:
    """Whether the server can undo an answer's ``Content-Encoding`` (else its body is passed on
    as it came, with that header: the caller asked for the coding)."""
    found = headers.get_list("content-encoding")
    return not found or all(c in DECODABLE for c in _codings(",".join(found)))


def accepted(value: str) -> str:
    """A caller's ``Accept-Encoding`` for a guarded call, whose answer the guard reads: as it
    came, but for the codings the server cannot undo (Node's ``fetch`` and curl offer ``br``:
    without the ``brotli`` package its answer could be read by neither the guard nor, once its
    ``Content-Encoding`` is taken off, the caller); ``identity`` when none is left."""
    items = [item for item in value.split(",") if item.strip()]
    kept = [item for item, name in zip(items, _codings(value), strict=True) if name in DECODABLE]
    if len(kept) == len(items):
        return value
    return ",".join(kept).strip() or "identity"


class Answer(dict[str, Any]):
    """An upstream JSON answer as data, with the status, bytes and headers it came in."""

    def __init__(
        self,
        body: Mapping[str, Any],
        content: bytes,
        headers: Mapping[str, str],
        status: int = 200,
    ) -> None:
        super().__init__(body)
        self.content = content
        self.status = status
        # as httpx.Headers: a header sent twice (Set-Cookie) stays two
        self.headers = headers if isinstance(headers, httpx.Headers) else httpx.Headers(headers)


class Event(dict[str, Any]):
    """One server-sent event's JSON data, with its text and event name as received."""

    def __init__(self, body: Mapping[str, Any], data: str, name: str | None) -> None:
        super().__init__(body)
        self.data = data
        self.name = name
        #: the chunk the transport read from this event (a guard that passes the chunk on
        #: unchanged passes on this very object)
        self.chunk: StreamChunk | None = None


@dataclass(slots=True)
class Forward:
    """What the server keeps beside one guarded request (in its extensions).

    Attributes:
        path: the upstream path (``/chat/completions`` or ``/responses``), after the base URL.
        body: the caller's JSON body as parsed.
        content: the caller's body bytes, forwarded as they are while the guard changes nothing.
        query: the caller's query string as it came, with its ``?`` (``?api-version=...``), or
            ``""``: it goes upstream with the request.
        sent: the caller's header pairs that go upstream, as they came (a header sent twice
            stays two, each value its bytes): every attempt sends them, the transport's own
            (a tier's key) over them.
        headers: the upstream's answer headers of the last attempt (set by the transport).
        last: the last chunk the upstream streamed (what chunks the guard makes are dated by).
        chat: every event of the last attempt's chat stream, in order, each with the chunk the
            transport read from it (the server hands them on where the guard changed nothing).
        events: every event of the last attempt's Responses stream, in order (the guard
            passes on only their text; the server replays the others around it).
        unterminated: the last attempt's chat stream ended without ``data: [DONE]`` (some
            servers send none): the server then sends none either.
    """

    path: str
    # the caller's data and credentials: never in a repr (a debug log, an error tracker)
    body: Mapping[str, Any] = field(repr=False)
    content: bytes = field(repr=False)
    query: str = ""
    sent: list[tuple[bytes, bytes]] = field(default_factory=list, repr=False)
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    last: Event | None = None
    chat: list[tuple[Event, StreamChunk]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    unterminated: bool = False


class UpstreamError(ModelError):
    """The upstream answered with an error status (or could not be reached: ``status_code``
    ``None``); ``content`` and ``headers`` are its answer, passed on as they are."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None,
        headers: Mapping[str, str] | None = None,
        content: bytes = b"",
        model: str | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, headers=headers, model=model)
        self.content = content
        self.headers = httpx.Headers(headers or {})
        #: the stream event that reported it, when the upstream failed inside its stream
        self.event: Event | None = None
        #: the status the upstream answered with, when it is not ``status_code``: an error
        #: object in a 200 answer is passed on as that answer, status and all
        self.answered: int | None = None


def _is_responses(forward: Forward | None) -> bool:
    return forward is not None and forward.path.endswith("/responses")


def request_body(request: ModelRequest, *, stream: bool) -> dict[str, Any]:
    """The wire body of ``request`` for its endpoint."""
    forward = request.extensions.get(FORWARD)
    if _is_responses(forward if isinstance(forward, Forward) else None):
        # its input items, tools as given, as the openai transport sends it
        return responses_body(request, stream=stream)
    return request.to_body(stream=stream)


def responses_request(body: Mapping[str, Any]) -> ModelRequest:
    """The neutral request of a Responses API body."""
    return request_from_responses(body)


class Pool:
    """The connections to the upstreams: one pooled httpx transport (keep-alive, HTTP/1.1).

    Requests go out as they are: no cookie jar (one caller's cookies must never reach another),
    no redirects followed, no retries (the guard's retry layer is the only one). httpx's client
    would add each of these; the transport alone is also several times cheaper per request.

    Args:
        transport: the httpx transport (default: aiohttp's connections behind httpx's
            interface, :class:`~agentguard.serve._aiohttp.AiohttpTransport`, when aiohttp is
            installed — the ``serve`` extra installs it — else ``httpx.AsyncHTTPTransport``;
            both with ``max_connections`` and no retries; tests give an
            ``httpx.MockTransport``).
        timeout: seconds for each read, write and pool wait (connect: at most 10).
        max_connections: connections open at once, to all upstreams together.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        timeout: float = 600.0,
        max_connections: int = 512,
    ) -> None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self.transport = transport or _default_transport(limits)
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0)).as_dict()
        self._urls: dict[str, httpx.URL] = {}

    def _url(self, text: str) -> httpx.URL:
        url = self._urls.get(text)
        if url is None:
            url = httpx.URL(text)
            if len(self._urls) < 1024:  # the model paths, not every forwarded query
                self._urls[text] = url
        return url

    async def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | list[tuple[bytes, bytes]],
        content: bytes,
        timeout: float | None = None,
        model: str | None = None,
    ) -> httpx.Response:
        """Send one request; the answer's body is left to stream. ``headers``: by name, or as
        the raw pairs they go out as.

        Raises:
            ModelTimeout: the upstream did not answer in time.
            UpstreamError: it could not be reached (``status_code`` ``None``).
        """
        seconds = self._timeout if timeout is None else httpx.Timeout(timeout).as_dict()
        request = _request(method, self._url(url), headers, content, {"timeout": seconds})
        try:
            response = await self.transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise failure(exc, cut=False, model=model) from exc
        response.request = request
        return response

    async def aclose(self) -> None:
        """Close every connection."""
        await self.transport.aclose()


def _request(
    method: str,
    url: httpx.URL,
    headers: Mapping[str, str] | list[tuple[bytes, bytes]],
    content: bytes,
    extensions: dict[str, Any],
) -> httpx.Request:
    """The httpx request httpx would make of ``content=content``, its header pairs given
    whole: ``Host`` first, then ``headers`` (names as given; values by name as Latin-1, the
    bytes a caller's value came as), then the body's ``Content-Length`` (``0`` where the method
    carries a body and there is none).

    httpx's own way reads the header pairs again and again (their encoding, a look-up for each
    header it would add), most of the cost of building a request, paid per request.
    """
    pairs = (
        headers
        if isinstance(headers, list)
        else [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    )
    raw = [(b"Host", url.netloc), *pairs]
    if content or method in ("POST", "PUT", "PATCH"):
        raw.append((b"Content-Length", b"%d" % len(content)))
    request = httpx.Request(
        method, url, headers=raw, stream=httpx.ByteStream(content), extensions=extensions
    )
    request.read()  # the body in hand (``request.content``), as with ``content=``
    return request


def read_by_server(pairs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The header pairs (lowercase names) of a request whose answer the server reads itself (a
    guarded call, the model list it adds the tiers to): each ``Accept-Encoding`` as
    :func:`accepted` leaves it."""
    return [
        (k, accepted(v.decode("latin-1")).encode("latin-1")) if k == b"accept-encoding" else (k, v)
        for k, v in pairs
    ]


class UpstreamCut(UpstreamError, ConnectionError):
    """The upstream's answer broke off (its connection dropped mid-answer): a connection error,
    which the guard retries as it would the httpx ``ReadError`` it came from."""


def failure(exc: httpx.HTTPError, *, cut: bool, model: str | None = None) -> ModelError:
    """The model error of an httpx error reaching the upstream, or (``cut``) reading its
    answer: a :class:`~agentguard.ModelTimeout` when it did not answer in time, else an
    :class:`UpstreamError` with no status (:class:`UpstreamCut` for an answer that broke off),
    which the server answers as a 504 and a 502 ``upstream_unreachable``."""
    name = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return ModelTimeout(f"the upstream did not answer in time ({name})", model=model)
    if cut:
        return UpstreamCut(
            f"the upstream's answer broke off ({name})", status_code=None, model=model
        )
    return UpstreamError(
        f"the upstream could not be reached ({name})", status_code=None, model=model
    )


async def read_whole(response: httpx.Response, *, model: str | None = None) -> bytes:
    """The body of ``response``, whole, then the answer closed (its connection back in the
    pool once read to its end).

    A body stream that reads itself whole (``read_whole()``: aiohttp's answers, see
    :mod:`agentguard.serve._aiohttp`) does so in one call, where httpx's reading passes each
    piece through a decoder, a chunker and a context of its own (a sizeable share of a
    forwarded request's CPU); it answers ``None`` for a body httpx has a content coding to
    undo, which httpx's reading then decodes as before.
    """
    try:
        whole = getattr(response.stream, "read_whole", None)
        content: bytes | None = await whole() if whole is not None else None
        return content if content is not None else await response.aread()
    except httpx.HTTPError as exc:  # the connection dropped, or went silent, mid-answer
        raise failure(exc, cut=True, model=model) from exc
    finally:
        await response.aclose()


def body_pieces(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body of ``response`` as it arrives, its content coding undone (httpx's
    ``aiter_bytes``).

    A body stream that gives its pieces itself (``direct_pieces()``: aiohttp's answers, see
    :mod:`agentguard.serve._aiohttp`) gives them straight, where httpx's reading passes each
    through three generators, a decoder and a chunker of its own (per piece of a stream, on
    the way to the caller); it answers ``None`` for a body httpx has a content coding to undo,
    which httpx's reading then decodes as before.
    """
    pieces = getattr(response.stream, "direct_pieces", None)
    direct: AsyncIterator[bytes] | None = pieces() if pieces is not None else None
    return direct if direct is not None else response.aiter_bytes()


def _default_transport(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    try:
        from ._aiohttp import AiohttpTransport  # noqa: PLC0415 - aiohttp is optional
    except ImportError:
        return httpx.AsyncHTTPTransport(limits=limits, retries=0)
    return AiohttpTransport(max_connections=limits.max_connections or 512)


def _unchanged(body: Mapping[str, Any], caller: Mapping[str, Any]) -> bool:
    """Whether the body to send is the caller's: equal, but for the empty lists the neutral
    request leaves out (``"tools": []``, which OpenAI refuses and a local server ignores: either
    way the upstream's to judge, on the caller's bytes)."""
    if body == caller:
        return True
    return len(body) < len(caller) and body == {
        k: v for k, v in caller.items() if k in body or v != []
    }


#: The request headers that carry a caller's credentials (OpenAI and most servers, Azure
#: OpenAI, Anthropic-style servers, Google's; cookies), lower-case.
CREDENTIALS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "x-goog-api-key", "cookie"}
)
_CREDENTIALS = frozenset(name.encode() for name in CREDENTIALS)


def _own_keys(headers: list[tuple[bytes, bytes]]) -> tuple[bytes, ...]:
    """The secrets among a transport's own headers: each credential header's value and the
    token of an ``Authorization: <scheme> <token>`` (and their forms in JSON text), longest
    first."""
    keys: set[bytes] = set()
    for name, value in headers:
        if name not in _CREDENTIALS:
            continue
        for key in (value.strip(), value.strip().rpartition(b" ")[2]):
            if len(key) >= MIN_SECRET_LENGTH:
                keys.add(key)
                keys.add(json.dumps(key.decode("latin-1"))[1:-1].encode("latin-1"))
    return tuple(sorted(keys, key=len, reverse=True))


def _masked(content: bytes, keys: tuple[bytes, ...]) -> bytes:
    """``content`` with each of ``keys`` replaced by ``***``."""
    for key in keys:
        if key in content:
            content = content.replace(key, REDACTED.encode())
    return content


def _event_stream(headers: httpx.Headers) -> bool:
    """Whether an answer's ``Content-Type`` is an event stream (``text/event-stream``)."""
    kind: str = headers.get("content-type", "")
    return kind.lower().startswith("text/event-stream")


def _as_answered(response: httpx.Response, content: bytes, model: str) -> UpstreamError:
    """An upstream answer that is no answer the guard can read (an error status, a redirect, a
    2xx whose body is no JSON object or, to a stream, no event stream) as the error that
    passes it on as it came: its status, headers and body. The guard classifies it by that
    status: retried when it is a 429 or a 5xx, else raised at once."""
    status = response.status_code
    unread = "" if status >= 400 else ", no answer the guard can read"
    return UpstreamError(
        f"HTTP {status} from the upstream{unread}",
        status_code=status,
        headers=response.headers,
        content=content,
        model=model,
    )


class HTTPUpstream:
    """An async transport to one OpenAI-compatible base URL.

    Args:
        pool: the connections to send through.
        base_url: the upstream's base URL, e.g. ``http://127.0.0.1:11434/v1``.
        headers: headers every request carries (a tier's own ``Authorization``), over the
            caller's.
        keep_credentials: whether the caller's credentials go along (``Authorization``,
            ``api-key``, ``x-api-key`` ...): not to a tier at another origin than the server's
            upstream, which they were not given for.
    """

    def __init__(
        self,
        pool: Pool,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        *,
        keep_credentials: bool = True,
    ) -> None:
        self._pool = pool
        self._base = base_url.rstrip("/")
        self._own = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        # the caller's headers that do not go: those the transport sends its own of, and the
        # caller's credentials where they may not go
        self._replaced = frozenset(k for k, _ in self._own) | (
            frozenset() if keep_credentials else _CREDENTIALS
        )
        # the transport's own credentials (a tier's key): the caller never gave them, so an
        # answer to a request they went with is passed on without them (see _hidden)
        self._keys = _own_keys(self._own)

    async def _open(self, request: ModelRequest, *, stream: bool) -> httpx.Response:
        forward = request.extensions.get(FORWARD)
        forward = forward if isinstance(forward, Forward) else None
        body = request_body(request, stream=stream)
        path = forward.path + forward.query if forward is not None else "/chat/completions"
        if forward is not None and _unchanged(body, forward.body):
            content = forward.content  # unchanged: the caller's bytes, exactly
        else:
            content = json.dumps(body, ensure_ascii=False).encode()
        # the caller's headers as sent (repeats, each value's bytes), the transport's own over
        # them; the caller's Content-Type, else JSON's
        caller = (
            forward.sent
            if forward is not None
            else [
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in request.headers.items()
            ]
        )
        pairs = [(k, v) for k, v in caller if k not in self._replaced] + self._own
        if not any(k == b"content-type" for k, _ in pairs):
            pairs.append((b"content-type", b"application/json"))
        response = await self._pool.send(
            "POST",
            self._base + path,
            headers=read_by_server(pairs),
            content=content,
            timeout=request.timeout,
            model=request.model,
        )
        if forward is not None:
            forward.headers = response.headers
        if not 200 <= response.status_code < 300 or (
            stream and not _event_stream(response.headers)
        ):
            raise self._hidden(
                _as_answered(
                    response, await read_whole(response, model=request.model), request.model
                )
            )
        return response

    def _hidden(self, failure: UpstreamError) -> UpstreamError:
        """``failure`` with the transport's own credentials (a tier's key) masked in the body
        and headers it passes on (an upstream echoing the key it was sent, as many do in a 401,
        must not hand it to the caller). An answer to the caller's own credentials (no key of
        the transport's) is passed on as it came."""
        if self._keys:
            failure.content = _masked(failure.content, self._keys)
            if any(key in value for _, value in failure.headers.raw for key in self._keys):
                failure.headers = httpx.Headers(
                    [(k, _masked(v, self._keys)) for k, v in failure.headers.raw]
                )
            event = failure.event
            if event is not None:
                data = _masked(event.data.encode(), self._keys).decode()
                if data != event.data:
                    failure.event = Event(json_object(data) or {}, data, event.name)
        return failure

    async def asend(self, request: ModelRequest) -> ModelResponse:
        """One non-streaming call."""
        response = await self._open(request, stream=False)
        content = await read_whole(response, model=request.model)
        data = json_object(content)
        if data is None:
            raise self._hidden(_as_answered(response, content, request.model))
        answer = Answer(data, content, response.headers, response.status_code)
        forward = request.extensions.get(FORWARD)
        responses = _is_responses(forward if isinstance(forward, Forward) else None)
        if responses:
            error = failed_error(answer)
        else:
            error = answer.get("error")
            if not isinstance(error, Mapping) or isinstance(answer.get("choices"), list):
                error = None
        if error is not None:
            # a chat answer that is an error object (a gateway's way to report a provider's
            # failure), a Responses answer whose status is "failed": retried as the error it
            # reports, passed on as it came when the last
            failure = UpstreamError(
                "the upstream answered with an error object",
                status_code=inband_status(error),
                headers=response.headers,
                content=content,
                model=request.model,
            )
            failure.answered = response.status_code
            raise self._hidden(failure)
        if responses:
            return response_from_responses(answer, raw=answer)
        return ModelResponse.from_body(answer, raw=answer)

    async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """One streaming call, event by event."""
        forward = request.extensions.get(FORWARD)
        forward = forward if isinstance(forward, Forward) else None
        responses = _is_responses(forward)
        calls: dict[int, int] = {}
        response = await self._open(request, stream=True)
        if forward is not None:  # a new attempt: its own record
            forward.events = []
            forward.chat = []
            forward.unterminated = False
        done = False
        try:
            async for event in _events(response):
                if event is _DONE:
                    done = True
                    continue
                if isinstance(event, str):  # a keep-alive: no event of the answer's
                    yield StreamChunk(comment=event)
                    continue
                if forward is not None and responses:
                    forward.events.append(event)
                if _failed(event, responses):
                    reported = self._hidden(_reported(event, model=request.model))
                    if forward is not None and responses and reported.event is not None:
                        forward.events[-1] = reported.event  # kept as passed on: key masked
                    raise reported
                chunk = (
                    chunk_of_event(event, calls, event.get("type") or event.name)
                    if responses
                    else _chat_chunk(event)
                )
                if forward is not None and not responses:
                    forward.last = event
                    forward.chat.append((event, chunk))
                yield chunk
            if forward is not None and not responses:
                forward.unterminated = not done
        except httpx.HTTPError as exc:  # the connection dropped, or went silent, mid-stream
            # a connection error the guard retries while nothing of this attempt reached the
            # caller; once part of it did, the guard ends the stream on it (see the pipeline)
            raise failure(exc, cut=True, model=request.model) from exc
        finally:
            await response.aclose()


def _failed(event: Event, responses: bool) -> bool:
    """Whether an upstream stream's event is its error: a chat stream's ``data: {"error":
    {...}}`` (after a 200 head: OpenRouter's and OpenAI's way to fail mid-answer), a Responses
    stream's ``error`` event or ``response.failed``, or an event of either whose data is such an
    ``{"error": {...}}`` (the openai client raises it as an ``APIError``)."""
    error = event.get("error")  # none in a chunk: no ABC check for it
    if error is not None and isinstance(error, Mapping):
        return True
    return responses and (event.get("type") or event.name) in FAILURES


def _reported(event: Event, *, model: str) -> UpstreamError:
    """An upstream stream's error event (see :func:`_failed`) as the upstream error it is, with
    the status its code or name stands for (see ``inband_status``): retried while nothing of
    the attempt reached the caller; then, or once every attempt failed so, passed on as the
    event it came as, in a stream of the upstream's (see the server's ``_stream``)."""
    error: Any = event.get("error")
    whole = isinstance(error, Mapping)  # the event's data is the error object
    if not whole and (event.get("type") or event.name) == "response.failed":
        found = event.get("response")
        error = found.get("error") if isinstance(found, Mapping) else None
    elif not whole:
        error = {k: event.get(k) for k in ("type", "code", "message", "param")}
    error = dict(error) if isinstance(error, Mapping) else {}
    failure = UpstreamError(
        "the upstream reported an error in its stream",
        status_code=inband_status(error),
        headers={"content-type": "application/json"},
        content=event.data.encode() if whole else json.dumps({"error": error}).encode(),
        model=model,
    )
    failure.event = event
    return failure


def _chat_chunk(event: Event) -> StreamChunk:
    event.chunk = StreamChunk.from_body(event, raw=event)
    return event.chunk


_DONE = Event({}, "[DONE]", None)

# After ``[DONE]`` the upstream's body normally ends at once (the chunked encoding's last,
# empty chunk). It is read before the stream ends, so that the connection goes back to the pool:
# a response closed before its body's end closes its connection, and every stream would then
# pay a new connection (a TLS handshake with a remote upstream). Bounded for an upstream that
# keeps the stream open after ``[DONE]``: that connection is closed, as before.
_DRAIN_SECONDS = 0.25
_DRAIN_BYTES = 65_536


def _event(data: list[str], name: str | None) -> Event | None:
    """The event of some ``data:`` lines: :data:`_DONE` for ``[DONE]``, ``None`` when it holds
    no JSON object (nothing the guard can read, nothing to pass on either)."""
    text = "\n".join(data)
    if text.strip() == "[DONE]":
        return _DONE
    body = json_object(text)
    return Event(body, text, name) if body is not None else None


#: A comment's text goes on to at most this many characters (a keep-alive is a few words).
_COMMENT_CHARS = 256


async def _batches(response: httpx.Response) -> AsyncIterator[list[str]]:
    """The lines of ``response``'s body as they arrive: those of each piece read, together."""
    decoder = httpx_decoders.LineDecoder()  # the line splitting of httpx's ``aiter_lines``
    # the text decoding of httpx's ``aiter_text``, over the pieces as they come
    texts = codecs.getincrementaldecoder(_encoding(response))(errors="replace")
    async for piece in body_pieces(response):
        text = texts.decode(piece)
        if not text:
            continue
        lines = decoder.decode(text)
        if lines:
            yield lines
        # a comment line still coming is kept to its start (all of it that goes on): one
        # endless comment holds no more memory than a piece read (httpx keeps a line's pieces
        # in a list; should that change, the line is kept whole, as a data line is)
        held = getattr(decoder, "buffer", None)
        if isinstance(held, list) and len(held) > 1 and str(held[0]).startswith(":"):
            decoder.buffer = ["".join(held)[: _COMMENT_CHARS + 1]]
    text = texts.decode(b"", True)
    lines = (decoder.decode(text) if text else []) + decoder.flush()
    if lines:
        yield lines


def _encoding(response: httpx.Response) -> str:
    """``response.encoding``: httpx reads it from the ``Content-Type`` through the email
    package (microseconds per stream), needed only when that names a charset; else it is the
    response's default (the server never sets an encoding of its own)."""
    default = response.default_encoding
    if (
        isinstance(default, str)
        and "charset" not in response.headers.get("content-type", "").lower()
    ):
        return default or "utf-8"
    return response.encoding or "utf-8"


async def _events(response: httpx.Response) -> AsyncIterator[Event | str]:
    """The server-sent events of ``response`` whose data is a JSON object (:data:`_DONE` for
    ``[DONE]``, the last: it ends the stream), and its comments (the text after the ``:``)
    where they came: an upstream's keep-alives.

    Only the event framing of the SSE format (``event:`` / ``data:`` lines, a blank line ends
    an event); the HTTP underneath is httpx's. The comments of one piece read with no event
    between them go on as one, its text cut to :data:`_COMMENT_CHARS`: a keep-alive's worth is
    when it came, and an upstream sending nothing else costs what it sends, once.
    """
    name: str | None = None
    data: list[str] = []
    batches = _batches(response)
    async for lines in batches:
        comment: str | None = None
        for line in lines:
            if line.startswith(":"):
                if comment is None:
                    comment = line[1 : _COMMENT_CHARS + 1]
                continue
            if line:
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "data":
                    data.append(value)
                elif key == "event":
                    name = value
                continue
            event = _event(data, name) if data else None
            data, name = [], None
            if event is _DONE:
                await _drain(batches)
                yield _DONE
                return
            if event is not None:
                if comment is not None:  # it came before the event
                    yield comment
                    comment = None
                yield event
        if comment is not None:
            yield comment
    event = _event(data, name) if data else None  # a last event without its blank line
    if event is not None and event is not _DONE:
        yield event


async def _drain(batches: AsyncIterator[list[str]]) -> None:
    """Read what is left of a stream's body after ``[DONE]`` (see :data:`_DRAIN_SECONDS`)."""
    left = _DRAIN_BYTES
    with anyio.move_on_after(_DRAIN_SECONDS):
        async for lines in batches:
            left -= sum(len(line) + 1 for line in lines)
            if left < 0:
                return
