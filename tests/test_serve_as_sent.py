"""``agentguard serve`` as a real process on loopback: what it passes on as it came.

The request target as the caller encoded it, the caller's headers as sent (but those of the
connection and the guard's own session header), an answer the guard cannot read as the upstream
gave it, a body nested too deep to read as the caller sent it, and no key in the access log.
The upstream is a scripted HTTP server in this process that records what reaches it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from _processes import free_port, process_env, running, serving
from test_serve_wire import ANSWER as CHAT

pytest.importorskip("uvicorn", reason='needs the serve extra: pip install "agentguard[serve]"')

ASK = [{"role": "user", "content": "summarise the release notes"}]
MOVED = b"<html>Moved Permanently</html>"
LOCATION = "https://api.example.invalid/v1/chat/completions"
# the answers the upstream gives, by the request's ``x-script`` header: status, headers, body
SCRIPTS: dict[str, tuple[int, list[tuple[str, str]], bytes]] = {
    "": (200, [("Content-Type", "application/json")], CHAT),
    "moved": (301, [("Location", LOCATION), ("Content-Type", "text/html")], MOVED),
    "hop": (
        200,
        [
            ("Content-Type", "application/json"),
            ("Connection", "X-Upstream-Hop"),
            ("X-Upstream-Hop", "upstream-connection-only"),
        ],
        CHAT,
    ),
}


class Upstream:
    """The scripted upstream: answers by :data:`SCRIPTS`, and records each request's target
    (as received), headers (lowercase names, in order, repeats kept) and body by its
    ``x-case`` header."""

    def __init__(self) -> None:
        self.received: dict[str, tuple[str, list[tuple[str, str]], bytes]] = {}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = [(k.lower(), v) for k, v in self.headers.items()]
                received[self.headers.get("x-case", "")] = (self.path, headers, body)
                status, answer_headers, content = SCRIPTS[self.headers.get("x-script", "")]
                self.send_response(status)
                for name, value in answer_headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler

    def got(self, case: str) -> tuple[str, list[tuple[str, str]], bytes]:
        """What reached the upstream for the request of ``case``."""
        assert case in self.received, f"{case} never went upstream"
        return self.received[case]


@contextlib.contextmanager
def _serve(tmp: Path, log_level: str = "warning") -> Iterator[tuple[str, Upstream, Path]]:
    """``agentguard serve`` in front of a scripted upstream until the block ends (the process
    stopped then); yields its base URL, the upstream and the server's log."""
    upstream = Upstream()
    config = tmp / "serve.yaml"
    config.write_text(yaml.safe_dump({}))
    log = tmp / "serve.log"
    port = str(free_port())
    base = f"http://127.0.0.1:{port}"
    with serving(upstream.handler()) as upstream_port:
        command = [sys.executable, "-m", "agentguard", "serve"]
        command += ["--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--config", str(config)]
        command += ["--port", port, "--graceful-timeout", "1", "--log-level", log_level]
        with running(command, env=process_env(), log=log, health=f"{base}/health", name="serve"):
            yield base, upstream, log


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Upstream]]:
    with _serve(tmp_path_factory.mktemp("serve")) as (base, upstream, _):
        yield base, upstream


def _post(base: str, path: str, case: str, body: bytes, **headers: str) -> httpx.Response:
    """POST ``body`` to ``path``, marked ``case`` (``headers``: ``x_script`` is ``x-script``)."""
    more = {k.replace("_", "-"): v for k, v in headers.items()}
    sent = {"content-type": "application/json", "x-case": case, **more}
    return httpx.post(f"{base}{path}", content=body, headers=sent, timeout=60)


def _chat(**more: Any) -> bytes:
    return json.dumps({"model": "m", "messages": ASK} | more).encode()


def test_the_target_goes_upstream_as_the_caller_encoded_it(served: tuple[str, Upstream]) -> None:
    """A forwarded request's path goes upstream with its percent-escapes as sent (``%2F`` was
    sent as ``/``, ``%3F`` moved the rest into the query, ``%23`` cut it off); a path that is a
    guarded route only once decoded is forwarded, not guarded."""
    base, upstream = served
    paths = [
        "/v1/files/a%2Fb",
        "/v1/files/a%3Fb?purpose=x",
        "/v1/files/a%23b",
        "/v1/files/a%2541",
        "/v1/models/meta-llama%2FLlama-3-8B",
    ]
    for i, path in enumerate(paths):
        answer = httpx.get(f"{base}{path}", headers={"x-case": f"target-{i}"}, timeout=60)
        assert answer.status_code == 200
        assert upstream.got(f"target-{i}")[0] == path
    answer = _post(base, "/v1/chat%2Fcompletions", "target-route", _chat())
    assert upstream.got("target-route")[0] == "/v1/chat%2Fcompletions"
    assert "x-agentguard-attempts" not in answer.headers  # forwarded, not guarded


@pytest.mark.parametrize(
    ("path", "more"),
    [
        ("/v1/chat/completions", {}),
        ("/v1/chat/completions", {"stream": True}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
def test_an_answer_the_guard_cannot_read_reaches_the_caller_as_it_came(
    served: tuple[str, Upstream], path: str, more: dict[str, Any]
) -> None:
    """An upstream's redirect to a guarded call reaches the caller as the upstream answered
    it (status, ``Location``, body), not as a 200."""
    base, _ = served
    body = _chat(**{**more, "model": "moved"})
    answer = _post(base, path, f"moved-{path}-{more}", body, x_script="moved")
    assert answer.status_code == 301
    assert answer.headers["location"] == LOCATION
    assert answer.content == MOVED
    assert answer.headers["x-agentguard-attempts"]  # the guard's report beside it


def test_a_json_answer_to_a_stream_reaches_the_caller_as_it_came(
    served: tuple[str, Upstream],
) -> None:
    """An upstream that answers a stream with a JSON answer (no event stream) has that answer
    passed on as it came, not turned into an empty stream."""
    base, _ = served
    body = _chat(stream=True, model="json-stream")
    answer = _post(base, "/v1/chat/completions", "json-stream", body)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == CHAT


def test_answers_the_guard_cannot_read_never_open_the_breaker(
    served: tuple[str, Upstream],
) -> None:
    """An upstream that ignores ``"stream"`` (a JSON answer every time) is answering, not
    failing: its answers are the request's, as a 4xx is, never held against the tier's
    breaker, which would then refuse its calls that it serves well."""
    base, _ = served
    for turn in range(12):
        body = _chat(stream=True, model="ignores-stream")
        answer = _post(base, "/v1/chat/completions", f"ignores-stream-{turn}", body)
        assert answer.status_code == 200
        assert answer.content == CHAT
        assert answer.headers["x-agentguard-attempts"].endswith(":client_error")
    plain = _post(
        base, "/v1/chat/completions", "ignores-stream-plain", _chat(model="ignores-stream")
    )
    assert plain.status_code == 200
    assert json.loads(plain.content)["choices"]


def test_a_guarded_call_goes_up_with_the_callers_headers_as_sent(
    served: tuple[str, Upstream],
) -> None:
    """A header sent twice reaches the upstream twice, and the caller's ``Content-Type`` as
    sent (it went through a mapping: one value, and ``application/json`` written over it)."""
    base, upstream = served
    sent = [
        ("content-type", "application/json; charset=utf-8"),
        ("x-tenant", "a"),
        ("x-tenant", "b"),
        ("x-case", "headers"),
    ]
    answer = httpx.post(f"{base}/v1/chat/completions", content=_chat(), headers=sent, timeout=60)
    assert answer.status_code == 200
    _, headers, body = upstream.got("headers")
    assert [v for k, v in headers if k == "x-tenant"] == ["a", "b"]
    assert [v for k, v in headers if k == "content-type"] == ["application/json; charset=utf-8"]
    assert body == _chat()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", _chat()),  # guarded
        ("/v1/chat/completions", b'{"model": "m", "messages": "no list"}'),  # unreadable
        ("/v1/embeddings", b'{"model": "e", "input": "hi"}'),  # forwarded, metered
        ("/api/chat", _chat()),  # forwarded
    ],
)
def test_the_session_header_never_goes_upstream(
    served: tuple[str, Upstream], path: str, body: bytes
) -> None:
    """``x-agentguard-session`` is the guard's: it went upstream on every route but the
    guarded call the guard could read."""
    base, upstream = served
    case = f"session-{path}-{body!r}"
    assert _post(base, path, case, body, x_agentguard_session="run-42").status_code == 200
    _, headers, _ = upstream.got(case)
    assert "x-agentguard-session" not in dict(headers)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_body_nested_too_deep_to_read_goes_upstream_as_it_came(
    served: tuple[str, Upstream], path: str
) -> None:
    """A body nested deeper than the JSON parser goes (``RecursionError``, not ``ValueError``)
    is one the guard cannot read: it goes upstream as it came (it was a plain 500)."""
    base, upstream = served
    deep = b"[" * 3000 + b"]" * 3000
    body = _chat(input="hi")[:-1] + b', "metadata": ' + deep + b"}"
    answer = _post(base, path, f"deep-{path}", body)
    assert answer.status_code == 200
    assert answer.content == CHAT
    assert upstream.got(f"deep-{path}")[2] == body


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/chat/completions"])
def test_headers_the_connection_names_stay_on_their_connection(
    served: tuple[str, Upstream], path: str
) -> None:
    """A header a ``Connection`` header names is the connection's (RFC 9110 §7.6.1): neither
    the caller's reaches the upstream nor the upstream's the caller."""
    base, upstream = served
    answer = _post(
        base,
        path,
        f"hop-{path}",
        b'{"model": "m", "input": "hi", "messages": [{"role": "user", "content": "hi"}]}',
        connection="keep-alive, X-Client-Hop",
        x_client_hop="client-connection-only",
        x_script="hop",
    )
    assert answer.status_code == 200
    assert "x-upstream-hop" not in answer.headers
    _, headers, _ = upstream.got(f"hop-{path}")
    assert "x-client-hop" not in dict(headers)
    assert dict(headers)["x-script"] == "hop"  # the others go as they came


def test_the_access_log_shows_no_key(tmp_path: Path) -> None:
    """At ``--log-level info`` uvicorn's access log writes each request line: a key in its
    query string (Google's ``?key=``, Azure's ``?api-key=``) is redacted there."""
    google, azure = "AIzaSyD-SECRETSECRETSECRET0123456789", "sk-azure-SECRET-0123456789"
    with _serve(tmp_path, log_level="info") as (base, _, log):
        for target in (f"/v1beta/models/m:generateContent?key={google}", f"/v1/m?api-key={azure}"):
            assert httpx.get(f"{base}{target}", timeout=60).status_code == 200
    text = log.read_text()  # whole: the process has ended
    assert google not in text
    assert azure not in text
    assert "generateContent?key=*** HTTP/1.1" in text
    assert "/v1/m?api-key=*** HTTP/1.1" in text


def test_the_access_log_shows_no_key_under_any_secret_name(tmp_path: Path) -> None:
    """Azure API Management's ``subscription-key``, Azure Functions' ``code``, an
    ``auth_token``, a SAS ``sig``: a parameter whose name ends in a secret word is masked in the
    access log; other parameters stay."""
    canary = "QUERYCANARY7777777"
    names = ("subscription-key", "code", "auth_token", "sig", "X-Api-Key")
    with _serve(tmp_path, log_level="info") as (base, _, log):
        for name in names:
            target = f"/v1/m?api-version=2024-06-01&{name}={canary}"
            assert httpx.get(f"{base}{target}", timeout=60).status_code == 200
    text = log.read_text()  # whole: the process has ended
    assert canary not in text
    for name in names:
        assert f"/v1/m?api-version=2024-06-01&{name}=*** HTTP/1.1" in text
