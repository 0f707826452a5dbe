"""Model calls ``agentguard serve`` forwards unguarded (legacy completions, embeddings, a
provider's own routes) count against the caller's budgets: held before they go upstream,
refused under ``hard_stop`` when they do not fit, settled from the usage their answer reports
(else the estimate of the text it carried). The bytes both ways stay as they came.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from importlib import import_module
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("starlette", reason='needs the serve extra: pip install "agentguard[serve]"')

import agentguard as ag
from agentguard.serve import GuardServer, create_app
from agentguard.serve._app import _caller
from agentguard.serve._meter import AnswerReader, metered_call, usage_of
from agentguard.testing import FakeClock
from agentguard.types import Usage

openai = pytest.importorskip("openai")
client_http: Any = import_module(
    "httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx"
)

KEY = "sk-metered-0123456789abcdef"
COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "text": " a forwarded answer", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 60, "completion_tokens": 90, "total_tokens": 150},
}
EMBEDDING = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}],
    "model": "e",
    "usage": {"prompt_tokens": 40, "total_tokens": 40},
}


def _events(usage: bool) -> bytes:
    chunks = [
        {**COMPLETION, "choices": [{"index": 0, "text": word, "finish_reason": None}]}
        for word in (" a", " streamed", " answer")
    ]
    for chunk in chunks:
        del chunk["usage"]
    if usage:
        chunks.append({**COMPLETION, "choices": []})
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


class Upstream:
    """Answers legacy completions (whole or streamed), embeddings and a refusal; records."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.answers: list[bytes] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request.content)
        body = json.loads(request.content)
        path = request.url.path
        if body.get("model") == "refuse":
            answer = httpx.Response(400, json={"error": {"message": "no such model"}})
        elif path.endswith("/embeddings"):
            answer = httpx.Response(200, json=EMBEDDING)
        elif body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            answer = httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=_events(usage)
            )
        else:
            answer = httpx.Response(200, json=COMPLETION)
        self.answers.append(answer.read())
        return answer


@pytest.fixture
async def served() -> AsyncIterator[Any]:
    made: list[GuardServer] = []

    def make(budget: dict[str, Any]) -> tuple[GuardServer, Upstream, Any]:
        upstream = Upstream()
        clock = FakeClock()
        server = GuardServer(
            ag.GuardConfig.from_dict({"token_budget": budget}),
            "http://upstream.invalid/v1",
            transport=upstream.transport,
            clock=clock,
            sleep=clock.asleep,
            rng=random.Random(0),
        )
        made.append(server)
        client = openai.AsyncOpenAI(
            api_key=KEY,
            base_url="http://serve.invalid/v1",
            http_client=client_http.AsyncClient(
                transport=client_http.ASGITransport(app=create_app(server))
            ),
            max_retries=0,
        )
        return server, upstream, client

    yield make
    for server in made:
        await server.aclose()


def _usage(server: GuardServer, session: str) -> Any:
    ledger = server.guard_for(_caller({"authorization": f"Bearer {KEY}"})).pipeline.ledger
    assert ledger is not None
    return ledger.usage(session)


pytestmark = pytest.mark.anyio


async def test_forwarded_completions_count_and_a_spent_budget_refuses_them(served: Any) -> None:
    """Legacy completions through the server spend the key's hourly budget (150 tokens each,
    as the upstream reports) until ``hard_stop`` refuses, as it refuses a guarded call; the
    caller reads the upstream's answer byte for byte, and the upstream gets what was sent."""
    server, upstream, client = served(
        {"per_hour": 350, "max_output_tokens": 100, "policy": "hard_stop"}
    )
    raws = []
    for _ in range(2):
        raw = await client.completions.with_raw_response.create(
            model="m", prompt="say something", max_tokens=90
        )
        raws.append(raw)
    assert [r.http_response.content for r in raws] == upstream.answers
    assert json.loads(upstream.seen[0]) == {
        "model": "m",
        "prompt": "say something",
        "max_tokens": 90,
    }
    assert _usage(server, "forwarded /v1/completions").hour_tokens == 300
    with pytest.raises(openai.RateLimitError) as caught:
        await client.completions.create(model="m", prompt="and more", max_tokens=90)
    assert caught.value.body["type"] == "budget_exceeded"
    assert len(upstream.seen) == 2  # the refused call never went upstream


async def test_a_forwarded_stream_counts_its_usage_event_or_its_text(served: Any) -> None:
    """A streamed completion counts the usage its last event reports; without one, the prompt's
    estimate and the text it carried. The caller reads every event the upstream sent."""
    server, _, client = served({"per_session": 10_000})
    headers = {"x-agentguard-session": "run-1"}
    stream = await client.completions.create(
        model="m",
        prompt="stream",
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
    )
    texts = [c.choices[0].text async for c in stream if c.choices]
    assert texts == [" a", " streamed", " answer"]
    assert _usage(server, "run-1").session_tokens == 150
    stream = await client.completions.create(
        model="m", prompt="stream", stream=True, extra_headers={"x-agentguard-session": "run-2"}
    )
    assert [c.choices[0].text async for c in stream] == [" a", " streamed", " answer"]
    counted = _usage(server, "run-2")
    assert 0 < counted.session_tokens < 150
    assert counted.session_reserved == 0


async def test_embeddings_count_their_prompt_and_hold_no_output(served: Any) -> None:
    """An embedding holds no output (a budget with room for its input only admits it) and
    counts the tokens its usage reports."""
    server, _, client = served(
        {"per_session": 60, "max_output_tokens": 1_000, "policy": "hard_stop"}
    )
    answer = await client.embeddings.create(
        model="e", input="a short text", extra_headers={"x-agentguard-session": "rag"}
    )
    assert answer.data[0].embedding == [0.5, -0.25]
    assert _usage(server, "rag").session_tokens == 40


async def test_a_refused_forwarded_call_counts_nothing_and_other_requests_are_not_metered(
    served: Any,
) -> None:
    """An upstream's refusal (400) used nothing: its hold is given back; a POST whose body
    names no model (a file upload's metadata, a batch) is no model call."""
    server, _, client = served({"per_session": 1_000})
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(
            model="refuse", prompt="x", extra_headers={"x-agentguard-session": "bad"}
        )
    counted = _usage(server, "bad")
    assert (counted.session_tokens, counted.session_reserved) == (0, 0)
    async with client_http.AsyncClient(
        transport=client_http.ASGITransport(app=create_app(server)), base_url="http://s.invalid"
    ) as http:
        sent = await http.post(
            "/v1/batches",
            json={"input_file_id": "f", "endpoint": "/v1/completions"},
            headers={"authorization": f"Bearer {KEY}", "x-agentguard-session": "batch"},
        )
    assert sent.status_code == 200
    assert _usage(server, "batch").session_tokens == 0


def test_usage_is_read_in_every_shape_servers_report_it() -> None:
    """OpenAI's chat and completions, embeddings (prompt and total), the Responses API's
    completed event, Anthropic's message, Ollama's native counts; none: ``None``."""
    assert usage_of(COMPLETION) == Usage(60, 90)
    assert usage_of(EMBEDDING) == Usage(40, 0)
    completed = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 7, "output_tokens": 3}},
    }
    assert usage_of(completed) == Usage(7, 3)
    assert usage_of({"type": "message_start", "message": {"usage": {"input_tokens": 12}}}) == Usage(
        12, 0
    )
    assert usage_of({"done": True, "prompt_eval_count": 26, "eval_count": 290}) == Usage(26, 290)
    assert usage_of({"choices": []}) is None
    assert usage_of({"usage": {"prompt_tokens": "many"}}) is None
    assert usage_of([1, 2]) is None


def test_only_json_bodies_naming_a_model_are_model_calls() -> None:
    """The output cap is the least the body sets (Ollama's ``options.num_predict`` too)."""
    found = metered_call(
        b'{"model": "m", "prompt": "hi", "max_tokens": 50, "options": {"num_predict": 20}}'
    )
    assert found is not None
    assert (found[0], found[2]) == ("m", 20)
    assert found[1] > 0
    for body in (b"", b"[1]", b"model=m", b'{"model": 5}', b'{"model": ""}', b"{broken"):
        assert metered_call(body) is None


ANSWERS = [
    json.dumps(COMPLETION).encode(),
    json.dumps(COMPLETION, indent=2).encode(),
    _events(True),
    _events(False),
    b'{"response": "Hi", "done": false}\n{"response": "!", "done": true, "prompt_eval_count": 5, "eval_count": 2}\n',
]


@given(st.sampled_from(ANSWERS), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_an_answer_reads_the_same_however_it_is_split(answer: bytes, cuts: list[int]) -> None:
    """Bytes fed in any pieces give what the whole answer gives."""
    whole = AnswerReader()
    whole.feed(answer)
    expected = whole.used(10, None)
    pieces = AnswerReader()
    start = 0
    for cut in sorted(c % (len(answer) + 1) for c in cuts):
        pieces.feed(answer[start:cut])
        start = cut
    pieces.feed(answer[start:])
    assert pieces.used(10, None) == expected


def test_what_an_answer_used() -> None:
    """Usage reported wins; else the prompt's estimate and the text read, capped."""
    reader = AnswerReader()
    reader.feed(_events(False))
    used = reader.used(10, None)
    assert used.prompt_tokens == 10
    assert 0 < used.completion_tokens <= 10
    capped = AnswerReader()
    capped.feed(_events(False))
    assert capped.used(10, 1).completion_tokens == 1
    ollama = AnswerReader()
    ollama.feed(ANSWERS[4])
    assert ollama.used(10, None) == Usage(5, 2)
    pretty = AnswerReader()
    pretty.feed(ANSWERS[1])
    assert pretty.used(10, None) == Usage(60, 90)
    huge = AnswerReader()
    huge.feed(b'{"data": "' + b"x" * (2 << 20) + b'"}')
    assert huge.used(10, None) == Usage(10, 0)  # past the bound: not read, never kept


async def test_a_store_that_fails_never_costs_the_caller_the_answer(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metering fails open: a fault in it (before or after the call) forwards the request and
    passes the answer on, as the upstream gave it."""
    server, upstream, client = served({"per_session": 10_000})
    ledger = server.guard_for(_caller({"authorization": f"Bearer {KEY}"})).pipeline.ledger
    assert ledger is not None

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a fault")

    monkeypatch.setattr(ledger, "acommit", broken)
    raw = await client.completions.with_raw_response.create(model="m", prompt="x")
    assert raw.http_response.content == upstream.answers[-1]
    monkeypatch.setattr(ledger, "areserve", broken)
    raw = await client.completions.with_raw_response.create(model="m", prompt="y")
    assert raw.http_response.content == upstream.answers[-1]
    assert len(upstream.seen) == 2
