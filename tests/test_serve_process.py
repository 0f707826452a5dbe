"""``agentguard serve`` as real processes on loopback, started as a user starts them.

Two servers share budgets, tier breakers and sessions' loop ladders through one real Redis; a server stopped by SIGTERM
in the middle of a stream charges what the stream delivered and frees the rest of its hold.
Upstreams are scripted HTTP servers in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import agentguard as ag
from _processes import free_port, process_env, running, serving
from _stores import RedisServer
from agentguard.testing import Fault, Reply, ScriptedModel
from agentguard.transport import caller_scope
from test_shared_sessions import LOOPS, SEARCH

pytest.importorskip("uvicorn", reason='needs the serve extra: pip install "agentguard[serve]"')

KEY = "sk-fleet-caller-0123456789abcdef"
AUTH = {"authorization": f"Bearer {KEY}"}
ASK = [{"role": "user", "content": "summarise the release notes"}]
LONG = " ".join(f"note{i}" for i in range(200))


@contextlib.contextmanager
def serve(
    tmp: Path,
    upstream: str,
    reliability: dict[str, Any],
    name: str = "serve",
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``agentguard serve --upstream URL --config FILE`` on a free loopback port until the block
    ends (``env``: more environment variables); yields its base URL and the process."""
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"reliability": reliability}))
    port = str(free_port())
    command = [sys.executable, "-m", "agentguard", "serve", "--upstream", upstream]
    command += ["--config", str(config), "--port", port, "--graceful-timeout", "1"]
    base = f"http://127.0.0.1:{port}"
    with running(
        command, env=process_env(env), log=tmp / f"{name}.log", health=f"{base}/health", name=name
    ) as process:
        yield base, process


def _chat(base: str, session: str, model: str = "m") -> httpx.Response:
    body = {"model": model, "messages": ASK}
    headers = {**AUTH, "x-agentguard-session": session}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=60)


@pytest.mark.redis
def test_two_servers_share_budgets_and_breakers_through_redis(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A session's budget spent through one server is spent on the other; a tier breaker
    opened by one server's failures keeps the other from calling the dead tier."""
    model = ScriptedModel({"dead": [Fault.server_error()], "*": [Reply.text(LONG)]}, cycle=True)
    reliability = {
        "storage": {
            "backend": "redis",
            "url": redis_server.url,
            "key_prefix": f"serve-{os.getpid()}",
        },
        "token_budget": {"per_session": 300, "max_output_tokens": 100, "policy": "hard_stop"},
        "escalation": {"max_retries_before_escalate": 0},
    }
    with (
        model.serve() as upstream,
        serve(tmp_path, upstream, reliability, "a") as (a, _),
        serve(tmp_path, upstream, reliability, "b") as (b, _),
    ):
        assert _chat(a, "fleet-1").status_code == 200
        refused = _chat(b, "fleet-1")
        assert refused.status_code == 403
        assert refused.json()["error"]["type"] == "budget_exceeded"
        assert refused.headers["x-agentguard-budget-exceeded"] == "true"
        assert _chat(b, "fleet-2").status_code == 200  # another session is not held

        for i in range(5):  # the breaker's minimum of calls, all failing, through server a
            assert (
                _chat(a, f"dead-{i}", model="dead").status_code == 500
            )  # as the upstream answered
        calls = len(model.requests)
        answer = _chat(b, "dead-b", model="dead")
        assert answer.status_code == 503
        assert answer.headers["x-agentguard-attempts"] == "dead:breaker_open"
        assert len(model.requests) == calls  # server b never called the dead tier


class _SlowUpstream:
    """An upstream that streams two chunks of an answer, then holds the stream open until
    released (a long generation, cut by the server's shutdown)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for text in ("The release ", "notes say "):
                    self._send({"choices": [{"index": 0, "delta": {"content": text}}]})
                upstream.release.wait(timeout=120)
                self._send({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _send(self, chunk: dict[str, Any]) -> None:
                body = {
                    "id": "chatcmpl-slow",
                    "object": "chat.completion.chunk",
                    "model": "m",
                    **chunk,
                }
                self._chunk(f"data: {json.dumps(body)}\n\n".encode())

            def _chunk(self, data: bytes) -> None:
                with contextlib.suppress(OSError):
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        self.thread.start()
        try:
            yield f"http://127.0.0.1:{self.server.server_port}/v1"
        finally:
            self.release.set()
            self.server.shutdown()
            self.server.server_close()


def test_sigterm_mid_stream_settles_the_reservation(tmp_path: Path) -> None:
    """SIGTERM while a stream is open: the server exits cleanly, the tokens the stream
    delivered are charged to its session and nothing stays held."""
    store = tmp_path / "budgets.db"
    reliability = {
        "storage": {"backend": "sqlite", "path": str(store)},
        "token_budget": {"per_session": 100_000, "max_output_tokens": 1000, "reserve": "strict"},
    }
    with (
        _SlowUpstream().running() as upstream,
        serve(tmp_path, upstream, reliability) as (base, process),
    ):
        body = {"model": "m", "messages": ASK, "stream": True}
        headers = {**AUTH, "x-agentguard-session": "cut-1"}
        received = []
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json=body, headers=headers, timeout=60
        ) as answer:
            lines = answer.iter_lines()
            for line in lines:
                if line.startswith("data:"):
                    received.append(line)
                    break
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(httpx.HTTPError):
                received += [line for line in lines if line.startswith("data:")]
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "The release " in received[0]
    config = ag.GuardConfig.from_dict({"reliability": reliability})
    scope = f"{config.token_budget.scope}:{caller_scope(KEY)}"
    scoped = config.model_copy(
        update={"token_budget": config.token_budget.model_copy(update={"scope": scope})}
    )
    ledger = ag.TokenLedger(scoped, store=ag.SQLiteStore(str(store)))
    usage = ledger.usage("cut-1")
    ledger.close()
    assert usage.session_reserved == 0  # nothing held after the shutdown
    assert usage.session_tokens > 0  # what the stream delivered was charged


def _agent(servers: list[str], session: str, steps: int) -> list[tuple[int, str, str]]:
    """A looping agent whose requests go to ``servers`` in turn (a round-robin balancer): each
    step sends the whole history, runs the tool call it gets back (always the same empty
    result) and goes on. Per step: the status, the ladder rungs taken and the error type."""
    messages: list[dict[str, Any]] = list(ASK)
    seen = []
    for step in range(steps):
        base = servers[step % len(servers)]
        body = {"model": "m", "messages": messages, "tools": [SEARCH]}
        headers = {**AUTH, "x-agentguard-session": session}
        answer = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=60)
        rungs = answer.headers.get("x-agentguard-loop-recovery", "")
        if answer.status_code != 200:
            seen.append((answer.status_code, rungs, answer.json()["error"]["type"]))
            continue
        message = answer.json()["choices"][0]["message"]
        seen.append((200, rungs, "tool_calls" if message.get("tool_calls") else "text"))
        messages.append({k: v for k, v in message.items() if v is not None})
        for call in message.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "no results"})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "search again"})
    return seen


@pytest.mark.redis
def test_a_loop_is_judged_alike_across_two_servers_on_one_redis(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A looping conversation whose requests alternate between two servers (a round-robin
    balancer) climbs the recovery ladder exactly as on one server: the same verdicts at the
    same steps, the same rungs in the same order."""
    model = ScriptedModel([Reply.call("search", {"q": "release notes"})], cycle=True)
    reliability = {
        "storage": {
            "backend": "redis",
            "url": redis_server.url,
            "key_prefix": f"ladder-{os.getpid()}",
        },
        **LOOPS,
    }
    with (
        model.serve() as upstream,
        serve(tmp_path, upstream, reliability, "a") as (a, _),
        serve(tmp_path, upstream, reliability, "b") as (b, _),
    ):
        alone = _agent([a], "ladder-alone", 12)
        balanced = _agent([a, b], "ladder-balanced", 12)
    taken = [rungs for _, rungs, _ in alone if rungs]
    assert taken[:4] == ["hint", "summary", "prune", "force"]  # the ladder, climbed
    assert any(status == 400 for status, _, _ in alone)  # and the loop stopped at last
    assert balanced == alone, (alone, balanced)


def test_an_answer_passed_on_carries_the_upstreams_date_and_server_once(tmp_path: Path) -> None:
    """uvicorn's own ``Date`` and ``Server`` went out beside the upstream's: every guarded or
    forwarded answer had both headers twice. They are the upstream's, once; the server's own
    answers carry a date of their own and no ``Server``."""
    model = ScriptedModel([Reply.text("hi")], cycle=True)
    with (
        model.serve() as url,
        serve(tmp_path, url, {"memory_pressure": {"enabled": False}}) as (
            base,
            _,
        ),
    ):
        guarded = _chat(base, "dates")
        forwarded = httpx.get(f"{base}/v1/models/m", headers=AUTH, timeout=60)
        direct = httpx.get(f"{url}/models/m", headers=AUTH, timeout=60)
        health = httpx.get(f"{base}/health", timeout=60)
    assert guarded.status_code == 200
    for answer in (guarded, forwarded):
        assert answer.headers.get_list("server") == direct.headers.get_list("server")
        assert len(answer.headers.get_list("date")) == 1
    assert len(health.headers.get_list("date")) == 1
    assert "server" not in health.headers


class _EchoingKey(BaseHTTPRequestHandler):
    """An upstream refusing every request with a 401 that echoes the key it was sent, in its
    body and in a header (as gateways and self-hosted servers do)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        key = (self.headers.get("authorization") or "").removeprefix("Bearer ")
        body = json.dumps(
            {"error": {"message": f"Incorrect API key provided: {key}", "type": "auth"}}
        ).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("x-seen-key", key)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_tier_keys_echo_never_reaches_the_caller(tmp_path: Path) -> None:
    """A tier at another origin is sent the operator's key (``api_key_env``); its 401 echoing
    that key reaches the caller with the key masked (status and the rest of the body as the
    upstream sent them). The caller's own key's 401 is passed on byte for byte, as the
    upstream answers it directly."""
    operator = "Zq8mW3xK9pL2vN7rT4yB6cD1fG5hJ0sA"  # no sk- shape: only its value tells
    with serving(_EchoingKey) as port:
        upstream = f"http://127.0.0.1:{port}/v1"
        reliability = {
            "tiers": {
                "fast": {"model": "small"},
                "premium": {
                    "model": "big",
                    "base_url": f"http://localhost:{port}/v1",  # another origin
                    "api_key_env": "SERVE_TEST_OPERATOR_KEY",
                },
            },
            "escalation": {"chain": ["fast", "premium"]},
            "memory_pressure": {"enabled": False},
        }
        env = {"SERVE_TEST_OPERATOR_KEY": operator}
        with serve(tmp_path, upstream, reliability, env=env) as (base, _):
            tier = _chat(base, "tier-key", model="premium")
            own = _chat(base, "own-key", model="fast")
            streamed = httpx.post(
                f"{base}/v1/chat/completions",
                json={"model": "premium", "messages": ASK, "stream": True},
                headers=AUTH,
                timeout=60,
            )
        body = {"model": "small", "messages": ASK}
        direct = httpx.post(f"{upstream}/chat/completions", json=body, headers=AUTH, timeout=60)
    assert tier.status_code == 401
    assert operator not in tier.text
    assert all(operator not in v for v in tier.headers.values())
    assert tier.json() == {"error": {"message": "Incorrect API key provided: ***", "type": "auth"}}
    assert tier.headers["x-seen-key"] == "***"
    assert (streamed.status_code, streamed.content) == (401, tier.content)
    assert own.status_code == 401
    assert own.content == direct.content  # the caller's own key, echoed to the caller: as sent
    assert own.headers["x-seen-key"] == KEY
