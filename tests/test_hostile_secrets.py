"""Hostile battery: a canary secret never leaves the guard.

The canary is configured as a tier's API key (through the environment variable the tier names),
as the wrapped client's key, and as a Redis URL password; upstreams echo it in error bodies.
It must never appear in logs, events, reports, the guard's exceptions (text and ``repr``) or
``config show``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentguard as ag
from _hostile import (
    BASE_URL,
    CANARY,
    MESSAGES,
    TOOLS,
    RawUpstream,
    assert_no_canary,
    assert_only,
    call,
    cases,
    completion,
    encode,
    http,
    openai,
    outcome,
)
from agentguard import cli
from agentguard.config import StorageConfig
from agentguard.storage import RedisStore
from agentguard.testing import FakeClock, capture_events

JSON = "application/json"
UNREACHABLE = f"redis://:{CANARY}@127.0.0.1:1/0"


def _tier_config() -> ag.GuardConfig:
    return ag.GuardConfig.from_dict(
        {
            "tiers": {
                "fast": {"model": "small", "api_key_env": "HOSTILE_TIER_KEY"},
                "big": {"model": "large", "api_key_env": "HOSTILE_TIER_KEY"},
            },
            "escalation": {"chain": ["fast", "big"], "max_retries_before_escalate": 1},
            "memory_pressure": {"enabled": False},
        },
        env={},
    )


def _client(upstream: RawUpstream, config: ag.GuardConfig) -> Any:
    raw = openai.OpenAI(
        api_key="sk-not-the-canary",
        base_url=BASE_URL,
        max_retries=0,
        http_client=http.Client(transport=upstream.transport()),
    )
    clock = FakeClock()
    return ag.wrap(raw, config, clock=clock, sleep=clock.sleep)


def _shown(got: Any, events: Any, caplog: pytest.LogCaptureFixture) -> list[Any]:
    """Everything the guard showed: its error, attempts, report, events and logs."""
    shown: list[Any] = [caplog.text, [repr(e) for e in events]]
    if isinstance(got.error, ag.AgentGuardError):
        shown += [got.error, getattr(got.error, "attempts", None)]
    elif got.error is None:
        shown.append(ag.report_of(got.value))
    return shown


@pytest.fixture
def tier_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The canary as the tiers' API key, in the variable they name."""
    monkeypatch.setenv("HOSTILE_TIER_KEY", CANARY)
    return CANARY


@pytest.mark.parametrize("status", [400, 401, 429, 500, 503])
def test_a_tier_key_is_never_shown_on_failure(
    status: int, tier_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A tier's key, sent upstream, is not in anything the guard shows when the tier fails."""
    body = json.dumps({"error": {"message": "service says no"}}).encode()
    client = _client(RawUpstream([(status, JSON, body)]), _tier_config())
    caplog.set_level(logging.DEBUG)
    with capture_events() as events:
        got = outcome(lambda: client.chat.completions.create(model="fast", messages=MESSAGES))
    assert got.error is not None
    assert_no_canary(*_shown(got, events, caplog))


ERROR_FIELDS = ["message", "type", "code", "param"]


def _error_body(field: str, prefix: str, status: int) -> tuple[int, bytes]:
    error = {"message": "x", field: f"{prefix}{CANARY}"}
    return status, json.dumps({"error": error}).encode()


error_bodies = st.builds(
    _error_body,
    st.sampled_from(ERROR_FIELDS),
    st.sampled_from(["", "key=", "Incorrect API key provided: ", "Bearer "]),
    st.sampled_from([400, 401, 403, 404, 422]),
)


@cases(150)
@given(answer=error_bodies)
def test_a_client_error_echoing_the_tier_key_passes_through_unrepeated(
    answer: tuple[int, bytes], tier_key: str
) -> None:
    """A 4xx echoing the key anywhere in its body: the SDK's own error passes through, and the
    guard's events carry no copy of it."""
    status, body = answer
    client = _client(RawUpstream([(status, JSON, body)]), _tier_config())
    with capture_events() as events:
        got = outcome(lambda: client.chat.completions.create(model="fast", messages=MESSAGES))
    assert got.error is not None
    assert_only(got.error, openai.APIStatusError)
    assert_no_canary([repr(e) for e in events])


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_a_retryable_error_echoing_the_tier_key_is_redacted(
    status: int, tier_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 5xx/429 echoing the tier's key: every attempt and the final error redact it."""
    body = json.dumps({"error": {"message": f"invalid key {CANARY}"}}).encode()
    client = _client(RawUpstream([(status, JSON, body)]), _tier_config())
    caplog.set_level(logging.DEBUG)
    with capture_events() as events:
        got = outcome(lambda: client.chat.completions.create(model="fast", messages=MESSAGES))
    assert isinstance(got.error, ag.AgentGuardError)
    assert_no_canary(*_shown(got, events, caplog))


@pytest.mark.parametrize("status", [401, 500, 503])
def test_a_logged_traceback_holds_no_tier_key_echoed_upstream(status: int, tier_key: str) -> None:
    """``logger.exception`` prints the whole chain: the guard's error and the upstream error
    chained to it (``__cause__``, still the SDK's own, its status kept), whose message is the
    body that echoed the tier's key. Neither prints the key."""
    body = json.dumps({"error": {"message": f"invalid key {CANARY}"}}).encode()
    client = _client(RawUpstream([(status, JSON, body)]), _tier_config())
    got = outcome(lambda: client.chat.completions.create(model="fast", messages=MESSAGES))
    assert got.error is not None
    log = io.StringIO()
    logger = logging.getLogger("hostile.app")
    logger.addHandler(handler := logging.StreamHandler(log))
    try:
        try:
            raise got.error
        except Exception:
            logger.exception("agent step failed")
    finally:
        logger.removeHandler(handler)
    assert_no_canary([log.getvalue()])
    upstream = got.error.__cause__ if isinstance(got.error, ag.TiersExhausted) else got.error
    assert isinstance(upstream, openai.APIStatusError)
    assert upstream.status_code == status


def test_a_redis_password_is_not_shown_when_the_store_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis unreachable (fail-open): the fallback event, logs and ``repr`` carry no password."""
    caplog.set_level(logging.DEBUG)
    store = RedisStore(UNREACHABLE, key_prefix="hostile", timeout=0.2)
    config = ag.GuardConfig(storage=StorageConfig(backend="redis", url=UNREACHABLE))
    with capture_events() as events:
        ledger = ag.TokenLedger(config, store=store, clock=FakeClock())
        ledger.commit(ledger.reserve("s", 5), 5)
    assert ledger.degraded
    assert_no_canary(caplog.text, [repr(e) for e in events], store, ledger)
    store.close()


def test_a_redis_password_is_not_in_store_unavailable() -> None:
    """Redis unreachable (fail-closed): ``StoreUnavailable`` carries no password."""
    store = RedisStore(UNREACHABLE, key_prefix="hostile", timeout=0.2)
    config = ag.GuardConfig(
        storage=StorageConfig(backend="redis", url=UNREACHABLE, fail_mode="closed")
    )
    ledger = ag.TokenLedger(config, store=store, clock=FakeClock())
    with pytest.raises(ag.StoreUnavailable) as caught:
        ledger.reserve("s", 5)
    assert_no_canary(caught.value)
    store.close()


def test_config_show_never_prints_a_tier_key(tier_key: str, tmp_path: Any) -> None:
    """``config show`` with the key in the environment: names the variable, not the key."""
    path = tmp_path / "tiers.yaml"
    path.write_text(
        "tiers:\n  fast: {model: small, api_key_env: HOSTILE_TIER_KEY}\n"
        "escalation: {chain: [fast]}\n"
    )
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["config", "show", str(path)])
    assert code == 0
    assert "HOSTILE_TIER_KEY" in out.getvalue()
    assert_no_canary(out.getvalue(), err.getvalue())


def test_a_successful_call_report_never_holds_the_key(
    tier_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A healthy call through a keyed tier: its report, events and logs hold no key."""
    answers = [
        (
            200,
            JSON,
            encode(completion(content=None, finish="tool_calls", tool_calls=[call("read_fil")])),
        ),
        (200, JSON, encode(completion(content=None, finish="tool_calls", tool_calls=[call()]))),
    ]
    client = _client(RawUpstream(answers), _tier_config())
    caplog.set_level(logging.DEBUG)
    with capture_events() as events:
        got = outcome(
            lambda: client.chat.completions.create(model="fast", messages=MESSAGES, tools=TOOLS)
        )
    assert got.error is None, got
    assert_no_canary(*_shown(got, events, caplog))
