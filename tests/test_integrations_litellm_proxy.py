"""End to end through a real litellm proxy: the config names agentguard, the openai client drives it.

The test starts ``litellm --config config.yaml`` as a process on loopback; the proxy's models are
``agentguard/<tier>`` (the custom provider the config names) and its callback turns each
report into ``x-agentguard-*`` headers. Upstream is a scripted OpenAI-compatible server in this
process, so every failure is on cue and nothing leaves the machine. Runs in the ``litellm``
nox session; skipped where litellm's proxy is not installed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from _litellm_kit import OFFLINE_FLAGS, TOOLS, polling_history
from agentguard.testing import Fault, Reply, ScriptedModel
from agentguard.transport import ModelRequest

pytest.importorskip("litellm.proxy.proxy_server", reason="needs litellm[proxy]: nox -s litellm")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

PROXY_CONFIG = {
    "model_list": [
        {"model_name": "agent", "litellm_params": {"model": "agentguard/fast"}},
        {"model_name": "agent-strong", "litellm_params": {"model": "agentguard/strong"}},
    ],
    "litellm_settings": {
        "custom_provider_map": [
            {
                "provider": "agentguard",
                "custom_handler": "agentguard.integrations.litellm.proxy_handler",
            }
        ],
        "callbacks": "agentguard.integrations.litellm.proxy_headers",
    },
    # the guard is the one retry layer: the proxy's router must not retry guarded calls
    "router_settings": {"num_retries": 0},
}


class Upstream:
    """The scripted upstream: each test queues the answers of each model."""

    def __init__(self) -> None:
        self.queues: dict[str, collections.deque[Reply | Fault]] = collections.defaultdict(
            collections.deque
        )
        self.model = ScriptedModel({"*": [self._next]}, cycle=True)

    def _next(self, request: ModelRequest) -> Reply | Fault:
        queue = self.queues[request.model]
        return queue.popleft() if queue else Fault.server_error(500, "nothing queued")

    def script(self, **answers: list[Reply | Fault]) -> int:
        """Queue answers per model (``fast_model=[...]``); returns the request count so far."""
        for model, steps in answers.items():
            self.queues[model.replace("_", "-")].extend(steps)
        return len(self.model.requests)

    def models_since(self, start: int) -> list[str]:
        return [r.model for r in self.model.requests[start:]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
    tmp = tmp_path_factory.mktemp("proxy")
    tier = {"base_url": url, "api_key_env": "UPSTREAM_API_KEY"}
    guard = {
        "tiers": {
            "fast": {"model": "openai/fast-model", **tier},
            "strong": {"model": "openai/strong-model", **tier},
        },
        "escalation": {"chain": ["fast", "strong"], "max_retries_before_escalate": 0},
        "token_budget": {"per_session": 3000, "warn_ratio": 0.5, "max_output_tokens": 100},
        "memory_pressure": {"enabled": False},
    }
    (tmp / "agentguard.yaml").write_text(yaml.safe_dump({"reliability": guard}))
    (tmp / "config.yaml").write_text(yaml.safe_dump(PROXY_CONFIG))
    master_key = "sk-" + secrets.token_hex(24)
    env = {
        **os.environ,
        "AGENTGUARD_CONFIG": str(tmp / "agentguard.yaml"),
        "UPSTREAM_API_KEY": "sk-test-upstream-not-real",
        "LITELLM_MASTER_KEY": master_key,
        "NO_PROXY": "127.0.0.1,localhost",
        **OFFLINE_FLAGS,
    }
    port = _free_port()
    litellm_cli = Path(sys.executable).with_name("litellm")
    log = (tmp / "proxy.log").open("w")
    command = [str(litellm_cli), "--config", str(tmp / "config.yaml"), "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_ready(process, f"http://127.0.0.1:{port}", tmp / "proxy.log")
        client = openai.OpenAI(
            api_key=master_key, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
        )
        yield client
        client.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_ready(process: subprocess.Popen[bytes], base: str, log: Path) -> None:
    """Poll the liveliness endpoint (at most ~3 minutes on a loaded machine); fail with the log."""
    with httpx.Client(timeout=2) as http:
        for _ in range(360):
            if process.poll() is not None:
                pytest.fail(f"litellm proxy exited ({process.returncode}):\n{log.read_text()}")
            try:
                if http.get(f"{base}/health/liveliness").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.5)  # the pause between polls; returns early if it dies
    pytest.fail(f"litellm proxy not ready:\n{log.read_text()[-4000:]}")


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
