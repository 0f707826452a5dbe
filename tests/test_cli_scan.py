"""``agentguard scan`` run as a real command on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentguard

SRC = str(Path(agentguard.__file__).resolve().parent.parent)
EXAMPLE = Path(SRC).parent / "examples" / "looping_agent.jsonl"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m agentguard scan ...`` against the package under test."""
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "120"}
    env.pop("AGENTGUARD_LOOP_DETECTION__ENABLED", None)
    return subprocess.run(
        [sys.executable, "-m", "agentguard", "scan", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )


def tool_call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """An assistant tool-call message."""
    fn = {"name": name, "arguments": json.dumps(args)}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "function": fn}]}


def polling(n: int) -> list[dict[str, Any]]:
    """An agent polling a finished build ``n`` times."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append(tool_call(i, "get_build", {"id": 7}))
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": '{"status": "failed"}'})
    return out


def test_bundled_example_shows_findings_in_a_table() -> None:
    """The README's first command prints a table with the example's loops and exits 0."""
    proc = run(EXAMPLE)
    assert proc.returncode == 0, proc.stderr
    for expected in [
        "ci-triage-8812",
        "poll_no_progress",
        "near_duplicate",
        "BREAK",
        "typing-utils",
    ]:
        assert expected in proc.stdout
    assert "no loops found" in proc.stdout  # the healthy transcript


def test_json_output_is_machine_readable() -> None:
    """--json prints one JSON document with per-transcript findings and a summary."""
    proc = run(EXAMPLE, "--json")
    data = json.loads(proc.stdout)
    assert [t["id"] for t in data["transcripts"]] == ["ci-triage-8812", "typing-utils"]
    assert data["transcripts"][1]["findings"] == []
    assert data["summary"]["break"] >= 1
    first = data["transcripts"][0]["findings"][0]
    assert set(first) == {"index", "severity", "category", "detector", "count", "tool", "message"}


@pytest.mark.parametrize(("fail_on", "code"), [("warning", 1), ("break", 1), ("never", 0)])
def test_fail_on_sets_the_exit_code(fail_on: str, code: int) -> None:
    """Exit 1 when a finding reaches --fail-on, 0 otherwise."""
    assert run(EXAMPLE, "--fail-on", fail_on).returncode == code


def test_fail_on_not_reached_exits_zero(tmp_path: Path) -> None:
    """Findings below the --fail-on bar do not fail the run."""
    path = tmp_path / "warn.jsonl"
    path.write_text(json.dumps(polling(3)) + "\n")
    assert run(path, "--fail-on", "critical").returncode == 0
    assert run(path, "--fail-on", "warning").returncode == 1


def test_message_per_line_grouped_by_session(tmp_path: Path) -> None:
    """One message per line, interleaved sessions, are scanned as separate transcripts."""
    path = tmp_path / "messages.jsonl"
    lines = []
    for a, b in zip(polling(7), polling(1) * 7, strict=False):
        lines.append(json.dumps({**a, "session_id": "looping"}))
        lines.append(json.dumps({**b, "session": "healthy"}))
    path.write_text("\n".join(lines) + "\n")
    data = json.loads(run(path, "--json").stdout)
    by_id = {t["id"]: t for t in data["transcripts"]}
    assert by_id["looping"]["findings"][-1]["severity"] == "break"
    assert by_id["looping"]["messages"] == 14


def test_json_array_file_of_messages(tmp_path: Path) -> None:
    """A pretty-printed JSON array of messages is one transcript, decoded item by item."""
    path = tmp_path / "transcript.json"
    path.write_text(json.dumps(polling(7), indent=2))
    data = json.loads(run(path, "--json").stdout)
    assert len(data["transcripts"]) == 1
    assert data["transcripts"][0]["messages"] == 14
    assert data["summary"]["break"] == 1


def test_json_array_file_of_transcripts(tmp_path: Path) -> None:
    """A JSON array of transcript objects gives one transcript each."""
    path = tmp_path / "many.json"
    path.write_text(
        json.dumps([{"id": "a", "messages": polling(3)}, {"id": "b", "messages": []}], indent=1)
    )
    data = json.loads(run(path, "--json").stdout)
    assert [t["id"] for t in data["transcripts"]] == ["a", "b"]


def test_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    """Unusable input exits 2 with the file and line in the error."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(polling(1)) + "\n" + '{"role": "user", "content": \n')
    proc = run(path)
    assert proc.returncode == 2
    assert f"{path}:2" in proc.stderr
    assert "invalid JSON" in proc.stderr


def test_wrong_shape_names_file_and_line(tmp_path: Path) -> None:
    """A line that is neither a transcript nor a message exits 2 naming the line."""
    path = tmp_path / "shape.jsonl"
    path.write_text('[{"role": "user", "content": "hi"}]\n42\n')
    proc = run(path)
    assert proc.returncode == 2
    assert f"{path}:2" in proc.stderr


def test_missing_file_exits_two(tmp_path: Path) -> None:
    """A file that cannot be read exits 2 naming it."""
    proc = run(tmp_path / "nope.jsonl")
    assert proc.returncode == 2
    assert "nope.jsonl" in proc.stderr


def test_large_generated_file_streams(tmp_path: Path) -> None:
    """A file with 2,000 transcripts (80,000 messages) scans and reports every loop."""
    path = tmp_path / "large.jsonl"
    with path.open("w") as fh:
        for i in range(2_000):
            fh.write(json.dumps({"id": f"run-{i}", "messages": polling(20)}) + "\n")
    proc = run(path, "--json", "--fail-on", "break")
    assert proc.returncode == 1
    summary = json.loads(proc.stdout)["summary"]
    assert {k: summary[k] for k in ("transcripts", "messages", "findings")} == {
        "transcripts": 2_000, "messages": 80_000, "findings": 6_000,
    }  # fmt: skip
    assert (summary["warning"], summary["critical"], summary["break"]) == (2_000, 2_000, 2_000)
    assert 0 < summary["loop_tokens"] < summary["tokens"]
