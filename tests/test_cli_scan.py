"""``agentguard scan`` run as a real command on real files."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentguard
from agentguard.cli._audit import SessionAudit
from agentguard.cli._formats import InputError, open_counted, records
from agentguard.cli._scan import _collecting_rarely, scan_file
from agentguard.config import GuardConfig
from agentguard.loops import is_error_result

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
    assert set(first) == {
        *("index", "step", "severity", "category", "detector", "count", "tool", "message"),
        *("action", "tokens", "cost"),
    }


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


def test_json_array_of_messages_reads_the_same_by_lines_as_item_by_item(tmp_path: Path) -> None:
    """An array of messages a line each (decoded a run of lines at a time) gives the messages,
    and the errors, that one laid out item by item (pretty-printed) gives."""
    messages: list[Any] = [
        {"role": "tool" if i % 3 else "user", "content": f"line {i}\n" * (i % 50)}
        for i in range(3_000)
    ]

    def read(text: str) -> list[Any] | str:
        path = tmp_path / "array.json"
        path.write_text(text)
        stream, _ = open_counted(str(path))
        try:
            with stream:
                return [(r.session, r.message) for r in records(stream, str(path))]
        except InputError as exc:
            return str(exc)

    by_lines = "[\n" + ",\n".join(json.dumps(m) for m in messages) + "\n]\n"
    assert read(by_lines) == read(json.dumps(messages, indent=2))
    # an item spread over lines far into the file: read item by item from there
    parts = [json.dumps(m, indent=2 if i == 2_000 else None) for i, m in enumerate(messages)]
    assert read("[\n" + ",\n".join(parts) + "\n]") == read(by_lines)
    # an item that is no object is reported at the line of its batch's last message
    parts = [json.dumps(m) for m in messages]
    parts[1_500] = "5"
    assert read("[\n" + ",\n".join(parts) + "\n]\n").endswith(  # type: ignore[union-attr]
        "array.json:1537: expected a message object, got int"
    )


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


DATA = Path(__file__).parent / "data"


def test_openhands_event_log_is_audited() -> None:
    """An OpenHands event log: its tool calls, results and usage become a session's audit."""
    data = json.loads(run(DATA / "openhands_events.json", "--json").stdout)
    (session,) = data["transcripts"]
    found = {(f["detector"], f["tool"]) for f in session["findings"]}
    assert ("poll_no_progress", "execute_bash") in found  # the test run again and again
    assert ("unknown_tool", "search_codebase") in found  # a tool OpenHands does not have
    assert not session["tokens_estimated"]  # the model responses carry their usage
    assert 0 < session["loop_tokens"] < session["tokens"]


def test_litellm_request_log_is_audited_against_its_tools() -> None:
    """LiteLLM request logs: history fed once, calls checked against model_parameters.tools."""
    data = json.loads(run(DATA / "litellm_requests.jsonl", "--json").stdout)
    (session,) = data["transcripts"]
    assert session["id"] == "trip-umbrella-42"
    found = {(f["detector"], f["tool"], f["severity"]) for f in session["findings"]}
    assert ("unknown_tool", "get_weather_forecast", "critical") in found
    assert ("invalid_json", "get_forecast", "warning") in found
    assert ("text_tool_call", "get_forecast", "warning") in found
    assert any(d == "poll_no_progress" for d, _, _ in found)
    assert session["retry_tokens"] > 0  # the rate-limited call and the invalid turns
    assert session["messages"] == 19  # each message once, not once per request


def test_tokens_are_per_session_and_in_total(tmp_path: Path) -> None:
    """Tokens spent and burnt are reported per session and summed in the summary."""
    path = tmp_path / "two.jsonl"
    path.write_text(
        json.dumps({"id": "loops", "messages": polling(8)})
        + "\n"
        + json.dumps({"id": "fine", "messages": polling(1)})
        + "\n"
    )
    data = json.loads(run(path, "--json").stdout)
    by_id = {t["id"]: t for t in data["transcripts"]}
    assert by_id["loops"]["loop_tokens"] > 0
    assert by_id["fine"]["loop_tokens"] == 0
    assert by_id["loops"]["tokens_estimated"]
    total = data["summary"]
    assert total["tokens"] == by_id["loops"]["tokens"] + by_id["fine"]["tokens"]
    assert total["loop_tokens"] == by_id["loops"]["loop_tokens"]


def test_tool_calls_checked_against_declared_tools(tmp_path: Path) -> None:
    """A transcript's own 'tools' make an undeclared tool name a critical finding."""
    tools = [{"type": "function", "function": {"name": "get_build", "parameters": {}}}]
    messages = [
        tool_call(0, "get_build", {"id": 7}),
        {"role": "tool", "tool_call_id": "c0", "content": "ok"},
        tool_call(1, "get_bulid_logs", {"id": 7}),
    ]
    path = tmp_path / "declared.jsonl"
    path.write_text(json.dumps({"id": "t", "tools": tools, "messages": messages}) + "\n")
    proc = run(path, "--json", "--fail-on", "critical")
    assert proc.returncode == 1
    (finding,) = json.loads(proc.stdout)["transcripts"][0]["findings"]
    assert (finding["detector"], finding["tool"]) == ("unknown_tool", "get_bulid_logs")


def test_html_report_is_self_contained(tmp_path: Path) -> None:
    """--html writes one page with inline styles, a timeline per session, and no external URL."""
    report = tmp_path / "report.html"
    proc = run(EXAMPLE, "--html", report)
    assert proc.returncode == 0, proc.stderr
    page = report.read_text()
    assert page.count("<svg") == 2  # one timeline per session
    assert "ci-triage-8812" in page
    assert "poll_no_progress" in page
    assert "<style>" in page
    assert "http://" not in page
    assert "https://" not in page
    assert "<script" not in page
    assert "<link" not in page


def test_html_report_escapes_what_the_trace_says(tmp_path: Path) -> None:
    """Session names and messages from the trace cannot inject markup into the report."""
    path = tmp_path / "evil.jsonl"
    path.write_text(json.dumps({"id": "<script>alert(1)</script>", "messages": polling(4)}) + "\n")
    report = tmp_path / "evil.html"
    run(path, "--html", report)
    page = report.read_text()
    assert "<script>" not in page
    assert "&lt;script&gt;" in page


def test_html_report_masks_the_values_of_secret_looking_keys(tmp_path: Path) -> None:
    """A looping call logging in somewhere: its arguments' ``password`` and ``token`` and its
    result's ``client_secret`` (plain values, no key shape) are ``***`` in the shared report;
    the rest of the call is shown."""
    password, token = "hunter2-correct-horse-9", "3f9c2a7be41d4c08a6f15e9d2b7c0a41"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "deploy"}]
    for i in range(8):
        arguments = json.dumps({"env": "prod", "password": password, "token": token})
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "deploy", "arguments": arguments},
        }
        result = json.dumps({"error": "failed", "client_secret": password})
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": result},
        ]  # fmt: skip
    path = tmp_path / "login.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    report = tmp_path / "login.html"
    run(path, "--html", report)
    page = report.read_text()
    assert password not in page
    assert token not in page
    assert "deploy(" in page
    assert "prod" in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    _chromium() is None,
    reason="no chromium on this machine (.ci/run installs Debian's chromium); "
    "the HTML report is not rendered in a browser here",
)
def test_html_report_renders_in_a_headless_browser(tmp_path: Path) -> None:
    """The report, rendered by headless Chromium, shows the summary, sessions and findings."""
    report = tmp_path / "report.html"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(EXAMPLE.read_text() + (DATA / "litellm_requests.jsonl").read_text())
    assert run(mixed, "--html", report).returncode == 0
    browser = _chromium()
    assert browser is not None
    proc = subprocess.run(
        [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "agentguard scan report" in dom
    for session in ("ci-triage-8812", "typing-utils", "trip-umbrella-42"):
        assert session in dom
    assert "tokens burnt in loops" in dom
    assert "get_weather_forecast" in dom
    assert dom.count("<svg") == 3
    assert "no loops or bad tool calls found" in dom
    assert "guard would" in dom  # what the guard would have done at each finding
    assert "the calls and results around it" in dom
    assert "Tools with findings" in dom


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal, stderr shows a progress bar; piped (the other tests), it shows nothing."""
    import pty

    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"messages": polling(5)}) + "\n" for _ in range(500)))
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": SRC, "TERM": "xterm-256color", "COLUMNS": "100"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentguard", "scan", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    chunks: list[bytes] = []

    def drain() -> None:  # read the terminal while the scan runs, so it never blocks on it
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    out, _ = proc.communicate(timeout=120)
    reader.join(timeout=30)
    os.close(leader)
    assert proc.returncode == 0
    assert json.loads(out)["summary"]["messages"] == 5_000  # stdout stays clean JSON
    assert "scanning big.jsonl" in b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("content", "failed"),
    [
        ("Errors found: 0", False),  # the scan's old rule saw a failure here
        ('{"error": null, "rows": 3}', False),
        ("Traceback (most recent call last):\n  ValueError", True),  # and saw none here
        ('{"ok": false}', True),
        ([{"type": "text", "text": "Error: no such file"}], True),
    ],
)
def test_scan_judges_failed_results_as_the_live_guard_does(content: Any, failed: bool) -> None:
    """A result the guard judges failed does not prove the tool works, by the guard's rule;
    nor does it make the name a hallucination (issue 16: a business error says the tool ran)."""
    audit = SessionAudit("s", GuardConfig())
    audit.feed(tool_call(0, "lookup", {"q": "x"}))
    audit.feed({"role": "tool", "tool_call_id": "c0", "content": content})
    audit.feed({"role": "assistant", "content": "Done."})
    audit.finish()
    assert ("lookup" in audit.calls.working) is not failed
    assert audit.issues == []
    assert is_error_result(content) is failed


@pytest.mark.parametrize(
    ("content", "suspect"),
    [
        ("Error: unknown tool lookup", True),  # the result says the name is no tool
        ("Error: FunctionCallNotExistsError: Tool lookup is not registered.", True),
        ("Error: seat 12A is taken", False),  # a business error: the tool ran
        ("Error: flight HAT030 not available on date 2024-05-13", False),
    ],
)
def test_without_a_tool_list_only_a_refused_name_is_hallucinated(
    content: str, suspect: bool
) -> None:
    """No tools declared: business errors never make a real tool a hallucinated name."""
    audit = SessionAudit("s", GuardConfig())
    for i in range(3):
        audit.feed(tool_call(i, "lookup", {"q": i}))
        audit.feed({"role": "tool", "tool_call_id": f"c{i}", "content": content})
    audit.finish()
    found = [(i.detector, i.tool) for i in audit.issues if i.category == "tool_call"]
    assert (found == [("unknown_tool", "lookup")]) is suspect


def test_a_call_in_the_last_turn_without_a_result_is_not_suspect() -> None:
    """A trace that ends on a call (SWE-agent's ``submit``) has no result for it: no evidence."""
    audit = SessionAudit("s", GuardConfig())
    audit.feed(tool_call(0, "submit", {}))
    audit.finish()
    assert audit.issues == []


def test_scan_decodes_arguments_as_the_guard_does() -> None:
    """Blank (whitespace) arguments are not JSON for ToolGuard and the validator, nor for scan."""
    audit = SessionAudit("s", GuardConfig())
    fn = {"name": "lookup", "arguments": "  "}
    audit.feed({"role": "assistant", "tool_calls": [{"id": "c0", "function": fn}]})
    assert [i.detector for i in audit.issues] == ["invalid_json"]


@contextlib.contextmanager
def _frozen(anything: bool) -> Iterator[None]:
    """A process that froze something (``gc.freeze()``, as a server does after its start-up)
    or nothing; the collector's frozen set as it was is put back afterwards (as a set frozen
    or not)."""
    was = gc.get_freeze_count()
    gc.unfreeze()
    if anything:
        gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if was:
            gc.freeze()


def test_the_library_scan_leaves_what_the_process_froze_frozen() -> None:
    """``gc.unfreeze`` releases every frozen object: a scan in a process that froze its own
    objects neither freezes nor unfreezes, it only raises the thresholds."""
    with _frozen(True):
        before = gc.get_freeze_count()
        with _collecting_rarely():
            assert gc.get_threshold() == (50_000, 20, 100)
            during = gc.get_freeze_count()
        after = gc.get_freeze_count()
        # frozen objects may die meanwhile (the count falls by those), never all of them; a
        # freeze would have added every object made since
        assert before // 2 < after <= during <= before


def test_the_library_scan_freezes_only_what_it_found_and_gives_it_back() -> None:
    with _frozen(False):
        with _collecting_rarely():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0


def test_the_library_scan_gives_the_garbage_collector_back(tmp_path: Path) -> None:
    """``scan_file`` sets the cyclic collector aside while it scans (it would walk the growing
    heap of audits again and again) and restores it when the last scan under way ends: nested,
    in several threads, or ended by bad input."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps([{"role": "user", "content": "hi"}]) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    config = GuardConfig.from_dict({}, env={})
    threshold = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    with _frozen(False), _collecting_rarely():  # an outer scan: the inner ones leave it aside
        seen.append(gc.get_threshold())
        threads = [threading.Thread(target=scan_file, args=(str(path), config)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with pytest.raises(InputError):
            scan_file(str(bad), config)
        seen.append(gc.get_threshold())
        inside = gc.get_freeze_count()
    assert seen == [(50_000, 20, 100)] * 2
    assert gc.get_threshold() == threshold
    assert inside > 0
    with pytest.raises(InputError):
        scan_file(str(bad), config)
    assert gc.get_threshold() == threshold
    assert len(scan_file(str(path), config)) == 1
    assert gc.get_threshold() == threshold


def _fed_whole(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The report of one audit fed ``messages`` in order and finished at the end."""
    audit = SessionAudit("run-0", GuardConfig.from_dict({}, env={}))
    for message in messages:
        audit.feed(message)
    audit.finish()
    return audit.to_dict()


def test_a_transcript_name_reused_by_a_later_line_is_one_session(tmp_path: Path) -> None:
    """A transcript's audit is finished as soon as it is read; when a later message line names
    the same session, the file is read again and the report is the one of a single audit fed
    every message of the session, as if none had been finished early."""
    first, more = polling(3), polling(5)[2:]
    path = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"id": "run-0", "messages": first}),
             json.dumps({"id": "other", "messages": polling(2)})]  # fmt: skip
    lines += [json.dumps({**m, "session": "run-0"}) for m in more]
    path.write_text("\n".join(lines) + "\n")
    audits = scan_file(str(path), GuardConfig.from_dict({}, env={}))
    assert [a.id for a in audits] == ["run-0", "other"]
    assert audits[0].to_dict() == _fed_whole(first + more)
    assert audits[0].messages == len(first) + len(more)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_is_read_once_with_every_audit_kept_open(tmp_path: Path) -> None:
    """A pipe cannot be read again: its transcripts' audits stay open to the end, and a name
    reused by a later line still gives a single session."""
    first, more = polling(3), polling(5)[2:]
    text = json.dumps({"id": "run-0", "messages": first}) + "\n"
    text += "".join(json.dumps({**m, "session": "run-0"}) + "\n" for m in more)
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)

    def write() -> None:
        with fifo.open("w") as fh:
            fh.write(text)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        audits = scan_file(str(fifo), GuardConfig.from_dict({}, env={}))
    finally:
        writer.join()
    assert len(audits) == 1
    assert audits[0].to_dict() == _fed_whole(first + more)


def test_message_lines_finish_a_session_when_the_file_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines of chat messages, one session after another: a session's audit is finished (its
    detectors' state let go) when the lines move on to the next session, not at the end."""
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps({**m, "session": s}) + "\n"
                            for s in ("a", "b", "c") for m in polling(3)))  # fmt: skip
    seen: list[str] = []
    finish, feed_run = SessionAudit.finish, SessionAudit.feed_run

    def finishing(self: SessionAudit) -> None:
        seen.append(f"finish {self.id}")
        finish(self)

    def feeding(self: SessionAudit, messages: Any) -> None:
        seen.append(f"feed {self.id}")
        feed_run(self, messages)

    monkeypatch.setattr(SessionAudit, "finish", finishing)
    monkeypatch.setattr(SessionAudit, "feed_run", feeding)
    audits = scan_file(str(path), GuardConfig.from_dict({}, env={}))
    assert [a.id for a in audits] == ["a", "b", "c"]
    assert seen == ["feed a", "finish a", "feed b", "finish b", "feed c", "finish c"]


def test_a_session_of_message_lines_coming_back_is_one_session(tmp_path: Path) -> None:
    """A session whose lines come back after another session's is one audit fed every one
    of its messages (the file read again with every audit kept open)."""
    first, more = polling(3), polling(5)[2:]
    lines = [json.dumps({**m, "session": "run-0"}) for m in first]
    lines += [json.dumps({**m, "session": "other"}) for m in polling(2)]
    lines += [json.dumps({**m, "session": "run-0"}) for m in more]
    path = tmp_path / "lines.jsonl"
    path.write_text("\n".join(lines) + "\n")
    audits = scan_file(str(path), GuardConfig.from_dict({}, env={}))
    assert [a.id for a in audits] == ["run-0", "other"]
    assert audits[0].to_dict() == _fed_whole(first + more)
    assert audits[0].messages == len(first) + len(more)
