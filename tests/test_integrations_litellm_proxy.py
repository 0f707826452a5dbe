"""End to end through a real litellm proxy: the config names agentguard, the openai client drives it.

The test starts ``litellm --config config.yaml`` as a process on loopback; the proxy's models are
``agentguard/<tier>`` (the custom provider the config names) and its callback turns each
report into ``x-agentguard-*`` headers. Upstream is a scripted OpenAI-compatible server in this
process, so every failure is on cue and nothing leaves the machine. Runs in the ``litellm``
nox session; skipped where litellm's proxy is not installed.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _litellm_kit import TOOLS, Upstream, guard_config, litellm_proxy, polling_history
from agentguard.testing import Fault, Reply
from agentguard.types import Usage

pytest.importorskip("litellm.proxy.proxy_server", reason="needs litellm[proxy]: nox -s litellm")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[Upstream, str]]:
    up = Upstream()
    with up.model.serve() as url:
        yield up, url


@pytest.fixture(scope="module")
def proxy(
    upstream: tuple[Upstream, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A real litellm proxy process on loopback; the openai client pointed at it."""
    _, url = upstream
    budget = {
        "per_session": 3000,
        "warn_ratio": 0.5,
        "max_output_tokens": 100,
        "policy": "hard_stop",
    }
    with _client(url, tmp_path_factory.mktemp("proxy"), budget) as client:
        yield client


@contextlib.contextmanager
def _client(url: str, tmp: Path, budget: dict[str, Any]) -> Iterator[Any]:
    """A proxy whose guard has ``budget``, and an openai client (no retries of its own) on it."""
    litellm_cli = str(Path(sys.executable).with_name("litellm"))
    guard = guard_config(url, token_budget=budget)
    with litellm_proxy(litellm_cli, tmp, guard) as (base, key):
        client = openai.OpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0)
        yield client
        client.close()


def _ask(client: Any, session: str, text: str = "find the install docs", **kw: Any) -> Any:
    messages = kw.pop("messages", [{"role": "user", "content": text}])
    return client.chat.completions.with_raw_response.create(
        model=kw.pop("model", "agent"),
        messages=messages,
        extra_headers={"x-agentguard-session": session},
        **kw,
    )


def _guard_headers(raw: Any) -> dict[str, str]:
    return {k: v for k, v in raw.headers.items() if k.startswith("x-agentguard-")}


def test_malformed_tool_call_is_corrected_and_reported(proxy: Any, upstream: Any) -> None:
    """A call missing its required field is re-asked; the client gets the corrected call."""
    up, _ = upstream
    start = up.script(
        fast_model=[Reply.call("search", {}), Reply.call("search", {"query": "install"})]
    )
    raw = _ask(proxy, "correct-1", tools=TOOLS)
    call = raw.parse().choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"query": "install"}
    headers = _guard_headers(raw)
    assert headers["x-agentguard-tier"] == "fast"
    assert headers["x-agentguard-corrections"] == "1"
    assert headers["x-agentguard-session"] == "correct-1"
    assert up.models_since(start) == ["fast-model", "fast-model"]
    assert "query" in up.model.requests[-1].messages[-1]["content"]  # the correction


def test_broken_json_is_repaired_for_free(proxy: Any, upstream: Any) -> None:
    """Truncated arguments JSON is repaired locally: one upstream call, a repairs header."""
    up, _ = upstream
    start = up.script(fast_model=[Reply.call("search", '{"query": "install"')])
    raw = _ask(proxy, "repair-1", tools=TOOLS)
    call = raw.parse().choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"query": "install"}
    assert _guard_headers(raw)["x-agentguard-repairs"] == "1"
    assert up.models_since(start) == ["fast-model"]


def test_dead_tier_escalates_to_the_next_model(proxy: Any, upstream: Any) -> None:
    """A 500 from the fast tier re-routes inside the proxy: upstream sees the strong model."""
    up, _ = upstream
    start = up.script(fast_model=[Fault.server_error()], strong_model=[Reply.text("strong ok")])
    raw = _ask(proxy, "dead-1")
    assert raw.parse().choices[0].message.content == "strong ok"
    headers = _guard_headers(raw)
    assert headers["x-agentguard-tier"] == "strong"
    assert headers["x-agentguard-escalated-from"] == "fast"
    assert headers["x-agentguard-escalation-reason"] == "server_error"
    assert up.models_since(start) == ["fast-model", "strong-model"]


def test_a_loop_in_the_transcript_is_forced_escalated_then_refused(
    proxy: Any, upstream: Any
) -> None:
    """A stuck polling loop first gets an answer asked for from the pruned conversation; the
    run coming back still looping moves up a tier with the summary; a loop that outlives that
    at the top tier is refused (400)."""
    up, _ = upstream
    start = up.script(
        fast_model=[Reply.text("still 40%: not done")],
        strong_model=[Reply.text("the build is stuck; stopping"), Reply.text("stuck")],
    )
    history = polling_history(8)
    raw = _ask(proxy, "loop-1", messages=history)
    headers = _guard_headers(raw)
    assert (headers["x-agentguard-tier"], headers["x-agentguard-loop-recovery"]) == (
        "fast",
        "force",
    )
    assert len(up.model.requests[-1].messages) == 1 + 2 + 1  # one poll left, the recovery turn
    answer = {"role": "assistant", "content": raw.parse().choices[0].message.content}
    raw = _ask(proxy, "loop-1", messages=[*history, answer, *polling_history(9)[-2:]])
    headers = _guard_headers(raw)
    assert headers["x-agentguard-escalation-reason"] == "loop_detected"
    assert (headers["x-agentguard-tier"], headers["x-agentguard-loop-recovery"]) == (
        "strong",
        "escalate",
    )
    assert up.models_since(start) == ["fast-model", "strong-model"]
    raw = _ask(proxy, "loop-2", model="agent-strong", messages=history)
    assert _guard_headers(raw)["x-agentguard-loop-recovery"] == "force"
    answer = {"role": "assistant", "content": raw.parse().choices[0].message.content}
    with pytest.raises(openai.BadRequestError, match="agentguard loop_detected"):
        _ask(
            proxy,
            "loop-2",
            model="agent-strong",
            messages=[*history, answer, *polling_history(9)[-2:]],
        )
    assert up.models_since(start) == ["fast-model", "strong-model", "strong-model"]


def test_budget_warning_travels_as_a_header(proxy: Any, upstream: Any) -> None:
    """A session past the budget's warning ratio is told so in x-agentguard-budget-warning."""
    up, _ = upstream
    up.script(fast_model=[Reply.text("short answer")])
    long_text = " ".join(f"line {i} of the attached build log" for i in range(300))
    raw = _ask(proxy, "budget-1", text=long_text)
    assert _guard_headers(raw)["x-agentguard-budget-warning"] == "true"


def test_streaming_through_the_proxy_carries_the_report_at_the_end(
    proxy: Any, upstream: Any
) -> None:
    """stream=True: text streams after an escalation; the last chunks carry the report."""
    up, _ = upstream
    up.script(fast_model=[Fault.server_error(503)], strong_model=[Reply.text("streamed answer")])
    stream = proxy.chat.completions.create(
        model="agent",
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        extra_headers={"x-agentguard-session": "stream-1"},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "streamed answer"
    )
    reports = [getattr(c, "agentguard", None) for c in chunks]
    report = next(r for r in reports if r)
    assert (report["x-agentguard-tier"], report["x-agentguard-escalated-from"]) == (
        "strong",
        "fast",
    )


def test_tool_calls_still_invalid_answer_502_with_the_guards_headers(
    proxy: Any, upstream: Any
) -> None:
    """Invalid on every tier after every correction: 502 as documented, and the error response
    carries the x-agentguard-* headers, each attempt labelled by what happened."""
    up, _ = upstream
    # a different wrong answer each time: an identical one would end the re-asks sooner
    wrong = [Reply.call("search", args) for args in ({}, {"q": "a"}, {"query": 1}, {"term": "b"})]
    start = up.script(fast_model=wrong, strong_model=wrong)
    with pytest.raises(openai.APIStatusError) as info:
        _ask(proxy, "invalid-1", tools=TOOLS)
    error = info.value
    assert error.status_code == 502
    assert "tool_validation_failed" in str(error)
    headers = _guard_headers(error.response)
    assert headers["x-agentguard-session"] == "invalid-1"
    assert headers["x-agentguard-corrections"] == "6"  # three re-asks on each tier
    attempts = headers["x-agentguard-attempts"].split(",")
    assert attempts == ["fast:tool_validation_failure"] * 4 + ["strong:tool_validation_failure"] * 4
    assert len(up.models_since(start)) == 8


def test_a_spent_session_budget_is_a_final_refusal(proxy: Any, upstream: Any) -> None:
    """hard_stop, session budget spent: 403 (a default OpenAI() client does not retry it),
    no Retry-After, the budget state in the headers; nothing reaches upstream."""
    up, _ = upstream
    start = up.script(fast_model=[Reply.text("never sent")])
    huge = " ".join(f"line {i} of the attached build log" for i in range(1000))
    with pytest.raises(openai.PermissionDeniedError) as info:
        _ask(proxy, "budget-2", text=huge)
    headers = info.value.response.headers
    assert "retry-after" not in headers
    assert headers["x-agentguard-budget-exceeded"] == "true"
    assert headers["x-agentguard-session"] == "budget-2"
    assert up.models_since(start) == []
    up.queues["fast-model"].clear()


def test_a_stream_refused_before_its_first_chunk_answers_with_the_same_status(
    proxy: Any, upstream: Any
) -> None:
    """stream=True, every tier down before anything was sent: the status a call would get
    (litellm builds this answer itself: without the x-agentguard-* headers, as documented)."""
    up, _ = upstream
    up.script(fast_model=[Fault.server_error(503)], strong_model=[Fault.server_error(503)])
    with pytest.raises(openai.APIStatusError) as info:
        list(
            proxy.chat.completions.create(
                model="agent",
                messages=[{"role": "user", "content": "stream please"}],
                stream=True,
                extra_headers={"x-agentguard-session": "stream-dead"},
            )
        )
    assert info.value.status_code == 503
    assert "agentguard tiers_exhausted" in str(info.value)


@pytest.fixture(scope="module")
def hourly_proxy(
    upstream: tuple[Upstream, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A second proxy whose rolling-hour budget is tiny (it is spent for the whole module)."""
    _, url = upstream
    budget = {"per_hour": 400, "max_output_tokens": 50, "policy": "hard_stop"}
    with _client(url, tmp_path_factory.mktemp("hourly"), budget) as client:
        yield client


def test_a_spent_hourly_budget_answers_429_with_retry_after(
    hourly_proxy: Any, upstream: Any
) -> None:
    """hard_stop, the rolling hour spent: 429 with Retry-After (seconds until it frees up), which
    a default OpenAI() client waits for; the budget state in the x-agentguard-* headers."""
    up, _ = upstream
    up.script(fast_model=[Reply.text("an answer")] * 10)
    text = " ".join(f"line {i} of the log" for i in range(30))  # ~150 tokens a call
    with pytest.raises(openai.RateLimitError) as info:  # noqa: PT012
        for i in range(10):  # the hour holds 400: the third or fourth call is refused
            _ask(hourly_proxy, f"hour-{i}", text=text)
    headers = info.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 3600
    assert headers["x-agentguard-budget-exceeded"] == "true"
    assert "budget_exceeded" in str(info.value)
    up.queues["fast-model"].clear()


def test_callers_with_the_same_conversation_get_their_own_sessions(
    proxy: Any, upstream: Any
) -> None:
    """Without a session header, `user: alice` and `user: bob` asking the same thing are two
    sessions (never one fingerprint of their opening), and each keeps its own on a retry."""
    up, _ = upstream
    up.script(fast_model=[Reply.text("same answer")] * 4)
    messages = [{"role": "user", "content": "what does the install guide say?"}]
    sessions = {}
    for user in ("alice", "bob"):
        raw = proxy.chat.completions.with_raw_response.create(
            model="agent", messages=messages, user=user
        )
        sessions[user] = _guard_headers(raw)["x-agentguard-session"]
    assert sessions["alice"] != sessions["bob"]
    assert all(s.startswith("auto-") for s in sessions.values())


# litellm's own types trip a pydantic warning on first use in this process; it is theirs
@pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier")
def test_a_clients_params_reach_the_model_as_plain_litellm_sends_them(
    proxy: Any, upstream: Any
) -> None:
    """Differential: what a client of the proxy asks for reaches the tier's model as plain
    litellm sends it to that model — ``reasoning_effort`` was refused as unsupported by the
    ``agentguard`` provider (a 400), ``max_completion_tokens`` went as ``max_tokens``."""
    import litellm

    up, url = upstream
    params = {"max_completion_tokens": 50, "reasoning_effort": "low", "seed": 7}
    messages = [{"role": "user", "content": "which docs cover the install?"}]
    up.queues["fast-model"].clear()  # what earlier tests queued and left
    start = up.script(fast_model=[Reply.text("plain"), Reply.text("guarded")])
    plain = litellm.completion(
        model="openai/fast-model",
        messages=messages,
        api_base=url,
        api_key="sk-test-upstream-not-real",
        **params,
    )
    raw = _ask(proxy, "params-1", messages=messages, **params)
    assert (plain.choices[0].message.content, raw.parse().choices[0].message.content) == (
        "plain",
        "guarded",
    )
    sent_plain, sent_guarded = up.model.requests[start:]
    assert sent_guarded.params == sent_plain.params
    assert sent_guarded.params["max_completion_tokens"] == 50


# The proxy's own check of two keys (litellm's `custom_auth`): no database of virtual keys.
_TWO_KEYS = """
from litellm.proxy._types import UserAPIKeyAuth

async def user_api_key_auth(request, api_key):
    if api_key in ("sk-alice-0001", "sk-bob-0002"):
        return UserAPIKeyAuth(api_key=api_key, user_id=api_key.split("-")[1])
    raise Exception("unknown key")
"""


def test_two_keys_naming_one_session_have_two_sessions(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    """alice spends her session `run-1` (hard_stop) until refused; bob, sending the same
    session name with his own key, has a session of his own, with nothing spent yet."""
    up, url = upstream
    (tmp_path / "two_keys.py").write_text(_TWO_KEYS)
    budget = {"per_session": 300, "max_output_tokens": 20, "policy": "hard_stop"}
    guard = guard_config(url, token_budget=budget)
    litellm_cli = str(Path(sys.executable).with_name("litellm"))
    general = {"custom_auth": "two_keys.user_api_key_auth"}
    text = "hello there " * 20
    statuses: dict[str, list[int]] = {"alice": [], "bob": []}
    with litellm_proxy(litellm_cli, tmp_path, guard, general=general) as (base, _):
        for user, key in (("alice", "sk-alice-0001"), ("bob", "sk-bob-0002")):
            client = openai.OpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0)
            for _ in range(4 if user == "alice" else 1):
                up.script(fast_model=[Reply.text("Sunny.", usage=Usage(100, 20))])
                try:
                    raw = _ask(client, "run-1", text=text)
                    assert _guard_headers(raw)["x-agentguard-session"] == "run-1"
                    statuses[user].append(raw.status_code)
                except openai.PermissionDeniedError as error:
                    statuses[user].append(error.status_code)
                    up.queues["fast-model"].clear()
            client.close()
    assert statuses["alice"][:2] == [200, 200]
    assert statuses["alice"][-1] == 403
    assert statuses["bob"] == [200]


def test_concurrent_conversations_with_one_opening_share_nothing(proxy: Any, upstream: Any) -> None:
    """Six clients run the same two-step conversation at once, with no session header: six
    sessions, each continued by its second step, no loop verdict, no budget warning (each
    session spends its own budget)."""
    from concurrent.futures import ThreadPoolExecutor

    up, _ = upstream
    up.queues.clear()  # answers an earlier test queued and did not use
    users = 6
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "search", "arguments": '{"query": "install"}'},
    }
    up.script(
        fast_model=[Reply.call("search", {"query": "install"}, id="call_0")] * users
        + [Reply.text("Section 2 of the guide.")] * users
    )
    opening = [{"role": "user", "content": "where is the install guide?"}]
    follow_up = [
        *opening,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "guide.md, section 2"},
    ]

    def ask(messages: list[dict[str, Any]]) -> dict[str, str]:
        raw = proxy.chat.completions.with_raw_response.create(
            model="agent", messages=messages, tools=TOOLS
        )
        return _guard_headers(raw)

    with ThreadPoolExecutor(users) as pool:
        first = list(pool.map(ask, [opening] * users))
        second = list(pool.map(ask, [follow_up] * users))
    assert len({h["x-agentguard-session"] for h in first}) == users
    assert {h["x-agentguard-session"] for h in second} == {h["x-agentguard-session"] for h in first}
    for headers in first + second:  # no loop verdict moved a call, no budget was shared
        assert "x-agentguard-escalation-reason" not in headers
        assert "x-agentguard-budget-warning" not in headers


# -- OpenTelemetry in the proxy process -------------------------------------------------------

# Starts the proxy as `litellm` does, after setting the process's global OpenTelemetry tracer
# provider (as `opentelemetry-instrument` or an application's startup would): each finished span
# is written as one JSON line to the file named first on the command line.
_TRACED_PROXY = """#!{python}
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
out = open(sys.argv.pop(1), "w", buffering=1)
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
    out=out, formatter=lambda span: json.dumps(json.loads(span.to_json())) + "\\n")))
trace.set_tracer_provider(provider)
from litellm import run_server
sys.argv[0] = "litellm"
sys.exit(run_server())
"""


def _traced_launcher(tmp_path: Path) -> tuple[str, Path]:
    """A launcher standing in for ``litellm`` with a global tracer provider, and the file its
    spans go to (the test is skipped without the OpenTelemetry SDK)."""
    pytest.importorskip("opentelemetry.sdk.trace")
    launcher = tmp_path / "traced-litellm"
    launcher.write_text(_TRACED_PROXY.format(python=sys.executable))
    launcher.chmod(0o755)
    return str(launcher), tmp_path / "spans.jsonl"


def test_the_guard_records_its_spans_inside_the_proxy(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    """A proxy process with a global tracer provider: each guarded request is an ``agentguard
    chat`` span with one ``chat`` CLIENT span per upstream attempt (a 500, then the strong
    tier), the session as ``gen_ai.conversation.id``, the provider as litellm routes it."""
    up, url = upstream
    launcher, spans_file = _traced_launcher(tmp_path)
    guard = guard_config(url)
    with litellm_proxy(launcher, tmp_path, guard, prefix=[str(spans_file)]) as (base, key):
        client = openai.OpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0)
        up.script(fast_model=[Fault.server_error(500)], strong_model=[Reply.text("found it")])
        raw = _ask(client, "otel-run")
        client.close()
    assert raw.parse().choices[0].message.content == "found it"
    spans = [json.loads(line) for line in spans_file.read_text().splitlines() if line.strip()]
    calls = [s for s in spans if s["name"] == "agentguard chat fast"]
    assert len(calls) == 1
    call = calls[0]
    chats = [s for s in spans if s["parent_id"] == call["context"]["span_id"]]
    assert [s["name"] for s in chats] == ["chat openai/fast-model", "chat openai/strong-model"]
    assert {s["kind"] for s in chats} == {"SpanKind.CLIENT"}
    first, second = (s["attributes"] for s in chats)
    assert first["error.type"] == "500"
    assert second["gen_ai.provider.name"] == "openai"
    assert second["gen_ai.conversation.id"] == "otel-run"
    assert second["gen_ai.usage.output_tokens"] > 0
    events = [e["attributes"] for e in call["events"] if e["name"] == "gen_ai.guardrail.result"]
    assert any(e["gen_ai.guardrail.policy.id"] == "escalation" for e in events)


def test_the_guards_spans_join_the_proxys_trace(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    """With litellm's own OpenTelemetry callback on, a request that carries the client's
    ``traceparent`` is one trace: the proxy's request span continues the client's, and the
    guarded call's span sits under it, beside litellm's own spans."""
    up, url = upstream
    launcher, spans_file = _traced_launcher(tmp_path)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
    with litellm_proxy(
        launcher, tmp_path, guard_config(url), prefix=[str(spans_file)], callbacks=["otel"]
    ) as (base, key):
        client = openai.OpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0)
        up.script(fast_model=[Reply.text("found it")])
        answer = client.chat.completions.create(
            model="agent",
            messages=[{"role": "user", "content": "find it"}],
            extra_headers={"traceparent": traceparent},
        )
        client.close()
    assert answer.choices[0].message.content == "found it"
    spans = [json.loads(line) for line in spans_file.read_text().splitlines() if line.strip()]
    (proxy,) = [s for s in spans if s["name"] == "Received Proxy Server Request"]
    (call,) = [s for s in spans if s["name"] == "agentguard chat fast"]
    (logged,) = [s for s in spans if s["name"] == "litellm_request"]
    assert proxy["context"]["trace_id"] == f"0x{trace_id}"  # the client's trace
    assert call["context"]["trace_id"] == logged["context"]["trace_id"] == f"0x{trace_id}"
    assert call["parent_id"] == logged["parent_id"] == proxy["context"]["span_id"]
    (attempt,) = [s for s in spans if s["parent_id"] == call["context"]["span_id"]]
    assert attempt["name"] == "chat openai/fast-model"
