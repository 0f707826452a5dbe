"""The ``agentguard serve`` application: an OpenAI-compatible guard in front of any upstream.

:class:`GuardServer` holds what every request shares (the configuration, the pooled upstream
connections, the store, one guard per caller); :func:`create_app` puts it behind a Starlette app
whose routes are :data:`ROUTES` (extend them with :func:`add_route`) followed by a catch-all
that forwards every other request to the upstream unchanged.

Who calls: a request's ``Authorization`` (or ``api-key`` / ``x-api-key``) header, only ever kept
as a fingerprint. Each caller has a guard of its own — loop state, named sessions and budgets
(``token_budget.scope`` gets the caller's fingerprint) are never shared across keys — over one
store and one set of tier breakers that every caller, and every server on the same store, share.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import re
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from contextlib import asynccontextmanager
from email.utils import formatdate
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from agentguard.budget import TokenLedger, caller_config
from agentguard.config import GuardConfig
from agentguard.events import Hook
from agentguard.exceptions import AgentGuardError, LoopDetected, ModelTimeout
from agentguard.guard import AsyncGuard, AsyncGuardedStream, GuardReport
from agentguard.hooks._http import hook_endpoint
from agentguard.integrations._http import error_answer, headers_of
from agentguard.integrations._replay import ChatReplay, bare, call_keys, text_only
from agentguard.integrations._tiers import origin, tier_api_key
from agentguard.integrations.openai._responses import (
    OPENINGS,
    cut_response,
    is_text_event,
    unchanged_text,
)
from agentguard.pressure import MemoryPressureProbe, PressureReading
from agentguard.resilience import CircuitBreaker
from agentguard.storage import Store, store_from_config
from agentguard.transport import (
    SCOPE,
    SESSION_HEADER,
    TRACE_PARENT,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    caller_key,
    caller_scope,
    message_from_items,
    register_secret,
)
from agentguard.types import Tier

from ._meter import Metered, meter
from ._upstream import (
    FORWARD,
    Answer,
    Event,
    Forward,
    HTTPUpstream,
    Pool,
    UpstreamError,
    body_pieces,
    end_to_end,
    json_object,
    read_by_server,
    read_whole,
    readable,
    responses_request,
)

__all__ = ["ROUTES", "Endpoint", "GuardApp", "GuardServer", "add_route", "create_app"]

#: An endpoint of the server: the shared :class:`GuardServer` and the request, to a response.
Endpoint = Callable[["GuardServer", Request], Awaitable[Response]]

logger = logging.getLogger("agentguard.serve")

_KEY_HEADERS = ("authorization", "api-key", "x-api-key")
# What a forwarded model call's metering reads of its headers: the caller's key, the session.
_METER_HEADERS = frozenset(h.encode() for h in (*_KEY_HEADERS, SESSION_HEADER))
# A request's header that goes upstream with its body only when the body goes as it came.
_CODING = frozenset({b"content-encoding"})
_SESSION = SESSION_HEADER.encode()


class GuardServer:
    """What the requests of one ``agentguard serve`` process share.

    Args:
        config: the guard's configuration; its tiers may name their own ``base_url`` and
            ``api_key_env``, else they are served by ``upstream``.
        upstream: the upstream's OpenAI base URL (e.g. ``http://127.0.0.1:11434/v1``).
        transport: the httpx transport to reach it with (default: a pooled
            ``httpx.AsyncHTTPTransport``; tests give an ``httpx.MockTransport``).
        timeout: the default upstream timeout in seconds (a tier's own ``timeout`` wins).
        max_callers: callers whose guards are kept at once (the least recently seen go).
        clock: monotonic seconds for loop windows (injected in tests).
        sleep: how the guard waits between retries (injected in tests).
        rng: randomness for backoff jitter.
        hooks: event hooks of every guard.
    """

    def __init__(
        self,
        config: GuardConfig,
        upstream: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 600.0,
        max_callers: int = 1024,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        self.config = config
        self.upstream = upstream.rstrip("/")
        #: The pooled connections to the upstreams.
        self.pool = Pool(transport, timeout=timeout)
        #: The store of every caller's budgets and of the tier breakers (``storage`` section).
        self.store: Store = store_from_config(config.storage)
        self._options: dict[str, Any] = {"clock": clock, "sleep": sleep, "rng": rng}
        self._hooks = list(hooks or ())
        # one probe of the host for every caller, read at most once a second
        self._probe = (
            SampledProbe(config, clock=clock, hooks=self._hooks)
            if config.memory_pressure.enabled
            else None
        )
        self._guards: collections.OrderedDict[str, AsyncGuard] = collections.OrderedDict()
        self._max_callers = max(1, max_callers)
        # by endpoint, not tier: a model name no tier has is a tier of its own, and names are
        # the caller's to choose (the breakers of such tiers are bounded by the pipeline)
        self._transports: dict[tuple[str | None, str | None], HTTPUpstream] = {}
        self._breakers: collections.OrderedDict[str, CircuitBreaker] = collections.OrderedDict()
        self._streams: set[AsyncGuardedStream] = set()

    def caller(self, request: Request) -> str:
        """The caller's fingerprint (``""`` when the request names no key)."""
        return _caller(request.headers)

    def guard_for(self, caller: str) -> AsyncGuard:
        """The guard of one caller (made on first use; its budgets are scoped to it)."""
        guard = self._guards.get(caller)
        if guard is not None:
            self._guards.move_to_end(caller)
            return guard
        config = caller_config(self.config, caller) if caller else self.config
        ledger = (
            TokenLedger(config, store=self.store, hooks=self._hooks)
            if config.token_budget.enabled
            else None
        )
        guard = AsyncGuard(
            config=config,
            tier_transport=self.transport,
            ledger=ledger,
            probe=self._probe,
            hooks=self._hooks,
            **self._options,
        )
        # one breaker per tier, for every caller (and, on a shared store, every server)
        guard.pipeline.breakers = self._breakers
        if config.storage.backend != "memory":
            guard.pipeline.breaker_store = self.store
            # and each named session's loop ladder, whichever server a request reaches
            guard.pipeline.session_store = self.store
        self._guards[caller] = guard
        if len(self._guards) > self._max_callers:
            self._guards.popitem(last=False)
        return guard

    def transport(self, tier: Tier) -> HTTPUpstream:
        """The transport of a tier: its own endpoint and key, else the upstream's.

        The caller's credentials (``Authorization``, ``api-key``, ``x-api-key`` ...) were given
        for the server's upstream: a tier at another origin never gets them, only its own key.
        """
        found = self._transports.get(tier.endpoint)
        if found is None:
            key = tier_api_key(tier)
            headers = {"authorization": f"Bearer {key}"} if key else {}
            base = tier.base_url or self.upstream
            elsewhere = origin(base) != origin(self.upstream)
            found = HTTPUpstream(self.pool, base, headers, keep_credentials=not elsewhere)
            self._transports[tier.endpoint] = found
        return found

    @property
    def callers(self) -> int:
        """Callers whose guards are kept."""
        return len(self._guards)

    @property
    def open_streams(self) -> int:
        """Streams being served."""
        return len(self._streams)

    def track(self, stream: AsyncGuardedStream) -> None:
        """Keep ``stream`` until it ends, so that shutdown can settle it."""
        self._streams.add(stream)

    def untrack(self, stream: AsyncGuardedStream) -> None:
        self._streams.discard(stream)

    async def aclose(self, *, drain: float = 5.0) -> None:
        """Settle the streams still open (what they delivered is charged, the rest of their
        holds is freed), then close the upstream connections and the store.

        Args:
            drain: seconds to let cancelled requests settle their own streams first (a server
                shutting down cancels them, and goes on without waiting for them to end).
        """
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(drain):
                while self._streams:
                    await anyio.sleep(0.01)
            for stream in list(self._streams):
                await stream.aclose()
            self._streams.clear()
            await self.pool.aclose()
            self.store.close()


class SampledProbe(MemoryPressureProbe):
    """A memory-pressure probe that reads the host at most once per ``every`` seconds.

    A server calls it on every request; memory pressure changes over seconds, and a reading
    costs a file read or two (PSI, cgroup), which would otherwise be paid per request.
    """

    def __init__(
        self,
        config: GuardConfig,
        *,
        every: float = 1.0,
        clock: Callable[[], float] | None = None,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        super().__init__(config, clock=clock, hooks=hooks)
        self._every = every
        self._now = clock or _monotonic
        self._last: PressureReading | None = None
        self._until = 0.0

    def reading(self) -> PressureReading:
        """The last reading, or a new one when it is ``every`` seconds old."""
        now = self._now()
        if self._last is None or now >= self._until:
            self._last = super().reading()
            self._until = now + self._every
        return self._last


def _monotonic() -> float:
    return time.monotonic()  # noqa: TID251 - the server's own pacing, never a decision's clock


# An ``Authorization`` value's ``Bearer`` scheme (RFC 9110: any case, then one or more spaces).
def _caller(headers: Mapping[str, str]) -> str:
    """The fingerprint of the caller whose request has ``headers`` (lowercase names; ``""``
    when they name no key).

    The caller is its key, however the request spells it: ``Authorization: Bearer K``,
    ``authorization: bearer K`` and ``api-key: K`` are one caller, with one budget.
    """
    for name in _KEY_HEADERS:
        value = headers.get(name)
        if value:
            register_secret(value)  # forwarded upstream: never shown in an error
            key = caller_key(value)
            register_secret(key)
            return caller_scope(key)
    return ""


# -- answers --------------------------------------------------------------------------------


def _upstream_headers(headers: httpx.Headers) -> dict[str, str]:
    """An upstream answer's headers to pass on (not those of its connection or encoding: see
    :func:`end_to_end`), by name (:func:`_repeated` puts back a header sent twice)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in end_to_end(headers.raw)}


class _Whole(Response):
    """An answer sent whole, its headers given as the raw pairs they go out as.

    Starlette's ``Response`` reads its headers from a mapping and encodes them again; an
    answer passed on from the upstream has its pairs already (a header sent twice stays two).
    """

    def __init__(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = status
        self.body = body
        self.background = None
        self.raw_headers = headers


def _whole(
    status: int,
    body: bytes,
    upstream: httpx.Headers,
    extra: Mapping[str, str] | None = None,
    *,
    head: bool = False,
) -> Response:
    """An upstream answer to send whole: its headers as they came, but those of its connection
    and encoding (a header sent twice stays two) and any ``extra`` names (the guard's own
    headers, added after them); the body's ``Content-Length`` as Starlette sets it (none on a
    1xx, 204 or 304), for a ``head`` request the upstream's own (the length of the body it did
    not send)."""
    added = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()]
    names = {k for k, _ in added}
    out = [(k, v) for k, v in end_to_end(upstream.raw) if k not in names]
    out += added
    if head:
        length = [(b"content-length", v) for k, v in upstream.raw if k.lower() == b"content-length"]
        out += length[-1:]
    elif status >= 200 and status not in (204, 304):
        out.append((b"content-length", b"%d" % len(body)))
    return _Whole(status, body, out)


def _repeated(response: Response, upstream: Mapping[str, str]) -> Response:
    """``response`` with each header the upstream sent more than once (``Set-Cookie``) as it
    came, not joined into one (a ``Mapping`` of headers holds one value per name)."""
    if not isinstance(upstream, httpx.Headers):
        return response
    pairs = end_to_end(upstream.raw)
    counts = collections.Counter(k for k, _ in pairs)
    repeated = {k for k, n in counts.items() if n > 1}
    if repeated:
        kept = [h for h in response.raw_headers if h[0] not in repeated]
        response.raw_headers = kept + [h for h in pairs if h[0] in repeated]
    return response


def guard_error(exc: AgentGuardError) -> Response:
    """A guard decision as an OpenAI-shaped error answer (with ``x-agentguard-*`` headers).

    A refused loop carries the structured ``loop_detected`` error (detector, tool, count,
    ``retry_after``); a budget that frees up carries ``retry_after`` as its ``Retry-After``, and
    so does a 503 whose last upstream said when to come back.
    """
    status, kind, headers = error_answer(exc)
    error: dict[str, Any] = {"message": str(exc), "type": kind, "param": None, "code": kind}
    if isinstance(exc, LoopDetected):
        error.update(exc.to_error())
    if "retry-after" not in headers and status == 503:
        # every tier failed: the last upstream's own Retry-After, when it said one
        upstream = getattr(getattr(exc.__cause__, "response", None), "headers", None)
        found = upstream.get("retry-after") if isinstance(upstream, Mapping) else None
        if isinstance(found, str) and found.strip().isdigit():
            headers["retry-after"] = found.strip()
    if "retry-after" in headers:
        error["retry_after"] = int(headers["retry-after"])
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def upstream_error(exc: UpstreamError | ModelTimeout) -> Response:
    """An upstream error the guard let through, as the upstream answered it (its status, body
    and headers), with the guard's ``x-agentguard-*`` headers; an upstream that could not be
    reached is a 502 (504 when it did not answer in time)."""
    report = exc.agentguard_report
    extra = headers_of(report) if report is not None else {}
    if isinstance(exc, UpstreamError) and exc.status_code is not None:
        return _whole(exc.answered or exc.status_code, exc.content, exc.headers, extra)
    status, kind = (
        (504, "upstream_timeout")
        if isinstance(exc, ModelTimeout)
        else (502, "upstream_unreachable")
    )
    error = {"message": str(exc), "type": kind, "param": None, "code": kind}
    return JSONResponse({"error": error}, status_code=status, headers=extra)


def _same(original: ModelResponse, guarded: ModelResponse) -> bool:
    """Whether the guard left the answer as the upstream gave it."""
    a, b = original.message, guarded.message
    return original.finish_reason == guarded.finish_reason and all(
        (a.get(k) or None) == (b.get(k) or None) for k in ("content", "tool_calls")
    )


def _completion_body(answer: Answer, guarded: ModelResponse) -> bytes:
    """The chat completion to send: the upstream's bytes, or its body carrying the guard's
    message (tool calls the guard does not judge, ``custom`` ..., stay in it)."""
    if _same(ModelResponse.from_body(answer), guarded):
        return answer.content
    data = dict(answer)
    found = data.get("choices")
    choices: list[Any] = found if isinstance(found, list) else []
    first: Mapping[str, Any] = choices[0] if choices and isinstance(choices[0], Mapping) else {}
    message = dict(guarded.message)
    original = first.get("message")
    upstream_message: Mapping[str, Any] = original if isinstance(original, Mapping) else {}
    others = [
        c
        for c in upstream_message.get("tool_calls") or ()
        if isinstance(c, Mapping) and c.get("type") not in (None, "function")
    ]
    if others:
        message["tool_calls"] = [*(message.get("tool_calls") or ()), *others]
    data["choices"] = [
        {
            **first,
            "index": first.get("index", 0),
            "message": message,
            "finish_reason": guarded.finish_reason,
        },
        *choices[1:],
    ]
    return json.dumps(data, ensure_ascii=False).encode()


def _responses_body(answer: Answer, guarded: ModelResponse) -> bytes:
    from agentguard.integrations.openai._responses import (  # noqa: PLC0415
        response_from_responses,
        responses_output,
    )

    if _same(response_from_responses(answer), guarded):
        return answer.content
    data = dict(answer)
    data["output"] = responses_output(data, guarded.message)
    return json.dumps(data, ensure_ascii=False).encode()


# -- requests -------------------------------------------------------------------------------


def _forwarded(request: Request) -> dict[str, str]:
    """The caller's headers (not those of its connection), by name, for the guard to read:
    the caller's key, the session it names, its trace context (what goes upstream is
    :func:`_sent`'s)."""
    return {
        k.decode("latin-1"): v.decode("latin-1") for k, v in end_to_end(request.scope["headers"])
    }


def _sent(scope: Scope, *, keep: frozenset[bytes] = frozenset()) -> list[tuple[bytes, bytes]]:
    """The caller's header pairs that go upstream: as they came (a header sent twice stays
    two, each value its bytes, ``Content-Type`` as sent), but those of its connection (see
    :func:`end_to_end`, ``keep`` kept) and the guard's own ``x-agentguard-session``, which
    never goes upstream, whatever the route."""
    return [(k, v) for k, v in end_to_end(scope["headers"], keep=keep) if k != _SESSION]


async def _read(request: Request) -> tuple[bytes, dict[str, Any] | None]:
    """The request's body, and the JSON object it holds (``None``: none the guard can read,
    deep nesting included: the body then goes upstream as it came)."""
    content = await request.body()
    return content, json_object(content)


def _chat_request(
    body: dict[str, Any], headers: Mapping[str, str], extensions: Mapping[str, Any]
) -> ModelRequest | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not isinstance(body.get("model"), str):
        return None
    if not all(isinstance(m, dict) for m in messages):
        return None  # a message the guard cannot read would be left out of what goes upstream
    skip = {"model", "messages"} | ({"stream"} if body.get("stream") is True else set())
    params = {k: v for k, v in body.items() if k not in skip}
    return ModelRequest(
        model=body["model"],
        messages=messages,
        params=params,
        headers=headers,
        extensions=extensions,
    )


def _build(
    server: GuardServer, request: Request, path: str, content: bytes, body: dict[str, Any]
) -> tuple[AsyncGuard, ModelRequest] | None:
    """The caller's guard and the neutral request, or ``None`` when the guard cannot read the
    body (it then goes upstream unguarded, and the upstream answers it)."""
    if path == "/responses" and not isinstance(body.get("model"), str):
        return None
    headers = _forwarded(request)
    caller = _caller(headers)
    forward = Forward(path, body, content, _query(request.scope), sent=_sent(request.scope))
    extensions: dict[str, Any] = {FORWARD: forward}
    if caller:
        extensions[SCOPE] = caller
    # the caller's trace context: the guard's spans join the caller's trace (they go upstream
    # as sent, with the rest of the headers)
    carrier = {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
    if carrier:
        extensions[TRACE_PARENT] = carrier
    if path != "/responses":
        found = _chat_request(body, headers, extensions)
        return None if found is None else (server.guard_for(caller), found)
    neutral = responses_request(body)
    neutral = ModelRequest(
        model=neutral.model,
        messages=neutral.messages,
        params=neutral.params,
        headers=headers,
        tools=neutral.tools,
        max_output_tokens=neutral.max_output_tokens,
        extensions={**neutral.extensions, **extensions},
    )
    return server.guard_for(caller), neutral


async def _guarded(server: GuardServer, request: Request, path: str) -> Response:
    content, body = await _read(request)
    built = _build(server, request, path, content, body) if body is not None else None
    if built is None:
        return await forward(server, request, content=content)
    guard, neutral = built
    try:
        if body is not None and body.get("stream") is True:
            return await _stream(server, guard, neutral)
        response = await guard.acomplete(neutral)
    except AgentGuardError as exc:
        if isinstance(exc, (UpstreamError, ModelTimeout)):
            return upstream_error(exc)
        return guard_error(exc)
    raw = response.raw
    report: GuardReport | None = response.report
    headers = headers_of(report) if report is not None else {}
    if not isinstance(raw, Answer):  # nothing else comes from this transport
        return JSONResponse(dict(response.message), headers=headers)
    make = _responses_body if path == "/responses" else _completion_body
    return _whole(raw.status, make(raw, response), raw.headers, headers)


async def chat_completions(server: GuardServer, request: Request) -> Response:
    """``POST /v1/chat/completions``: the guarded call (streaming included)."""
    return await _guarded(server, request, "/chat/completions")


async def responses(server: GuardServer, request: Request) -> Response:
    """``POST /v1/responses``: the guarded Responses API call."""
    return await _guarded(server, request, "/responses")


# -- streams --------------------------------------------------------------------------------

_HEAD = ("id", "object", "created", "model", "system_fingerprint", "service_tier")


def _sse(data: str, name: str | None = None) -> bytes:
    """One server-sent event: each line of ``data`` on a ``data:`` line of its own (an event
    whose JSON came over several lines goes out as it came, not as one ``data:`` line followed
    by lines a client reads as unknown fields)."""
    head = f"event: {name}\n" if name else ""
    if "\n" in data:
        return (head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n").encode()
    return f"{head}data: {data}\n\n".encode()


def _made(chunk: StreamChunk, forward: Forward) -> bytes:
    """A chunk the guard made as a server-sent event, dated like the upstream's last."""
    last: Mapping[str, Any] = forward.last or {}
    head = {k: last[k] for k in _HEAD if k in last}
    delta: dict[str, Any] = {}
    if chunk.content:
        delta["content"] = chunk.content
    if chunk.reasoning:
        delta["reasoning_content"] = chunk.reasoning
    if chunk.refusal:
        delta["refusal"] = chunk.refusal
    if chunk.tool_calls:
        delta["tool_calls"] = [dict(c) for c in chunk.tool_calls]
    data = {
        **head,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": chunk.finish_reason}],
    }
    return _sse(json.dumps(data, ensure_ascii=False))


def _without_text(event: Event, neutral: StreamChunk) -> Event | None:
    """A chat event without the first answer's text (``None`` when nothing else is in it)."""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    first = choices[0] if isinstance(choices[0], Mapping) else {}
    if text_only(neutral, len(choices), first.get("logprobs")):
        return None
    out = []
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        first_answer = isinstance(choice, Mapping) and choice.get("index", 0) in (0, None)
        if first_answer and isinstance(delta, Mapping) and delta.get("content"):
            out.append({**choice, "delta": {k: v for k, v in delta.items() if k != "content"}})
        else:
            out.append(choice)
    body = {**event, "choices": out}
    return Event(body, json.dumps(body, ensure_ascii=False), event.name)


def _usage_only(event: Event) -> Event:
    """A chat event with its usage alone (no choices), as OpenAI sends the usage: what goes out
    of a finish chunk carrying the usage (llama.cpp) when the guard's own finish went out."""
    body = {**event, "choices": []}
    return Event(body, json.dumps(body, ensure_ascii=False), event.name)


class _ChatEvents:
    """A guarded chat stream as events: the upstream's own wherever the guard changed nothing
    (see :class:`~agentguard.integrations._replay.ChatReplay`), the guard's made otherwise."""

    def __init__(self, forward: Forward) -> None:
        self._forward = forward
        self._replay = ChatReplay(lambda: forward.chat, _without_text, _usage_only)

    def _one(self, item: Any) -> bytes:
        if isinstance(item, StreamChunk):
            return _made(item, self._forward)
        return _sse(item.data, item.name)

    def _bytes(self, items: list[Any]) -> bytes:
        if len(items) == 1:  # most chunks: the upstream's one event, without a join
            return self._one(items[0])
        return b"".join(map(self._one, items))

    def out(self, chunk: StreamChunk) -> bytes:
        if chunk.raw is None and bare(chunk) and not chunk.refusal:
            # the guard's finish of an answer the upstream gave none (a stream that ended on an
            # error event, or without its finish chunk): a chunk of nothing, which the upstream
            # never sent
            return b""
        return self._bytes(self._replay.of(chunk))

    def end(self) -> bytes:
        return self._bytes(self._replay.end())

    def failed(self, event: Event | None = None) -> bytes:
        """What goes out before the error the stream ends with (see ``ChatReplay.failed``:
        the opening ``role`` chunk ...; a call being judged stays back). (``event``: the
        upstream's error event, which no chunk stands for.)"""
        return self._bytes(self._replay.failed())


def _comment(text: str) -> bytes:
    """An upstream's keep-alive (``: OPENROUTER PROCESSING``), passed on where it came: a
    comment line and the blank line after it.

    Proxies and load balancers between the caller and the server cut a stream that stays
    silent past their idle timeout (often a minute); the upstream's comments keep it open while
    the model thinks, also while the guard holds text or a call back. One before the answer's
    first chunk sends the stream's head with it, as the upstream's own head had gone out: an
    error after it (every attempt failed) is an error event, no longer an error status.
    """
    return f":{text}\n\n".encode()


def _piece(replay: _ChatEvents | _Replay, chunk: StreamChunk) -> bytes:
    """What goes out for ``chunk``: an upstream's keep-alive as it came (see :func:`_comment`),
    the rest as the replay gives it."""
    return _comment(chunk.comment) if chunk.comment is not None else replay.out(chunk)


def _report_line(report: GuardReport) -> bytes:
    """A stream's report: a comment line, which clients skip and a person can read."""
    return f": agentguard {json.dumps(headers_of(report))}\n\n".encode()


def _error_event(exc: Exception, responses: list[Event] | None = None) -> bytes:
    """An error after the stream began, in the OpenAI form of a streamed error: a chat
    stream's ``data: {"error": {...}}``; a Responses stream's ``error`` event (``type``,
    ``code``, ``message``, ``param`` and the next ``sequence_number`` after the events it
    ``responses`` received), which the SDK hands on as a ``ResponseErrorEvent``."""
    if isinstance(exc, UpstreamError) and exc.event is not None:  # the upstream's own event
        return _sse(exc.event.data, exc.event.name)
    if isinstance(exc, UpstreamError) and exc.content:
        return _sse(exc.content.decode("utf-8", "replace"))
    kind = "error"
    error: dict[str, Any] = {"message": str(exc), "param": None}
    if isinstance(exc, AgentGuardError) and not isinstance(exc, (UpstreamError, ModelTimeout)):
        _, kind, _ = error_answer(exc)
        if isinstance(exc, LoopDetected):
            error.update(exc.to_error())
    if responses is not None:
        event = {"type": "error", **error, "code": kind, "sequence_number": _next(responses)}
        return _sse(json.dumps(event, ensure_ascii=False), "error")
    error.setdefault("type", kind)
    error["code"] = kind
    return _sse(json.dumps({"error": error}, ensure_ascii=False))


async def _stream(server: GuardServer, guard: AsyncGuard, neutral: ModelRequest) -> Response:
    """A guarded stream. Errors before its first chunk (an upstream's keep-alive is one: see
    :func:`_comment`) are answered as errors (status, headers), except an error the upstream
    sent in its stream's body (see :func:`_body_error`); later ones end the stream with an
    error event, as OpenAI does."""
    forward = neutral.extensions[FORWARD]
    assert isinstance(forward, Forward)
    stream = guard.astream(neutral)
    server.track(stream)
    try:
        first: StreamChunk | None = await anext(stream)
    except StopAsyncIteration:
        first = None
    except AgentGuardError as exc:
        await _settle(server, stream)
        if isinstance(exc, UpstreamError) and exc.event is not None:
            return _body_error(exc, forward)
        if isinstance(exc, (UpstreamError, ModelTimeout)):
            return upstream_error(exc)
        return guard_error(exc)
    except BaseException:
        await _settle(server, stream)
        raise
    headers = _upstream_headers(forward.headers)  # an event stream's (see HTTPUpstream)
    events = _events(server, stream, first, forward)
    try:
        opening = await anext(events)  # the stream's head, up to its first chunk
    except BaseException:
        await events.aclose()  # settles the stream
        raise
    return _repeated(_EventStream(opening, events, headers=headers), forward.headers)


def _body_error(exc: UpstreamError, forward: Forward) -> Response:
    """The last attempt's stream when it ended on the error event in its body (every attempt
    failed so, or its error is not retried) before anything went to the caller: as the
    upstream answered it, a 200 event stream (its head, the opening events the raw client
    hands on before the error, then the error's own event), not an error status the caller's
    client would take for another error (and retry: an SDK retries a 5xx or a 429, never an
    error event). A call the guard was judging stays back."""
    chat = forward.path != "/responses"
    replay: _ChatEvents | _Replay = _ChatEvents(forward) if chat else _Replay(forward)
    body = replay.failed(exc.event) + _error_event(exc)
    report = exc.agentguard_report
    if isinstance(report, GuardReport):
        body += _report_line(report)
    headers = _upstream_headers(forward.headers)
    return _repeated(_EventStream(body, _nothing(), headers=headers), forward.headers)


async def _nothing() -> AsyncGenerator[bytes, None]:
    """No more events (a stream whose head is all of it)."""
    nothing: tuple[bytes, ...] = ()
    for piece in nothing:
        yield piece


class _EventStream(StreamingResponse):
    """A stream of server-sent events whose head (the headers and the events up to the first
    chunk) goes out from the request's own task, as soon as the first chunk is there.

    Starlette's ``StreamingResponse`` sends everything from a task of its own, which starts on
    the event loop's next turn: on a busy server a turn is milliseconds, all of them added to
    the caller's time to first token. The rest goes out from the request's task too, while a
    plain task listens for the caller leaving.
    """

    def __init__(
        self, opening: bytes, events: AsyncGenerator[bytes, None], headers: Mapping[str, str]
    ) -> None:
        super().__init__(events, headers=headers, media_type="text/event-stream")
        self._opening = opening
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            start = {"type": "http.response.start", "status": self.status_code}
            await send({**start, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self._opening, "more_body": True})
        except BaseException:
            await self._events.aclose()  # settles the stream: the caller is gone
            raise
        try:
            await self._rest(scope, receive, send)
        finally:
            # a caller gone while a send waited (its connection full) leaves the events
            # suspended after a piece: settled now, not once the garbage collector finds them
            await self._events.aclose()

    async def _rest(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The events after the head, until they end or the caller leaves."""
        loop = _asyncio_loop()
        if loop is None or scope["type"] != "http" or _spec(scope) >= (2, 4):
            # a send to a caller gone raises (ASGI 2.4), or not asyncio: Starlette's own way
            await super().__call__(scope, receive, send)
            return
        # Starlette's way for a server that reports a caller leaving only by a message (uvicorn
        # says 2.3): the events sent while a task listens for it, and the sending cancelled
        # when it comes. Here the sending stays in the request's task and one plain task
        # listens: an anyio task group per stream costs several times as much.
        with anyio.CancelScope() as sending:
            listening = loop.create_task(_listen(receive, sending))
            try:
                await self.stream_response(send)
            finally:
                listening.cancel()
        if listening.done() and not listening.cancelled():
            failed = listening.exception()  # receive() itself failed: raised, as Starlette does
            if failed is not None:
                raise failed

    async def stream_response(self, send: Send) -> None:
        """The rest of the events (the head went out already)."""
        async for chunk in self._events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio event loop (``None`` under another async library)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _spec(scope: Scope) -> tuple[int, ...]:
    """The ASGI spec version the server reports (``2.0`` when it names none)."""
    version: str = scope.get("asgi", {}).get("spec_version", "2.0")
    return tuple(map(int, version.split(".")))


async def _listen(receive: Receive, sending: anyio.CancelScope) -> None:
    """Wait for the caller to leave (``http.disconnect``), then cancel ``sending``; also when
    ``receive`` fails."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:
        sending.cancel()
        raise
    sending.cancel()


async def _settle(server: GuardServer, stream: AsyncGuardedStream) -> None:
    """Close ``stream`` (what it delivered is charged, the rest of its hold freed), even while
    the request is being cancelled (a client gone, a shutdown)."""
    with anyio.CancelScope(shield=True):
        await stream.aclose()
    server.untrack(stream)


async def _events(
    server: GuardServer, stream: AsyncGuardedStream, first: StreamChunk | None, forward: Forward
) -> AsyncGenerator[bytes, None]:
    """The stream's events as they go out; the first piece is its head (the upstream's opening
    event and the first chunk), the last the report and ``[DONE]`` (none when the upstream's
    stream ended without one)."""
    chat = forward.path != "/responses"
    replay: _ChatEvents | _Replay = _ChatEvents(forward) if chat else _Replay(forward)
    try:
        try:
            yield _piece(replay, first) if first is not None else b""
            async for chunk in stream:
                yield _piece(replay, chunk)
        except Exception as exc:  # the answer has begun: the error can only be an event
            yield replay.failed(getattr(exc, "event", None))
            yield _error_event(exc, None if chat else forward.events)
            report = getattr(exc, "agentguard_report", None)
            if isinstance(report, GuardReport):
                yield _report_line(report)
            return
        yield replay.end()
        report = stream.report
        if report is not None:
            yield _report_line(report)
        if chat and not forward.unterminated:  # as the upstream ended it
            yield b"data: [DONE]\n\n"
    finally:
        await _settle(server, stream)


# Responses stream events that belong to a function call or end the response: held until the
# guard has judged the calls
_CALL_EVENTS = frozenset(
    {"response.function_call_arguments.delta", "response.function_call_arguments.done"}
)
_END_EVENTS = frozenset({"response.completed", "response.incomplete"})


def _held(event: Event) -> bool:
    kind = event.get("type")
    if kind in _CALL_EVENTS or kind in _END_EVENTS:
        return True
    item = event.get("item")
    return (
        kind in ("response.output_item.added", "response.output_item.done")
        and isinstance(item, Mapping)
        and item.get("type") == "function_call"
    )


def _opened_empty(event: Event) -> bool:
    """Whether a Responses event opens the answer's message or one of its parts, holding no
    text yet."""
    kind = event.get("type")
    if kind == "response.output_item.added":
        item = event.get("item")
        return (
            isinstance(item, Mapping) and item.get("type") == "message" and not item.get("content")
        )
    part = event.get("part")
    return kind == "response.content_part.added" and not (
        isinstance(part, Mapping) and part.get("text")
    )


def _text_event(event: Event) -> bool:
    item = event.get("item")
    return is_text_event(event.get("type"), item.get("type") if isinstance(item, Mapping) else None)


class _Replay:
    """A guarded Responses stream as the upstream's events: the guard passes on the text and
    reasoning deltas; the events between them go out in order around them; the function-call
    events and the closing event wait until the guard has judged the calls, and go out as the
    upstream sent them when it changed nothing (else rebuilt to carry the guard's calls; a
    stream the guard cut ends with ``response.incomplete``)."""

    def __init__(self, forward: Forward) -> None:
        self._forward = forward
        self._sent = 0  # forward.events[:_sent] went out (or were held)
        self._held: list[Event] = []
        self._calls: list[Mapping[str, Any]] = []
        self._text: list[str] = []  # the text the guard passed on
        self._finish: str | None = None  # the guard's answer's

    def _flush(self, upto: int, *, text: bool = True) -> bytes:
        out = []
        for event in self._forward.events[self._sent : upto]:
            if _held(event):
                self._held.append(event)
            elif text or not _text_event(event):
                out.append(_sse(event.data, event.name))
        self._sent = max(self._sent, upto)
        return b"".join(out)

    def out(self, chunk: StreamChunk) -> bytes:
        """What goes out for one guarded chunk: the events up to its text delta, or up to its
        reasoning delta short of the answer's text (which waits for the guard)."""
        raw = chunk.raw
        events = self._forward.events
        if chunk.content:
            self._text.append(chunk.content)
        if isinstance(raw, Event) and (chunk.content or chunk.reasoning):
            at = next((i for i in range(self._sent, len(events)) if events[i] is raw), None)
            if at is not None and chunk.content:
                return self._flush(at + 1)
            if at is not None:
                text = (i for i in range(self._sent, at + 1) if _text_event(events[i]))
                return self._flush(next(text, at + 1))
        self._calls.extend(chunk.tool_calls)
        self._finish = chunk.finish_reason or self._finish
        return b""

    def failed(self, error: Event | None = None) -> bytes:
        """What goes out before the error the stream ends with (``error``: the upstream's own
        error event, among the events received), as the raw client hands them on before it:
        the events not sent yet up to the first that carries what the guard holds (the
        answer's text, a call, the end); the openings, and a message's item and part opened
        empty, go."""
        events = self._forward.events
        upto = self._sent
        while upto < len(events) and events[upto] is not error:
            event = events[upto]
            if _held(event) or (_text_event(event) and not _opened_empty(event)):
                break
            upto += 1
        return self._flush(upto)

    def end(self) -> bytes:
        """The rest of the stream, once the guard's answer is complete. When the guard's text
        is not the upstream's (a call written as text, taken out of it), the upstream's text
        events not sent yet stay back and the closing response carries the guard's text."""
        received = self._forward.events
        closing = next((e for e in reversed(received) if e.get("type") in _END_EVENTS), None)
        cut = closing is None and self._finish == "length"
        if cut:
            closing = _incomplete(received)
        body = closing.get("response") if closing is not None else None
        if closing is None or not isinstance(body, Mapping):
            return self._flush(len(received)) + b"".join(_sse(e.data, e.name) for e in self._held)
        upstream = message_from_items(body.get("output"))
        text = "".join(self._text)
        same_text = unchanged_text(text, upstream.get("content"), received)
        rest = self._flush(len(received), text=same_text)
        theirs = call_keys(upstream.get("tool_calls") or ())
        if same_text and call_keys(self._calls) == theirs and not cut:
            return rest + b"".join(_sse(e.data, e.name) for e in self._held)
        from agentguard.integrations.openai._responses import responses_output  # noqa: PLC0415

        message = {
            **upstream,
            "content": text or None,
            "tool_calls": [dict(c) for c in self._calls],
        }
        output = responses_output(body, message)
        events: list[dict[str, Any]] = []
        for index, item in enumerate(output):
            if item.get("type") == "function_call":
                for kind in ("response.output_item.added", "response.output_item.done"):
                    events.append({"type": kind, "output_index": index, "item": item})
        events.append({**closing, "response": {**body, "output": output}})
        seq = closing.get("sequence_number")
        out = [rest]
        for event in events:
            if isinstance(seq, int):
                event["sequence_number"] = seq
                seq += 1
            out.append(_sse(json.dumps(event, ensure_ascii=False), str(event["type"])))
        return b"".join(out)


def _next(received: list[Event]) -> int:
    """The sequence number after those of a Responses stream's ``received`` events."""
    numbers = [e.get("sequence_number") for e in received]
    return max((n for n in numbers if isinstance(n, int)), default=-1) + 1


def _incomplete(received: list[Event]) -> Event | None:
    """The closing event of a stream the guard cut (a degenerating answer) before the
    upstream's own: ``response.incomplete``, the response the upstream opened with, as an answer
    cut at the output cap (a chat stream's ``finish_reason: "length"``)."""
    opening = next((e for e in received if e.get("type") in OPENINGS), None)
    body = opening.get("response") if opening is not None else None
    if not isinstance(body, Mapping):
        return None
    event = {
        "type": "response.incomplete",
        "sequence_number": _next(received),
        "response": cut_response(body),
    }
    return Event(event, json.dumps(event, ensure_ascii=False), "response.incomplete")


# -- the rest -------------------------------------------------------------------------------


def _target(server: GuardServer, path: str) -> str:
    """The upstream URL of a path: ``/v1/...`` under the upstream's base URL, anything else
    under its origin."""
    if path == "/v1" or path.startswith("/v1/"):
        return server.upstream + path[3:]
    origin = httpx.URL(server.upstream).copy_with(path="/", query=None)
    return str(origin).rstrip("/") + path


def _wire_path(scope: Scope) -> str:
    """The request's path as its caller encoded it, what the server routes and forwards by:
    ASGI's ``raw_path`` (``/v1/files/a%2Fb``, where ``path`` has ``a/b``, and ``%3F`` would
    become a query), less the ``root_path`` the app is served under; ``path`` from a server
    that gives no ``raw_path``."""
    raw: bytes | None = scope.get("raw_path")
    path = raw.decode("latin-1") if raw is not None else scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _query(scope: Scope) -> str:
    """The request's query string as it came, with its ``?`` (``""`` when it has none)."""
    query: bytes = scope.get("query_string") or b""
    return "?" + query.decode() if query else ""


async def forward(
    server: GuardServer, request: Request, *, content: bytes | None = None
) -> Response:
    """Any request, sent upstream as it came and answered as the upstream answered (streamed,
    unless it is small: see :func:`_small`)."""
    scope = request.scope
    body = content if content is not None else await request.body()
    return await _forward(server, scope, body)


async def _forward(server: GuardServer, scope: Scope, body: bytes) -> Response:
    """The request of ``scope`` with ``body``, sent upstream: its target as the caller gave it
    (the query string's bytes as they came) and its headers' raw pairs (a header sent twice
    stays two), but those of its connection (its body's ``Content-Encoding`` kept)."""
    url = _target(server, _wire_path(scope)) + _query(scope)
    # the body goes as it came, so its coding goes with it (a gzip body without its
    # Content-Encoding cannot be read upstream)
    headers = _sent(scope, keep=_CODING)
    method = scope["method"]
    metered: Metered | None = None
    if method == "POST" and server.config.token_budget.enabled:
        # a model call on a route the guard does not read still counts against the budgets
        try:
            metered = await _meter(server, scope, body)
        except AgentGuardError as exc:  # the budget refuses (or a store fails closed)
            return guard_error(exc)
        except Exception:  # a fault of the metering's own: forwarded unmetered (fail open)
            logger.warning("agentguard: could not meter a forwarded call", exc_info=True)
    try:
        answer = await server.pool.send(method, url, headers=headers, content=body)
        decoded = readable(answer.headers)
        if decoded and _small(answer):
            # read whole and sent as one: no stream to drive (Starlette's runs a task beside
            # it, listening for the caller to leave) and no chunked framing (a write less)
            content = await read_whole(answer)
            if metered is not None:
                metered.reader.feed(content)
                await metered.done(answer.status_code)
            return _whole(answer.status_code, content, answer.headers, head=method == "HEAD")
    except (UpstreamError, ModelTimeout) as exc:
        if metered is not None:
            await metered.fail()
        return upstream_error(exc)
    except BaseException:
        if metered is not None:
            metered.abandon()
        raise

    async def body_of() -> AsyncIterator[bytes]:
        # a coding the server cannot undo goes on as it came, for the caller that asked for it
        # (an answer read already, as a mock transport's are, holds the bytes as they came)
        raw = not decoded and not answer.is_stream_consumed
        pieces = answer.aiter_raw() if raw else body_pieces(answer)
        read = metered.reader.feed if metered is not None and decoded else None
        try:
            async for piece in pieces:
                if read is not None:
                    read(piece)
                yield piece
        except BaseException:
            if metered is not None:
                metered.abandon()
            raise
        finally:
            await answer.aclose()
        if metered is not None:
            await metered.done(answer.status_code)

    headers_out = _upstream_headers(answer.headers)
    if not decoded:
        headers_out["content-encoding"] = ", ".join(answer.headers.get_list("content-encoding"))
    out = StreamingResponse(body_of(), status_code=answer.status_code, headers=headers_out)
    return _repeated(out, answer.headers)


async def _meter(server: GuardServer, scope: Scope, body: bytes) -> Metered | None:
    """The hold of a forwarded model call on its caller's budgets (``None``: no model call).

    Raises:
        BudgetExceeded: under ``hard_stop``, the call does not fit.
    """
    headers = {
        k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _METER_HEADERS
    }
    ledger = server.guard_for(_caller(headers)).pipeline.ledger
    if ledger is None:
        return None
    return await meter(ledger, scope["path"], headers, body)


#: Answers of at most this many bytes (by their ``Content-Length``) are forwarded whole.
_WHOLE_BYTES = 1 << 20


def _small(answer: httpx.Response) -> bool:
    """Whether an answer is forwarded whole: its length is known and small, and it is no
    event stream (whose events go out as they come)."""
    length = answer.headers.get("content-length", "")
    return (
        length.isdigit()
        and int(length) <= _WHOLE_BYTES
        and not answer.headers.get("content-type", "").startswith("text/event-stream")
    )


async def models(server: GuardServer, request: Request) -> Response:
    """``GET /v1/models``: the upstream's models, plus the configured tiers by name."""
    tiers = list(server.config.tiers)
    if not tiers:
        return await forward(server, request)
    listed: list[Any] = []
    headers: dict[str, str] = {}
    try:
        answer = await server.pool.send(
            "GET",
            server.upstream + "/models" + _query(request.scope),
            headers=read_by_server(_sent(request.scope)),
            content=b"",
        )
        content = await read_whole(answer)
        if answer.status_code == 200:
            data = json_object(content)
            listed = list(data.get("data") or []) if data is not None else []
            headers = _upstream_headers(answer.headers)
    except (AgentGuardError, httpx.HTTPError, ValueError):
        listed = []  # the tiers are models the server serves all the same
    known = {m.get("id") for m in listed if isinstance(m, Mapping)}
    listed += [
        {"id": name, "object": "model", "created": 0, "owned_by": "agentguard"}
        for name in tiers
        if name not in known
    ]
    headers.pop("content-type", None)
    return JSONResponse({"object": "list", "data": listed}, headers=headers)


async def health(server: GuardServer, request: Request) -> Response:
    """``GET /health``: the server is up (it does not call the upstream)."""
    return JSONResponse(
        {
            "status": "ok",
            "storage": server.config.storage.backend,
            "callers": server.callers,
            "open_streams": server.open_streams,
        }
    )


#: The server's own routes, in match order: ``(method, path, endpoint)``; every other request
#: is forwarded upstream unchanged. Extend with :func:`add_route`.
ROUTES: list[tuple[str, str, Endpoint]] = [
    ("POST", "/v1/chat/completions", chat_completions),
    ("POST", "/chat/completions", chat_completions),
    ("POST", "/v1/responses", responses),
    ("POST", "/responses", responses),
    ("GET", "/v1/models", models),
    ("GET", "/health", health),
    ("POST", "/hooks/{agent}", hook_endpoint),  # coding-agent HTTP hooks (agentguard.hooks)
]


def add_route(method: str, path: str, endpoint: Endpoint) -> None:
    """Serve ``endpoint`` for ``method`` requests to ``path`` in every app made afterwards.

    ``path`` is a Starlette path (``/hooks/{agent}``: the request's ``path_params`` hold
    ``agent``); the endpoint receives the :class:`GuardServer` (configuration, store, upstream
    client) and the request. Routes added later match after the built-in ones, before the
    catch-all forwarding.
    """
    ROUTES.append((method.upper(), path, endpoint))


def _route(server: GuardServer, method: str, path: str, endpoint: Endpoint) -> Route:
    fixed = "{" not in path

    async def handle(request: Request) -> Response:
        if fixed and _wire_path(request.scope) != path:
            # Starlette matched the decoded path (``/v1/chat%2Fcompletions``): a route of
            # fixed path serves only itself as sent, as on the server's own way (GuardApp)
            return await forward(server, request)
        return await endpoint(server, request)

    return Route(path, handle, methods=[method])


#: The methods the catch-all forwards (any other is refused by Starlette's router).
_FORWARDED = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


class GuardApp(Starlette):
    """The server's Starlette app, whose hot requests skip Starlette's routing.

    A request for a route of fixed path and method (the model calls, ``/health``) goes
    straight to its endpoint, and one that no route's path matches straight to the upstream;
    anything else (the lifespan, a route with parameters, a method a route does not serve, a
    fixed route behind an earlier one matching it) takes Starlette's way, as does every
    request once middleware is added. The outcome is the one Starlette's routing gives; its
    cost per request (its exception middleware, a regular expression per route tried, the
    request's URL parsed) is not paid.
    """

    def __init__(self, server: GuardServer, routes: list[tuple[str, str, Endpoint]]) -> None:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            try:
                yield
            finally:
                await server.aclose()

        async def rest(request: Request) -> Response:
            return await forward(server, request)

        table = [_route(server, method, path, endpoint) for method, path, endpoint in routes]
        table.append(Route("/{path:path}", rest, methods=list(_FORWARDED)))
        super().__init__(routes=table, lifespan=lifespan)
        self.server = server
        # a fixed route is dispatched here unless a route before it serves the same request
        # (routes match in order): an earlier fixed one, or one with parameters matching it
        self._exact: dict[tuple[str, str], Endpoint] = {}
        earlier: list[tuple[str, re.Pattern[str]]] = []
        for (method, path, endpoint), route in zip(routes, table, strict=False):
            if "{" in path:
                earlier.append((method, route.path_regex))
            elif not any(m == method and p.match(path) for m, p in earlier):
                self._exact.setdefault((method, path), endpoint)
        self._paths = {path for _, path, _ in routes if "{" not in path}
        self._patterns = [pattern for _, pattern in earlier]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            send = _dated(send)
        if scope["type"] == "http" and not scope.get("root_path") and not self.user_middleware:
            method, path = scope["method"], _wire_path(scope)
            endpoint = self._exact.get((method, path))
            if endpoint is not None:
                scope["app"] = self
                response = await endpoint(self.server, Request(scope, receive))
                await response(scope, receive, send)
                return
            if (
                method in _FORWARDED
                and path not in self._paths
                and not any(p.match(path) for p in self._patterns)
            ):
                body = await _body(receive)
                if body is not None:  # else the caller left: nothing to answer
                    response = await _forward(self.server, scope, body)
                    await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _dated(send: Send) -> Send:
    """``send``, adding a ``Date`` header to an answer that has none.

    An answer passed on from the upstream carries the upstream's ``Date`` (and ``Server``); the
    ASGI server's own are off (``agentguard serve`` starts uvicorn without them), or the caller
    would get both twice. The server's own answers (``/health``, its errors) get the date here.
    """

    async def dated(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers") or ()
            if not any(name.lower() == b"date" for name, _ in headers):
                message = {**message, "headers": [*headers, (b"date", _http_date())]}
        await send(message)

    return dated


def _http_date() -> bytes:
    """The current time as an HTTP date (``Wed, 25 Nov 2026 04:40:00 GMT``)."""
    return formatdate(usegmt=True).encode("ascii")


async def _body(receive: Receive) -> bytes | None:
    """A request's body (``None`` when the caller disconnected before it was whole)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def create_app(server: GuardServer) -> GuardApp:
    """The ASGI app of ``server``: :data:`ROUTES`, then everything else forwarded upstream.

    Shutting down settles the streams still open and closes the upstream connections and store.
    """
    return GuardApp(server, list(ROUTES))
