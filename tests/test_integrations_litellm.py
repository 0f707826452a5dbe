"""The litellm SDK through the ``agentguard/`` provider, against a scripted model on loopback.

Real litellm end to end: ``litellm.completion(model="agentguard/fast")`` runs the guard, whose
model calls go through litellm's own openai provider over HTTP to :meth:`ScriptedModel.serve`.
Runs in the ``litellm`` nox session; skipped where litellm is not installed.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import http.server
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

import agentguard as ag
from _litellm_kit import TOOLS, polling_history  # sets litellm's offline flags first
from _processes import serving
from agentguard.integrations._http import error_answer
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, capture_events
from agentguard.transport import ModelRequest

litellm = pytest.importorskip("litellm", reason="needs litellm: nox -s litellm")
from agentguard.integrations.litellm import (  # noqa: E402
    GuardedLLM,
    LiteLLMTransport,
    proxy_headers,
    register,
    report_headers,
)

# litellm's own types trip a pydantic warning on first use; it is theirs, not ours
pytestmark = pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier")
KEY_ENV = "AGENTGUARD_TEST_UPSTREAM_KEY"
ASK = [{"role": "user", "content": "find the install docs"}]


def config(base_url: str, **sections: Any) -> ag.GuardConfig:
    """Two tiers on one scripted upstream: ``fast`` (fast-model), then ``strong``."""
    tier = {"base_url": base_url, "api_key_env": KEY_ENV}
    return ag.GuardConfig.from_dict(
        {
            "tiers": {
                "fast": {"model": "openai/fast-model", **tier},
                "strong": {"model": "openai/strong-model", **tier},
            },
            "escalation": {"chain": ["fast", "strong"], "max_retries_before_escalate": 0},
            "memory_pressure": {"enabled": False},
            **sections,
        },
        env={},
    )


@pytest.fixture(autouse=True)
def _quiet_litellm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, "sk-test-upstream-not-real")
    monkeypatch.setattr(litellm, "suppress_debug_info", True)
    saved = list(litellm.custom_provider_map)
    yield
    litellm.custom_provider_map = saved


def guarded(base_url: str, **sections: Any) -> GuardedLLM:
    clock = FakeClock()
    return register(
        config(base_url, **sections),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        rng=random.Random(0),
    )


def test_sync_completion_is_repaired_and_reported() -> None:
    """Broken tool-call JSON is repaired for free; the report rides on the response."""
    model = ScriptedModel([Reply.call("search", '{"query": "install"')])
    with model.serve() as url:
        guarded(url)
        response = litellm.completion(model="agentguard/fast", messages=ASK, tools=TOOLS)
    call = response.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("search", '{"query": "install"}')
    report = ag.report_of(response)
    assert report is not None
    assert report.repairs
    assert report.tier == "fast"
    # litellm files provider headers as llm_provider-*; the proxy callback strips that again
    hidden = response._hidden_params["additional_headers"]
    assert hidden["llm_provider-x-agentguard-tier"] == "fast"
    headers = report_headers(response)
    assert headers is not None
    assert (headers["x-agentguard-tier"], headers["x-agentguard-repairs"]) == ("fast", "1")
    assert [r.model for r in model.requests] == ["fast-model"]  # through litellm's provider


def test_invalid_call_is_corrected_through_litellm() -> None:
    """A call missing a required field is re-asked on the same tier, then served."""
    model = ScriptedModel([Reply.call("search", {}), Reply.call("search", {"query": "install"})])
    with model.serve() as url:
        guarded(url)
        response = litellm.completion(model="agentguard/fast", messages=ASK, tools=TOOLS)
    assert '"install"' in response.choices[0].message.tool_calls[0].function.arguments
    report = ag.report_of(response)
    assert report is not None
    assert report.corrections == 1
    assert "query" in model.requests[1].messages[-1]["content"]


def test_dead_tier_escalates_to_the_next_model() -> None:
    """A 500 from the fast tier re-routes the call to the strong tier's model."""
    model = ScriptedModel(
        {"fast-model": [Fault.server_error()], "strong-model": [Reply.text("ok")]}
    )
    with model.serve() as url:
        guarded(url)
        response = litellm.completion(model="agentguard/fast", messages=ASK)
    assert response.choices[0].message.content == "ok"
    report = ag.report_of(response)
    assert report is not None
    assert (report.tier, report.escalated_from, report.reasons) == (
        "strong",
        "fast",
        ("server_error",),
    )
    assert [r.model for r in model.requests] == ["fast-model", "strong-model"]


@pytest.mark.parametrize(("wait", "sleeps", "tiers"), [(7, [7.0], ["fast"]), (120, [], ["strong"])])
def test_a_tiers_retry_after_is_read_through_litellm(
    wait: float, sleeps: list[float], tiers: list[str]
) -> None:
    """A 429 with `Retry-After` from a tier reached through litellm: waited for, or (past
    `max_retry_after`) escalated from at once, as for any other client."""
    model = ScriptedModel(
        {
            "fast-model": [Fault.rate_limit(wait), Reply.text("fast ok")],
            "strong-model": [Reply.text("strong ok")],
        }
    )
    chain = {"chain": ["fast", "strong"], "max_retries_before_escalate": 1, "max_retry_after": 30}
    clock = FakeClock()
    with model.serve() as url:
        register(config(url, escalation=chain), clock=clock, sleep=clock.sleep)
        response = litellm.completion(model="agentguard/fast", messages=ASK)
    report = ag.report_of(response)
    assert report is not None
    assert clock.sleeps == sleeps
    assert report.tier == tiers[-1]
    assert ("rate_limited" in report.reasons) == (tiers == ["strong"])


@pytest.mark.anyio
async def test_async_completion_runs_the_same_guard() -> None:
    """acompletion goes through the same pipeline, sessions shared with sync calls."""
    model = ScriptedModel([Reply.call("search", {}), Reply.call("search", {"query": "x"})])
    with model.serve() as url:
        handler = guarded(url)
        response = await litellm.acompletion(
            model="agentguard/fast",
            messages=ASK,
            tools=TOOLS,
            extra_headers={"x-agentguard-session": "async-1"},
        )
    report = ag.report_of(response)
    assert report is not None
    assert (report.session, report.session_source, report.corrections) == ("async-1", "header", 1)
    assert handler.aguard.pipeline is handler.guard.pipeline


def test_streaming_passes_text_and_releases_tool_calls_once_valid() -> None:
    """stream=True: text flows, the tool call arrives whole and corrected, usage at the end."""
    model = ScriptedModel(
        [
            Reply(content="let me look", tool_calls=Reply.call("search", {}).tool_calls),
            Reply.call("search", {"query": "install"}),
        ]
    )
    with model.serve() as url:
        guarded(url)
        chunks = list(
            litellm.completion(model="agentguard/fast", messages=ASK, tools=TOOLS, stream=True)
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("let me look")
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("search", '{"query": "install"}')
    ]
    assert any(c.choices and c.choices[0].finish_reason == "tool_calls" for c in chunks)


@pytest.mark.anyio
async def test_async_streaming_escalates_a_dead_tier() -> None:
    """Async streaming: the dead tier's error never reaches the caller; the next tier answers."""
    model = ScriptedModel(
        {"fast-model": [Fault.server_error(503)], "strong-model": [Reply.text("streamed ok")]}
    )
    with model.serve() as url:
        guarded(url)
        stream = await litellm.acompletion(model="agentguard/fast", messages=ASK, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "streamed ok"
    assert [r.model for r in model.requests] == ["fast-model", "strong-model"]


def test_guard_decisions_become_litellm_errors_with_a_status() -> None:
    """A loop the guard refuses is a 400 (a recovery ladder of ``stop`` alone refuses at once);
    a session budget spent for good (hard_stop) is a 403, which clients do not retry (an hourly
    one is a 429 with Retry-After: see below)."""
    history = polling_history(8)
    model = ScriptedModel([Reply.text(" ".join(f"fact{i}" for i in range(80)))], cycle=True)
    budget = {"per_session": 200, "policy": "hard_stop", "max_output_tokens": 100}
    with model.serve() as url:
        guarded(
            url,
            escalation={"chain": ["fast"]},
            token_budget=budget,
            loop_detection={"recovery": {"rungs": ["stop"]}},
        )
        with pytest.raises(litellm.exceptions.BadRequestError, match="agentguard loop_detected"):
            litellm.completion(model="agentguard/fast", messages=history)
        with pytest.raises(  # noqa: PT012
            litellm.exceptions.PermissionDeniedError, match="agentguard budget_exceeded"
        ):
            for _ in range(5):
                litellm.completion(
                    model="agentguard/fast",
                    messages=ASK,
                    extra_headers={"x-agentguard-session": "b"},
                )


def test_call_params_pass_through_and_the_key_never_leaks() -> None:
    """temperature and api_base reach upstream; the call's key shows in no event or report."""
    canary = "sk-canary-litellm-0123456789abcdef"
    model = ScriptedModel([Reply.text("ok")])
    with model.serve() as url, capture_events() as events:
        register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
        response = litellm.completion(
            model="agentguard/openai/plain-model",
            messages=ASK,
            temperature=0.25,
            api_base=url,
            api_key=canary,
            extra_headers={"x-agentguard-session": "s9"},
        )
    sent = model.requests[0]
    assert (sent.model, sent.params["temperature"]) == ("plain-model", 0.25)
    report = ag.report_of(response)
    assert report is not None
    assert report.session == "s9"
    assert canary not in repr(report) + repr(list(events))


def test_transport_refuses_to_call_itself() -> None:
    """A tier whose model is agentguard/... would recurse: a config error says so."""
    request = ModelRequest(model="agentguard/fast", messages=ASK)
    with pytest.raises(ag.ConfigError, match="agentguard/"):
        LiteLLMTransport().send(request)


# -- status codes and headers of the guard's errors ----------------------------------------------


def _budget_error(budget: str, resets_at: float | None) -> ag.BudgetExceeded:
    return ag.BudgetExceeded(
        budget=budget, used=90, requested=20, limit=100, resets_at=resets_at, session="s"
    )


def test_an_hourly_budget_answers_429_with_retry_after_when_it_frees_up() -> None:
    """The rolling hour frees up by itself: 429, Retry-After in whole seconds (rounded up)."""
    status, kind, headers = error_answer(_budget_error("hour", 1_000.2), now=900.0)
    assert (status, kind) == (429, "budget_exceeded")
    assert headers["retry-after"] == "101"
    assert headers["x-agentguard-budget-exceeded"] == "true"


@pytest.mark.parametrize(("budget", "status"), [("session", 403), ("request", 400)])
def test_a_final_refusal_has_no_retry_after_and_a_status_clients_do_not_retry(
    budget: str, status: int
) -> None:
    """A session budget spent for good is a 403; a request over any budget a 400; no wait."""
    answer, kind, headers = error_answer(_budget_error(budget, None), now=0.0)
    assert (answer, kind) == (status, "budget_exceeded")
    assert "retry-after" not in headers
    assert answer not in (408, 409, 429)  # what the openai SDKs retry
    assert answer < 500


def test_tool_calls_invalid_on_every_tier_are_a_502_as_documented() -> None:
    """Every tier tried and the tool calls stayed invalid: 502 tool_validation_failed, with
    the attempts labelled by what happened on each."""
    model = ScriptedModel([Reply.call("search", {})], cycle=True)
    with model.serve() as url:
        guarded(url, tool_validation={"max_retries": 0})
        with pytest.raises(litellm.exceptions.BadGatewayError) as info:
            litellm.completion(model="agentguard/fast", messages=ASK, tools=TOOLS)
    assert "agentguard tool_validation_failed" in str(info.value)
    cause = info.value.__context__
    while cause is not None and not isinstance(cause, ag.AgentGuardError):
        cause = cause.__cause__ or cause.__context__
    assert isinstance(cause, ag.TiersExhausted)
    status, _, headers = error_answer(cause)
    assert status == 502
    assert headers["x-agentguard-attempts"] == (
        "fast:tool_validation_failure,strong:tool_validation_failure"
    )
    assert headers["x-agentguard-tokens"] != "0"


@pytest.mark.anyio
async def test_the_proxy_callback_answers_guard_errors_with_their_status_and_headers() -> None:
    """The proxy's failure hook finds the guard's error inside litellm's and answers with its
    status, type, Retry-After and x-agentguard-* headers; other errors it leaves alone."""
    model = ScriptedModel([Reply.text("ok")], cycle=True)
    budget = {"per_hour": 50, "policy": "hard_stop", "max_output_tokens": 10}
    with model.serve() as url:
        guarded(url, token_budget=budget)
        with pytest.raises(litellm.exceptions.RateLimitError) as info:  # noqa: PT012
            for _ in range(10):
                await litellm.acompletion(model="agentguard/fast", messages=ASK)
    answer = await proxy_headers.async_post_call_failure_hook(
        request_data={}, original_exception=info.value, user_api_key_dict=None
    )
    assert answer.status_code == 429
    assert answer.type == "budget_exceeded"
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.headers["x-agentguard-budget-exceeded"] == "true"
    assert answer.headers["x-agentguard-session"]
    other = await proxy_headers.async_post_call_failure_hook(
        request_data={}, original_exception=ValueError("not ours"), user_api_key_dict=None
    )
    assert other is None


def test_the_stream_report_is_on_the_chunk_report_headers_finds() -> None:
    """stream=True: one chunk carries the report as ``chunk.agentguard``; report_headers finds it."""
    model = ScriptedModel([Reply.text("hello there")])
    with model.serve() as url:
        guarded(url)
        chunks = list(litellm.completion(model="agentguard/fast", messages=ASK, stream=True))
    found = [h for h in map(report_headers, chunks) if h]
    assert len(found) == 1
    assert found[0]["x-agentguard-tier"] == "fast"
    assert found[0]["x-agentguard-attempts"] == "fast:ok"


def test_the_proxy_caller_scopes_conversations_found_without_a_session() -> None:
    """The proxy's caller (its virtual key's hash, else the Authorization header) becomes the
    request's scope, as a fingerprint: never the key itself."""
    from agentguard.integrations.litellm import _request
    from agentguard.transport import SCOPE

    def scope(**litellm_params: Any) -> Any:
        request, _ = _request({"model": "agentguard/fast", "litellm_params": litellm_params})
        return request.extensions.get(SCOPE)

    one = scope(metadata={"user_api_key_hash": "hash-one"})
    two = scope(metadata={"user_api_key_hash": "hash-two"})
    header = scope(proxy_server_request={"headers": {"Authorization": "Bearer sk-live-secret"}})
    assert len({one, two, header}) == 3
    assert "sk-live-secret" not in str(header)
    assert scope() is None
    # one key is one caller however the header spells its scheme (each spelling would have a
    # budget of its own)
    spellings = ["bearer sk-live-secret", "BEARER  sk-live-secret ", " Bearer\tsk-live-secret"]
    for spelled in spellings:
        assert scope(proxy_server_request={"headers": {"authorization": spelled}}) == header


# -- healthy traffic: the answer litellm returns, whole ---------------------------------------

#: An answer with what a plain parse keeps only if it keeps everything: a second choice (n=2),
#: logprobs, the system fingerprint, the service tier and the usage details.
RICH = {
    "id": "chatcmpl-rich",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "plain-model-2024-11",
    "system_fingerprint": "fp_1a2b",
    "service_tier": "default",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Sunny in Paris.", "refusal": None},
            "logprobs": {
                "content": [{"token": "Sunny", "logprob": -0.1, "bytes": [83], "top_logprobs": []}]
            },
            "finish_reason": "stop",
        },
        {
            "index": 1,
            "message": {"role": "assistant", "content": "It is sunny.", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        },
    ],
    "usage": {
        "prompt_tokens": 12,
        "completion_tokens": 4,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 0},
    },
}


@contextlib.contextmanager
def canned(
    *answers: dict[str, Any] | bytes, path: str | None = None
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback upstream answering ``answers`` in turn (the last one again after them): JSON,
    or the bytes of a stream; and the request bodies it received. ``path``: the one path
    answered (others get a 404: litellm's model-info lookups for Ollama)."""
    bodies: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if path is not None and self.path != path:
                self.send_error(404)
                return
            bodies.append(received)
            answer = answers[min(len(bodies), len(answers)) - 1]
            streamed = isinstance(answer, bytes)
            body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_response(200)
            self.send_header(
                "content-type", "text/event-stream" if streamed else "application/json"
            )
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as port:
        yield f"http://127.0.0.1:{port}/v1", bodies


def _ask(model: str, url: str, **extra: Any) -> Any:
    return litellm.completion(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        api_base=url,
        api_key="sk-test-not-real",
        n=2,
        logprobs=True,
        temperature=0.3,
        **extra,
    )


def test_a_healthy_answer_is_the_one_litellm_returns_raw() -> None:
    """Differential: raw litellm and the ``agentguard/`` provider on one upstream. The upstream
    receives the same body, and the caller the same answer, field for field — the second
    choice, logprobs, system fingerprint, service tier and usage details included (the guard
    rebuilt it from the first choice before, losing all of them)."""
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    with canned(RICH) as (url, bodies):
        raw = _ask("openai/plain-model", url)
        guarded_answer = _ask("agentguard/openai/plain-model", url)
    assert bodies[0] == bodies[1]
    assert guarded_answer.model_dump() == raw.model_dump()
    report = ag.report_of(guarded_answer)
    assert report is not None
    assert report.attempts[0].outcome == "ok"


def test_a_repaired_answer_keeps_the_rest_of_the_upstreams_answer() -> None:
    """The guard repairs the first choice's call; everything else is the upstream's."""
    broken = copy.deepcopy(RICH)
    broken["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "search", "arguments": '{"query": "paris weather"'},
            }
        ],
    }
    broken["choices"][0]["finish_reason"] = "tool_calls"
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    with canned(broken) as (url, _):
        raw = _ask("openai/plain-model", url, tools=TOOLS).model_dump()
        guarded_answer = _ask("agentguard/openai/plain-model", url, tools=TOOLS)
    out = guarded_answer.model_dump()
    call = out["choices"][0]["message"]["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {"query": "paris weather"}
    assert out["choices"][1] == raw["choices"][1]
    assert out["choices"][0]["logprobs"] == raw["choices"][0]["logprobs"]
    for key in ("system_fingerprint", "service_tier", "usage", "model", "id"):
        assert out[key] == raw[key], key
    report = ag.report_of(guarded_answer)
    assert report is not None
    assert report.repairs


def test_an_answer_after_a_re_ask_bills_every_attempt() -> None:
    """Healthy at the second attempt: the answer is the upstream's second one, but its usage is
    the report's (both attempts), which the proxy's spend tracking reads."""
    broken = copy.deepcopy(RICH)
    broken["choices"] = [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "no_such_tool", "arguments": "{}"},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ]
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    with canned(broken, RICH) as (url, bodies):
        answer = litellm.completion(
            model="agentguard/openai/plain-model",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            api_base=url,
            api_key="sk-test-not-real",
            tools=TOOLS,
        )
    assert len(bodies) == 2
    assert answer.choices[0].message.content == "Sunny in Paris."
    assert answer.system_fingerprint == "fp_1a2b"
    assert answer.usage.total_tokens == 32


def _sse(*choices: dict[str, Any]) -> bytes:
    """A streamed answer: one chunk per first choice's fields (its ``delta``, ``logprobs``),
    then a finish."""
    head = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "finish_reason": None, **choice}]} for choice in choices
    ]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


def test_a_healthy_stream_keeps_its_reasoning_and_logprobs() -> None:
    """Differential, streamed: a reasoning model's ``reasoning_content`` deltas and the text's
    ``logprobs`` reach the caller through the provider as raw litellm gives them (the guard
    handed litellm text-only chunks: the reasoning was lost, and the logprobs)."""
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    logprobs = {"content": [{"token": "Sunny", "logprob": -0.1, "bytes": [83], "top_logprobs": []}]}
    body = _sse(
        {"delta": {"role": "assistant", "reasoning_content": "Paris, so check the sky. "}},
        {"delta": {"reasoning_content": "Answer in two words."}},
        {"delta": {"content": "Sunny."}, "logprobs": logprobs},
    )

    def read(model: str, url: str) -> list[Any]:
        stream = litellm.completion(
            model=model,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            api_base=url,
            api_key="sk-test-not-real",
            stream=True,
        )
        return [c.choices[0] for c in stream if c.choices]

    with canned(body) as (url, bodies):
        raw = read("openai/plain-model", url)
        guarded_answer = read("agentguard/openai/plain-model", url)
    assert bodies[0] == bodies[1]

    def reasoning(choices: list[Any]) -> str:
        return "".join(getattr(c.delta, "reasoning_content", None) or "" for c in choices)

    assert (
        reasoning(guarded_answer)
        == reasoning(raw)
        == "Paris, so check the sky. Answer in two words."
    )
    assert "".join(c.delta.content or "" for c in guarded_answer) == "Sunny."
    assert guarded_answer[0].delta.role == "assistant"
    assert [c.logprobs.model_dump() for c in guarded_answer if c.logprobs] == [
        c.logprobs.model_dump() for c in raw if c.logprobs
    ]
    assert [c.finish_reason for c in guarded_answer if c.finish_reason] == ["stop"]


_ASIDE_BODIES = [
    _sse({"delta": {"role": "assistant", "refusal": "I can't help with that."}}),
    _sse(
        {"delta": {"role": "assistant", "content": ""}},
        {"index": 1, "delta": {"role": "assistant", "content": ""}},
        {"delta": {"content": "Sunny."}},
        {"index": 1, "delta": {"content": "Rainy."}},
        {"index": 1, "delta": {}, "finish_reason": "stop"},
    ),
]
_STREAM = {"messages": ASK, "api_key": "sk-test-not-real", "stream": True, "n": 2}


def _answers(chunks: list[Any]) -> dict[int, tuple[str, str]]:
    """Each answer's text and refusal, by choice index."""
    out: dict[int, tuple[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            text, refusal = out.get(choice.index, ("", ""))
            refused = getattr(choice.delta, "refusal", None) or ""
            out[choice.index] = (text + (choice.delta.content or ""), refusal + refused)
    return out


@pytest.mark.parametrize("body", _ASIDE_BODIES, ids=["refusal", "n=2"])
def test_a_streams_refusal_and_other_answers_go_out(body: bytes) -> None:
    """Differential, streamed: a `refusal` delta and the second answer's deltas (`n=2`) reach
    the caller through the provider as raw litellm gives them (they were dropped)."""
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    with canned(body) as (url, _):
        raw = _answers(list(litellm.completion(model="openai/m", api_base=url, **_STREAM)))
        guarded_answers = _answers(
            list(litellm.completion(model="agentguard/openai/m", api_base=url, **_STREAM))
        )
    assert guarded_answers == raw
    assert any(refusal or text for text, refusal in raw.values())


@pytest.mark.anyio
@pytest.mark.parametrize("body", _ASIDE_BODIES, ids=["refusal", "n=2"])
async def test_an_async_streams_refusal_and_other_answers_go_out(body: bytes) -> None:
    """The same through `acompletion`."""
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    got = {}
    with canned(body) as (url, _):
        for model in ("openai/m", "agentguard/openai/m"):
            stream = await litellm.acompletion(model=model, api_base=url, **_STREAM)
            got[model] = _answers([c async for c in stream])
    assert got["agentguard/openai/m"] == got["openai/m"]


# -- an error in a stream's body --------------------------------------------------------------

_CHUNK_HEAD = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m"}
_BODY_ERROR = b'data: {"error": {"message": "the model crashed", "type": "server_error"}}\n\n'


def _opened(*deltas: dict[str, Any]) -> bytes:
    chunks = [
        {**_CHUNK_HEAD, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
        for d in deltas
    ]
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()


_ROLE = {"role": "assistant", "content": ""}
_BEFORE_ERROR = {
    "first": b"",
    "after the role chunk": _opened(_ROLE),
    "after text": _opened(_ROLE, {"content": "Sunny "}),
}


def _fresh_guard() -> None:
    """A new guard for the provider (no breaker state of an earlier call), on a fake clock."""
    clock = FakeClock()
    register(
        ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        rng=random.Random(0),
    )


async def _items_then_error(model: str, url: str, asynchronous: bool) -> tuple[list[Any], Any]:
    """The chunks a streamed litellm call yields (each choice's role, text, finish), then what
    it raises: its type, the type of the error it wraps, its status and its message."""
    ask = {"messages": ASK, "api_base": url, "api_key": "sk-test-not-real", "stream": True}
    items: list[Any] = []

    def add(chunk: Any) -> None:
        items.append([(c.delta.role, c.delta.content, c.finish_reason) for c in chunk.choices])

    async def read() -> None:
        if asynchronous:
            async for chunk in await litellm.acompletion(model=model, **ask):
                add(chunk)
        else:
            for chunk in litellm.completion(model=model, **ask):
                add(chunk)

    with pytest.raises(
        litellm.exceptions.MidStreamFallbackError, match="the model crashed"
    ) as raised:
        await read()
    error = raised.value
    inner = getattr(error, "original_exception", None)
    return items, (type(error), type(inner), getattr(error, "status_code", None), str(error))


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("where", list(_BEFORE_ERROR))
async def test_an_error_in_a_streams_body_is_raised_as_raw_litellm_raises_it(
    where: str, asynchronous: bool
) -> None:
    """Differential, streamed: the upstream's 200 stream carries an error in its body. Raw
    litellm yields what came before it (the opening ``role`` chunk, text), then raises a
    ``MidStreamFallbackError`` around the upstream's error; through the provider (after the
    guard's retries, each failing so) the caller gets the same error, and before it the
    opening as raw litellm yields it. Before: the role chunk was lost, and litellm wrapped its
    own ``MidStreamFallbackError`` in a second one (another ``original_exception``, another
    message)."""
    body = _BEFORE_ERROR[where] + _BODY_ERROR
    with canned(body) as (url, bodies):
        raw = await _items_then_error("openai/plain-model", url, asynchronous)
        asked = len(bodies)
        _fresh_guard()
        guarded_answer = await _items_then_error("agentguard/openai/plain-model", url, asynchronous)
    assert guarded_answer[1] == raw[1]
    assert raw[1][0].__name__ == "MidStreamFallbackError"
    if where == "after text":
        # the guard names the role on its first chunk out (as on a healthy stream): the same
        # role and text, in one chunk where raw litellm has two
        assert guarded_answer[0] == [[("assistant", "Sunny ", None)]]
        assert raw[0] == [[("assistant", "", None)], [(None, "Sunny ", None)]]
        assert len(bodies) - asked == 1  # text had gone out: not asked again
    else:
        assert guarded_answer[0] == raw[0]
        assert len(bodies) - asked > 1  # nothing had gone out: retried


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_an_error_in_a_streams_body_releases_no_call_unjudged(asynchronous: bool) -> None:
    """The error comes in the middle of a tool call: the caller gets the opening as from raw
    litellm, then the same error; the call's first fragment, which the guard holds until the
    call is whole and valid, never goes out (raw litellm hands it on)."""
    call = {"index": 0, "id": "c1", "type": "function"}
    call["function"] = {"name": "search", "arguments": '{"qu'}
    body = _opened(_ROLE, {"tool_calls": [call]}) + _BODY_ERROR
    with canned(body) as (url, _):
        raw_items, raw_error = await _items_then_error("openai/plain-model", url, asynchronous)
        _fresh_guard()
        items, error = await _items_then_error("agentguard/openai/plain-model", url, asynchronous)
    assert error == raw_error
    assert items == raw_items[:1] == [[("assistant", "", None)]]
    assert len(raw_items) > 1


# -- the call's parameters reach the model as plain litellm sends them ----------------------------

_SAID = RICH["choices"][0]["message"]["content"]
_OLLAMA = {"model": "qwen3", "created_at": "2026-01-01T00:00:00Z", "prompt_eval_count": 10}
_OLLAMA_TEXT = {
    **_OLLAMA,
    "message": {"role": "assistant", "content": _SAID},
    "done": True,
    "done_reason": "stop",
    "eval_count": 2,
}
_OLLAMA_STREAM = (
    json.dumps({**_OLLAMA, "message": {"role": "assistant", "content": _SAID[:5]}, "done": False})
    + "\n"
    + json.dumps({**_OLLAMA_TEXT, "message": {"role": "assistant", "content": _SAID[5:]}})
    + "\n"
).encode()
_SCHEMA = {"name": "w", "schema": {"type": "object", "properties": {"sky": {"type": "string"}}}}
# Parameters each model's provider takes that litellm's generic list for custom providers lacks
# or maps otherwise: they were refused (UnsupportedParamsError) or renamed
# (max_completion_tokens to max_tokens) on the way to the guard.
_PARAMS = [
    ("openai/gpt-5", {"reasoning_effort": "low", "verbosity": "low", "user": "u-1"}),
    (
        "openai/gpt-4o",
        {
            "max_completion_tokens": 64,
            "logprobs": True,
            "top_logprobs": 2,
            "seed": 7,
            "user": "u-1",
        },
    ),
    ("openai/o3-mini", {"max_tokens": 64, "temperature": 0.2, "drop_params": True}),
    ("hosted_vllm/qwen3", {"reasoning_effort": "low", "max_completion_tokens": 64, "top_k": 20}),
    (
        "hosted_vllm/qwen3",
        {
            "thinking": {"type": "enabled", "budget_tokens": 128},
            "response_format": {"type": "json_schema", "json_schema": _SCHEMA},
        },
    ),
    ("ollama_chat/qwen3", {"reasoning_effort": "low", "max_completion_tokens": 64, "seed": 7}),
]
_IDS = [f"{model}:{','.join(params)}" for model, params in _PARAMS]


@pytest.fixture
def _collect_between_tests() -> Iterator[None]:
    """The garbage collector off during the test, run after it. litellm 1.105's own HTTP handler
    (``hosted_vllm``, ``ollama_chat``) ends a sync stream without closing its response, which
    the collector closes later; run inside the next request, while that thread holds httpcore's
    connection-pool lock, the close waits for the lock forever (plain litellm does the same:
    it hung these tests now and then)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _upstream(model: str, *, stream: bool) -> Any:
    """The scripted upstream of ``model``'s provider: the answer, and the path of its calls."""
    if model.startswith("ollama_chat/"):
        return canned(_OLLAMA_STREAM if stream else _OLLAMA_TEXT, path="/api/chat")
    return canned(_sse({"delta": {"role": "assistant", "content": _SAID}}) if stream else RICH)


def _call(model: str, url: str, params: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    """The arguments of a call to ``model``, plain or ``agentguard/``."""
    ollama = model.removeprefix("agentguard/").startswith("ollama_chat/")
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "api_base": url.removesuffix("/v1") if ollama else url,
        "api_key": "sk-test-not-real",
        "stream": stream,
        **copy.deepcopy(params),
    }


def _text(answer: Any, *, stream: bool) -> str:
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    return str(answer.choices[0].message.content)


@pytest.mark.usefixtures("_collect_between_tests")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("model", "params"), _PARAMS, ids=_IDS)
def test_params_reach_the_model_as_plain_litellm_sends_them(
    model: str, params: dict[str, Any], stream: bool
) -> None:
    """Differential: raw litellm and the ``agentguard/`` provider in front of the same model
    send the upstream the same body — parameters litellm supports for the model's provider
    included (``reasoning_effort``, ``verbosity``, ``thinking`` were refused as unsupported by
    "agentguard", ``max_completion_tokens`` went as ``max_tokens``, ``user`` was lost, an
    explicit ``stream=False`` was left out), and ``drop_params`` drops what that provider does
    not take, as it does without the guard."""
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    texts = []
    with _upstream(model, stream=stream) as (url, bodies):
        for name in (model, f"agentguard/{model}"):
            answer = litellm.completion(**_call(name, url, params, stream=stream))
            texts.append(_text(answer, stream=stream))
    assert len(bodies) == 2
    assert bodies[1] == bodies[0]
    assert texts == [_SAID, _SAID]


@pytest.mark.anyio
@pytest.mark.usefixtures("_collect_between_tests")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("model", "params"), _PARAMS, ids=_IDS)
async def test_async_params_reach_the_model_as_plain_litellm_sends_them(
    model: str, params: dict[str, Any], stream: bool
) -> None:
    """The same through ``acompletion``."""
    register(ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}))
    texts = []
    with _upstream(model, stream=stream) as (url, bodies):
        for name in (model, f"agentguard/{model}"):
            answer = await litellm.acompletion(**_call(name, url, params, stream=stream))
            if stream:
                answer = [chunk async for chunk in answer]
            texts.append(_text(answer, stream=stream))
    assert len(bodies) == 2
    assert bodies[1] == bodies[0]
    assert texts == [_SAID, _SAID]


def test_a_param_the_tiers_provider_lacks_is_refused_as_litellm_refuses_it() -> None:
    """A parameter the tier's model does not take is litellm's ``UnsupportedParamsError`` for
    that model's provider, before anything is sent — a mistake of the request, not escalated
    (it named the ``agentguard`` provider's list before)."""
    model = ScriptedModel([Reply.text("unused")])
    with model.serve() as url:
        guarded(url)
        with pytest.raises(litellm.UnsupportedParamsError, match="openai does not support"):
            litellm.completion(model="agentguard/fast", messages=ASK, thinking={"type": "enabled"})
    assert model.requests == []
