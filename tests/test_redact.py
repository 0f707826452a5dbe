"""Redaction: the registry of secret values, the patterns, and every channel text leaves by.

Each test invents its own secret (never registered before, not shaped like any known key), so
it proves the mechanism it names, not that some earlier test happened to register the value.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import pickle
import random
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentguard as ag
from agentguard import _redact, cli
from agentguard._redact import (
    REDACTED,
    redact,
    redact_content,
    redact_data,
    register_credentials,
    register_secret,
)
from agentguard.events import GuardInternalError, StoreFallback, log_event
from agentguard.guard import Guard
from agentguard.resilience import Classification, ErrorClass, classify
from agentguard.testing import FakeClock, Fault, ScriptedModel, capture_events
from agentguard.transport import ModelRequest


def _secret() -> str:
    """A secret no test has seen and no pattern knows (plain letters and digits)."""
    return f"zq{uuid.uuid4().hex}"


def _texts(*values: Any) -> str:
    out = []
    for value in values:
        out += [str(value), repr(value)]
        if isinstance(value, BaseException):
            out += [str(a) for a in value.args]
    return "\n".join(out)


# -- the registry -----------------------------------------------------------------------------


def test_a_registered_value_is_redacted_wherever_it_appears() -> None:
    secret = _secret()
    assert redact(f"invalid key {secret}") == f"invalid key {secret}"  # unknown: kept
    register_secret(secret)
    assert redact(f"invalid key {secret}, again {secret}!") == "invalid key ***, again ***!"


def test_short_and_non_string_values_are_not_registered() -> None:
    """A short value would redact common words; None / numbers are what callers have."""
    before = _redact._known
    for value in (None, 12345678, "", "hunter2", "x" * (_redact.MAX_SECRET_LENGTH + 1)):
        register_secret(value)
    assert _redact._known is before
    assert redact("hunter2 was here") == "hunter2 was here"


def test_registering_a_known_value_again_changes_nothing() -> None:
    secret = _secret()
    register_secret(secret)
    snapshot = _redact._known
    register_secret(secret)
    assert _redact._known is snapshot


def test_the_longest_secret_wins_where_one_contains_another() -> None:
    short = _secret()
    long = f"{short}{_secret()}"
    register_secret(short)
    register_secret(long)
    assert redact(f"[{long}]") == "[***]"


def test_the_registry_is_bounded_oldest_forgotten_first() -> None:
    first = _secret()
    register_secret(first)
    for _ in range(_redact.MAX_SECRETS):
        register_secret(_secret())
    assert len(_redact._known.values) == _redact.MAX_SECRETS
    assert first not in _redact._known.members


def test_concurrent_registration_loses_no_value() -> None:
    """Copy-on-write under a lock: threads registering at once all end up redacted."""
    values = [_secret() for _ in range(64)]
    barrier = threading.Barrier(8)

    def work(part: list[str]) -> None:
        barrier.wait()
        for v in part:
            register_secret(v)
            redact(v)  # readers run while writers swap the snapshot

    threads = [threading.Thread(target=work, args=(values[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(redact(v) == REDACTED for v in values)


def test_credential_headers_are_registered_with_their_token() -> None:
    token, azure, plain = _secret(), _secret(), _secret()
    register_credentials(
        {"Authorization": f"Bearer {token}", "api-key": azure, "x-request-id": plain}
    )
    assert redact(f"{token} {azure}") == "*** ***"
    assert redact(plain) == plain  # not a credential header


# -- the patterns -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://:pw-1@localhost:6379/0", "redis://:***@localhost:6379/0"),
        ("redis://default:pw-1@h:6380/2", "redis://default:***@h:6380/2"),
        ("https://TOKEN123@github.com/x", "https://***@github.com/x"),
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("https://h/p?user=a&password=pw-1&db=2", "https://h/p?user=a&password=***&db=2"),
        ("key sk-abcdefghijklmnop", "key ***"),
    ],
)
def test_patterns_mask_urls_and_keys_keeping_the_rest(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_a_long_text_without_credentials_is_redacted_in_one_pass() -> None:
    """The URL pattern starts at a literal '://': a long text has no quadratic case."""
    text = "a://" + "x" * 200_000 + " b://" + "y:" * 50_000
    assert redact(text) == text


def test_redact_data_redacts_every_string_of_plain_data() -> None:
    secret = _secret()
    register_secret(secret)
    data = {"a": [secret, {"url": "redis://:p4ssw0rd@h:1/0"}], "n": 5}
    assert redact_data(data) == {"a": [REDACTED, {"url": "redis://:***@h:1/0"}], "n": 5}


# -- the channels ------------------------------------------------------------------------------


def test_channel_exception_messages() -> None:
    """Every AgentGuardError's message, whoever built it, is redacted (str, repr, args,
    and after pickling)."""
    secret = _secret()
    register_secret(secret)
    errors = [
        ag.StoreUnavailable(f"cannot reach redis://:{secret}@h:1/0"),
        ag.ModelError(f"invalid key {secret}", status_code=503),
        ag.ModelTimeout(f"no answer for {secret}"),
        ag.LoopDetected(f"loop on {secret}", detector="d", count=3),
    ]
    for error in errors:
        again = pickle.loads(pickle.dumps(error))
        assert secret not in _texts(error, again)


def test_channel_events_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    """An event's free text is redacted when it is made: hooks and the log never see it."""
    secret = _secret()
    register_secret(secret)
    caplog.set_level(logging.DEBUG, logger="agentguard")
    events = [
        GuardInternalError(component="c", error_type="E", message=f"boom {secret}"),
        StoreFallback(store="redis", error_type="E", message=f"down {secret}"),
    ]
    for event in events:
        log_event(event)
    assert secret not in _texts(*events, *(e.to_dict() for e in events), caplog.text)


def test_channel_classification_reasons_including_a_callers_classifier() -> None:
    secret = _secret()
    register_secret(secret)
    exc = RuntimeError(f"upstream said {secret}")
    assert secret not in classify(exc).reason

    def mine(e: BaseException) -> Classification:
        return Classification.of(ErrorClass.TRANSIENT, reason=str(e))

    assert secret not in classify(exc, classifiers=(mine,)).reason


def _two_tiers(**extra: Any) -> ag.GuardConfig:
    return ag.GuardConfig.from_dict(
        {
            "tiers": {"fast": {"model": "m", **extra}, "big": {"model": "l", **extra}},
            "escalation": {"chain": ["fast", "big"], "max_retries_before_escalate": 1},
            "memory_pressure": {"enabled": False},
        },
        env={},
    )


def test_channel_report_attempts_for_a_credential_header_echoed_upstream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key sent in a request header (an Azure ``api-key``) and echoed by a 503: the guard's
    error, its attempts, events and logs do not repeat it."""
    secret = _secret()
    model = ScriptedModel([Fault.server_error(503, f"invalid api-key {secret}")], cycle=True)
    clock = FakeClock()
    guard = Guard(model, _two_tiers(), clock=clock, sleep=clock.sleep, rng=random.Random(0))
    request = ModelRequest(
        model="fast", messages=[{"role": "user", "content": "hi"}], headers={"api-key": secret}
    )
    caplog.set_level(logging.DEBUG, logger="agentguard")
    with capture_events() as events, pytest.raises(ag.TiersExhausted) as caught:
        guard.complete(request)
    assert caught.value.attempts[-1].detail  # the history is there, its details redacted
    assert secret not in _texts(caught.value, caught.value.attempts, list(events), caplog.text)


def test_channel_tier_key_read_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key a tier's ``api_key_env`` names is registered when the config is loaded."""
    secret = _secret()
    monkeypatch.setenv("AG_TEST_TIER_KEY", secret)
    _two_tiers(api_key_env="AG_TEST_TIER_KEY")
    assert redact(f"echo {secret}") == "echo ***"


def test_channel_config_show_and_repr(tmp_path: Path) -> None:
    """``config show`` (YAML and JSON) and ``repr(GuardConfig)``: the Redis password masked,
    scheme, host, port and database kept."""
    password = _secret()
    url = f"redis://user:{password}@cache.internal:6380/3"
    path = tmp_path / "c.yaml"
    path.write_text(f"storage: {{backend: redis, url: '{url}'}}\n")
    for extra in ([], ["--json"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(["config", "show", str(path), *extra]) == 0
        assert password not in out.getvalue()
        assert "redis://user:***@cache.internal:6380/3" in out.getvalue()
    config = ag.GuardConfig.from_file(path, env={})
    assert password not in _texts(config, config.storage)
    assert "redis://user:***@cache.internal:6380/3" in repr(config.storage)
    assert config.storage.url == url  # the value itself is untouched: the store needs it


# -- configured secrets, names in free text, structured content, exceptions --------------------


def test_a_configured_secret_outlives_any_number_of_caller_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tier's key (read from its ``api_key_env`` as the configuration loads) and a storage
    URL's password are registered as configured: the bounded list of per-request keys (a proxy
    registers each caller's) never forgets them."""
    tier_key, password, caller = _secret(), _secret(), _secret()
    monkeypatch.setenv("AG_TEST_PINNED_KEY", tier_key)
    _two_tiers(api_key_env="AG_TEST_PINNED_KEY")
    ag.GuardConfig.from_dict(
        {"storage": {"backend": "redis", "url": f"redis://:{password}@h:6379/0"}}, env={}
    )
    register_secret(caller)
    for _ in range(2 * _redact.MAX_SECRETS):
        register_secret(_secret())
    assert redact(f"{tier_key} {password}") == "*** ***"
    assert redact(caller) == caller  # a per-request key: the oldest goes first
    assert len(_redact._known.values) == _redact.MAX_SECRETS


def test_a_value_registered_again_as_configured_is_kept_for_good() -> None:
    value = _secret()
    register_secret(value)
    register_secret(value, configured=True)
    assert value in _redact._known.configured
    assert value not in _redact._known.values
    for _ in range(_redact.MAX_SECRETS):
        register_secret(_secret())
    assert redact(value) == REDACTED


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("OPENAI_API_KEY=Zq8mW3xK9pL2vN7rT4 python run.py", "OPENAI_API_KEY=*** python run.py"),
        ("export GITHUB_TOKEN=abcd1234efgh5678", "export GITHUB_TOKEN=***"),
        ("curl -H 'X-Api-Key: 77aa88bb99cc00dd' https://h/v1", "curl -H 'X-Api-Key: ***' https://h/v1"),
        ("aws configure set aws_secret_access_key wJalrXUtnFEMI7K", "aws configure set aws_secret_access_key ***"),
        ("tool --api-key a1b2c3d4e5f6 --verbose", "tool --api-key *** --verbose"),
        ("login --password=hunter2", "login --password=***"),
        ('{"password": "hunter2", "user": "bob"}', '{"password": "***", "user": "bob"}'),
        ('{"token": "a\\"b", "n": 1}', '{"token": "***", "n": 1}'),
        ("DB_PASSWORD='correct horse'", "DB_PASSWORD='***'"),
        ("client_secret: 9f8e7d6c5b4a", "client_secret: ***"),
        # prose, code and ordinary commands keep their words
        ("the token expired, so the password was reset", "the token expired, so the password was reset"),
        ("Password: Required", "Password: Required"),
        ("token = get_token()", "token = get_token()"),
        ("def login(password: str) -> None", "def login(password: str) -> None"),
        ("max_tokens=100 token_budget=5 tokens: 12345678", "max_tokens=100 token_budget=5 tokens: 12345678"),
        ("AWS_ACCESS_KEY_ID=AKIAEXAMPLE1234", "AWS_ACCESS_KEY_ID=AKIAEXAMPLE1234"),
        ("git commit -m 'rotate the api key'", "git commit -m 'rotate the api key'"),
        ("echo $OPENAI_API_KEY | wc -c", "echo $OPENAI_API_KEY | wc -c"),
    ],
)  # fmt: skip
def test_the_value_of_a_secret_looking_name_is_masked_in_free_text(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("?subscription-key=Q1&q=2", "?subscription-key=***&q=2"),
        ("?code=Q1", "?code=***"),
        ("&auth_token=Q1", "&auth_token=***"),
        ("?sv=2024&sig=Q1%3D&se=x", "?sv=2024&sig=***&se=x"),
        ("?X-Api-Key=Q1", "?X-Api-Key=***"),
        ("?api-version=2024-06-01&model=m", "?api-version=2024-06-01&model=m"),
    ],
)
def test_a_query_parameter_named_as_a_secret_is_masked(query: str, shown: str) -> None:
    """Azure API Management's ``subscription-key``, Azure Functions' ``code``, a SAS ``sig``:
    any parameter whose name ends in a secret word."""
    assert redact(f"POST /v1/chat/completions{query} HTTP/1.1") == (
        f"POST /v1/chat/completions{shown} HTTP/1.1"
    )


def test_redact_content_masks_secret_keys_also_inside_json_text() -> None:
    """Tool arguments and results that are JSON text: the values under secret-looking keys
    (nested ones whole), as in a mapping; text that holds none is kept as it came."""
    arguments = json.dumps({"user": "bob", "auth": {"password": "pw", "n": 1}, "api_key": "k1"})
    content = {
        "arguments": arguments,
        "client_secret": {"a": "b"},
        "result": '{"items": [{"token": 42}]}',
        "plain": '{"query":  "x"}',
        "broken": '{"password": "cut off',
    }
    assert redact_content(content) == {
        "arguments": '{"user": "bob", "auth": {"password": "***", "n": 1}, "api_key": "***"}',
        "client_secret": REDACTED,
        "result": '{"items": [{"token": "***"}]}',
        "plain": '{"query":  "x"}',
        "broken": '{"password": "cut off',
    }
    too_long = json.dumps({"password": "z", "pad": "x" * _redact.MAX_JSON_CHARS})
    assert redact_content(too_long) == redact(too_long)  # not parsed: redacted as text


def _chained(secret: str) -> RuntimeError:
    try:
        raise ValueError(f"upstream said: invalid key {secret}")
    except ValueError as inner:
        outer = RuntimeError("failed", 3)
        outer.message = f"see {secret}"  # type: ignore[attr-defined]
        outer.__cause__ = inner
        return outer


def test_redact_exception_redacts_the_chain_keeping_type_and_cause() -> None:
    secret = _secret()
    register_secret(secret)
    exc = _chained(secret)
    _redact.redact_exception(exc)
    assert exc.args == ("failed", 3)
    assert exc.message == "see ***"  # type: ignore[attr-defined]
    assert isinstance(exc.__cause__, ValueError)
    assert str(exc.__cause__) == "upstream said: invalid key ***"


# -- properties --------------------------------------------------------------------------------

# text made of words, separators and names, secret-looking or not
_WORDS = st.sampled_from(
    ["token", "API_KEY", "password", "x-api-key", "tokens", "key", "value", "hunter2", "a1b2c3d4e5",
     "sk-abcdefgh12345", "=", ":", " ", "'", '"', "?", "&", "--", "\n", "https://u:p@h/", "***"]
)  # fmt: skip
_TEXTS = st.lists(_WORDS, max_size=30).map("".join) | st.text(max_size=80)
# text that holds no secret-looking name, value or query: redact keeps it as it is
_PLAIN = st.text(
    alphabet=st.sampled_from(list("abcdfghijlmnoqruvwxyz0123456789 .,:=-_'\"\n")), max_size=120
)


@given(text=_TEXTS)
@settings(max_examples=300, deadline=None)
def test_redact_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


@given(text=_PLAIN)
@settings(max_examples=300, deadline=None)
def test_redact_keeps_text_without_secrets_as_it_is(text: str) -> None:
    assert redact(text) == text
    assert redact_content(text) == text


@given(data=st.recursive(
    st.text(max_size=20) | st.integers(),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["a", "token", "api_key", "n", "password"]), inner, max_size=4),
    max_leaves=12,
))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_redact_content_is_idempotent_and_masks_every_secret_key(data: Any) -> None:
    once = redact_content(data)
    assert redact_content(once) == once
    as_text = redact_content(json.dumps(data))
    assert redact_content(as_text) == as_text


@pytest.mark.parametrize(
    "text",
    [
        "token " * 40_000,
        "a" * 200_000 + "_token",
        ("x_api_key=" * 20_000),
        'password: "' + "x" * 200_000,
        "?" + "a" * 100_000 + "key" * 30_000,
        "-" * 100_000 + "secret" + " 1" * 50_000,
        "TOKEN" * 50_000 + "=v",
    ],
)
def test_adversarial_texts_are_redacted_in_linear_time(text: str) -> None:
    """Each start of a name or parameter reads over its own run only: texts that would make
    a backtracking pattern quadratic finish (a quadratic pass over these would take minutes)."""
    once = redact(text)
    assert redact(once) == once
