"""benchmarks/run.py's report sections and bench_realmodel's parts that need no model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentguard import GuardConfig
from agentguard.guard import Guard
from agentguard.testing import Reply, ScriptedModel
from agentguard.transport import ModelRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_realmodel
import run

HEADER = "# Benchmarks\n\n- Command: `nox -s bench`\n\n"
MEASURED = "### A real model\n\n| prompt | raw tokens |\n|---|---|\n| `story` | 1,024 |\n"


def test_tables_of_an_unmarked_report_are_kept_as_one_section(tmp_path: Path) -> None:
    """A report written before sections were marked keeps its tables under the empty name."""
    report = tmp_path / "benchmarks.md"
    report.write_text(HEADER + "### Ledger\n\n| a |\n|---|\n| 1 |\n", encoding="utf-8")
    assert run._sections(report) == {"": "### Ledger\n\n| a |\n|---|\n| 1 |\n"}


def test_realmodel_without_its_model_says_how_to_run_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the GGUF the module is unavailable and reports one row naming nox -s realmodel."""
    monkeypatch.setenv("AGENTGUARD_GGUF", "/nonexistent/model.gguf")
    assert not bench_realmodel.available()
    (table,) = bench_realmodel.run(quick=True)
    assert len(table.rows) == 1
    assert "nox -s realmodel" in str(table.rows[0][0])


def test_an_unavailable_module_keeps_its_measured_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.py --only realmodel without the model keeps the numbers measured where it was."""
    report = tmp_path / "benchmarks.md"
    other = "<!-- section: bench_budget -->\n### Ledger\n"
    report.write_text(
        f"{HEADER}{other}<!-- section: bench_realmodel -->\n{MEASURED}", encoding="utf-8"
    )
    monkeypatch.setenv("AGENTGUARD_GGUF", "/nonexistent/model.gguf")
    monkeypatch.setattr(sys, "argv", ["run.py", "--only", "realmodel", "--output", str(report)])
    assert run.main() == 0
    assert run._sections(report) == {"bench_budget": "### Ledger\n", "bench_realmodel": MEASURED}


def test_replay_cuts_where_the_stream_watch_does() -> None:
    """The thresholds table's replay stops at the same chunk as the guard's own stream cut."""
    phrase = "The cat ate the fish and then it slept."
    model = ScriptedModel([Reply.degenerate(phrase, times=60)], chunk_size=7)
    tiers = {"tiers": {"fast": {"model": "m"}}, "escalation": {"chain": ["fast"]}}
    config = GuardConfig.from_dict({**tiers, "memory_pressure": {"enabled": False}}, env={})
    request = ModelRequest(model="fast", messages=[{"role": "user", "content": "a story"}])
    cut = [c.content for c in Guard(model, config).stream(request) if c.content]
    text = " ".join([phrase] * 60)
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    assert bench_realmodel._replay(pieces, 20) == len(cut) < len(pieces)
    assert (bench_realmodel._replay(pieces, 5) or 0) < len(cut)
    assert bench_realmodel._replay(pieces[:10], 5) is None
