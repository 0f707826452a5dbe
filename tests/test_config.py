"""GuardConfig: loading from dicts and files, environment overrides, precise errors."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard import ConfigError, GuardConfig
from agentguard.config import EscalationConfig, LoopDetectionConfig, TokenBudgetConfig


def test_defaults_match_the_documented_reliability_block() -> None:
    """An empty config gives the documented defaults of ARCHITECTURE §5."""
    cfg = GuardConfig.from_dict({}, env={})
    assert cfg.fail_mode == "open"
    assert cfg.loop_detection.window_size == 10
    assert cfg.loop_detection.duplicate_threshold == 3
    assert cfg.token_budget.per_session == 500_000
    assert cfg.token_budget.policy == "warn_and_continue"
    assert cfg.storage.backend == "memory"


def test_reliability_key_is_optional() -> None:
    """The mapping may or may not be wrapped in a top-level ``reliability`` key."""
    inner = {"token_budget": {"per_session": 10}}
    assert GuardConfig.from_dict({"reliability": inner}, env={}) == GuardConfig.from_dict(
        inner, env={}
    )


def test_error_names_path_value_and_allowed_values() -> None:
    """A bad value is reported with its full key path, the value and what is allowed."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict({"reliability": {"token_budget": {"policy": "explode"}}}, env={})
    (problem,) = info.value.problems
    assert problem["path"] == "reliability.token_budget.policy"
    assert problem["value"] == "explode"
    assert "hard_stop" in problem["allowed"]
    assert "reliability.token_budget.policy" in str(info.value)


def test_all_problems_are_reported_at_once() -> None:
    """Every bad key is reported in one error, not one per run."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict(
            {"loop_detection": {"window_size": 0, "typo_key": 1}, "storage": {"backend": "s3"}},
            env={},
        )
    paths = {p["path"] for p in info.value.problems}
    assert paths == {
        "reliability.loop_detection.window_size",
        "reliability.loop_detection.typo_key",
        "reliability.storage.backend",
    }


def test_unknown_key_lists_the_allowed_keys() -> None:
    """A misspelt key is rejected with the keys that exist at that level."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict({"loop_detection": {"windowsize": 5}}, env={})
    assert "window_size" in info.value.problems[0]["allowed"]


def test_unknown_section_is_rejected() -> None:
    """A misspelt section name is an error, not silently ignored."""
    with pytest.raises(ConfigError, match="loop_detection"):
        GuardConfig.from_dict({"loop_detect": {}}, env={})


def test_cross_field_rule_is_reported_on_the_section() -> None:
    """warn_at <= critical_at <= break_at is enforced with a readable message."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict({"loop_detection": {"warn_at": 40}}, env={})
    assert info.value.problems[0]["path"] == "reliability.loop_detection"
    assert "warn_at <= critical_at <= break_at" in info.value.problems[0]["allowed"]


def test_storage_backend_needs_its_location() -> None:
    """sqlite needs a path and redis a URL."""
    with pytest.raises(ConfigError, match="needs 'path'"):
        GuardConfig.from_dict({"storage": {"backend": "sqlite"}}, env={})
    with pytest.raises(ConfigError, match="needs 'url'"):
        GuardConfig.from_dict({"storage": {"backend": "redis"}}, env={})


def test_top_level_must_be_a_mapping() -> None:
    """A config that is not a mapping gives a typed error."""
    with pytest.raises(ConfigError):
        GuardConfig.from_dict(["not", "a", "mapping"], env={})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        GuardConfig.from_dict({"reliability": 5}, env={})


def test_env_overrides_a_nested_key_with_parsed_value() -> None:
    """AGENTGUARD_SECTION__KEY overrides one key; values are parsed as YAML scalars."""
    env = {
        "AGENTGUARD_TOKEN_BUDGET__PER_SESSION": "1000",
        "AGENTGUARD_LOOP_DETECTION__ENABLED": "false",
        "AGENTGUARD_FAIL_MODE": "closed",
        "UNRELATED": "x",
    }
    cfg = GuardConfig.from_dict({"token_budget": {"per_session": 5, "per_hour": 99}}, env=env)
    assert cfg.token_budget.per_session == 1000
    assert cfg.token_budget.per_hour == 99
    assert cfg.loop_detection.enabled is False
    assert cfg.fail_mode == "closed"


def test_env_override_with_unknown_key_is_an_error() -> None:
    """A misspelt override variable is reported, not silently ignored."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict({}, env={"AGENTGUARD_TOKEN_BUDGET__PER_SESSON": "1"})
    assert info.value.problems[0]["path"] == "AGENTGUARD_TOKEN_BUDGET__PER_SESSON"


def test_env_override_with_bad_value_names_the_key() -> None:
    """A bad override value is reported at the key it overrides."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict({}, env={"AGENTGUARD_TOKEN_BUDGET__WARN_RATIO": "lots"})
    assert info.value.problems[0]["path"] == "reliability.token_budget.warn_ratio"


def test_env_is_read_from_the_process_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``env=``, overrides come from os.environ."""
    monkeypatch.setenv("AGENTGUARD_TOKEN_BUDGET__PER_HOUR", "77")
    assert GuardConfig.from_dict({}).token_budget.per_hour == 77


def test_secret_looking_env_values_are_redacted_in_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unknown override whose name looks secret never shows its value, error or warning."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict({}, env={"AGENTGUARD_STORAGE__API_KEY": "sk-canary-1234567890"})
    assert "sk-canary" not in str(info.value)
    with caplog.at_level("WARNING", logger="agentguard.config"):
        GuardConfig.from_dict({}, env={"AGENTGUARD_API_KEY": "sk-canary-1234567890"})
    assert "AGENTGUARD_API_KEY" in caplog.text
    assert "sk-canary" not in caplog.text


YAML = """
reliability:
  loop_detection: {window_size: 12}
  token_budget:
    per_session: 1234
    policy: hard_stop
"""
TOML = """
[reliability.loop_detection]
window_size = 12

[reliability.token_budget]
per_session = 1234
policy = "hard_stop"
"""


@pytest.mark.parametrize(("name", "text"), [("a.yaml", YAML), ("a.yml", YAML), ("a.toml", TOML)])
def test_from_file_reads_yaml_and_toml(tmp_path: Path, name: str, text: str) -> None:
    """YAML and TOML files give the same config."""
    path = tmp_path / name
    path.write_text(text)
    cfg = GuardConfig.from_file(path, env={})
    assert cfg.loop_detection.window_size == 12
    assert cfg.token_budget.per_session == 1234
    assert cfg.token_budget.policy == "hard_stop"


def test_from_file_reads_json(tmp_path: Path) -> None:
    """A JSON file is accepted too."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"storage": {"backend": "sqlite", "path": "x.db"}}))
    assert GuardConfig.from_file(path, env={}).storage.path == "x.db"


def test_from_file_errors_name_the_file(tmp_path: Path) -> None:
    """Parse and validation errors say which file they come from."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("reliability: [unclosed")
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        GuardConfig.from_file(broken, env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[reliability.token_budget]\nper_session = -1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml") as info:
        GuardConfig.from_file(bad, env={})
    assert info.value.problems[0]["path"] == "reliability.token_budget.per_session"


def test_missing_file_and_unknown_suffix_are_config_errors(tmp_path: Path) -> None:
    """A missing file or an unsupported format gives a ConfigError, not an OSError."""
    with pytest.raises(ConfigError, match="readable file"):
        GuardConfig.from_file(tmp_path / "nope.yaml")
    odd = tmp_path / "c.ini"
    odd.write_text("x")
    with pytest.raises(ConfigError, match=r"\.toml"):
        GuardConfig.from_file(odd)


def test_sections_are_immutable() -> None:
    """Config objects are frozen: a running guard's settings cannot change under it."""
    cfg = GuardConfig()
    with pytest.raises(ValueError, match="frozen"):
        cfg.token_budget.per_session = 1  # type: ignore[misc]


def test_to_dict_round_trips() -> None:
    """The effective config dumped by to_dict() loads back to an equal config."""
    cfg = GuardConfig.from_dict(
        {"token_budget": {"per_session": 42}, "loop_detection": {"enabled": False}}, env={}
    )
    assert GuardConfig.from_dict(cfg.to_dict(), env={}) == cfg


@given(
    window=st.integers(min_value=-5, max_value=50),
    warn=st.integers(min_value=-2, max_value=60),
)
def test_loop_thresholds_load_exactly_when_valid(window: int, warn: int) -> None:
    """Valid values load; anything else is a ConfigError (never another exception)."""
    data = {"loop_detection": {"window_size": window, "warn_at": warn}}
    if window >= 2 and 1 <= warn <= 20:
        cfg = GuardConfig.from_dict(data, env={})
        assert isinstance(cfg.loop_detection, LoopDetectionConfig)
        assert cfg.loop_detection.window_size == window
    else:
        with pytest.raises(ConfigError):
            GuardConfig.from_dict(data, env={})


def test_sections_can_be_built_directly() -> None:
    """Each section is a plain model usable on its own."""
    section = TokenBudgetConfig(per_session=10, policy="hard_stop")
    assert GuardConfig(token_budget=section).token_budget.per_session == 10


def test_configuration_reference_is_in_sync() -> None:
    """docs/configuration.md documents exactly the current settings (regenerate if this fails)."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "tools" / "gen_config_reference.py"
    spec = importlib.util.spec_from_file_location("gen_config_reference", script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.PAGE.read_text(encoding="utf-8")
    assert module.render(page) == page, "run: python tools/gen_config_reference.py"


def test_every_setting_has_a_description() -> None:
    """Every key of every section documents itself (the reference is generated from it)."""
    from pydantic import BaseModel

    for section_name, section in GuardConfig.model_fields.items():
        model = section.annotation
        if typing.get_origin(model) is dict:
            model = typing.get_args(model)[1]
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            assert section.description, section_name
            continue
        for key, field in model.model_fields.items():
            assert key == "enabled" or field.description, f"{section_name}.{key}"


# Everything `from agentguard.config import ...` offered before the module became a package.
_CONFIG_NAMES = (  # noqa: SIM905 - a record of the old surface, not a second __all__
    "ENV_PREFIX ConfigError EscalationConfig EscalationTrigger GuardConfig LoopDetectionConfig "
    "MemoryPressureConfig ModelPrice Section StorageConfig TierConfig TokenBudgetConfig "
    "ToolBreakerConfig ToolRetryConfig ToolTimeoutsConfig ToolValidationConfig ToolsConfig"
).split()


@pytest.mark.parametrize("name", _CONFIG_NAMES)
def test_public_names_import_from_agentguard_config(name: str) -> None:
    """Every public name of ``agentguard.config`` still imports from there."""
    import agentguard.config

    assert getattr(agentguard.config, name) is not None


def test_config_all_lists_its_public_names() -> None:
    """``agentguard.config.__all__`` is sorted and names everything public but the exception."""
    import agentguard.config

    assert agentguard.config.__all__ == sorted(agentguard.config.__all__)
    assert set(agentguard.config.__all__) == set(_CONFIG_NAMES) - {"ConfigError"}


# -- the seed's own block, aliases, suggestions, warnings, load() --------------------------------

SEED = Path(__file__).parent / "data" / "seed_reliability.yaml"


def test_the_seed_block_loads_as_written() -> None:
    """The requirements' ``reliability:`` block, verbatim, loads; cloud_fallback is its last tier."""
    cfg = GuardConfig.from_file(SEED, env={})
    assert cfg.loop_detection.similarity_threshold == 0.95
    assert cfg.token_budget.per_session == 500_000
    assert cfg.escalation.escalate_on == [
        "tool_validation_failure",
        "loop_detected",
        "timeout",
        "server_error",
    ]
    premium = cfg.tiers["premium"]  # the chain's last tier: "premium (cloud via OpenRouter)"
    assert premium.model == "anthropic/claude-sonnet-4-6"
    assert premium.base_url == "https://openrouter.ai/api/v1"
    assert premium.api_key_env == "OPENROUTER_API_KEY"
    # its local tiers are not defined in this block: config check says they are skipped
    assert any("not defined: fast, standard, longctx" in note for note in cfg.check())


def test_aliases_load_as_the_canonical_keys_in_canonical_units() -> None:
    """per_request_output, on_exceed and memory_monitor (fractions) are the canonical keys."""
    cfg = GuardConfig.from_dict(
        {
            "token_budget": {"per_request_output": 4096, "on_exceed": "hard_stop"},
            "memory_monitor": {
                "enabled": True,
                "warning_threshold": 0.85,
                "critical_threshold": 0.95,
                "psi_some_warning": 0.1,
                "sustained_seconds": 60,
            },
        },
        env={},
    )
    assert cfg.token_budget.max_output_tokens == 4096
    assert cfg.token_budget.policy == "hard_stop"
    assert cfg.memory_pressure.percent_warning == 85.0
    assert cfg.memory_pressure.percent_critical == 95.0
    assert cfg.memory_pressure.psi_some_warning == 10.0
    assert cfg.memory_pressure.sustained_seconds == 60.0
    assert "memory_monitor" not in cfg.to_dict()["reliability"]  # shown under canonical names


def test_an_alias_and_its_canonical_key_together_are_an_error() -> None:
    """Giving one setting twice, under both names, is refused rather than guessed."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict(
            {"token_budget": {"per_request_output": 1, "max_output_tokens": 2}}, env={}
        )
    assert info.value.problems[0]["path"] == "reliability.token_budget.per_request_output"
    assert "max_output_tokens" in info.value.problems[0]["allowed"]


def test_memory_monitor_thresholds_must_be_fractions() -> None:
    """A percent under memory_monitor (which takes fractions) is an error saying so."""
    with pytest.raises(ConfigError, match="a fraction between 0 and 1"):
        GuardConfig.from_dict({"memory_monitor": {"warning_threshold": 90}}, env={})


def test_cloud_fallback_provider_and_keys_are_checked() -> None:
    """An unknown provider or key of cloud_fallback is named, with the likely intended one."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict(
            {"escalation": {"cloud_fallback": {"provider": "openroute", "modle": "m"}}}, env={}
        )
    text = str(info.value)
    assert "did you mean 'model'?" in text
    assert "did you mean 'openrouter'?" in text


def test_cloud_fallback_with_base_url_needs_no_known_provider() -> None:
    """Any OpenAI-compatible endpoint can be the fallback; it becomes the chain's last tier."""
    cfg = GuardConfig.from_dict(
        {
            "tiers": {"local": {"model": "qwen"}},
            "escalation": {
                "chain": ["local", "cloud"],
                "cloud_fallback": {"base_url": "https://llm.example/v1", "model": "big"},
            },
        },
        env={},
    )
    assert cfg.tiers["cloud"].base_url == "https://llm.example/v1"
    assert cfg.check() == []
    with pytest.raises(ConfigError, match="already defined in tiers"):
        GuardConfig.from_dict(
            {
                "tiers": {"premium": {"model": "x"}},
                "escalation": {"cloud_fallback": {"model": "y"}},
            },
            env={},
        )


@pytest.mark.parametrize(
    ("data", "suggestion"),
    [
        ({"loop_detection": {"windowsize": 5}}, "did you mean 'window_size'?"),
        ({"token_budget": {"per_sesion": 5}}, "did you mean 'per_session'?"),
        ({"loop_detect": {}}, "did you mean 'loop_detection'?"),
        ({"token_budget": {"per_request_ouput": 5}}, "did you mean 'per_request_output'?"),
        ({"escalation": {"cloud_fallbak": {}}}, "did you mean 'cloud_fallback'?"),
        ({"memory_monitor": {"warning_treshold": 0.9}}, "did you mean 'warning_threshold'?"),
    ],
)
def test_unknown_keys_suggest_the_near_match(data: dict[str, Any], suggestion: str) -> None:
    """A misspelt key is answered with the key it most likely meant (aliases included)."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict(data, env={})
    assert suggestion in info.value.problems[0]["allowed"]


def test_env_variables_that_are_not_configuration_paths_are_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A user's own AGENTGUARD_WRAP=1 never breaks loading: ignored, with a warning."""
    with caplog.at_level("WARNING", logger="agentguard.config"):
        cfg = GuardConfig.from_dict(
            {}, env={"AGENTGUARD_WRAP": "1", "AGENTGUARD_FAIL_MOD": "closed"}
        )
    assert cfg == GuardConfig()
    assert "AGENTGUARD_WRAP is not a configuration key; ignored" in caplog.text
    assert "did you mean AGENTGUARD_FAIL_MODE?" in caplog.text


def test_env_misspelt_key_of_a_known_section_suggests_the_variable() -> None:
    """Under a real section a misspelt key stays an error, naming the intended variable."""
    with pytest.raises(ConfigError, match="did you mean AGENTGUARD_TOKEN_BUDGET__PER_SESSION"):
        GuardConfig.from_dict({}, env={"AGENTGUARD_TOKEN_BUDGET__PER_SESSON": "1"})


def test_check_warns_on_what_will_do_nothing() -> None:
    """No tiers, a chain of one, unused tiers, escalate with nowhere to go: each is named."""
    assert any("no tiers are defined" in n for n in GuardConfig().check())
    assert GuardConfig(escalation=EscalationConfig(enabled=False)).check() == []
    cfg = GuardConfig.from_dict(
        {
            "tiers": {"fast": {"model": "a"}, "spare": {"model": "b"}},
            "escalation": {"chain": ["fast"]},
            "token_budget": {"policy": "escalate"},
        },
        env={},
    )
    notes = "\n".join(cfg.check())
    assert "nowhere to escalate" in notes
    assert "never used: spare" in notes
    assert "no cheaper tier" in notes


def test_load_accepts_a_config_a_dict_a_path_or_the_environment(tmp_path: Path) -> None:
    """GuardConfig.load: an instance as it is; dict, path and None with the overrides."""
    built = GuardConfig(fail_mode="closed")
    env = {"AGENTGUARD_TOKEN_BUDGET__PER_HOUR": "77"}
    assert GuardConfig.load(built, env=env) is built
    assert GuardConfig.load({"fail_mode": "closed"}, env=env).token_budget.per_hour == 77
    path = tmp_path / "ag.yaml"
    path.write_text("reliability:\n  token_budget: {per_session: 9}\n")
    assert GuardConfig.load(path, env={}).token_budget.per_session == 9
    assert GuardConfig.load(str(path), env={}).token_budget.per_session == 9
    from_env = GuardConfig.load(None, env={"AGENTGUARD_CONFIG": str(path), **env})
    assert (from_env.token_budget.per_session, from_env.token_budget.per_hour) == (9, 77)
    assert GuardConfig.load(None, env={}) == GuardConfig()
    with pytest.raises(TypeError, match="a dict or a file path"):
        GuardConfig.load(42, env={})  # type: ignore[arg-type]


def test_config_check_prints_warnings_and_strict_fails_on_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``agentguard config check`` on the seed: ok, with warnings; ``--strict`` exits 2."""
    from agentguard.cli import main

    assert main(["config", "check", str(SEED)]) == 0
    out = capsys.readouterr()
    assert "ok (2 warning(s))" in out.out
    assert "warning: escalation.chain names tiers that are not defined" in out.err
    assert main(["config", "check", "--strict", str(SEED)]) == 2
