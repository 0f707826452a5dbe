"""``agentguard serve``: how a guarded stream moves (the ASGI app called directly, so that what
goes out to the caller is seen message by message; the upstream an httpx mock transport whose
body is a generator).

The first content goes out before the upstream's next chunk is read; the response's head goes
out from the request's own task; the upstream's body is read to its end after ``[DONE]``, so
that its connection goes back to the pool; a caller gone before the head went out leaves no
stream open.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette", reason='needs the serve extra: pip install "agentguard[serve]"')

import agentguard as ag
from agentguard.serve import GuardServer, create_app
from agentguard.serve import _upstream as upstream_module
from test_wrap_paths import TOOLS as READ_FILE

pytestmark = pytest.mark.anyio

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


OPENING = _event({"role": "assistant", "content": ""})
WORDS = [_event({"content": "The docs "}), _event({"content": "are at /docs."})]
FINISH = _event({}, "stop")
DONE = b"data: [DONE]\n\n"


class Body(httpx.AsyncByteStream):
    """An upstream's streamed body: ``parts`` one by one, each after ``before(i)`` ran; notes
    whether it was read to its end and whether it was closed."""

    def __init__(
        self, parts: list[bytes], before: Callable[[int], Any] | None = None, tail: Any = None
    ) -> None:
        self.parts = parts
        self.before = before
        self.tail = tail  # awaited after the last part (an upstream that keeps the body open)
        self.ended = False
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, part in enumerate(self.parts):
            if self.before is not None:
                self.before(i)
            yield part
        if self.tail is not None:
            await self.tail()
        self.ended = True

    async def aclose(self) -> None:
        self.closed = True


def _server(
    body: Body, content_type: str = "text/event-stream", config: ag.GuardConfig | None = None
) -> GuardServer:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, stream=body)

    return GuardServer(
        config or ag.GuardConfig.from_dict({}),
        "http://upstream.invalid/v1",
        transport=httpx.MockTransport(answer),
    )


async def _call(
    server: GuardServer,
    send: Callable[[dict[str, Any]], Any] | None = None,
    path: str = "/v1/chat/completions",
    then: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    session: str | None = None,
    **extra: Any,
) -> list[dict[str, Any]]:
    """One streamed chat request through the app (``extra``: more of its body; on
    ``/v1/responses`` a Responses request); the ASGI messages sent back. ``then``: the
    caller's next message once the body is sent (default: none, it stays until the answer
    ends); ``session``: the session it names."""
    ask: dict[str, Any] = (
        {"input": "docs?"}
        if path == "/v1/responses"
        else {"messages": [{"role": "user", "content": "docs?"}]}
    )
    body = json.dumps({"model": "m", **ask, "stream": True, **extra}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080),
    }
    if session is not None:
        scope["headers"].append((b"x-agentguard-session", session.encode()))
    asked = False
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": body, "more_body": False}
        if then is not None:
            return await then()
        import anyio

        await anyio.Event().wait()  # the caller stays until the answer ends
        raise AssertionError("unreachable")

    async def record(message: dict[str, Any]) -> None:
        out.append(message)
        if send is not None:
            await send(message)

    await create_app(server)(scope, receive, record)
    return out


def _sent(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


async def test_the_first_content_goes_out_before_the_next_chunk_is_read() -> None:
    """The caller has the first words (and the response's head) before the server asks the
    upstream for its next chunk: nothing is held back to look ahead."""
    out: list[dict[str, Any]] = []
    seen_when_asked: list[bytes] = []

    def before(i: int) -> None:
        if i == 2:  # the upstream is asked for the chunk after the first words
            seen_when_asked.append(_sent(out))
            assert any(m["type"] == "http.response.start" for m in out)

    body = Body([OPENING, WORDS[0], WORDS[1], FINISH, DONE], before)
    server = _server(body)

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    messages = await _call(server, send)
    assert seen_when_asked == [OPENING + WORDS[0]]
    # and the caller got exactly what the upstream sent, then the guard's report and [DONE]
    events = _sent(messages)
    assert events.startswith(OPENING + WORDS[0] + WORDS[1] + FINISH)
    assert events.endswith(DONE)
    assert messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert server.open_streams == 0


async def test_the_head_goes_out_in_one_message_after_the_start() -> None:
    """The response start, then one body message with the opening event and the first words
    (one write to the caller, not two)."""
    server = _server(Body([OPENING, WORDS[0], WORDS[1], FINISH, DONE]))
    messages = await _call(server)
    assert messages[0]["type"] == "http.response.start"
    assert messages[0]["status"] == 200
    assert messages[1]["body"] == OPENING + WORDS[0]


async def test_the_upstream_body_is_read_to_its_end_after_done() -> None:
    """After ``[DONE]`` the rest of the upstream's body is read before it is closed: a body
    closed before its end closes its connection, and the next stream would need a new one."""
    body = Body([OPENING, WORDS[0], FINISH, DONE, b"\n"])
    server = _server(body)
    await _call(server)
    assert body.ended
    assert body.closed


async def test_an_upstream_that_keeps_the_body_open_after_done_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read after ``[DONE]`` is bounded: a body that never ends is closed (its connection
    with it) and the caller's stream ends all the same."""
    import anyio

    monkeypatch.setattr(upstream_module, "_DRAIN_SECONDS", 0)
    body = Body([OPENING, WORDS[0], FINISH, DONE], tail=anyio.Event().wait)
    server = _server(body)
    messages = await _call(server)
    assert _sent(messages).endswith(DONE)
    assert not body.ended
    assert body.closed


async def test_an_upstream_that_streams_on_after_done_is_read_only_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read after ``[DONE]`` stops after a bounded number of bytes."""
    monkeypatch.setattr(upstream_module, "_DRAIN_BYTES", 100)
    more = [b": keep-alive\n\n"] * 50
    body = Body([OPENING, WORDS[0], FINISH, DONE, *more])
    server = _server(body)
    messages = await _call(server)
    assert _sent(messages).endswith(DONE)
    assert not body.ended
    assert body.closed


async def test_a_caller_gone_before_the_head_went_out_leaves_no_stream_open() -> None:
    """The head is sent from the request's task: if the caller is gone by then, the stream is
    settled there (nothing is left open, the upstream body is closed)."""
    body = Body([OPENING, WORDS[0], WORDS[1], FINISH, DONE])
    server = _server(body)

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the caller is gone")

    with pytest.raises(OSError, match="gone"):
        await _call(server, send)
    assert server.open_streams == 0
    assert body.closed


def _leaving(failure: Exception | None) -> tuple[Any, Any]:
    """A caller that leaves once the stream's head is there (its ``send`` and ``then``): it
    disconnects, or its server's ``receive`` fails with ``failure``."""
    import anyio

    head = anyio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            head.set()

    async def then() -> dict[str, Any]:
        await head.wait()
        if failure is not None:
            raise failure
        return {"type": "http.disconnect"}

    return send, then


def _budgeted(body: Body) -> GuardServer:
    config = ag.GuardConfig.from_dict(
        {"token_budget": {"max_output_tokens": 500, "reserve": "strict"}}
    )
    return _server(body, config=config)


def _settled(server: GuardServer, body: Body) -> None:
    """The upstream's body was closed unread; what went out is charged, nothing held."""
    from agentguard.transport import caller_scope

    assert body.closed
    assert not body.ended
    assert server.open_streams == 0
    ledger = server.guard_for(caller_scope("sk-1")).pipeline.ledger
    assert ledger is not None
    usage = ledger.usage("s-1")
    assert usage.session_reserved == 0
    assert usage.session_tokens > 0


async def test_a_caller_gone_mid_stream_settles_it() -> None:
    """A caller that disconnects mid-answer ends the stream, as it is: the upstream's body is
    closed without being read on, what went out is charged to the session and nothing stays
    held."""
    import anyio

    # then a long generation: the upstream sends nothing more
    body = Body([OPENING, WORDS[0]], tail=anyio.Event().wait)
    server = _budgeted(body)
    send, then = _leaving(None)
    with anyio.fail_after(30):  # a stream the caller's leaving did not end would wait for ever
        messages = await _call(server, send, then=then, session="s-1")
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert messages[1]["body"] == OPENING + WORDS[0]
    _settled(server, body)


async def test_a_caller_gone_while_its_connection_is_full_settles_the_stream_at_once() -> None:
    """A caller that leaves while the server waits to send it more (its connection full): the
    stream is settled when the request ends, not later by the garbage collector."""
    import anyio

    body = Body([OPENING, WORDS[0], WORDS[1]], tail=anyio.Event().wait)
    server = _budgeted(body)
    head = anyio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] != "http.response.body":
            return
        if head.is_set():
            await anyio.Event().wait()  # the caller reads no more: the write never completes
        head.set()

    async def then() -> dict[str, Any]:
        await head.wait()
        return {"type": "http.disconnect"}

    with anyio.fail_after(30):
        await _call(server, send, then=then, session="s-1")
    _settled(server, body)


async def test_a_receive_failing_mid_stream_ends_it_with_that_error() -> None:
    """The server's ``receive`` failing while the stream is sent ends the stream (settled as
    a caller's leaving does) and the request with that error."""
    import anyio

    body = Body([OPENING, WORDS[0]], tail=anyio.Event().wait)
    server = _budgeted(body)
    send, then = _leaving(OSError("receive broke"))
    with anyio.fail_after(30), pytest.raises(OSError, match="receive broke"):
        await _call(server, send, then=then, session="s-1")
    _settled(server, body)


async def test_a_call_written_as_text_goes_out_as_a_call_not_as_text() -> None:
    """A local model writes its call into the text: the caller's stream carries the words
    before it as the upstream sent them, then the structured call, never the call's text."""
    written = '<tool_call>\n{"name": "read_docs", "arguments": {"topic": "install"}}\n</tool_call>'
    parts = [written[i : i + 7] for i in range(0, len(written), 7)]
    body = Body([OPENING, WORDS[0], *(_event({"content": p}) for p in parts), FINISH, DONE])
    tool = {
        "type": "function",
        "function": {
            "name": "read_docs",
            "parameters": {"type": "object", "properties": {"topic": {"type": "string"}}},
        },
    }
    events = _sent(await _call(_server(body), tools=[tool])).decode()
    assert events.startswith((OPENING + WORDS[0]).decode())
    chunks = [
        json.loads(line[6:])
        for line in events.splitlines()
        if line.startswith("data: {") and "choices" in line
    ]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "The docs "
    (call,) = [t for d in deltas for t in d.get("tool_calls") or ()]
    assert call["function"]["name"] == "read_docs"
    assert json.loads(call["function"]["arguments"]) == {"topic": "install"}
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "tool_calls"


def _responses_body(summary: str, text: str) -> list[bytes]:
    """A reasoning model's streamed Responses answer: its summary, then its text."""
    from _openai_upstream import reasoning_answer, response_events

    answer = reasoning_answer(summary, text)
    return [
        f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in response_events(answer)
    ]


async def test_a_responses_streams_reasoning_goes_out_as_it_comes() -> None:
    """A reasoning model's summary deltas go out as they arrive, before the upstream is read
    for the answer's text (they waited for the first text delta); the caller gets the
    upstream's events, byte for byte."""
    parts = _responses_body("The user wants the docs; look them up.", "The docs are at /docs.")
    out: list[dict[str, Any]] = []
    seen_when_text_asked: list[bytes] = []
    first_text = next(i for i, p in enumerate(parts) if b"output_text.delta" in p)

    def before(i: int) -> None:
        if i == first_text:
            seen_when_text_asked.append(_sent(out))

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    server = _server(Body(parts, before))
    messages = await _call(server, send, path="/v1/responses")
    reasoning = [p for p in parts[:first_text] if b"reasoning_summary_text.delta" in p]
    assert len(reasoning) > 1
    assert all(p in seen_when_text_asked[0] for p in reasoning)
    assert _sent(messages).startswith(b"".join(parts))
    assert server.open_streams == 0


async def test_a_responses_stream_cut_for_degenerate_reasoning_ends_incomplete() -> None:
    """Reasoning deltas that repeat one line are watched like chat's ``reasoning_content``: the
    stream is cut, and it ends as a Responses stream does, with ``response.incomplete`` (cut at
    the cap), not in the middle of an item."""
    parts = _responses_body("I should look at the docs again. " * 300, "Done.")
    body = Body(parts)
    server = _server(body)
    sent = _sent(await _call(server, path="/v1/responses")).decode()
    events = [
        json.loads(line[len("data: ") :]) for line in sent.splitlines() if line.startswith("data: ")
    ]
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [e["sequence_number"] for e in events] == sorted(e["sequence_number"] for e in events)
    assert not any(e["type"] == "response.output_text.delta" for e in events)
    assert server.open_streams == 0


async def test_an_event_whose_data_spans_several_lines_goes_out_as_it_came() -> None:
    """SSE lets an event's data come over several ``data:`` lines (joined by newlines): the
    caller gets them as sent, each on a ``data:`` line of its own, which its client reads back
    as the one JSON chunk (a single ``data:`` line followed by bare JSON lines is no event)."""
    lines = json.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}, indent=1)
    spread = "".join(f"data: {line}\n" for line in lines.split("\n")).encode() + b"\n"
    parts = [OPENING, spread, FINISH, DONE]
    sent = _sent(await _call(_server(Body(parts))))
    assert sent.startswith(b"".join(parts[:-1]))


REPORT = b": agentguard "


@pytest.mark.parametrize(
    "tail",
    [
        [DONE],  # an upstream that ends the answer without a finish chunk
        [],  # ... or without [DONE] either
    ],
)
async def test_a_stream_without_a_finish_chunk_gets_none_added(tail: list[bytes]) -> None:
    """The guard's answer has no finish reason when the upstream gave none: the caller gets the
    upstream's events and then the report, not an empty chunk (no id, no delta) the upstream
    never sent; and ``[DONE]`` only when the upstream sent it."""
    parts = [OPENING, WORDS[0], *tail]
    sent = _sent(await _call(_server(Body(parts))))
    upstream = b"".join(p for p in parts if p != DONE)
    assert sent[: sent.index(REPORT)] == upstream
    assert sent.endswith(DONE) == (DONE in tail)


@pytest.mark.parametrize(
    "kind",
    ["text/event-stream", "text/event-stream; charset=utf-8", "text/event-stream;charset=UTF-8"],
)
async def test_a_streams_content_type_is_the_upstreams(kind: str) -> None:
    """The caller's stream has the upstream's ``Content-Type`` as sent (Ollama and llama.cpp
    send no charset, OpenAI and vLLM ``; charset=utf-8``), not one the server writes again."""
    server = _server(Body([OPENING, WORDS[0], FINISH, DONE]), kind)
    start = (await _call(server))[0]
    assert [v for k, v in start["headers"] if k == b"content-type"] == [kind.encode()]


@pytest.mark.parametrize(
    ("kind", "coding"),
    [
        ("text/event-stream", "utf-8"),
        ("text/event-stream; charset=iso-8859-1", "iso-8859-1"),
        ("text/event-stream; Charset=ISO-8859-1", "iso-8859-1"),
    ],
)
async def test_a_stream_is_read_in_the_charset_its_content_type_names(
    kind: str, coding: str
) -> None:
    """An upstream's events are read in the charset its ``Content-Type`` names (UTF-8 when it
    names none), and the caller gets their text."""
    word = _event({"content": "Café "}).decode().replace("\\u00e9", "é").encode(coding)
    sent = _sent(await _call(_server(Body([OPENING, word, FINISH, DONE]), kind)))
    assert "Café " in sent.decode()


class Cut(Body):
    """An upstream body whose connection drops after ``parts``."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        raise httpx.ReadError("peer closed connection without sending complete message body")


def _cutting(
    bodies: list[Body], content_type: str = "text/event-stream", **more: str
) -> GuardServer:
    """A server whose upstream answers 200 with ``bodies`` in turn (``more``: other headers;
    the guard's retries wait on a fake clock)."""
    from agentguard.testing import FakeClock

    clock = FakeClock()
    left = iter(bodies)

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {
            "content-type": content_type,
            **{k.replace("_", "-"): v for k, v in more.items()},
        }
        return httpx.Response(200, headers=headers, stream=next(left))

    return GuardServer(
        ag.GuardConfig.from_dict({}),
        "http://upstream.invalid/v1",
        transport=httpx.MockTransport(answer),
        clock=clock,
        sleep=clock.asleep,
    )


def _openai_error(messages: list[dict[str, Any]]) -> dict[str, Any]:
    start = messages[0]
    assert start["status"] == 502
    assert (b"content-type", b"application/json") in start["headers"]
    error: dict[str, Any] = json.loads(_sent(messages))["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_whose_connection_drops_is_retried_then_an_openai_error(
    stream: bool,
) -> None:
    """The upstream's connection drops before its answer is whole (a restart, a proxy's idle
    cut): the guard retries it like any dropped connection, and when every attempt drops the
    caller gets an OpenAI-shaped 502, not the ASGI server's bare ``Internal Server Error``."""
    half = OPENING if stream else b'{"id": "chatcmpl-1", "object": "chat.co'
    kind = "text/event-stream" if stream else "application/json"
    bodies: list[Body] = [Cut([half]) for _ in range(4)]
    error = _openai_error(await _call(_cutting(bodies, kind), stream=stream))
    assert error["type"] == "upstream_unreachable"
    assert "ReadError" in error["message"]
    assert all(b.closed for b in bodies)
    # and an attempt after a dropped one answers the caller as the upstream did
    whole = [OPENING, WORDS[0], FINISH, DONE]
    messages = await _call(_cutting([Cut([half]), Body(whole)]))
    assert messages[0]["status"] == 200
    assert _sent(messages).startswith(b"".join(whole[:-1]))


async def test_a_forwarded_answer_whose_connection_drops_is_an_openai_error() -> None:
    """A forwarded request's answer (read whole: it is small) that breaks off: an
    OpenAI-shaped 502 as well."""
    server = _cutting([Cut([b'{"object": "list", "da'])], "application/json", content_length="90")
    error = _openai_error(await _call(server, path="/v1/files"))
    assert error["type"] == "upstream_unreachable"


async def test_a_stream_that_breaks_off_after_its_first_words_ends_on_the_error() -> None:
    """The connection drops after words went to the caller: another attempt would answer again
    from its start, and the guard's retry lost the rest (the caller got "The docs " and
    ``finish_reason: "stop"``, a cut answer passed off as whole). The stream ends on the error,
    as it would straight from the upstream; nothing is asked again."""
    whole = Body([OPENING, *WORDS, FINISH, DONE])
    sent = _sent(await _call(_cutting([Cut([OPENING, WORDS[0]]), whole])))
    error = b'data: {"error": {"message": "the upstream\'s answer broke off (ReadError)"'
    assert sent.startswith(OPENING + WORDS[0] + error)
    assert b'"finish_reason": "stop"' not in sent
    assert not whole.closed  # never asked for


async def test_a_responses_stream_that_breaks_off_ends_on_an_error_event() -> None:
    """A Responses stream's error after it began is the API's own ``error`` event (``type``,
    ``code``, ``message``, ``param``, the next ``sequence_number``), which the SDK hands on as
    a ``ResponseErrorEvent``, not chat's ``{"error": ...}``."""
    parts = _responses_body("Look it up.", "The docs are at /docs.")
    upto = next(i for i, p in enumerate(parts) if b"output_text.delta" in p) + 1
    sent = _sent(await _call(_cutting([Cut(parts[:upto])]), path="/v1/responses"))
    assert sent.startswith(b"".join(parts[:upto]))
    last = sent[len(b"".join(parts[:upto])) :].split(b"\n\n")[0].decode()
    name, data = last.split("\n")
    event = json.loads(data.removeprefix("data: "))
    assert name == "event: error"
    assert event == {
        "type": "error",
        "code": "error",
        "message": "the upstream's answer broke off (ReadError)",
        "param": None,
        "sequence_number": upto,
    }


async def test_a_repaired_stream_whose_usage_rides_on_the_finish_finishes_once() -> None:
    """llama.cpp sends the usage on its finish chunk. When the guard repairs the call, its own
    finish goes out and the usage after it without choices: a second finish chunk made clients
    that add chunks up (LangChain) read ``"tool_callstool_calls"``."""
    call = {"index": 0, "id": "t1", "type": "function"}
    call["function"] = {"name": "read_file", "arguments": "{'path': 'a.txt',}"}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    finish = {**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    parts = [
        _event({"role": "assistant", "content": None, "tool_calls": [call]}),
        f"data: {json.dumps({**finish, 'usage': usage})}\n\n".encode(),
        DONE,
    ]
    sent = _sent(await _call(_server(Body(parts)), tools=READ_FILE)).decode()
    chunks = [
        json.loads(line[len("data: ") :])
        for line in sent.splitlines()
        if line.startswith("data: {")
    ]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["tool_calls"]
    calls = [
        tc
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert [json.loads(tc["function"]["arguments"]) for tc in calls] == [{"path": "a.txt"}]
    assert [c["usage"] for c in chunks if not c["choices"]] == [usage]


FAILED = b'data: {"error": {"message": "Provider returned error", "code": 502}}\n\n'
LIMITED = b'data: {"error": {"type": "rate_limit_error", "message": "slow down"}}\n\n'


async def test_an_error_event_before_the_answer_begins_is_retried() -> None:
    """The upstream's stream opens with its error (OpenRouter's ``{"error": {"code": 502}}``
    after a 200 head): the guard retries, and the caller gets the next attempt's answer, not
    the error (before: the error went out as an answer the guard counted as fine)."""
    server = _cutting([Body([FAILED, DONE]), Body([OPENING, *WORDS, FINISH, DONE])])
    sent = _sent(await _call(server))
    assert b"error" not in sent
    assert b"The docs " in sent
    assert b'"x-agentguard-attempts": "m:transient,m:ok"' in sent


async def test_an_error_event_on_every_attempt_is_the_upstreams_error_event() -> None:
    """No attempt gets past its error event: the caller gets the last attempt's stream as the
    upstream sent it, a 200 ending on its error event (then the report), as straight from the
    upstream; not an error status (before: a 429 the caller's SDK retried on top of the guard's
    retries, raised by ``create`` as a ``RateLimitError`` where the raw client raises the
    event's ``APIError`` as the stream is read)."""
    server = _cutting([Body([LIMITED, DONE]) for _ in range(10)])
    out = await _call(server)
    assert out[0]["status"] == 200
    assert (b"content-type", b"text/event-stream") in out[0]["headers"]
    sent = _sent(out)
    assert sent[: sent.index(REPORT)] == LIMITED
    assert b'"x-agentguard-attempts": "m:rate_limited,m:rate_limited' in sent


@pytest.mark.parametrize(
    "error",
    [
        FAILED,
        # OpenAI's error event in the middle of a chat stream (no finish chunk follows)
        b'data: {"error": {"message": "The server had an error while processing your '
        b'request.", "type": "server_error", "param": null, "code": null}}\n\n',
    ],
)
async def test_an_error_event_after_the_first_words_ends_the_stream_as_it_came(
    error: bytes,
) -> None:
    """The error comes after text went out: no attempt can go on from it; the caller gets the
    upstream's events up to its own error event, as the raw client reads them, then the report
    (nothing added: no finish chunk, no ``[DONE]`` after the error)."""
    parts = [OPENING, WORDS[0], error]
    sent = _sent(await _call(_cutting([Body([*parts, DONE])])))
    assert sent[: sent.index(REPORT)] == b"".join(parts)
    assert sent[sent.index(REPORT) :].count(b"\n\n") == 1  # the report is the last line
    assert DONE not in sent


RESPONSE_ERROR = (
    b'event: error\ndata: {"type": "error", "code": "server_error", "message": "The server had '
    b'an error", "param": null, "sequence_number": 0}\n\n'
)


async def test_a_responses_error_event_before_the_answer_is_retried() -> None:
    """A Responses stream that opens with its ``error`` event: retried; the caller reads the
    next attempt's answer."""
    answer = _responses_body("", "The docs are at /docs.")
    server = _cutting([Body([RESPONSE_ERROR]), Body(answer)])
    sent = _sent(await _call(server, path="/v1/responses"))
    assert b"server_error" not in sent
    assert b"The docs are at /docs." in sent
    assert b'"x-agentguard-attempts": "m:transient,m:ok"' in sent


async def test_a_responses_error_event_on_every_attempt_is_the_upstreams_event() -> None:
    """Every attempt fails so: the caller gets the last attempt's ``error`` event in a 200
    stream, as the upstream sent it (the openai client hands it on as an event)."""
    server = _cutting([Body([RESPONSE_ERROR]) for _ in range(10)])
    out = await _call(server, path="/v1/responses")
    assert out[0]["status"] == 200
    sent = _sent(out)
    assert sent[: sent.index(REPORT)] == RESPONSE_ERROR


async def test_a_responses_error_event_after_reasoning_went_out_ends_the_stream_on_it() -> None:
    """Reasoning went out live, then the upstream failed: no attempt can go on from it; the
    stream ends on the upstream's own ``error`` event, as it came."""
    events = _responses_body("Thinking about the docs.", "The docs are at /docs.")
    cut = next(i for i, e in enumerate(events) if b"reasoning_summary_text.delta" in e) + 1
    server = _cutting([Body([*events[:cut], RESPONSE_ERROR])])
    sent = _sent(await _call(server, path="/v1/responses"))
    assert b"reasoning_summary_text.delta" in sent  # went out live
    assert RESPONSE_ERROR in sent
    assert b"The docs are at /docs." not in sent
