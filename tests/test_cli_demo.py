"""``agentguard demo`` run as a real command: every scenario, --json, --confirm, terminal output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentguard

pytest.importorskip("openai")

SRC = str(Path(agentguard.__file__).resolve().parent.parent)
ANSI = "\x1b["
EXPECTED = {
    "malformed_call": ("done", {"repair", "correction"}),
    "hallucinated_tool": ("done", {"repair", "correction"}),
    "text_call": ("done", {"repair"}),
    "tool_loop": ("done", {"hint", "escalation"}),
    "repeated_response": ("done", {"warning", "escalation"}),
    "rate_limited": ("done", {"retry"}),
    "dead_tier": ("done", {"retry", "escalation", "breaker"}),
    "budget": ("stopped", {"stop"}),
    "flaky_tool": ("done", {"retry", "breaker"}),
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTGUARD_")}
    env.update(PYTHONPATH=SRC, COLUMNS="120")
    env.pop("FORCE_COLOR", None)
    env.pop("NO_COLOR", None)
    return env


def demo(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``python -m agentguard demo --speed 0 ...`` (no real waiting) with piped output."""
    return subprocess.run(
        [sys.executable, "-m", "agentguard", "demo", "--speed", "0", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
        timeout=180,
    )


def events_of(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The JSON lines of a ``--json`` run."""
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def all_events() -> list[dict[str, Any]]:
    """The event log of one run of every scenario."""
    return events_of(demo("--json"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_scenario_ends_as_designed(name: str, all_events: list[dict[str, Any]]) -> None:
    """Every failure mode is injected and answered the way the guard promises."""
    summary = all_events[-1]
    assert summary["kind"] == "summary"
    result = next(r for r in summary["results"] if r["scenario"] == name)
    outcome, how = EXPECTED[name]
    assert result["outcome"] == outcome, result
    assert how <= set(result["how"]), result
    assert result["faults"] >= 1
    assert result["tokens"] > 0
    own = [e for e in all_events[:-1] if e["scenario"] == name]
    assert any(e["kind"] == "fault_injected" for e in own)


def test_json_is_an_event_log_with_guard_events(all_events: list[dict[str, Any]]) -> None:
    """--json prints one object per line: agent steps, wire, tools and the guard's own events."""
    kinds = {e["kind"] for e in all_events}
    assert {"task", "model_call", "tool_result", "fault_injected", "escalated"} <= kinds
    assert {"tool_call_repaired", "loop_flagged", "budget_exhausted", "wait"} <= kinds
    guard = [e for e in all_events[:-1] if e["source"] == "guard" and "event" in e]
    assert all(e["event"]["kind"] == e["kind"] for e in guard)
    assert all(e["t"] >= 0 for e in all_events[:-1])
    totals = all_events[-1]
    assert totals["recovered"] == 8
    assert totals["stopped"] == 1
    assert totals["failed"] == 0


def test_rate_limit_waits_what_the_server_asked(all_events: list[dict[str, Any]]) -> None:
    """The 429's Retry-After (2 s) is honoured once, on the demo's clock."""
    waits = [e for e in all_events[:-1] if e["scenario"] == "rate_limited" and e["kind"] == "wait"]
    assert [(w["seconds"], w["why"]) for w in waits] == [(2.0, "Retry-After: 2")]


def test_budget_stops_before_the_limit(all_events: list[dict[str, Any]]) -> None:
    """The hard-stop budget stops the runaway agent without spending past the limit."""
    result = next(r for r in all_events[-1]["results"] if r["scenario"] == "budget")
    assert "BudgetExceeded" in result["reason"]
    assert result["tokens"] <= 9_000
    assert result["tokens_saved"] > 0


def test_one_scenario_in_plain_text_when_piped() -> None:
    """--scenario runs one failure mode; piped output has no colour codes, and a summary."""
    proc = demo("--scenario", "text_call")
    assert proc.returncode == 0, proc.stderr
    assert ANSI not in proc.stdout
    assert "injected: tool call written as <tool_call> text" in proc.stdout
    assert "repaired for free: extracted_from_text" in proc.stdout
    assert "What the guard did" in proc.stdout
    assert "tool_loop" not in proc.stdout  # only the chosen scenario ran


def test_whole_demo_prints_the_summary_table() -> None:
    """The README's first command: every scenario, then one table, exit 0."""
    proc = demo()
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout[proc.stdout.index("What the guard did") :]
    for name in EXPECTED:
        assert name in table
    assert "8 recovered" in table
    assert "1 stopped, 0 failed" in table
    assert "waiting 4.0 s (Retry-After: 4)" in proc.stdout  # the progress line past 3 s


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_colour_on_a_terminal() -> None:
    """On a terminal the timeline is coloured."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentguard", "demo", "--speed", "0", "--scenario", "text_call"],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env={**_env(), "TERM": "xterm-256color"},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=180) == 0
    out = b"".join(chunks).decode("utf-8", "replace")
    assert ANSI in out
    assert "repaired for free" in out


def test_confirm_asks_and_follows_the_answers() -> None:
    """--confirm: no silent failover; 'retry' tries the tier again, 'backup' moves on."""
    proc = demo("--confirm", "--json", stdin="1\n2\n")
    events = events_of(proc)
    choices = [e["choice"] for e in events if e["kind"] == "choice"]
    assert choices == ["retry", "use_backup"]
    asks = [e for e in events if e["kind"] == "confirm"]
    assert asks[0]["prompt"]["options"] == ["retry", "use_backup", "cancel"]
    assert asks[0]["prompt"]["proposed"] == "standard"
    assert events[-1]["results"][0]["outcome"] == "done"
    assert "Used so far:" in proc.stderr  # the prompt shows tokens and cost
    assert "This run so far:" in proc.stderr
    assert "waiting 4.0 s (Retry-After: 4)" in proc.stderr  # a progress indicator past 3 s


@pytest.mark.parametrize("stdin", ["3\n", ""])
def test_confirm_cancel_or_no_answer_stops_cleanly(stdin: str) -> None:
    """Cancelling (or no answer at all) stops the run: nothing fails over without consent."""
    proc = demo("--confirm", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    assert "run cancelled: no failover without consent" in proc.stdout
    assert "standard (llama-3.1-8b) →" not in proc.stdout  # the backup never answered


def test_unknown_scenario_is_a_usage_error() -> None:
    """An unknown --scenario exits 2 and lists the names."""
    proc = demo("--scenario", "nope")
    assert proc.returncode == 2
    assert "malformed_call" in proc.stderr


def test_without_openai_says_what_to_install() -> None:
    """Without the openai package the demo says which extra to install."""
    code = (
        "import sys; sys.modules['openai'] = None; "
        "from agentguard.cli import main; raise SystemExit(main(['demo']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=False
    )
    assert proc.returncode == 2
    assert "agentguard[openai]" in proc.stderr
