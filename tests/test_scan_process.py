"""``agentguard scan`` as a process: prices and formats from the command line, and an
interrupted scan (Ctrl-C, a closed pipe) ends quietly, without a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentguard

SRC = str(Path(agentguard.__file__).resolve().parent.parent)
DATA = Path(__file__).parent / "data"


def command(*args: str | Path) -> list[str]:
    """The ``agentguard scan`` command line."""
    return [sys.executable, "-m", "agentguard", "scan", *map(str, args)]


def env() -> dict[str, str]:
    """The environment of the package under test."""
    out = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "120"}
    out.pop("AGENTGUARD_LOOP_DETECTION__ENABLED", None)
    return out


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run the command to its end."""
    return subprocess.run(
        command(*args), capture_output=True, text=True, env=env(), check=False, timeout=120
    )


def polling(session: str, n: int) -> dict[str, Any]:
    """A transcript polling a failed build ``n`` times."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "is build 7 fixed?"}]
    for i in range(n):
        fn = {"name": "get_build", "arguments": '{"id": 7}'}
        messages.append({"role": "assistant", "tool_calls": [{"id": f"c{i}", "function": fn}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "failed"})
    return {"id": session, "messages": messages}


def test_prices_from_the_command_line_price_the_findings(tmp_path: Path) -> None:
    """--price MODEL=IN,OUT prices every call; the burnt cost is per finding and summed."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(polling("p", 10)) + "\n")
    data = json.loads(run(path, "--json", "--price", "*=3,15").stdout)
    (session,) = data["transcripts"]
    assert session["cost"] > 0
    burnt = [f["cost"] for f in session["findings"]]
    assert any(burnt)
    assert data["summary"]["burnt_cost"] == pytest.approx(sum(burnt), abs=1e-5)
    assert session["first_action"]["action"] == "hint"
    assert data["tools"]["get_build"]["calls"] == 10


def test_a_bad_price_is_a_one_line_error(tmp_path: Path) -> None:
    """A price that is not MODEL=IN,OUT exits 2 naming it."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(polling("p", 1)) + "\n")
    proc = run(path, "--price", "gpt-4o=cheap")
    assert proc.returncode == 2
    assert "--price 'gpt-4o=cheap'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_format_can_be_forced() -> None:
    """--format reads every item as the named format."""
    ok = run(DATA / "codex_rollout.jsonl", "--format", "codex", "--json")
    assert json.loads(ok.stdout)["summary"]["tokens"] == 19_890


@pytest.mark.parametrize(
    ("sample", "forced", "found"),
    [
        ("tau_bench_airline.json", "otlp", "tau-bench"),
        ("codex_rollout.jsonl", "swe-agent", "codex"),
        ("otlp_genai_spans.json", "claude-code", "otlp"),
        ("swe_agent_test_repo.traj", "tau-bench", "swe-agent"),
        ("openhands_events.json", "atif", "openhands"),
    ],
)
def test_a_wrong_format_forced_is_a_one_line_error(sample: str, forced: str, found: str) -> None:
    """A forced format that reads nothing in a file exits 2 with one line naming the format
    and what the file looks like, not an empty report."""
    proc = run(DATA / sample, "--format", forced, "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert f"--format {forced} reads nothing in it (it looks like {found})" in line
    assert "leave out --format to detect the format" in line


def test_a_forced_format_of_an_empty_file_is_an_empty_report(tmp_path: Path) -> None:
    """A file with nothing in it is no wrong format: an empty report, exit 0."""
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    proc = run(path, "--format", "otlp", "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["summary"]["messages"] == 0


#: Run the command after it with SIGINT as a shell's foreground job gets it: handled by default,
#: unblocked. A child inherits an ignored or blocked SIGINT from the process that starts it;
#: something earlier in a long test session (a library's C code or thread) can leave the test
#: process so, and the scan would then rightly ignore the signal, as under ``nohup``.
_AS_A_TERMINAL_STARTS_IT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


@pytest.mark.skipif(sys.platform == "win32", reason="named pipes and SIGINT")
def test_ctrl_c_ends_the_scan_quietly(tmp_path: Path) -> None:
    """SIGINT while the scan reads (here: a named pipe it waits on) exits 130, no traceback."""
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [*_AS_A_TERMINAL_STARTS_IT, *command(fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    try:
        with fifo.open("w") as writer:  # returns once the scan has opened the pipe to read it
            writer.write(json.dumps(polling("a", 3)) + "\n")
            writer.flush()
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
    finally:  # a scan that ignored the signal must not outlive the test
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130
    assert b"Traceback" not in err
    assert b"KeyboardInterrupt" not in err


#: A ``sitecustomize`` that sends its process SIGINT as it first looks for the module named by
#: ``CTRL_C_AT``: Ctrl-C at a chosen moment of start-up, the same on a fast or a loaded machine.
#: SIGINT is unblocked and handled as a shell's foreground job has it (see above).
_CTRL_C_AT_IMPORT = """
import os, signal, sys

signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class CtrlCAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["CTRL_C_AT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)


sys.meta_path.insert(0, CtrlCAt())
"""
#: the console script's own lines (``agentguard = "agentguard.cli:main"``)
_CONSOLE_SCRIPT = [
    sys.executable,
    "-c",
    "import sys; from agentguard.cli import main; sys.exit(main())",
]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_during_start_up_ends_the_command_quietly(tmp_path: Path) -> None:
    """SIGINT at any moment of the command (the command line imported, its parser built, the
    configuration models and pydantic_core's extension loaded, the trace's tools read, the
    tables written) exits 130 with nothing on stderr, by ``python -m agentguard`` and by the
    console script."""
    (tmp_path / "sitecustomize.py").write_text(_CTRL_C_AT_IMPORT)
    trace = str(DATA / "otlp_genai_spans.json")
    moments = [
        (command(trace), "agentguard.cli"),  # the first import of python -m agentguard
        (command(trace), "argparse"),  # the first import of main()
        (command(trace), "datetime"),  # pydantic_core imports it through the C API
        (command(trace), "pydantic"),
        (command(trace), "jsonschema"),  # during the scan: the trace declares its tools
        (command(trace), "rich.table"),  # after the scan: the tables written
        ([*_CONSOLE_SCRIPT, "scan", trace], "argparse"),
        ([*_CONSOLE_SCRIPT, "scan", trace], "datetime"),
    ]
    started = [
        (
            at,
            subprocess.Popen(
                args,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{SRC}", "CTRL_C_AT": at},
            ),
        )
        for args, at in moments
    ]
    wrong = []
    for at, proc in started:
        out, err = proc.communicate(timeout=60)
        if (proc.returncode, out, err) != (130, b"", b""):
            wrong.append((at, proc.returncode, err.decode()[-300:]))
    assert wrong == []


@pytest.mark.skipif(sys.platform == "win32", reason="SIGPIPE semantics")
@pytest.mark.parametrize("output", [(), ("--json",)])
def test_a_closed_pipe_ends_the_scan_quietly(tmp_path: Path, output: tuple[str, ...]) -> None:
    """``scan big | head -c 100``: the reader goes away, the scan stops without a traceback."""
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(polling(f"s{i}", 6)) + "\n" for i in range(400)))
    proc = subprocess.Popen(
        command(path, *output), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env()
    )
    assert proc.stdout is not None
    proc.stdout.read(100)
    proc.stdout.close()  # as `head -c 100` does, long before the report is written
    assert proc.stderr is not None
    with proc.stderr:
        err = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 141
    assert b"Traceback" not in err
    assert b"BrokenPipeError" not in err
    assert b"Exception ignored" not in err


def test_html_shows_the_calls_and_results_around_each_finding_escaped(tmp_path: Path) -> None:
    """Under each finding, the messages around it, its arguments and results, escaped."""
    trace = polling("<b>run</b>", 8)
    for m in trace["messages"]:
        if m["role"] == "tool":
            m["content"] = "<img src=x onerror=alert(1)> failed"
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(trace) + "\n")
    report = tmp_path / "r.html"
    assert run(path, "--html", report, "--price", "*=1,1").returncode == 0
    page = report.read_text()
    assert "the calls and results around it" in page
    assert "get_build({&quot;id&quot;: 7})" in page
    assert "&lt;img src=x onerror=alert(1)&gt; failed" in page
    assert "<img" not in page
    assert "&lt;b&gt;run&lt;/b&gt;" in page
    assert "<b>run" not in page
    assert "burnt at the findings" in page
