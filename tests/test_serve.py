"""``agentguard serve`` in process: the real openai client → the server's ASGI app → a scripted
upstream (recording what it receives), over httpx mock transports on both sides.

Healthy traffic is invisible (a differential test against the same client calling the upstream
directly: the same bytes reach the upstream, the same answers come back, streams included);
decisions of the guard are OpenAI-shaped errors with their ``x-agentguard-*`` headers; callers
are told apart by their key, which is never shown.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from importlib import import_module
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette", reason='needs the serve extra: pip install "agentguard[serve]"')
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import agentguard as ag
from _hostile import completion
from _openai_upstream import Upstream
from _otel import recorded_spans
from _stores import RedisServer
from agentguard.serve import ROUTES, GuardServer, add_route, create_app
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel

openai = pytest.importorskip("openai")
# the caller's openai client runs on httpx2 (openai 3.x) or httpx (2.x); the server on httpx
client_http: Any = import_module(
    "httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx"
)
pytestmark = pytest.mark.anyio

KEY_A = "sk-caller-a-0123456789abcdef"
KEY_B = "sk-caller-b-0123456789abcdef"
ASK = [{"role": "user", "content": "find the install docs"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "search the docs",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
            },
        },
    }
]


class Served:
    """A server over a scripted upstream, and callers on it."""

    def __init__(self, replies: list[Any] | ScriptedModel, config: dict[str, Any] | None = None):
        self.upstream = Upstream(httpx, replies)
        self.clock = FakeClock()
        self.server = GuardServer(
            ag.GuardConfig.from_dict(config or {}),
            "http://upstream.invalid/v1",
            transport=self.upstream.transport,
            clock=self.clock,
            sleep=self.clock.asleep,
            rng=random.Random(0),
        )
        self.app = create_app(self.server)

    def http(self) -> Any:
        """A plain HTTP client on the server."""
        return client_http.AsyncClient(
            transport=client_http.ASGITransport(app=self.app), base_url="http://serve.invalid"
        )

    def client(self, key: str = KEY_A) -> Any:
        """The real openai client on the server (no retries of its own)."""
        return openai.AsyncOpenAI(
            api_key=key,
            base_url="http://serve.invalid/v1",
            http_client=client_http.AsyncClient(transport=client_http.ASGITransport(app=self.app)),
            max_retries=0,
        )

    def bodies(self) -> list[bytes]:
        return [content for _, _, content, _ in self.upstream.seen]


@pytest.fixture
async def served() -> AsyncIterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(replies: list[Any] | ScriptedModel, config: dict[str, Any] | None = None) -> Served:
        made.append(Served(replies, config))
        return made[-1]

    yield make
    for one in made:
        await one.server.aclose()


def _direct(replies: list[Any]) -> tuple[Upstream, Any]:
    upstream = Upstream(client_http, replies)
    return upstream, upstream.client(openai, asynchronous=True).with_options(max_retries=0)


def _script() -> list[Any]:
    return [
        Reply.text("The install docs are at /docs/install."),
        Reply.call("search", {"q": "install"}),
        Reply.text("Streaming: the install docs are at /docs/install, section 2."),
        Reply.call("search", {"q": "install guide"}),
    ]


async def _calls(client: Any) -> list[Any]:
    """The same four calls: plain, tools, streamed text (with usage), streamed tool call."""
    out: list[Any] = []
    out.append(await client.chat.completions.create(model="m", messages=ASK, temperature=0.2))
    out.append(
        await client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice="auto", user="u-1"
        )
    )
    stream = await client.chat.completions.create(
        model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
    )
    out.append([chunk async for chunk in stream])
    stream = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True)
    chunks = [chunk async for chunk in stream]
    out.append(_assembled(chunks))
    return out


def _assembled(chunks: list[Any]) -> tuple[str, list[tuple[str, str]], str | None]:
    """A streamed answer as the client assembles it: text, tool calls, finish reason."""
    text, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            text += delta.content or ""
            for call in delta.tool_calls or ():
                slot = calls.setdefault(call.index, ["", ""])
                slot[0] += call.function.name or ""
                slot[1] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return text, [tuple(v) for _, v in sorted(calls.items())], finish


def _dumped(results: list[Any]) -> list[Any]:
    out = []
    for result in results:
        if isinstance(result, list):
            out.append([chunk.model_dump() for chunk in result])
        elif hasattr(result, "model_dump"):
            out.append(result.model_dump())
        else:
            out.append(result)
    return out


async def test_healthy_traffic_is_invisible(served: Callable[..., Served]) -> None:
    """The upstream receives exactly the bytes the client sends it directly, and the client
    gets exactly the answers it gets directly (streams included)."""
    upstream, direct = _direct(_script())
    expected = _dumped(await _calls(direct))
    server = served(_script())
    got = _dumped(await _calls(server.client()))
    assert got == expected
    assert server.bodies() == [content for _, _, content, _ in upstream.seen]
    assert all(json.loads(b)["model"] == "m" for b in server.bodies())


async def test_streamed_text_reaches_the_caller_byte_for_byte(
    served: Callable[..., Served],
) -> None:
    """A clean stream's events are the upstream's own text, in order, then ``[DONE]``."""
    model = ScriptedModel([Reply.text("one two three four five six")], chunk_size=4)
    server = served(model)
    body = {"model": "m", "messages": ASK, "stream": True}
    async with server.http() as http:
        answer = await http.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY_A}"}
        )
    upstream_model = ScriptedModel([Reply.text("one two three four five six")], chunk_size=4)
    status, _, direct = upstream_model._http_answer(
        "POST", "/v1/chat/completions", json.dumps(body).encode()
    )
    assert status == 200
    # the server's text is the upstream's, plus one comment line clients skip
    events = [e for e in answer.text.split("\n\n") if e and not e.startswith(":")]
    assert events == [e for e in direct.decode().split("\n\n") if e]
    assert answer.headers["content-type"].startswith("text/event-stream")


async def test_repaired_tool_call_reaches_the_caller_as_a_real_call(
    served: Callable[..., Served],
) -> None:
    """A tool call written as text comes back as a structured call, and the report says so."""
    server = served([Reply.embedded("search", {"q": "install"})])
    raw = await server.client().chat.completions.with_raw_response.create(
        model="m", messages=ASK, tools=TOOLS
    )
    answer = raw.parse()
    call = answer.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("search", {"q": "install"})
    assert answer.choices[0].finish_reason == "tool_calls"
    assert int(raw.headers["x-agentguard-repairs"]) >= 1


async def test_session_header_names_the_session_and_never_goes_upstream(
    served: Callable[..., Served],
) -> None:
    """``x-agentguard-session`` names the session in the report headers and stays here."""
    server = served([Reply.text("ok")])
    raw = await server.client().chat.completions.with_raw_response.create(
        model="m", messages=ASK, extra_headers={"x-agentguard-session": "run-7"}
    )
    assert raw.headers["x-agentguard-session"] == "run-7"
    (_, _, _, headers) = server.upstream.seen[0]
    assert "x-agentguard-session" not in headers
    assert headers["authorization"] == f"Bearer {KEY_A}"  # the caller's key goes upstream


async def test_the_guards_spans_continue_the_callers_trace(
    served: Callable[..., Served],
) -> None:
    """A caller's ``traceparent`` makes the guarded call a span of the caller's trace, and goes
    upstream as sent."""
    server = served([Reply.text("ok")])
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with recorded_spans() as exporter:
        await server.client().chat.completions.create(
            model="m", messages=ASK, extra_headers={"traceparent": traceparent}
        )
    (call,) = [s for s in exporter.get_finished_spans() if s.name.startswith("agentguard chat")]
    assert call.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert call.parent is not None
    assert call.parent.span_id == 0x00F067AA0BA902B7
    (_, _, _, headers) = server.upstream.seen[0]
    assert headers["traceparent"] == traceparent


def _looping(n: int) -> list[Any]:
    return [Reply.call("search", {"q": "same"}) for _ in range(n)]


def _loop_history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = list(ASK)
    for i in range(turns):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "search", "arguments": '{"q": "same"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "no results"})
    return messages


LONG = " ".join(f"word{i}" for i in range(200))
LOOPS = {"loop_detection": {"warn_at": 2, "critical_at": 3, "break_at": 4}}


async def test_a_refused_loop_is_a_structured_loop_detected_error(
    served: Callable[..., Served],
) -> None:
    """A loop past its break level is a 400 whose body is the requirements' ``loop_detected``
    error (detector, count, retry_after), with the ``x-agentguard-*`` headers."""
    server = served(_looping(20), LOOPS)
    client = server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="m",
            messages=_loop_history(8),
            tools=TOOLS,
            extra_headers={"x-agentguard-session": "loop-1"},
        )
    error = caught.value.body
    assert error["type"] == "loop_detected"
    assert error["detector"]
    assert error["count"] >= 4
    assert "retry_after" in error
    headers = caught.value.response.headers
    assert headers["x-agentguard-session"] == "loop-1"


async def test_sessions_are_never_shared_across_keys(served: Callable[..., Served]) -> None:
    """The same session name under two keys is two sessions: one caller's spent budget does
    not refuse the other."""
    budget = {"token_budget": {"per_session": 300, "max_output_tokens": 100, "policy": "hard_stop"}}
    server = served([Reply.text(LONG) for _ in range(6)], budget)
    a, b = server.client(KEY_A), server.client(KEY_B)
    named = {"x-agentguard-session": "shared-name"}
    await a.chat.completions.create(model="m", messages=ASK, extra_headers=named)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await a.chat.completions.create(model="m", messages=ASK, extra_headers=named)
    assert caught.value.body["type"] == "budget_exceeded"
    assert caught.value.response.headers["x-agentguard-budget-exceeded"] == "true"
    assert "retry-after" not in caught.value.response.headers  # spent for good: no retry
    answer = await b.chat.completions.create(model="m", messages=ASK, extra_headers=named)
    assert answer.choices[0].message.content == LONG


async def test_one_key_is_one_caller_however_its_header_is_spelled(
    served: Callable[..., Served],
) -> None:
    """A key's spent budget is spent under every spelling of it: ``Bearer`` in any case, extra
    spaces, ``api-key`` / ``x-api-key`` (it used to be a fresh budget per spelling)."""
    budget = {"token_budget": {"per_session": 300, "max_output_tokens": 100, "policy": "hard_stop"}}
    server = served([Reply.text(LONG) for _ in range(8)], budget)
    body = {"model": "m", "messages": ASK}
    spellings = [
        {"authorization": f"Bearer {KEY_A}"},
        {"authorization": f"bearer {KEY_A}"},
        {"authorization": f"  BEARER   {KEY_A} "},
        {"api-key": KEY_A},
        {"x-api-key": f" {KEY_A}"},
    ]
    async with server.http() as http:
        named = {"x-agentguard-session": "task-1"}
        first = await http.post("/v1/chat/completions", json=body, headers=spellings[0] | named)
        assert first.status_code == 200
        statuses = [
            (await http.post("/v1/chat/completions", json=body, headers=h | named)).status_code
            for h in spellings
        ]
        other = await http.post(
            "/v1/chat/completions", json=body, headers={"api-key": KEY_B} | named
        )
    assert statuses == [403] * len(spellings)
    assert other.status_code == 200
    assert len(server.upstream.seen) == 2


async def test_a_request_costs_the_same_store_work_however_many_models_were_named(
    served: Callable[..., Served], redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Model names are the caller's to choose, and each unknown one is a tier of its own: the
    store work of a request stays that of its chain (read asynchronously), and the state kept
    per name is bounded. It used to read every breaker ever made, blocking, on every request."""
    import redis

    from agentguard.guard._pipeline import IMPLICIT_BREAKERS
    from agentguard.storage import RedisStore

    config = {
        "storage": {"backend": "redis", "url": redis_server.url, "key_prefix": "many-models"},
        "tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}},
        "escalation": {"chain": ["fast", "premium"]},
    }
    server = served(ScriptedModel([Reply.text("ok")], cycle=True), config)
    admin = redis.Redis(unix_socket_path=redis_server.socket)
    blocking_views: list[str] = []
    view = RedisStore.breaker_view

    def counted(store: RedisStore, spec: Any, now: float) -> Any:
        blocking_views.append(spec.name)
        return view(store, spec, now)

    monkeypatch.setattr(RedisStore, "breaker_view", counted)

    def commands() -> int:
        return sum(int(v["calls"]) for v in admin.info("commandstats").values())

    async with server.http() as http:

        async def ask(model: str) -> None:
            body = {"model": model, "messages": ASK}
            answer = await http.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200

        async def cost() -> int:
            before = commands()
            await ask("small")
            return commands() - before

        await ask("small")
        fresh = await cost()
        for i in range(IMPLICIT_BREAKERS + 44):
            await ask(f"model-{i}")
        after = await cost()
    admin.close()
    assert after == fresh
    assert blocking_views == []
    kept = server.server._breakers
    assert len(kept) == IMPLICIT_BREAKERS + 2
    assert {"fast", "premium"} <= set(kept)  # the configured tiers' breakers are never dropped
    assert len(server.server._transports) == 1  # one endpoint: the upstream


async def test_the_hourly_budget_is_per_key_and_says_when_to_retry(
    served: Callable[..., Served],
) -> None:
    """A key's hourly budget spent is a 429 with ``Retry-After``; another key is not held."""
    budget = {"token_budget": {"per_hour": 300, "max_output_tokens": 100, "policy": "hard_stop"}}
    server = served([Reply.text(LONG) for _ in range(6)], budget)
    a, b = server.client(KEY_A), server.client(KEY_B)
    await a.chat.completions.create(model="m", messages=ASK)
    with pytest.raises(openai.RateLimitError) as caught:
        await a.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    wait = int(caught.value.response.headers["retry-after"])
    assert 1 <= wait <= 3600
    assert caught.value.body["retry_after"] == wait
    await b.chat.completions.create(model="m", messages=ASK)


async def test_upstream_errors_pass_through_as_answered(served: Callable[..., Served]) -> None:
    """An upstream error the guard does not retry reaches the caller with its status and body."""
    server = served([Fault.context_length()])
    async with server.http() as http:
        answer = await http.post("/v1/chat/completions", json={"model": "m", "messages": ASK})
    assert answer.status_code == 400
    assert "maximum context length" in answer.json()["error"]["message"]
    assert answer.headers["x-agentguard-attempts"] == "m:client_error"


async def test_transient_errors_are_retried_upstream(served: Callable[..., Served]) -> None:
    """A 429 with Retry-After is waited out and retried by the guard (its clock, no sleep)."""
    server = served([Fault.rate_limit(retry_after=2), Reply.text("after the wait")])
    raw = await server.client().chat.completions.with_raw_response.create(model="m", messages=ASK)
    assert raw.parse().choices[0].message.content == "after the wait"
    assert raw.headers["x-agentguard-retries"] == "1"
    assert server.clock.sleeps == [2.0]


async def test_the_key_is_never_echoed(served: Callable[..., Served]) -> None:
    """Neither answers nor error bodies nor headers carry the caller's key."""
    server = served(_looping(20), LOOPS)
    client = server.client()
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=ASK, tools=TOOLS
    )
    seen = [json.dumps(dict(raw.headers)), raw.http_response.text]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="m", messages=_loop_history(8), tools=TOOLS)
    seen += [json.dumps(dict(caught.value.response.headers)), caught.value.response.text]
    assert not any(KEY_A in text or KEY_A[3:] in text for text in seen)


async def test_responses_api_is_guarded(served: Callable[..., Served]) -> None:
    """``/v1/responses`` answers as the upstream does, with the report's headers."""
    upstream, direct = _direct([Reply.text("a response")])
    expected = await direct.responses.create(model="m", input="hello")
    server = served([Reply.text("a response")])
    raw = await server.client().responses.with_raw_response.create(model="m", input="hello")
    assert raw.parse().model_dump() == expected.model_dump()
    assert server.bodies() == [content for _, _, content, _ in upstream.seen]
    assert raw.headers["x-agentguard-tier"] == "m"


async def test_streamed_responses_api_is_guarded(served: Callable[..., Served]) -> None:
    """A streamed ``/v1/responses`` call yields the upstream's events (text live)."""
    upstream, direct = _direct([Reply.text("a streamed response")])
    expected = [
        e.model_dump()
        async for e in await direct.responses.create(model="m", input="hi", stream=True)
    ]
    server = served([Reply.text("a streamed response")])
    stream = await server.client().responses.create(model="m", input="hi", stream=True)
    got = [e.model_dump() async for e in stream]
    assert got == expected
    assert server.bodies() == [content for _, _, content, _ in upstream.seen]


async def test_a_responses_conversation_kept_upstream_is_one_session(
    served: Callable[..., Served],
) -> None:
    """Turns that name their history by ``previous_response_id`` (it is kept upstream) are one
    session, whose loop is recovered on its fourth turn, through a streamed turn too; before,
    each turn was a session of its own and the loop was never seen."""
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    server = served(_looping(4))
    client = server.client()
    previous: Any = None
    sessions, recovery = [], []
    for turn in range(4):
        kwargs: dict[str, Any] = {"model": "m", "tools": tools}
        if previous is None:
            kwargs["input"] = "find the install docs"
        else:
            call = next(o for o in previous.output if o.type == "function_call")
            kwargs["previous_response_id"] = previous.id
            kwargs["input"] = [
                {"type": "function_call_output", "call_id": call.call_id, "output": "none"}
            ]
        if turn == 1:  # streamed: its report is at its end, where the client skips it
            stream = await client.responses.create(stream=True, **kwargs)
            previous = [event async for event in stream][-1].response
            continue
        raw = await client.responses.with_raw_response.create(**kwargs)
        previous = raw.parse()
        sessions.append(raw.headers["x-agentguard-session"])
        recovery.append(raw.headers.get("x-agentguard-loop-recovery"))
    assert len(set(sessions)) == 1
    assert recovery == [None, None, "hint"]


async def test_other_requests_are_forwarded_unchanged(served: Callable[..., Served]) -> None:
    """A path the server does not serve goes upstream as it came and comes back as answered."""
    server = served([])
    async with server.http() as http:
        answer = await http.post("/v1/embeddings?x=1", content=b'{"input": "abc"}')
    assert answer.status_code == 404  # the scripted upstream's own answer
    method, path, content, _ = server.upstream.seen[0]
    assert (method, path, content) == ("POST", "/v1/embeddings", b'{"input": "abc"}')


CUSTOM = [  # OpenAI's custom tool: free-form input under a grammar, no function schema
    {
        "type": "custom",
        "custom": {
            "name": "run_sql",
            "description": "runs one SQL query",
            "format": {
                "type": "grammar",
                "grammar": {"syntax": "lark", "definition": "start: /.+/"},
            },
        },
    }
]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_with_custom_tools_reaches_the_upstream(
    served: Callable[..., Served], stream: bool
) -> None:
    """Chat's ``custom`` tools have no function for the guard to read: the call went nowhere
    (a 500 "a tool needs a non-empty string 'name'"); it goes upstream as it came, unguarded,
    and the caller gets the upstream's answer."""
    upstream, direct = _direct([Reply.text("SELECT 1")])
    server = served([Reply.text("SELECT 1")])
    ask: dict[str, Any] = {"model": "m", "messages": ASK, "tools": CUSTOM}
    if stream:
        chunks = await direct.chat.completions.create(**ask, stream=True)
        expected: Any = [c.model_dump() async for c in chunks]
        chunks = await server.client().chat.completions.create(**ask, stream=True)
        got: Any = [c.model_dump() async for c in chunks]
    else:
        expected = (await direct.chat.completions.create(**ask)).model_dump()
        got = (await server.client().chat.completions.create(**ask)).model_dump()
    assert got == expected
    assert server.bodies() == [content for _, _, content, _ in upstream.seen]


@pytest.mark.parametrize("messages", [["hi"], [ASK[0], 5]])
async def test_messages_the_guard_cannot_read_go_upstream_as_they_came(
    served: Callable[..., Served], messages: list[Any]
) -> None:
    """A message that is no object was left out of the request sent upstream (``["hi"]`` went
    as ``[]``): the upstream now gets the caller's bytes, and answers them itself."""
    server = served([Reply.text("hi")])
    body = json.dumps({"model": "m", "messages": messages}).encode()
    async with server.http() as http:
        await http.post("/v1/chat/completions", content=body)
    assert server.bodies() == [body]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_empty_tools_list_goes_upstream_as_sent(
    served: Callable[..., Served], stream: bool
) -> None:
    """Clients that always send their tools send ``"tools": []`` when there are none: the
    request went upstream re-encoded without it (OpenAI answers such a request 400, the server
    made it a 200); it goes as the caller's bytes."""
    server = served([Reply.text("hi")])
    body = json.dumps({"model": "m", "messages": ASK, "tools": [], "stream": stream})
    async with server.http() as http:
        await http.post("/v1/chat/completions", content=body.encode())
    assert server.bodies() == [body.encode()]


class _Targets(httpx.AsyncBaseTransport):
    """A transport that notes each request's target (path and query) and passes it on."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.seen: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request.url.raw_path)
        return await self.inner.handle_async_request(request)


async def test_the_callers_query_string_goes_upstream(served: Callable[..., Served]) -> None:
    """A query string (Azure's ``api-version``, a client's ``extra_query``) goes upstream with
    the guarded calls, streamed or not, and with ``/v1/models``, as it goes with everything the
    server forwards."""
    replies = [Reply.text("one"), Reply.text("two"), Reply.text("three")]
    server = served(replies, {"tiers": {"fast": {"model": "m"}}})
    targets = _Targets(server.upstream.transport)
    server.server.pool.transport = targets
    client = server.client().with_options(default_query={"api-version": "2024-10-21"})
    await client.chat.completions.create(model="m", messages=ASK)
    stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
    [chunk async for chunk in stream]
    await client.responses.create(model="m", input="hi")
    await client.models.list()
    assert targets.seen == [
        b"/v1/chat/completions?api-version=2024-10-21",
        b"/v1/chat/completions?api-version=2024-10-21",
        b"/v1/responses?api-version=2024-10-21",
        b"/v1/models?api-version=2024-10-21",
    ]


async def test_models_lists_the_tiers(served: Callable[..., Served]) -> None:
    """``/v1/models`` lists the configured tiers by name (the upstream here has no list)."""
    tiers = {"tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}}}
    server = served([], tiers)
    models = await server.client().models.list()
    assert {m.id for m in models.data} >= {"fast", "premium"}


async def test_health(served: Callable[..., Served]) -> None:
    """``/health`` answers without calling the upstream."""
    server = served([])
    async with server.http() as http:
        answer = await http.get("/health")
    assert answer.json()["status"] == "ok"
    assert server.upstream.seen == []


async def test_routes_can_be_added(served: Callable[..., Served]) -> None:
    """A route added with ``add_route`` is served (ahead of the forwarding catch-all)."""

    async def hello(server: GuardServer, request: Request) -> Response:
        return JSONResponse(
            {"agent": request.path_params["agent"], "storage": server.config.storage.backend}
        )

    before = list(ROUTES)
    add_route("post", "/custom/{agent}", hello)  # (/hooks/{agent} is built in: agentguard.hooks)
    try:
        server = served([])
        async with server.http() as http:
            answer = await http.post("/custom/codex", json={})
        assert answer.json() == {"agent": "codex", "storage": "memory"}
    finally:
        ROUTES[:] = before


async def test_routes_of_a_fixed_path_and_middleware_are_served(
    served: Callable[..., Served],
) -> None:
    """A route of a fixed path is served by its endpoint (the app's own dispatch, ahead of the
    forwarding), the Starlette request in hand; middleware added to the app sees every
    request, those of the server's own routes and the forwarded ones too."""

    async def hello(server: GuardServer, request: Request) -> Response:
        return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})

    before = list(ROUTES)
    add_route("put", "/v1/hello", hello)
    try:
        server = served([])
        async with server.http() as http:
            answer = await http.put("/v1/hello", content=b"hi")
            assert answer.json() == {"path": "/v1/hello", "body": "hi"}

            async def tagged(request: Request, call_next: Any) -> Response:
                response: Response = await call_next(request)
                response.headers["x-seen-by"] = "middleware"
                return response

            from starlette.middleware.base import BaseHTTPMiddleware

            server.app.add_middleware(BaseHTTPMiddleware, dispatch=tagged)
            again = await http.put("/v1/hello", content=b"hi")
            health = await http.get("/health")
            files = await http.get("/v1/files")  # forwarded upstream
        assert again.json() == answer.json()
        assert again.headers["x-seen-by"] == health.headers["x-seen-by"] == "middleware"
        assert files.headers["x-seen-by"] == "middleware"
    finally:
        ROUTES[:] = before


async def test_a_fixed_route_behind_a_matching_route_with_parameters_stays_behind_it(
    served: Callable[..., Served],
) -> None:
    """Routes match in order, the app's own dispatch of fixed paths included: a fixed path
    added after ``/hooks/{agent}`` that the earlier route matches is served by that one, as
    Starlette's routing serves it; the same path for another method is the added route's."""
    called: list[str] = []

    async def special(server: GuardServer, request: Request) -> Response:
        called.append(request.method)
        return JSONResponse({"special": True})

    before = list(ROUTES)
    add_route("POST", "/hooks/special", special)
    add_route("PUT", "/hooks/special", special)
    try:
        server = served([])
        async with server.http() as http:
            shadowed = await http.post("/hooks/special", content=b"{}")
            other = await http.post("/hooks/other", content=b"{}")
            own = await http.put("/hooks/special", content=b"{}")
    finally:
        ROUTES[:] = before
    assert shadowed.status_code == other.status_code == 404  # the hooks' unknown agent
    assert shadowed.json() == other.json()
    assert own.json() == {"special": True}
    assert called == ["PUT"]


def test_serve_needs_an_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    """``agentguard serve`` without ``--upstream`` and without tier endpoints says what is
    missing and exits 2, before listening anywhere."""
    from agentguard.cli import main

    assert main(["serve", "--config", "/nonexistent/agentguard.yaml"]) == 1
    assert main(["serve"]) == 2
    assert "--upstream" in capsys.readouterr().err


async def test_streamed_responses_tool_call_is_held_until_judged(
    served: Callable[..., Served],
) -> None:
    """A streamed Responses tool call the guard leaves alone arrives exactly as upstream sent
    it; one it repairs arrives as a real ``function_call`` in the closing response."""
    tools = [
        {"type": "function", "name": "search", "parameters": TOOLS[0]["function"]["parameters"]}
    ]
    upstream, direct = _direct([Reply.call("search", {"q": "install"})])
    stream = await direct.responses.create(model="m", input="hi", tools=tools, stream=True)
    expected = [e.model_dump() async for e in stream]
    server = served([Reply.call("search", {"q": "install"}), Reply.embedded("search", {"q": "x"})])
    client = server.client()
    stream = await client.responses.create(model="m", input="hi", tools=tools, stream=True)
    assert [e.model_dump() async for e in stream] == expected
    assert server.bodies()[0] == upstream.seen[0][2]
    stream = await client.responses.create(model="m", input="again", tools=tools, stream=True)
    events = [e async for e in stream]
    final = events[-1].response
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("search", {"q": "x"})]
    # the call was written as text: none of that text reaches the caller, in events or output
    assert not any("<tool_call>" in json.dumps(e.model_dump()) for e in events)
    assert [item.type for item in final.output] == ["function_call"]


async def test_a_stream_refused_before_it_begins_is_an_error_answer(
    served: Callable[..., Served],
) -> None:
    """A streamed call the guard refuses up front (a loop) is an HTTP error with its headers,
    not a stream."""
    server = served(_looping(20), LOOPS)
    with pytest.raises(openai.BadRequestError) as caught:
        await server.client().chat.completions.create(
            model="m", messages=_loop_history(8), tools=TOOLS, stream=True
        )
    assert caught.value.body["type"] == "loop_detected"
    assert "x-agentguard-session" in caught.value.response.headers


def test_the_server_reads_memory_pressure_at_most_once_a_second() -> None:
    """Every request asks; the host is read again only when the last reading is a second
    old."""
    from agentguard.serve._app import SampledProbe

    clock = FakeClock()
    probe = SampledProbe(ag.GuardConfig.from_dict({}), clock=clock)
    first = probe.reading()
    assert probe.reading() is first
    clock.advance(1.0)
    assert probe.reading() is not first


async def test_every_tier_failing_says_when_to_retry(served: Callable[..., Served]) -> None:
    """Every tier rate-limited: a 503 ``tiers_exhausted`` carrying the last upstream's
    ``Retry-After``, and the attempts in the headers."""
    config = {
        "tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}},
        "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 0},
    }
    server = served([Fault.rate_limit(retry_after=7), Fault.rate_limit(retry_after=7)], config)
    with pytest.raises(openai.InternalServerError) as caught:
        await server.client().chat.completions.create(model="fast", messages=ASK)
    assert caught.value.status_code == 503
    assert caught.value.body["type"] == "tiers_exhausted"
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body["retry_after"] == 7
    assert caught.value.response.headers["x-agentguard-attempts"].startswith("fast:")
    assert [json.loads(b)["model"] for b in server.bodies()] == ["small", "big"]


async def test_a_stream_cancelled_mid_answer_settles_its_reservation() -> None:
    """What a shutdown relies on: a guarded stream whose task is cancelled mid-answer charges
    what it delivered and holds nothing (the core, under the server)."""
    import anyio

    from agentguard.transport import ModelRequest, StreamChunk

    class Stalling:
        """Streams two chunks, then waits for ever (a long generation)."""

        async def asend(self, request: ModelRequest) -> Any:
            raise AssertionError("not called")

        async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
            yield StreamChunk(content="The release ")
            yield StreamChunk(content="notes say ")
            await anyio.Event().wait()

    config = ag.GuardConfig.from_dict(
        {"token_budget": {"max_output_tokens": 500, "reserve": "strict"}}
    )
    ledger = ag.TokenLedger(config)
    guard = ag.AsyncGuard(Stalling(), config, ledger=ledger)
    received: list[str] = []

    async def consume() -> None:
        async for chunk in guard.astream(ModelRequest(model="m", messages=ASK), session="cut"):
            received.append(chunk.content or "")
            if len(received) == 2:
                scope.cancel()

    with anyio.CancelScope() as scope:
        await consume()
    usage = ledger.usage("cut")
    assert received == ["The release ", "notes say "]
    assert usage.session_reserved == 0
    assert usage.session_tokens > 0


async def test_a_re_ask_after_live_text_does_not_open_the_stream_again(
    served: Callable[..., Served],
) -> None:
    """Text streamed live, then its call was corrected: the re-ask's ``role`` chunk stays back
    (the SDK's stream helper adds roles up: it read ``"assistantassistant"``)."""
    wrong = Reply.call("delete_everything", {"q": "x"}, content="Let me search.")
    right = Reply.call("search", {"q": "install"}, content="Let me search.")
    server = served([wrong, right])
    client = server.client()
    fn = TOOLS[0]["function"]  # the SDK's helper (openai 2.x, async) parses strict tools only
    strict = {
        **fn,
        "strict": True,
        "parameters": {**fn["parameters"], "additionalProperties": False},
    }
    tools = [{"type": "function", "function": strict}]
    async with client.chat.completions.stream(model="m", messages=ASK, tools=tools) as stream:
        roles = [
            e.chunk.choices[0].delta.role
            async for e in stream
            if e.type == "chunk" and e.chunk.choices and e.chunk.choices[0].delta.role
        ]
        final = await stream.get_final_completion()
    assert len(server.upstream.seen) == 2
    assert roles == ["assistant"]
    message = final.choices[0].message
    assert (message.role, message.content) == ("assistant", "Let me search.")
    assert [c.function.name for c in message.tool_calls or ()] == ["search"]


@pytest.mark.parametrize("tier_key", [True, False], ids=["tier-key", "no-tier-key"])
async def test_a_tier_elsewhere_never_gets_the_callers_credentials(
    tier_key: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's key was given for the server's upstream: a tier at another origin gets only its
    own key (or none), never the caller's ``Authorization``, ``api-key`` or ``x-api-key``."""
    monkeypatch.setenv("PREMIUM_KEY", "sk-premium-tier-0123456789")
    premium: dict[str, Any] = {"model": "big", "base_url": "https://premium.invalid/v1"}
    if tier_key:
        premium["api_key_env"] = "PREMIUM_KEY"
    config = {
        "tiers": {"fast": {"model": "small"}, "premium": premium},
        "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 0},
        "memory_pressure": {"enabled": False},
    }
    seen: list[tuple[str, dict[str, str]]] = []
    answer = completion(content="ok")

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, {k.lower(): v for k, v in request.headers.items()}))
        if request.url.host == "upstream.invalid":
            return httpx.Response(503, json={"error": {"message": "down", "type": "server_error"}})
        return httpx.Response(200, json=answer)

    server = GuardServer(
        ag.GuardConfig.from_dict(config, env={}),
        "http://upstream.invalid/v1",
        transport=httpx.MockTransport(upstream),
        clock=FakeClock(),
        rng=random.Random(0),
    )
    try:
        async with client_http.AsyncClient(
            transport=client_http.ASGITransport(app=create_app(server)),
            base_url="http://serve.invalid",
        ) as http:
            got = await http.post(
                "/v1/chat/completions",
                json={"model": "fast", "messages": ASK},
                headers={"authorization": f"Bearer {KEY_A}", "api-key": KEY_B, "x-api-key": KEY_B},
            )
    finally:
        await server.aclose()
    assert got.status_code == 200
    hosts = [host for host, _ in seen]
    assert (hosts[0], hosts[-1]) == ("upstream.invalid", "premium.invalid")
    fast, tier = seen[0][1], seen[-1][1]
    assert (fast["authorization"], fast["x-api-key"]) == (f"Bearer {KEY_A}", KEY_B)
    assert not {"api-key", "x-api-key"} & set(tier)
    assert tier.get("authorization") == ("Bearer sk-premium-tier-0123456789" if tier_key else None)


async def test_the_guarded_requests_repr_holds_no_caller_key(
    served: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the server keeps beside a guarded request (the caller's header pairs and body, in
    its extensions) is out of its ``repr``: a transport's debug log or an error tracker's
    frame locals never write the caller's key."""
    from agentguard.serve import _upstream

    seen: list[str] = []
    send = _upstream.HTTPUpstream.asend

    async def recording(self: Any, request: Any) -> Any:
        seen.append(repr(request))
        return await send(self, request)

    monkeypatch.setattr(_upstream.HTTPUpstream, "asend", recording)
    s = served([Reply.text("ok")])
    async with s.http() as http:
        got = await http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": ASK},
            headers={"authorization": f"Bearer {KEY_A}"},
        )
    assert got.status_code == 200
    assert seen
    assert all(KEY_A not in text for text in seen)
    assert all("Forward(path='/chat/completions'" in text for text in seen)


# -- an error in a stream's body: as from the upstream ---------------------------------------

_CHUNK_HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
# the error event as OpenAI sends it in a chat stream (the openai client raises it as APIError)
_DATA_ERROR = (
    b'data: {"error": {"message": "The server had an error while processing your request.", '
    b'"type": "server_error", "param": null, "code": null}}\n\n'
)
# a Responses stream's own error event (the openai client hands it on as an event)
_EVENT_ERROR = (
    b'event: error\ndata: {"type": "error", "code": "server_error", "message": "The server had '
    b'an error", "param": null, "sequence_number": 9}\n\n'
)
RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]


def _before_error(api: str, where: str) -> bytes:
    """A stream's events before its error: none (``first``), its opening (chat's ``role``
    chunk; Responses' ``response.created`` and ``response.in_progress``), then some text
    (``text``; ``bare``: and a chunk with nothing in it, which the guard holds until the next)
    or the first fragment of a tool call (``call``)."""
    if api == "chat":
        deltas: list[dict[str, Any]] = [] if where == "first" else [{"role": "assistant"}]
        if where in ("text", "bare"):
            deltas.append({"content": "The docs "})
        if where == "bare":
            deltas.append({})
        if where == "call":
            fn = {"name": "search", "arguments": '{"q'}
            deltas.append(
                {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": fn}]}
            )
        chunks = [
            {**_CHUNK_HEAD, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
            for d in deltas
        ]
        return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)
    from _openai_upstream import reasoning_answer

    opening = {**reasoning_answer("", ""), "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = []
    if where != "first":
        events += [
            {"type": k, "response": opening} for k in ("response.created", "response.in_progress")
        ]
    at = {"output_index": 0, "item_id": "msg_1", "content_index": 0}
    if where == "text":
        message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress"}
        part = {"type": "output_text", "text": "", "annotations": []}
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**message, "content": []},
            },
            {"type": "response.content_part.added", **at, "part": part},
            {"type": "response.output_text.delta", **at, "delta": "The docs ", "logprobs": []},
        ]
    if where == "call":
        item = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "search"}
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
            {
                "type": "response.function_call_arguments.delta",
                "output_index": 0,
                "item_id": "fc_1",
                "delta": '{"q',
            },
        ]
    for n, event in enumerate(events):
        event["sequence_number"] = n
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


async def _read_to_error(client: Any, api: str) -> tuple[list[Any], Any]:
    """What a streamed call with tools gives: its items, then its error (or ``None``)."""
    items: list[Any] = []
    try:
        if api == "chat":
            stream = await client.chat.completions.create(
                model="m", messages=ASK, tools=TOOLS, stream=True
            )
        else:
            stream = await client.responses.create(
                model="m", input="docs?", tools=RESPONSES_TOOLS, stream=True
            )
        async for item in stream:
            items.append(item.model_dump())
    except openai.APIError as exc:
        return items, (type(exc), exc.message, exc.body)
    return items, None


async def _body_error_both_ways(body: bytes, api: str) -> tuple[Any, Any, Any, int]:
    """The openai client straight to an upstream answering every request with the 200 stream
    ``body``, and through the server to the same upstream; the server's answer (status,
    content type, body) to a plain HTTP client after; how often the server asked the upstream
    for the openai client's call."""
    asked: list[Any] = []

    def answer(library: Any) -> Any:
        def respond(request: Any) -> Any:
            asked.append(request)
            return library.Response(
                200, headers={"content-type": "text/event-stream"}, content=body
            )

        return respond

    direct = openai.AsyncOpenAI(
        api_key=KEY_A,
        base_url="http://upstream.invalid/v1",
        http_client=client_http.AsyncClient(
            transport=client_http.MockTransport(answer(client_http))
        ),
        max_retries=0,
    )
    clock = FakeClock()
    server = GuardServer(
        ag.GuardConfig.from_dict({}),
        "http://upstream.invalid/v1",
        transport=httpx.MockTransport(answer(httpx)),
        clock=clock,
        sleep=clock.asleep,
        rng=random.Random(0),
    )
    app = create_app(server)
    through = openai.AsyncOpenAI(
        api_key=KEY_A,
        base_url="http://serve.invalid/v1",
        http_client=client_http.AsyncClient(transport=client_http.ASGITransport(app=app)),
        max_retries=0,
    )
    try:
        raw = await _read_to_error(direct, api)
        asked.clear()
        guarded = await _read_to_error(through, api)
        attempts = len(asked)
        path = "/v1/chat/completions" if api == "chat" else "/v1/responses"
        ask = {"messages": ASK, "tools": TOOLS} if api == "chat" else {"input": "docs?"}
        async with client_http.AsyncClient(
            transport=client_http.ASGITransport(app=app), base_url="http://serve.invalid"
        ) as http:
            got = await http.post(
                path,
                json={"model": "m", "stream": True, **ask},
                headers={"authorization": f"Bearer {KEY_A}"},
            )
        answered = (got.status_code, got.headers["content-type"], got.content)
    finally:
        await server.aclose()
    return raw, guarded, answered, attempts


_BODY_ERRORS = [
    *(("chat", where, _DATA_ERROR) for where in ("first", "opening", "text", "bare")),
    *(
        ("responses", where, error)
        for error in (_DATA_ERROR, _EVENT_ERROR)
        for where in ("first", "opening", "text")
    ),
]


@pytest.mark.parametrize(
    ("api", "where", "error"),
    _BODY_ERRORS,
    ids=[f"{a}-{w}-{'event' if e is _EVENT_ERROR else 'data'}" for a, w, e in _BODY_ERRORS],
)
async def test_an_error_in_a_streams_body_reaches_the_caller_as_from_the_upstream(
    api: str, where: str, error: bytes
) -> None:
    """Differential: an upstream's 200 stream carrying an error in its body (first, after its
    opening, after some text). Through the server (after its retries, each attempt failing
    so) the openai client gets the same items, then the same error (``APIError``, raised as
    the stream is read; a Responses ``error`` event handed on as an event); the server's
    answer is a 200 event stream whose events are the upstream's bytes, then the report's
    comment line. Before: an error before the first words was a 502 or 429 answer with the
    error as its body (the client raised ``InternalServerError`` from ``create``, and would
    retry it), and the opening events were lost; after text, a chunk the guard was holding
    (one with nothing in it) was lost."""
    body = _before_error(api, where) + error
    raw, guarded, (status, kind, sent), attempts = await _body_error_both_ways(body, api)
    assert guarded == raw
    assert (status, kind.split(";")[0]) == (200, "text/event-stream")
    assert sent[: sent.index(b": agentguard ")] == body
    assert raw[0] or where == "first"
    # retried while nothing had gone to the caller; not once text had
    assert (attempts > 1) == (where not in ("text", "bare"))


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_error_in_a_streams_body_releases_no_call_unjudged(api: str) -> None:
    """The error comes in the middle of a tool call: the caller gets the opening as from the
    upstream, then the error; the call's first fragment, which the guard holds until the call
    is whole and valid, never goes out (the raw client hands it on)."""
    body = _before_error(api, "call") + _DATA_ERROR
    raw, guarded, (status, _, sent), _ = await _body_error_both_ways(body, api)
    (raw_items, raw_error), (items, error) = raw, guarded
    assert error == raw_error
    opening = 1 if api == "chat" else 2
    assert items == raw_items[:opening]
    assert len(raw_items) > opening
    assert status == 200
    assert sent[: sent.index(b": agentguard ")] == _before_error(api, "opening") + _DATA_ERROR
