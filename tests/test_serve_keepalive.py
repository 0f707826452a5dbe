"""``agentguard serve`` passes an upstream's keep-alives on: the comment lines (``: OPENROUTER
PROCESSING``, ``: keep-alive``, ``:ping``) an upstream sends while the model thinks reach the
caller where they came — before the first chunk (with the stream's head), between chunks, while
the guard holds a call back, in an attempt it re-asks — so that the proxies between the caller
and the server do not cut a long-thinking stream. They are no part of the answer: the guard's
verdicts and the answer the client parses are those of the same stream without them, and an
upstream sending nothing but comments costs bounded memory.

The ASGI app is called directly (what goes out is seen message by message, and when), and the
real openai client reads it over an ASGI transport, beside the same client reading the upstream
directly.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator
from importlib import import_module
from typing import Any

import pytest

pytest.importorskip("starlette", reason='needs the serve extra: pip install "agentguard[serve]"')

from agentguard.serve import GuardServer, create_app
from test_serve import TOOLS
from test_serve_stream import (
    DONE,
    FINISH,
    OPENING,
    REPORT,
    WORDS,
    Body,
    Cut,
    _call,
    _cutting,
    _event,
    _sent,
)

openai = pytest.importorskip("openai")
client_http: Any = import_module(
    "httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx"
)
pytestmark = pytest.mark.anyio

PROCESSING = b": OPENROUTER PROCESSING\n\n"
KEEPALIVE = b": keep-alive\n\n"
PING = b":ping\n\n"


def _call_events(name: str, arguments: list[str]) -> list[bytes]:
    """A streamed tool call: its opening delta, then its arguments in fragments."""
    opening = {"index": 0, "id": "call_1", "type": "function"}
    first = {**opening, "function": {"name": name, "arguments": ""}}
    out = [_event({"role": "assistant", "content": None, "tool_calls": [first]})]
    for piece in arguments:
        out.append(_event({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    return [*out, _event({}, "tool_calls")]


SEARCH = _call_events("search", ['{"q": ', '"install"}'])
WRONG = _call_events("delete_everything", ['{"q": ', '"x"}'])
TEXT = [OPENING, WORDS[0], WORDS[1], FINISH, DONE]


def _commented(parts: list[bytes], *comments: bytes) -> list[bytes]:
    """``parts`` with a comment before each of the first ones (one per comment given)."""
    out: list[bytes] = []
    for i, part in enumerate(parts):
        if i < len(comments):
            out.append(comments[i])
        out.append(part)
    return out


def _server(*bodies: Body) -> GuardServer:
    """A server whose upstream streams ``bodies`` in turn (retries wait on a fake clock)."""
    return _cutting(list(bodies))


def _without_report(sent: bytes) -> tuple[bytes, bytes]:
    """A stream's bytes without the guard's report line, and that line."""
    at = sent.index(REPORT)
    end = sent.index(b"\n\n", at) + 2
    return sent[:at] + sent[end:], sent[at:end]


def _parsed(bodies: list[list[bytes]]) -> list[Any]:
    """What the openai client reads of ``bodies``, straight from the upstream."""

    def answer(request: Any) -> Any:
        content = b"".join(bodies.pop(0))
        return client_http.Response(
            200, headers={"content-type": "text/event-stream"}, content=content
        )

    return [client_http.MockTransport(answer)]


async def _chunks(transport: Any, base_url: str, **extra: Any) -> list[dict[str, Any]]:
    """The chunks the real openai client reads of one streamed call, as data."""
    client = openai.AsyncOpenAI(
        api_key="sk-1",
        base_url=base_url,
        http_client=client_http.AsyncClient(transport=transport),
        max_retries=0,
    )
    ask = [{"role": "user", "content": "docs?"}]
    stream = await client.chat.completions.create(model="m", messages=ask, stream=True, **extra)
    return [chunk.model_dump() async for chunk in stream]


async def _through_serve(*bodies: Body, **extra: Any) -> list[dict[str, Any]]:
    server = _server(*bodies)
    try:
        app = client_http.ASGITransport(app=create_app(server))
        return await _chunks(app, "http://serve.invalid/v1", **extra)
    finally:
        await server.aclose()


def _split(stream: bytes) -> tuple[list[bytes], list[bytes]]:
    """A stream's events and its comments, each in order (the guard's report line left out)."""
    items = [e for e in stream.split(b"\n\n") if e and not e.startswith(REPORT)]
    return [e for e in items if not e.startswith(b":")], [e for e in items if e.startswith(b":")]


async def _timed(parts: list[bytes], **extra: Any) -> bytes:
    """The bytes the caller gets of an upstream streaming ``parts``, having checked that each
    comment had gone out before the upstream's next part was read."""
    out: list[dict[str, Any]] = []
    comments: list[bytes] = []

    def before(i: int) -> None:
        if i and parts[i - 1].startswith(b":"):
            comments.append(parts[i - 1])
            assert _split(_sent(out))[1] == [c.rstrip(b"\n") for c in comments]

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    await _call(_server(Body(parts, before)), send, **extra)
    assert comments  # the check ran
    return _sent(out)


async def test_comments_reach_the_caller_when_they_come() -> None:
    """Comments before the first chunk, between chunks and before ``[DONE]``: each goes out
    before the upstream's next part is read; the events are the upstream's, as without them."""
    parts = [PROCESSING, OPENING, KEEPALIVE, WORDS[0], PING, WORDS[1], b":\n\n", FINISH, DONE]
    events, comments = _split(await _timed(parts))
    assert events == _split(b"".join(TEXT))[0]
    assert comments == [b": OPENROUTER PROCESSING", b": keep-alive", b":ping", b":"]
    # where the guard holds nothing back, the bytes are the upstream's, comments in place
    sent, report = _without_report(_sent(await _call(_server(Body(parts[2:])))))
    assert sent == b"".join(parts[2:])
    assert report.startswith(REPORT)


async def test_a_comment_before_the_first_chunk_sends_the_head_with_it() -> None:
    """A model thinking before its first token: the upstream's comment goes out at once, with
    the stream's head (200, the upstream's headers), before the upstream's next part is read."""
    out: list[dict[str, Any]] = []
    seen_when_asked: list[bytes] = []

    def before(i: int) -> None:
        if i == 1:  # the upstream is asked for what follows its comment
            assert [m["status"] for m in out if m["type"] == "http.response.start"] == [200]
            seen_when_asked.append(_sent(out))

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    await _call(_server(Body([PROCESSING, *TEXT], before)), send)
    assert seen_when_asked == [PROCESSING]


async def test_comments_go_out_while_a_tool_call_is_held_back() -> None:
    """The guard holds a streamed call back until it is whole and valid: the upstream's
    comments between its fragments go out as they come, and the call that follows is the
    upstream's, parsed by the client as it parses the upstream's own stream."""
    parts = [*_commented(SEARCH, KEEPALIVE, KEEPALIVE, PING), DONE]
    events, comments = _split(await _timed(parts, tools=TOOLS))
    assert events == _split(b"".join([*SEARCH, DONE]))[0]
    assert comments == [b": keep-alive", b": keep-alive", b":ping"]
    # and the client reads the same answer from the server as from the upstream itself
    direct = await _chunks(_parsed([parts])[0], "http://upstream.invalid/v1", tools=TOOLS)
    served = await _through_serve(Body(parts), tools=TOOLS)
    assert served == direct


async def test_a_re_asked_stream_keeps_its_comments_and_its_verdicts() -> None:
    """An invalid call is re-asked: the comments of both attempts reach the caller as they
    came, and the answer and the guard's report are those of the same streams without them."""
    plain = [[*WRONG, DONE], [*SEARCH, DONE]]
    commented = [_commented(plain[0], PROCESSING, KEEPALIVE), _commented(plain[1], PING, PING)]
    quiet = _sent(await _call(_server(*(Body(p) for p in plain)), tools=TOOLS))
    loud = _sent(await _call(_server(*(Body(p) for p in commented)), tools=TOOLS))
    quiet_report, loud_report = _without_report(quiet)[1], _without_report(loud)[1]
    assert _verdicts(loud_report) == _verdicts(quiet_report)
    assert _verdicts(loud_report)["x-agentguard-attempts"] == "m:tool_validation_failure,m:ok"
    (events, comments), (quiet_events, no_comments) = _split(loud), _split(quiet)
    assert (events, no_comments) == (quiet_events, [])
    assert comments == [b": OPENROUTER PROCESSING", b": keep-alive", b":ping", b":ping"]
    served = await _through_serve(*(Body(p) for p in commented), tools=TOOLS)
    assert served == await _through_serve(*(Body(p) for p in plain), tools=TOOLS)


def _verdicts(report: bytes) -> dict[str, str]:
    """A report line's headers, but the session's name (made anew by each server)."""
    found: dict[str, str] = json.loads(report.removeprefix(REPORT))
    return {k: v for k, v in found.items() if k != "x-agentguard-session"}


async def test_a_retry_after_comments_is_still_a_retry() -> None:
    """Comments are no part of the answer: an attempt that sent only comments and then broke
    off is retried (nothing of it reached the caller), and the caller gets the retry's answer
    after the comments, not an error."""
    messages = await _call(_server(Cut([PROCESSING, KEEPALIVE]), Body([PING, *TEXT])))
    assert messages[0]["status"] == 200
    sent, report = _without_report(_sent(messages))
    assert sent == PROCESSING + KEEPALIVE + PING + b"".join(TEXT)
    assert b"connection" in report.lower() or b"retries" in report


async def test_a_responses_stream_passes_its_comments_on() -> None:
    """The Responses API's stream too: each comment goes out when it comes, the events as
    without them."""
    created = {"type": "response.created", "sequence_number": 0, "response": _response([])}
    delta = {
        "type": "response.output_text.delta",
        "sequence_number": 1,
        "output_index": 0,
        "content_index": 0,
        "item_id": "msg_1",
        "delta": "Hi",
    }
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
    }
    done = {"type": "response.completed", "sequence_number": 2, "response": _response([message])}
    parts = [
        PROCESSING,
        _responses_event(created),
        KEEPALIVE,
        _responses_event(delta),
        PING,
        _responses_event(done),
    ]
    events, comments = _split(await _timed(parts, path="/v1/responses"))
    assert events == _split(b"".join(parts))[0]
    assert comments == [b": OPENROUTER PROCESSING", b": keep-alive", b":ping"]


def _response(output: list[Any]) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "model": "m", "output": output}


def _responses_event(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


class Comments(Body):
    """An upstream that sends ``head``, then ``pieces`` times ``piece`` (comments, made as
    they are read), then ``parts``."""

    def __init__(self, head: bytes, piece: bytes, pieces: int, parts: list[bytes]) -> None:
        super().__init__(parts)
        self.head = head
        self.piece = piece
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        for _ in range(self.pieces):
            yield self.piece
        async for part in super().__aiter__():
            yield part


@pytest.mark.parametrize(
    ("head", "piece"),
    [(b"", b": keep-alive\n\n" * 4096), (b":", b"x" * 65_536)],
    ids=["many-comments", "one-endless-comment"],
)
async def test_an_upstream_sending_megabytes_of_comments_stays_bounded(
    head: bytes, piece: bytes
) -> None:
    """8 MB of comments before the answer (many small ones, or one endless line): the comments
    of each piece read go on as one, a comment's text cut short; the server's memory stays far
    below what the upstream sent, and the answer is the upstream's."""
    pieces = (8 << 20) // len(piece)
    server = _server(Comments(head, piece, pieces, [b"\n\n", *TEXT]))
    tracemalloc.start()
    try:
        messages = await _call(server)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    sent, _ = _without_report(_sent(messages))
    comments = [e for e in sent.split(b"\n\n") if e.startswith(b":")]
    assert 1 <= len(comments) <= pieces + 2
    assert all(len(c) <= 257 for c in comments)
    assert sent.endswith(b"".join(TEXT))
    assert len(sent) < 1 << 20
    assert peak < 2 << 20
