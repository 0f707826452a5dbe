"""Hostile battery: configuration data and files.

Properties: every configuration problem is a ``ConfigError`` at load time (never a
``UnicodeDecodeError``, never an accepted value that crashes a store later); loading costs
memory and work bounded by the file's size; a secret put anywhere in a configuration (a Redis
URL password, a raw key where a variable name belongs, a line with a syntax error) never appears
in an error, ``repr``, ``config show`` or ``config check``.
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentguard as ag
from _hostile import (
    CANARY,
    Scratch,
    alias_bomb,
    assert_no_canary,
    assert_only,
    bulk,
    cases,
    config_dicts,
    config_text,
    finishes,
    rand_json,
    seeds,
)
from agentguard import cli

# one directory for the whole module: hypothesis examples reuse it (no function-scoped fixture)
WORK = Scratch("ag-hostile-config-")


@pytest.fixture(scope="module", autouse=True)
def _remove_scratch() -> Iterator[None]:
    yield
    WORK.cleanup()


SUFFIXES = [".yaml", ".yml", ".toml", ".json", ""]


def _load_dict(data: Any, *, secrets: bool = False) -> ag.GuardConfig | None:
    """A config or ``None`` for a ConfigError; ``secrets``: the error must not show the canary."""
    try:
        return ag.GuardConfig.from_dict(data, env={})
    except ag.ConfigError as exc:
        if secrets:
            assert_no_canary(exc)
        return None


def _write(name: str, content: bytes | str) -> Path:
    path = WORK / name
    path.write_bytes(
        content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
    )
    return path


def _load_file(path: Path, *, secrets: bool = False) -> ag.GuardConfig | None:
    try:
        return finishes(lambda: ag.GuardConfig.from_file(path, env={}))
    except ag.ConfigError as exc:
        if secrets:
            assert_no_canary(exc)
        return None


def _cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue() + err.getvalue()


# -- data ---------------------------------------------------------------------------------------


@cases(1_000)
@given(data=config_dicts)
def test_any_mapping_is_a_config_or_a_config_error(data: dict[str, Any]) -> None:
    """Generated sections with hostile values: a config or a ConfigError, finite numbers."""
    config = _load_dict(data)
    if config is not None:
        for number in _numbers(config.to_dict()):
            assert math.isfinite(number), "an accepted non-finite number"


@cases(300)
@given(data=config_dicts)
def test_any_mapping_never_shows_a_secret(data: dict[str, Any]) -> None:
    """Generated sections holding Redis URLs with a password: errors never show it."""
    config = _load_dict(data, secrets=True)
    if config is not None:
        assert_no_canary(config)


def _numbers(value: Any) -> list[float]:
    out: list[float] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, float):
            out.append(item)
    return out


SECTION_KEYS = {
    "token_budget": ["per_session", "per_hour", "max_output_tokens", "policy", "scope"],
    "storage": ["backend", "url", "path", "timeout_seconds", "retry_seconds", "key_prefix"],
    "tools": ["sync_timeouts", "retry", "breaker", "retry_budget_per_turn"],
    "loop_detection": ["enabled", "window_size", "duplicate_threshold"],
    "escalation": ["chain", "mode", "max_retries_before_escalate"],
    "tool_validation": ["enabled", "max_corrections", "name_min_score"],
}


def _rand_config(rng: random.Random) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for section in rng.sample(sorted(SECTION_KEYS), rng.randint(1, 3)):
        keys = rng.sample(SECTION_KEYS[section], rng.randint(1, 2))
        data[section] = {k: rand_json(rng, 2) if rng.random() < 0.5 else _near(rng) for k in keys}
    return data


def _near(rng: random.Random) -> Any:
    """Values close to valid ones: where validators are most likely to let one through."""
    return rng.choice(
        [0, 1, -1, 1.5, 1e308, float("inf"), float("nan"), "memory", "redis", "hard_stop", True]
    )


@cases(300)
@given(seed=seeds)
def test_bulk_sections_are_a_config_or_a_config_error(seed: int) -> None:
    """20 generated configurations per seed (6,000 in all): a config, or a ConfigError."""
    bulk(seed, 20, _rand_config, _load_dict)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"storage": {"timeout_seconds": math.inf}}, id="storage-timeout-inf"),
        pytest.param({"storage": {"retry_seconds": math.inf}}, id="storage-retry-inf"),
        pytest.param({"storage": {"busy_timeout_seconds": math.inf}}, id="sqlite-busy-timeout-inf"),
        {"token_budget": {"per_session": math.inf}},
        {"token_budget": {"per_hour": math.nan}},
        pytest.param(
            {
                "tiers": {"fast": {"model": "m", "timeout": math.inf}},
                "escalation": {"chain": ["fast"]},
            },
            id="tier-timeout-inf",
        ),
    ],
)
def test_a_non_finite_number_is_a_config_error_at_load_time(data: dict[str, Any]) -> None:
    """``inf``/``nan`` wherever a number goes: rejected at load time, naming the key."""
    with pytest.raises(ag.ConfigError):
        ag.GuardConfig.from_dict(data, env={})


# -- files --------------------------------------------------------------------------------------


@cases(400)
@given(text=config_text, suffix=st.sampled_from(SUFFIXES))
def test_any_utf8_file_is_a_config_or_a_config_error(text: str, suffix: str) -> None:
    """Any text in any format: a config or a ConfigError, in bounded time."""
    data = text.encode("utf-8", "surrogatepass")
    if not _utf8(data):
        return  # covered by the non-UTF-8 test below
    _load_file(_write(f"c{suffix}", data))


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@cases(200)
@given(data=st.binary(min_size=1, max_size=64), suffix=st.sampled_from(SUFFIXES))
def test_any_bytes_are_a_config_or_a_config_error(data: bytes, suffix: str) -> None:
    """Any bytes, non-UTF-8 ones included: a config or a ConfigError."""
    try:
        _load_file(_write(f"b{suffix}", data))
    except Exception as exc:
        assert_only(exc)


@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".json"])
def test_a_non_utf8_file_is_a_config_error(suffix: str) -> None:
    """One byte that is not UTF-8: a ConfigError naming the file."""
    with pytest.raises(ag.ConfigError):
        ag.GuardConfig.from_file(_write(f"latin{suffix}", b"fail_mode: \xff\n"), env={})


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        "a: " + "[" * 5_000 + "]" * 5_000,
        "a: &a [*a]\n",
        "!!python/object:os.system {}\n",
    ],
    ids=["nested-100000", "nested-5000", "self-alias", "python-tag"],
)
def test_pathological_yaml_is_a_config_error(text: str) -> None:
    """Deep nesting, a self-referencing alias, a python tag: a ConfigError, in bounded time."""
    with pytest.raises(ag.ConfigError):
        finishes(lambda: ag.GuardConfig.from_file(_write("p.yaml", text), env={}))


def _peak_bytes(levels: int) -> int:
    path = _write(f"bomb{levels}.yaml", alias_bomb(levels))
    tracemalloc.start()
    try:
        with contextlib.suppress(ag.ConfigError):
            ag.GuardConfig.from_file(path, env={})
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_alias_bomb_costs_memory_bounded_by_the_file_size() -> None:
    """One more alias level (46 bytes, 9x the expanded leaves): about the same memory."""
    _peak_bytes(5)  # warm-up: first-use imports and caches are not the file's cost
    small, big = _peak_bytes(5), _peak_bytes(6)
    assert big <= 2 * small + 1_000_000, f"{small} bytes at 5 levels, {big} at 6"


# -- secrets --------------------------------------------------------------------------------------

REDIS_URL = f"redis://:{CANARY}@localhost:6379/0"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"tiers:\n  fast:\n    key: {CANARY}: x\n", id="mapping"),
        pytest.param(f"tiers: {{fast: {{model: {CANARY}\n", id="flow"),
        pytest.param(f'api_key: "{CANARY}\n', id="quote"),
        pytest.param(f"a:\n\tb: {CANARY}\n", id="tab"),
        pytest.param(f"x: {CANARY}\n  y: 1\n", id="indent"),
    ],
)
def test_a_yaml_syntax_error_never_shows_the_secret_on_its_line(text: str) -> None:
    """``config check`` of a broken file: the error names the place, never the line's secret."""
    code, shown = _cli("config", "check", str(_write("broken.yaml", text)))
    assert code == 1
    assert_no_canary(shown)


def test_a_key_in_api_key_env_is_not_echoed() -> None:
    """A key where a variable's NAME belongs: a ConfigError that does not repeat it."""
    with pytest.raises(ag.ConfigError) as caught:
        ag.GuardConfig.from_dict({"tiers": {"fast": {"model": "m", "api_key_env": CANARY}}}, env={})
    assert_no_canary(caught.value)


def test_a_redis_password_is_not_in_the_config_repr() -> None:
    """``repr``/``str`` of a config holding a Redis URL: the password redacted."""
    config = ag.GuardConfig.from_dict({"storage": {"backend": "redis", "url": REDIS_URL}}, env={})
    assert_no_canary(config, config.storage)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_redis_password_is_not_in_config_show(as_json: bool) -> None:
    """``agentguard config show``: the password redacted (YAML and JSON)."""
    path = _write("redis.yaml", f"storage:\n  backend: redis\n  url: {REDIS_URL}\n")
    code, shown = _cli("config", "show", str(path), *(["--json"] if as_json else []))
    assert code == 0
    assert_no_canary(shown)


@pytest.mark.parametrize(
    "data",
    [
        {"storage": REDIS_URL},
        {"storage": {"backend": "redis", "url": REDIS_URL, "unknown": 1}},
        {"storage": {"backend": "redis", "url": REDIS_URL, "key_prefix": 5}},
        {"storage": {"backend": "sqlite", "url": REDIS_URL}},
        {"storage": {"backend": "redis", "url": [REDIS_URL]}},
        {"reliability": REDIS_URL},
    ],
    ids=["section", "unknown-key", "bad-prefix", "wrong-backend", "url-a-list", "root"],
)
def test_a_redis_password_is_not_in_a_config_error(data: dict[str, Any]) -> None:
    """A configuration error next to (or about) a Redis URL: the password redacted."""
    with pytest.raises(ag.ConfigError) as caught:
        ag.GuardConfig.from_dict(data, env={})
    assert_no_canary(caught.value)


@pytest.mark.parametrize(
    "variable",
    ["AGENTGUARD_STORAGE__URL", "AGENTGUARD_FAIL_MODE"],
)
def test_a_secret_in_an_override_variable_is_not_echoed(variable: str) -> None:
    """An ``AGENTGUARD_*`` override holding a secret: not in the error nor in ``repr``."""
    env = {variable: REDIS_URL, "AGENTGUARD_STORAGE__BACKEND": "redis"}
    try:
        config = ag.GuardConfig.from_dict({}, env=env)
    except ag.ConfigError as exc:
        assert_no_canary(exc)
    else:
        if variable != "AGENTGUARD_STORAGE__URL":
            assert_no_canary(config)
