"""Fail-open and fail-closed on every path: plain calls and streams, sync and async.

A fault inside agentguard itself (injected here) must never break the agent: with
``fail_mode: open`` the call goes through unguarded, a stream hands over what the upstream sent
that the caller has not seen (text already streamed is not repeated), and the report says
``fail_open``; with ``fail_mode: closed`` a :class:`GuardFailure` is raised, the fault chained.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

from agentguard import AgentGuardError, GuardConfig, GuardFailure, ToolCallValidator
from agentguard.events import GuardInternalError
from agentguard.guard import AsyncGuard, Guard
from agentguard.guard._pipeline import Pipeline
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, capture_events
from agentguard.transport import ModelRequest, StreamChunk, report_of

SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": SCHEMA}}]
OPEN = GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
CLOSED = GuardConfig.from_dict(
    {"memory_pressure": {"enabled": False}, "fail_mode": "closed"}, env={}
)
ANSWER = Reply(
    content="Let me look it up. ", tool_calls=Reply.call("search", {"query": "x"}).tool_calls
)


def _request() -> ModelRequest:
    return ModelRequest(
        model="fast",
        messages=[{"role": "user", "content": "find the install guide"}],
        params={"tools": TOOLS},
    )


def _explode(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected fault")


def _guard(config: GuardConfig, *, asynchronous: bool = False) -> Any:
    clock = FakeClock()
    model = ScriptedModel([ANSWER], chunk_size=4)
    if asynchronous:
        return AsyncGuard(model, config, clock=clock, sleep=clock.asleep, rng=random.Random(0))
    return Guard(model, config, clock=clock, sleep=clock.sleep, rng=random.Random(0))


def _read(chunks: list[StreamChunk]) -> tuple[str, list[Any]]:
    text = "".join(c.content or "" for c in chunks)
    calls = [call for c in chunks for call in c.tool_calls]
    return text, calls


def _stream(config: GuardConfig, asynchronous: bool) -> tuple[list[StreamChunk], Any]:
    guard = _guard(config, asynchronous=asynchronous)
    if not asynchronous:
        stream = guard.stream(_request())
        return list(stream), stream.report

    async def main() -> tuple[list[StreamChunk], Any]:
        stream = guard.astream(_request())
        return [c async for c in stream], stream.report

    return anyio.run(main)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_fault_after_text_was_streamed_fails_open_without_repeating_it(
    asynchronous: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validator fails after the text went out live: the caller gets the text once, then
    the tool call the guard was holding back, and a fail-open report."""
    monkeypatch.setattr(ToolCallValidator, "validate", _explode)
    with capture_events() as events:
        chunks, report = _stream(OPEN, asynchronous)
    text, calls = _read(chunks)
    assert text == "Let me look it up. "
    assert "".join(c["function"].get("arguments") or "" for c in calls) == '{"query": "x"}'
    assert any(c.finish_reason for c in chunks)
    assert report is not None
    assert report.fail_open
    (event,) = events.of_type(GuardInternalError)
    assert event.component == "stream"
    assert event.error_type == "RuntimeError"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_fault_before_the_upstream_call_streams_unguarded(
    asynchronous: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard fails before it called the upstream: the whole answer streams unguarded."""
    monkeypatch.setattr(Pipeline, "_locate", _explode)
    chunks, report = _stream(OPEN, asynchronous)
    text, calls = _read(chunks)
    assert text == "Let me look it up. "
    assert calls
    assert report is not None
    assert report.fail_open


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_fail_closed_streams_raise_a_guard_failure(
    asynchronous: bool, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fail_mode: closed``: the stream raises :class:`GuardFailure`, the fault its cause."""
    if where == "before":
        monkeypatch.setattr(Pipeline, "_locate", _explode)
    else:
        monkeypatch.setattr(ToolCallValidator, "validate", _explode)
    with pytest.raises(GuardFailure) as raised:
        _stream(CLOSED, asynchronous)
    assert isinstance(raised.value, AgentGuardError)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert raised.value.component == "stream"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_fail_closed_plain_calls_raise_a_guard_failure(
    asynchronous: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a plain call, sync and async."""
    monkeypatch.setattr(ToolCallValidator, "validate", _explode)
    guard = _guard(CLOSED, asynchronous=asynchronous)

    def call() -> Any:
        if asynchronous:
            return anyio.run(guard.acomplete, _request())
        return guard.complete(_request())

    with pytest.raises(GuardFailure) as raised:
        call()
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "injected fault" in str(raised.value)
    # what the guard did before the fault travels with the typed error
    report = raised.value.agentguard_report
    assert report is not None
    assert [a.outcome for a in raised.value.attempts] == ["ok"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_plain_calls_fail_open(asynchronous: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain call survives the same fault: the model's own answer, a fail-open report."""
    monkeypatch.setattr(ToolCallValidator, "validate", _explode)
    guard = _guard(OPEN, asynchronous=asynchronous)
    response = (
        anyio.run(guard.acomplete, _request()) if asynchronous else guard.complete(_request())
    )
    assert response.message["tool_calls"]
    report = report_of(response)
    assert report is not None
    assert report.fail_open


def test_a_healthy_stream_is_unchanged_by_the_fail_safe() -> None:
    """No fault: the chunks are the guard's usual ones (text live, the call released whole)."""
    chunks, report = _stream(OPEN, False)
    text, calls = _read(chunks)
    assert text == "Let me look it up. "
    assert len(calls) == 1
    assert report is not None
    assert not report.fail_open


class KeepingAlive:
    """A transport streaming ``ANSWER`` with an upstream's keep-alive before each chunk."""

    def __init__(self) -> None:
        self.model = ScriptedModel([ANSWER], chunk_size=4)
        self.comments = 0

    def send(self, request: ModelRequest) -> Any:
        return self.model.send(request)

    async def asend(self, request: ModelRequest) -> Any:
        return self.model.send(request)

    def stream(self, request: ModelRequest) -> Any:
        for chunk in self.model.stream(request):
            self.comments += 1
            yield StreamChunk(comment=" keep-alive")
            yield chunk

    async def astream(self, request: ModelRequest) -> Any:
        for chunk in self.stream(request):
            yield chunk


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_fault_after_keep_alives_fails_open_with_the_held_call(
    asynchronous: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keep-alives went out while the call was held back, then the validator fails: they are
    no part of the answer (the call held back is handed over, not taken as delivered), and
    none is handed over twice."""
    monkeypatch.setattr(ToolCallValidator, "validate", _explode)
    transport = KeepingAlive()
    clock = FakeClock()
    kind = AsyncGuard if asynchronous else Guard
    sleep = clock.asleep if asynchronous else clock.sleep
    guard = kind(transport, OPEN, clock=clock, sleep=sleep, rng=random.Random(0))
    if asynchronous:

        async def main() -> list[StreamChunk]:
            return [c async for c in guard.astream(_request())]

        chunks = anyio.run(main)
    else:
        chunks = list(guard.stream(_request()))
    text, calls = _read(chunks)
    assert text == "Let me look it up. "
    assert "".join(c["function"].get("arguments") or "" for c in calls) == '{"query": "x"}'
    assert sum(c.comment is not None for c in chunks) == transport.comments
    assert all(c.comment is None or c == StreamChunk(comment=" keep-alive") for c in chunks)


# -- a fault while the guard handles the upstream's own error ------------------------------------


class UpstreamBroke(Exception):
    """The upstream's error, as a transport raises it."""


class Breaking:
    """A transport whose answer fails: a stream after its first chunks (or at once, ``at_open``),
    a whole answer always. Counts the calls made."""

    def __init__(self, *, at_open: bool = False) -> None:
        self.at_open = at_open
        self.calls = 0
        self.error = UpstreamBroke("connection reset by peer")
        self.before = list(
            ScriptedModel([Reply.text("Let me look it up.")], chunk_size=4).stream(_request())
        )[:2]

    def send(self, request: ModelRequest) -> Any:
        self.calls += 1
        raise self.error

    async def asend(self, request: ModelRequest) -> Any:
        return self.send(request)

    def stream(self, request: ModelRequest) -> Any:
        self.calls += 1
        if self.at_open:
            raise self.error
        return self._chunks()

    def _chunks(self) -> Any:
        yield from self.before
        raise self.error

    async def astream(self, request: ModelRequest) -> Any:
        for chunk in self.stream(request):
            yield chunk


def _breaking_guard(transport: Breaking, asynchronous: bool) -> Any:
    clock = FakeClock()
    kind = AsyncGuard if asynchronous else Guard
    sleep = clock.asleep if asynchronous else clock.sleep
    return kind(transport, OPEN, clock=clock, sleep=sleep, rng=random.Random(0))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("at_open", [False, True], ids=["mid-stream", "at-open"])
def test_a_fault_while_handling_the_upstreams_error_raises_that_error(
    asynchronous: bool, at_open: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream's stream breaks (or does not open) and the guard fails while it reads the
    error: the caller gets what was streamed, then the upstream's own error, as from the raw
    client. Before, a stream broken mid-way ended as if complete, and one that did not open was
    opened a second time, unguarded."""
    monkeypatch.setattr(Pipeline, "_classified", _explode)
    transport = Breaking(at_open=at_open)
    guard = _breaking_guard(transport, asynchronous)
    got: list[StreamChunk] = []

    async def read_async() -> None:
        async for chunk in guard.astream(_request()):
            got.append(chunk)

    def read() -> None:
        if asynchronous:
            anyio.run(read_async)
        else:
            got.extend(guard.stream(_request()))

    with capture_events() as events, pytest.raises(UpstreamBroke):
        read()
    assert "".join(c.content or "" for c in got) == (
        "" if at_open else "".join(c.content or "" for c in transport.before)
    )
    assert transport.calls == 1
    assert [e.component for e in events.of_type(GuardInternalError)] == ["stream"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_fault_while_handling_a_failed_call_raises_the_upstreams_error(
    asynchronous: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain call fails upstream and the guard fails while it reads the error: the upstream's
    error is raised, as from the raw client (before, the call was made a second time)."""
    monkeypatch.setattr(Pipeline, "_classified", _explode)
    transport = Breaking()
    guard = _breaking_guard(transport, asynchronous)

    async def call_async() -> Any:
        return await guard.acomplete(_request())

    with capture_events() as events, pytest.raises(UpstreamBroke):
        anyio.run(call_async) if asynchronous else guard.complete(_request())
    assert transport.calls == 1
    assert [e.component for e in events.of_type(GuardInternalError)] == ["pipeline"]


# -- the unguarded call, through the real openai client -------------------------------------------

TIERS = GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}},
        "escalation": {"chain": ["fast", "premium"]},
        "memory_pressure": {"enabled": False},
    },
    env={},
)


def _openai_client(model: ScriptedModel, *, asynchronous: bool, **options: Any) -> Any:
    """The real openai client over ``model`` (either major version, sync or async)."""
    openai = pytest.importorskip("openai")
    http = pytest.importorskip("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
    if asynchronous:
        return openai.AsyncOpenAI(
            api_key="sk-test",
            base_url="http://scripted.invalid/v1",
            http_client=http.AsyncClient(transport=model.mock_transport(http)),
            **options,
        )
    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://scripted.invalid/v1",
        http_client=http.Client(transport=model.mock_transport(http)),
        **options,
    )


def _text_of(client: Any, *, asynchronous: bool, stream: bool, model: str = "fast") -> Any:
    """One chat call for ``model`` on ``client``: the answer's text, or the exception raised."""
    ask = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}

    async def call_async() -> str:
        answer = await client.chat.completions.create(**ask)
        if not stream:
            return str(answer.choices[0].message.content)
        return "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])

    def call() -> str:
        if asynchronous:
            return anyio.run(call_async)
        answer = client.chat.completions.create(**ask)
        if not stream:
            return str(answer.choices[0].message.content)
        return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)

    try:
        return call()
    except Exception as exc:
        return exc


def _wrap(client: Any, asynchronous: bool) -> Any:
    import agentguard as ag

    clock = FakeClock()
    sleep = clock.asleep if asynchronous else clock.sleep
    return ag.wrap(client, TIERS, clock=clock, sleep=sleep, rng=random.Random(0))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_request_for_a_tier_fails_open_to_the_tiers_model(
    asynchronous: bool, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request for a tier's name (``model="fast"``) fails open to that tier's model, as the
    guard would have sent it. It went out for the model "fast", which no server has (vLLM: 404
    "The model `fast` does not exist"): a fault of the guard's broke a working call."""
    from agentguard.escalation import EscalationPolicy

    model = ScriptedModel({"small": [Reply.text("Hello.")] * 2})
    client = _wrap(_openai_client(model, asynchronous=asynchronous, max_retries=0), asynchronous)
    assert _text_of(client, asynchronous=asynchronous, stream=stream) == "Hello."  # no fault
    monkeypatch.setattr(EscalationPolicy, "start", _explode)
    with capture_events() as events:
        text = _text_of(client, asynchronous=asynchronous, stream=stream)
    assert text == "Hello."
    assert [r.model for r in model.requests] == ["small", "small"]
    assert [e.error_type for e in events.of_type(GuardInternalError)] == ["RuntimeError"]


@pytest.fixture
def instant_sdk_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The openai client's own retries without their wait (the SDK sleeps for real)."""
    base = pytest.importorskip("openai._base_client")
    for kind in (base.SyncAPIClient, base.AsyncAPIClient):
        monkeypatch.setattr(kind, "_calculate_retry_timeout", lambda *args, **kwargs: 0.0)


@pytest.mark.usefixtures("instant_sdk_retries")
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("client_retries", "copy_retries"),
    [(None, None), (1, None), (0, 2)],
    ids=["default", "client-1", "copy-2"],
)
def test_the_unguarded_call_keeps_the_callers_retries(
    asynchronous: bool,
    stream: bool,
    client_retries: int | None,
    copy_retries: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failing open before its first model call, the guarded client makes the call as the raw
    client would, with the client's (or the copy's) own ``max_retries``: two 503s, then an
    answer, give what they give the raw client. It went out once on the guard's retry-less
    client copy: the first 503 reached the agent, which the raw client retried away."""
    from agentguard.escalation import EscalationPolicy

    openai = pytest.importorskip("openai")
    script = [Fault.server_error(503)] * 2 + [Reply.text("Hello.")]
    options = {} if client_retries is None else {"max_retries": client_retries}
    copy = {} if copy_retries is None else {"max_retries": copy_retries}

    def outcome(client: Any, model: ScriptedModel) -> tuple[Any, int]:
        client = client.with_options(**copy) if copy else client
        got = _text_of(client, asynchronous=asynchronous, stream=stream, model="small")
        return (got if isinstance(got, str) else type(got)), len(model.requests)

    raw_model = ScriptedModel({"small": script})
    raw = outcome(_openai_client(raw_model, asynchronous=asynchronous, **options), raw_model)
    monkeypatch.setattr(EscalationPolicy, "start", _explode)
    model = ScriptedModel({"small": script})
    client = _wrap(_openai_client(model, asynchronous=asynchronous, **options), asynchronous)
    assert outcome(client, model) == raw
    assert raw == (("Hello.", 3) if client_retries != 1 else (openai.InternalServerError, 2))
