"""End to end through a real litellm proxy: the config names agentguard, the openai client drives it.

The test starts ``litellm --config config.yaml`` as a process on loopback; the proxy's models are
``agentguard/<tier>`` (the custom provider the config names) and its callback turns each
report into ``x-agentguard-*`` headers. Upstream is a scripted OpenAI-compatible server in this
process, so every failure is on cue and nothing leaves the machine. Runs in the ``litellm``
nox session; skipped where litellm's proxy is not installed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _litellm_kit import TOOLS, Upstream, guard_config, litellm_proxy, polling_history
from agentguard.testing import Fault, Reply

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
    budget = {"per_session": 3000, "warn_ratio": 0.5, "max_output_tokens": 100}
    guard = guard_config(url, token_budget=budget)
    litellm_cli = str(Path(sys.executable).with_name("litellm"))
    with litellm_proxy(litellm_cli, tmp_path_factory.mktemp("proxy"), guard) as (base, key):
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


def test_loop_in_the_transcript_escalates_then_is_refused(proxy: Any, upstream: Any) -> None:
    """A stuck polling loop moves the call up a tier; at the top tier it is refused (400)."""
    up, _ = upstream
    start = up.script(strong_model=[Reply.text("the build is stuck; stopping")])
    raw = _ask(proxy, "loop-1", messages=polling_history(8))
    headers = _guard_headers(raw)
    assert headers["x-agentguard-escalation-reason"] == "loop_detected"
    assert headers["x-agentguard-tier"] == "strong"
    assert up.models_since(start) == ["strong-model"]  # the looping tier is not asked again
    with pytest.raises(openai.BadRequestError, match="agentguard loop_detected"):
        _ask(proxy, "loop-2", model="agent-strong", messages=polling_history(8))
    assert up.models_since(start) == ["strong-model"]


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
