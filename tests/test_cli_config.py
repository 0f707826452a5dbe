"""``agentguard config check|show`` run as real commands on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

import agentguard

SRC = str(Path(agentguard.__file__).resolve().parent.parent)


def config(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m agentguard config ...`` with only the given AGENTGUARD_* variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTGUARD_")}
    return subprocess.run(
        [sys.executable, "-m", "agentguard", "config", *map(str, args)],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": SRC, **env},
        check=False,
        timeout=120,
    )


def test_check_accepts_a_valid_file(tmp_path: Path) -> None:
    """A valid YAML file passes: exit 0 and 'ok'."""
    path = tmp_path / "agentguard.yaml"
    path.write_text("reliability:\n  token_budget: {per_session: 100000, policy: hard_stop}\n")
    proc = config("check", path)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_check_names_every_bad_key(tmp_path: Path) -> None:
    """Each problem is reported with its key path, value and what is allowed; exit 1."""
    path = tmp_path / "bad.toml"
    path.write_text(
        "[reliability.loop_detection]\nwindow_size = 1\n\n"
        '[reliability.token_budget]\npolicy = "explode"\nper_sesion = 5\n'
    )
    proc = config("check", path)
    assert proc.returncode == 1
    for expected in (
        "reliability.loop_detection.window_size",
        "reliability.token_budget.policy",
        "explode",
        "reliability.token_budget.per_sesion",
        "per_session",  # the allowed keys are listed for a misspelt one
    ):
        assert expected in proc.stderr


def test_show_prints_defaults_with_environment_overrides() -> None:
    """config show: the effective configuration, defaults and AGENTGUARD_* overrides applied."""
    proc = config("show", AGENTGUARD_TOKEN_BUDGET__PER_SESSION="1234")
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)["reliability"]
    assert data["token_budget"]["per_session"] == 1234
    assert data["loop_detection"]["window_size"] == 10  # a default


def test_show_file_as_json(tmp_path: Path) -> None:
    """config show FILE --json prints the file's effective configuration as JSON."""
    path = tmp_path / "agentguard.json"
    path.write_text(json.dumps({"escalation": {"mode": "confirm"}}))
    proc = config("show", path, "--json")
    assert json.loads(proc.stdout)["reliability"]["escalation"]["mode"] == "confirm"


def test_unknown_environment_override_is_an_error() -> None:
    """A misspelt AGENTGUARD_* variable is named, not silently ignored."""
    proc = config("show", AGENTGUARD_TOKEN_BUDGET__PER_SESION="5")
    assert proc.returncode == 1
    assert "AGENTGUARD_TOKEN_BUDGET__PER_SESION" in proc.stderr
