"""``agentguard hook claude-code|codex`` invoked as the agents invoke it: a new process per event,
the event's JSON on stdin, the answer read from the exit code and stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from _stores import SRC
from agentguard import GuardConfig
from agentguard.hooks import HookAnswer, HookGuard
from agentguard.hooks import _client as client
from agentguard.hooks import _guard as guards
from agentguard.hooks._client import daemon_socket
from agentguard.hooks._daemon import _answer
from agentguard.hooks._guard import judge_once
from agentguard.storage import SQLiteStore
from agentguard.testing import FakeClock

DATA = Path(__file__).parent / "data" / "hooks"


class Hooks:
    """Runs the hook command with its state (store, daemon sockets) under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            **os.environ,
            "PYTHONPATH": SRC,
            "AGENTGUARD_HOOK_DIR": str(root / "run"),
            "XDG_STATE_HOME": str(root / "state"),
        }
        for key in [
            k for k in self.env if k.startswith("AGENTGUARD_") and k != "AGENTGUARD_HOOK_DIR"
        ]:
            del self.env[key]

    def run(
        self, agent: str, data: bytes, *args: str, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "agentguard", "hook", agent, *args],
            input=data,
            capture_output=True,
            env=self.env,
            cwd=cwd,
            timeout=120,
            check=False,
        )

    def stop_daemons(self) -> None:
        for lock in (self.root / "run").glob("*.lock"):
            pid = lock.read_text().strip()
            if pid.isdigit():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGTERM)


@pytest.fixture
def hooks(tmp_path: Path) -> Iterator[Hooks]:
    h = Hooks(tmp_path)
    yield h
    h.stop_daemons()


def answer(done: subprocess.CompletedProcess[bytes]) -> dict[str, Any] | None:
    """The hook's answer as the agent reads it: exit 0 and JSON on stdout, or nothing."""
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    return json.loads(out) if out else None


@pytest.mark.parametrize("fixture", sorted(str(p.relative_to(DATA)) for p in DATA.glob("*/*.json")))
def test_documented_events_get_silence(hooks: Hooks, fixture: str) -> None:
    """Each documented event of a healthy session: exit 0, nothing printed."""
    agent = fixture.split("/", maxsplit=1)[0]
    done = hooks.run(agent, (DATA / fixture).read_bytes(), "--no-daemon")
    assert answer(done) is None
    assert done.stdout == b""


def test_a_looping_session_replayed_through_the_hook_daemon(hooks: Hooks, tmp_path: Path) -> None:
    """The reconstructed 141-search session, one hook process per event (the first judges in
    process and starts the daemon, the rest are answered by it): the answers are exactly those
    of an in-process HookGuard over the same events and transcript, up to the first refusal,
    which is a documented PreToolUse deny."""
    transcript = tmp_path / "transcript.jsonl"
    mirror = tmp_path / "mirror.jsonl"
    store = SQLiteStore(tmp_path / "mirror.sqlite")
    local = HookGuard(GuardConfig.from_dict({}, env={}), store=store)
    steps = (DATA / "claude-code" / "grep_loop_session.jsonl").read_text().splitlines()
    seen: list[tuple[str, dict[str, Any] | None]] = []
    try:
        for line in steps:
            step = json.loads(line)
            if step["transcript"] is not None:
                for path in (transcript, mirror):
                    with path.open("a") as f:
                        f.write(json.dumps(step["transcript"]) + "\n")
            event = step["event"]
            name = event["hook_event_name"]
            got = answer(
                hooks.run(
                    "claude-code",
                    json.dumps({**event, "transcript_path": str(transcript)}).encode(),
                )
            )
            expected = local.handle("claude-code", {**event, "transcript_path": str(mirror)}).output
            assert got == expected, name
            seen.append((name, got))
            if got is not None and got.get("hookSpecificOutput", {}).get("permissionDecision"):
                break
    finally:
        store.close()
    assert list((tmp_path / "run").glob("*.sock")), "the daemon answered the later events"
    name, refusal = seen[-1]
    assert name == "PreToolUse"
    assert refusal is not None
    specific = refusal["hookSpecificOutput"]
    assert specific["hookEventName"] == "PreToolUse"
    assert specific["permissionDecision"] == "deny"
    assert specific["permissionDecisionReason"].startswith("agentguard: ")
    hints = [a for _, a in seen if a and "additionalContext" in a.get("hookSpecificOutput", {})]
    assert hints
    assert len(seen) < 2 * 141


def test_codex_refusal_in_codex_format(hooks: Hooks) -> None:
    """Codex: identical failing searches end in a deny Codex reads (permissionDecision)."""
    pre = json.loads((DATA / "codex" / "pre_tool_use.json").read_text())
    post = json.loads((DATA / "codex" / "post_tool_use.json").read_text())
    post["tool_response"] = ""
    decisions = []
    for _ in range(8):
        got = answer(hooks.run("codex", json.dumps(pre).encode()))
        decisions.append(got and got["hookSpecificOutput"].get("permissionDecision"))
        if not got or "permissionDecision" not in got["hookSpecificOutput"]:
            answer(hooks.run("codex", json.dumps(post).encode()))
    assert decisions[-2:] == ["deny", "deny"]
    assert decisions[0] is None


def test_a_relative_configuration_is_the_daemons_too(hooks: Hooks, tmp_path: Path) -> None:
    """``--config agentguard.yaml`` from the project directory: the daemon (which runs
    elsewhere) judges with that file's ladders (here: refuse the 4th unchanged attempt)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "agentguard.yaml").write_text(
        "reliability:\n  loop_detection:\n"
        "    {no_progress_warn_at: 2, no_progress_critical_at: 3, no_progress_break_at: 4}\n"
    )
    pre = (DATA / "codex" / "pre_tool_use.json").read_bytes()
    post = json.dumps(
        {**json.loads((DATA / "codex" / "post_tool_use.json").read_text()), "tool_response": ""}
    )
    decisions = []
    for _ in range(4):
        got = answer(hooks.run("codex", pre, "--config", "agentguard.yaml", cwd=project))
        decisions.append(got and got["hookSpecificOutput"].get("permissionDecision"))
        answer(hooks.run("codex", post.encode(), "--config", "agentguard.yaml", cwd=project))
    assert decisions == [None, None, None, "deny"]


def test_a_relative_storage_path_is_in_the_hooks_directory(hooks: Hooks, tmp_path: Path) -> None:
    """``storage.path`` relative in the configuration: the daemon (which runs elsewhere) opens
    that file in the hook's working directory, as a hook judging in process does, and serves."""
    project = tmp_path / "project"
    (project / "state").mkdir(parents=True)
    (project / "agentguard.yaml").write_text(
        "reliability:\n  storage: {backend: sqlite, path: state/hooks.sqlite}\n"
        "  loop_detection:\n"
        "    {no_progress_warn_at: 2, no_progress_critical_at: 3, no_progress_break_at: 4}\n"
    )
    hooks.env["AGENTGUARD_CONFIG"] = "agentguard.yaml"
    pre = (DATA / "codex" / "pre_tool_use.json").read_bytes()
    post = json.dumps(
        {**json.loads((DATA / "codex" / "post_tool_use.json").read_text()), "tool_response": ""}
    )
    decisions = []
    for _ in range(4):
        got = answer(hooks.run("codex", pre, cwd=project))
        decisions.append(got and got["hookSpecificOutput"].get("permissionDecision"))
        answer(hooks.run("codex", post.encode(), cwd=project))
    assert decisions == [None, None, None, "deny"]
    assert [p.name for p in (project / "state").glob("*.sqlite")] == ["hooks.sqlite"]
    assert list((tmp_path / "run").glob("*.sock")), "the daemon answered the later events"


def test_a_tool_name_with_a_lone_surrogate_is_judged(hooks: Hooks) -> None:
    """A tool name holding a lone surrogate (valid JSON ``\\ud800``): the answers are written
    (as JSON escapes), the loop is refused as any other's, and one daemon serves throughout."""
    tool = "mcp__srv__f\\ud800"
    pre = '{"session_id":"s","hook_event_name":"PreToolUse","tool_name":"%s","tool_input":{}}'
    post = pre.replace("PreToolUse", "PostToolUse")[:-1] + ',"tool_response":"no match"}'
    decisions, daemons = [], set()
    for _ in range(8):
        got = answer(hooks.run("claude-code", (pre % tool).encode()))
        decisions.append(got and got["hookSpecificOutput"].get("permissionDecision"))
        answer(hooks.run("claude-code", (post % tool).encode()))
        daemons |= {lock.read_text().strip() for lock in (hooks.root / "run").glob("*.lock")}
    assert "deny" in decisions
    assert len(daemons - {""}) == 1  # "": a daemon between truncating its lock and writing it


@pytest.mark.parametrize(
    ("stdin", "args"),
    [
        (b"{not json", ()),
        (b"", ()),
        (
            (DATA / "claude-code" / "pre_tool_use.json").read_bytes(),
            ("--store", "/proc/none/x.sqlite"),
        ),
        (
            (DATA / "claude-code" / "pre_tool_use.json").read_bytes(),
            ("--config", "/nonexistent.yaml"),
        ),
    ],
)
def test_faults_fail_open(hooks: Hooks, stdin: bytes, args: tuple[str, ...]) -> None:
    """Garbage on stdin, a store that cannot be opened, a missing configuration: exit 0 and no
    output — the agent proceeds."""
    done = hooks.run("claude-code", stdin, "--no-daemon", *args)
    assert done.returncode == 0
    assert done.stdout == b""


def test_a_write_locked_store_fails_open(hooks: Hooks) -> None:
    """Another process holds the store's write lock for longer than its busy timeout: the hook
    gives up (the subprocess timeout is only a guard against a hang) and exits 0 silently."""
    event = (DATA / "claude-code" / "pre_tool_use.json").read_bytes()
    assert answer(hooks.run("claude-code", event, "--no-daemon")) is None  # creates the store
    holder = sqlite3.connect(hooks.root / "state" / "agentguard" / "hooks.sqlite")
    holder.isolation_level = None
    try:
        holder.execute("BEGIN IMMEDIATE")
        done = hooks.run("claude-code", event, "--no-daemon")
    finally:
        holder.close()
    assert done.returncode == 0
    assert done.stdout == b""


class _OpenedLocked(SQLiteStore):
    """A SQLite store whose first open waits on a fake clock, counting the operations tried."""

    opened: ClassVar[list[_OpenedLocked]] = []

    def __init__(self, path: str, *, busy_timeout: float) -> None:
        clock = FakeClock()
        super().__init__(path, busy_timeout=busy_timeout, clock=clock, sleep=clock.sleep)
        self.steps = 0
        self.opened.append(self)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self.steps += 1
        with super()._transaction() as db:
            yield db


def test_a_store_locked_through_its_set_up_fails_the_event_open_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hook judging in its own process opens the store while another process holds its write
    lock: the set-up waits its busy timeout (on the store's clock, here a fake one) and gives
    up, and the event proceeds then — no store step waits the busy timeout again."""
    for key in [k for k in os.environ if k.startswith("AGENTGUARD_")]:
        monkeypatch.delenv(key)
    path = tmp_path / "hooks.sqlite"
    SQLiteStore(path).close()
    monkeypatch.setattr(guards, "SQLiteStore", _OpenedLocked)
    _OpenedLocked.opened.clear()
    caplog.set_level(logging.WARNING, "agentguard.hooks")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        event = (DATA / "claude-code" / "pre_tool_use.json").read_bytes()
        assert judge_once("claude-code", event, None, str(path)) == HookAnswer()
    finally:
        holder.close()
    (store,) = _OpenedLocked.opened
    assert not store.ready
    assert store.steps == 0
    assert "agentguard hook failed open (StoreUnavailable)" in caplog.text


def test_a_daemon_that_does_not_answer_in_time_lets_the_event_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon that takes the event but does not answer within the hook's wait (its store is
    write-locked, and it waits for it): the event proceeds, unjudged — the hook does not open
    the store itself to wait for the same lock again."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("AGENTGUARD_HOOK_DIR", str(run_dir))
    monkeypatch.setattr(client, "ANSWER_TIMEOUT", 0.05)
    store = tmp_path / "hooks.sqlite"
    path = daemon_socket(None, str(store))
    assert path is not None
    busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    busy.bind(path)
    busy.listen(1)  # takes the connection, never answers
    out = io.BytesIO()
    try:
        event = (DATA / "claude-code" / "pre_tool_use.json").read_bytes()
        code = client.run("claude-code", store=str(store), stdin=io.BytesIO(event), stdout=out)
    finally:
        busy.close()
        Hooks(tmp_path).stop_daemons()
    assert (code, out.getvalue()) == (0, b"")
    assert not store.exists()


def test_no_daemon_socket_in_a_directory_others_can_enter(tmp_path: Path) -> None:
    """The daemon's socket lives only in a private directory (0700, ours)."""
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    assert daemon_socket(None, None, {"AGENTGUARD_HOOK_DIR": str(open_dir)}) is None
    private = tmp_path / "private"
    path = daemon_socket(None, None, {"AGENTGUARD_HOOK_DIR": str(private)})
    assert path is not None
    assert Path(path).parent == private
    assert private.stat().st_mode & 0o777 == 0o700
    assert (
        daemon_socket(
            None, None, {"AGENTGUARD_HOOK_DIR": str(private), "AGENTGUARD_HOOK_DAEMON": "0"}
        )
        is None
    )
    other = daemon_socket(None, "redis://h/0", {"AGENTGUARD_HOOK_DIR": str(private)})
    assert other is not None
    assert other != path


def test_the_fast_path_loads_no_guard() -> None:
    """The command hook's client path imports neither pydantic nor the guard's components: its
    start-up is the agent's latency on every tool call."""
    probe = (
        "import sys, agentguard.cli, agentguard.cli._hook, agentguard.hooks._client;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'rapidfuzz',"
        " 'anyio') or m.startswith(('agentguard.config', 'agentguard.loops',"
        " 'agentguard.storage', 'agentguard.hooks._guard'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": SRC},
        check=True,
    )
    assert done.stdout.strip() == b"[]"


def test_the_plain_hook_takes_its_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``agentguard hook claude-code`` (the documented form) goes to the client at once, with the
    defaults; any option is argparse's to read, as before."""
    import agentguard.hooks._client as client
    from agentguard import cli

    calls: list[tuple[str, dict[str, Any]]] = []

    def run(agent: str, **options: Any) -> int:
        calls.append((agent, options))
        return 0

    monkeypatch.setattr(client, "run", run)
    parsed: list[list[str]] = []
    real_main = cli._main
    monkeypatch.setattr(cli, "_main", lambda args: parsed.append(args) or real_main(args))
    assert cli.main(["hook", "codex"]) == 0
    assert calls == [("codex", {})]
    assert parsed == []
    assert cli.main(["hook", "claude-code", "--no-daemon"]) == 0
    assert calls[-1] == ("claude-code", {"config": None, "store": None, "daemon": False})
    assert parsed == [["hook", "claude-code", "--no-daemon"]]


def test_a_hook_answered_by_the_daemon_imports_neither_argparse_nor_typing(hooks: Hooks) -> None:
    """Start-up is the agent's latency on every tool call: the plain form answered by the
    daemon imports neither argparse nor typing (together about half the hook's own start-up)."""
    event = (DATA / "claude-code" / "pre_tool_use.json").read_bytes()
    probe = (
        "import sys; from agentguard.cli import main; code = main(['hook', 'claude-code']);"
        "print(sorted({'argparse', 'typing', 'agentguard.config'} & set(sys.modules)),"
        " file=sys.stderr); sys.exit(code)"
    )
    loaded = None
    # the first event is judged in its own process, which starts the daemon; the daemon loads
    # the guard before it listens, and until then each event is judged in its process too
    for _ in range(300):
        done = subprocess.run(
            [sys.executable, "-c", probe],
            input=event,
            capture_output=True,
            env=hooks.env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0
        assert done.stdout == b""
        loaded = done.stderr.strip()
        if b"agentguard.config" not in loaded:  # answered by the daemon
            break
    assert loaded == b"[]"


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (b"cursor\n{}", b"0\n"),  # an agent the daemon does not know: proceed
        (b"claude-code\n{not json", b"0\n"),  # an event it cannot read: proceed
        (b"", b"0\n"),
    ],
)
def test_the_daemon_answers_what_it_cannot_judge_with_silence(
    tmp_path: Path, request_bytes: bytes, expected: bytes
) -> None:
    """The daemon's side of the wire: whatever arrives, the answer lets the agent proceed."""
    store = SQLiteStore(tmp_path / "d.sqlite")
    guard = HookGuard(GuardConfig.from_dict({}, env={}), store=store)
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(request_bytes)
        theirs.shutdown(socket.SHUT_WR)
        _answer(guard, ours)
        ours.close()
        assert theirs.recv(1024) == expected
    finally:
        theirs.close()
        store.close()


class _UnwritableAnswer(HookAnswer):
    @property
    def stdout(self) -> str:
        return "\ud800"  # text no encoding can write


class _Unwritable(HookGuard):
    def handle(self, agent: str, payload: Any) -> HookAnswer:
        return _UnwritableAnswer({})


def test_the_daemon_answers_an_answer_it_cannot_write_with_silence(tmp_path: Path) -> None:
    """An answer whose text cannot be encoded: that event proceeds; the daemon carries on."""
    store = SQLiteStore(tmp_path / "d.sqlite")
    guard = _Unwritable(GuardConfig.from_dict({}, env={}), store=store)
    try:
        for _ in range(2):
            ours, theirs = socket.socketpair()
            with theirs:
                theirs.sendall(b"claude-code\n{}")
                theirs.shutdown(socket.SHUT_WR)
                _answer(guard, ours)
                ours.close()
                assert theirs.recv(1024) == b"0\n"
    finally:
        store.close()
