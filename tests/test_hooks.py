"""HookGuard: coding-agent hook events judged with the session's loop and budget state.

Payloads are the documented ones (``tests/data/hooks``, see its SOURCES.md); state lives in a
real SQLite file (and a real Redis server) as it does for command hooks.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _stores import RedisServer
from agentguard import GuardConfig
from agentguard.hooks import HookAnswer, HookGuard, open_guard, parse_event
from agentguard.hooks import _transcript as transcripts
from agentguard.hooks._state import argument_form, replay_window, result_form
from agentguard.hooks._transcript import Cursor, read_usage
from agentguard.storage import RedisStore, SQLiteStore
from agentguard.testing import FakeClock

DATA = Path(__file__).parent / "data" / "hooks"


def payload(agent: str, name: str, **changes: Any) -> dict[str, Any]:
    """A documented payload of ``agent``, with ``changes`` applied."""
    data: dict[str, Any] = json.loads((DATA / agent / f"{name}.json").read_text())
    data.update(changes)
    return data


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "hooks.sqlite")
    yield store
    store.close()


def guard(store: Any, clock: FakeClock, **config: Any) -> HookGuard:
    return HookGuard(GuardConfig.from_dict(config, env={}), store=store, clock=clock)


class Session:
    """Drives one agent session through hooks: a tool call is a PreToolUse and, when it ran, a
    PostToolUse; the clock moves between events as it does between real hook processes."""

    def __init__(self, agent: str, guards: list[HookGuard], clock: FakeClock, **base: Any):
        self.agent, self.guards, self.clock = agent, guards, clock
        self.base = base
        self.turn = 0

    def event(self, name: str, **fields: Any) -> HookAnswer:
        self.clock.advance(0.5)
        data = payload(self.agent, name, **self.base, **fields)
        answer = self.guards[self.turn % len(self.guards)].handle(self.agent, data)
        self.turn += 1
        return answer

    def tool(self, tool_input: Any, response: Any) -> tuple[HookAnswer, HookAnswer | None]:
        tool = "Bash"
        pre = self.event("pre_tool_use", tool_name=tool, tool_input=tool_input)
        if _decision(pre) == "deny":
            return pre, None  # a refused call does not run: no PostToolUse
        return pre, self.event(
            "post_tool_use", tool_name=tool, tool_input=tool_input, tool_response=response
        )


def _specific(answer: HookAnswer | None) -> dict[str, Any]:
    return (answer.output or {}).get("hookSpecificOutput", {}) if answer else {}


def _decision(answer: HookAnswer | None) -> str | None:
    return _specific(answer).get("permissionDecision")


def _context(answer: HookAnswer | None) -> str | None:
    return _specific(answer).get("additionalContext")


# -- the protocol ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "name", "kind", "tool"),
    [
        ("claude-code", "pre_tool_use", "pre", "Write"),
        ("claude-code", "post_tool_use", "post", "Write"),
        ("claude-code", "post_tool_use_failure", "post", "Bash"),
        ("claude-code", "user_prompt_submit", "prompt", ""),
        ("claude-code", "stop", "stop", ""),
        ("codex", "pre_tool_use", "pre", "Bash"),
        ("codex", "post_tool_use", "post", "Bash"),
        ("codex", "stop", "stop", ""),
    ],
)
def test_documented_payloads_parse(agent: str, name: str, kind: str, tool: str) -> None:
    """Every documented event maps to what the guard judges: kind, session, tool, transcript."""
    data = payload(agent, name)
    event = parse_event(agent, data)
    assert (event.kind, event.tool, event.session) == (kind, tool, data["session_id"])
    assert event.transcript == data["transcript_path"]
    assert event.failed == (name == "post_tool_use_failure")
    if kind == "post":
        assert event.tool_response == data.get("tool_response", data.get("error"))


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_healthy_events_are_answered_with_silence(
    agent: str, db: SQLiteStore, clock: FakeClock
) -> None:
    """A healthy session's events (every documented one) get no output: the agent proceeds."""
    g = guard(db, clock)
    for path in sorted((DATA / agent).glob("*.json")):
        clock.advance(1)
        answer = g.handle(agent, path.read_bytes())
        assert answer == HookAnswer()
        assert answer.stdout == ""
        assert answer.exit_code == 0


def test_varied_work_stays_silent(db: SQLiteStore, clock: FakeClock) -> None:
    """Reading files, editing, re-running tests whose output changes: never a hint."""
    s = Session("claude-code", [guard(db, clock)], clock)
    answers = []
    for i in range(40):
        answers += s.tool({"command": f"sed -n {i},{i + 40}p src/app.py"}, {"stdout": f"line {i}"})
        answers += s.tool({"command": "pytest -q"}, {"stdout": f"{40 - i} failed, {i} passed"})
    assert all(a is not None and a.output is None for a in answers)


# -- loops -----------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_repeated_call_gets_a_hint_then_a_refusal(
    agent: str, db: SQLiteStore, clock: FakeClock
) -> None:
    """The same call with the same result: the hint as additionalContext, then a documented
    deny whose reason names the tool and the count (never the arguments)."""
    s = Session(agent, [guard(db, clock)], clock, transcript_path=None)
    call = {"command": "grep -rn TODO src | head -20"}
    answers = [s.tool(call, "") for _ in range(8)]
    pres = [pre for pre, _ in answers]
    assert [_decision(p) for p in pres] == [None] * 6 + ["deny"] * 2
    hint = _context(answers[2][1])
    assert hint is not None
    assert hint.startswith("agentguard: ")
    assert "`Bash`" in hint
    assert answers[2][1] is not None
    assert answers[2][1].output == {
        "hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": hint}
    }
    refusal = pres[6].output
    assert refusal is not None
    assert refusal["hookSpecificOutput"]["hookEventName"] == "PreToolUse"
    reason = refusal["hookSpecificOutput"]["permissionDecisionReason"]
    assert "7 times" in reason
    assert "grep" not in reason
    assert "TODO" not in reason
    assert pres[0].output is None
    assert answers[0][1] is not None
    assert answers[0][1].output is None
    # the user hears of it when the turn ends, once
    notice = s.event("stop").output
    assert notice == {
        "systemMessage": "agentguard: refused 2 tool calls this turn (repeated without "
        "progress, or past the token budget)."
    }
    assert s.event("stop").output is None


def test_state_is_shared_by_hook_processes(tmp_path: Path, clock: FakeClock) -> None:
    """Events handled by alternating guards (each its own connection to the file, as separate
    hook processes are) are judged exactly as by one guard."""
    looping = [({"command": f"grep -rn 'auth{i % 3}' src"}, {"stdout": ""}) for i in range(12)]

    def run(guards: list[HookGuard]) -> list[Any]:
        s = Session("claude-code", guards, clock)
        return [[a.output if a else None for a in s.tool(*step)] for step in looping]

    one = SQLiteStore(tmp_path / "one.sqlite")
    stores = [SQLiteStore(tmp_path / "shared.sqlite") for _ in range(3)]
    try:
        alone = run([guard(one, clock)])
        shared = run([guard(store, clock) for store in stores])
    finally:
        for store in (one, *stores):
            store.close()
    assert shared == alone
    assert any(step[0] is not None for step in alone)  # the loop was flagged


def test_near_identical_greps_of_a_real_looping_session(db: SQLiteStore, clock: FakeClock) -> None:
    """The 141-search session (reconstructed): hinted within its first dozen searches, refused
    well before its end, and no healthy-looking call in between is refused."""
    g = guard(db, clock, token_budget={"enabled": False})
    denied_at = hinted_at = None
    ran = 0
    skip_post = False
    lines = (DATA / "claude-code" / "grep_loop_session.jsonl").read_text().splitlines()
    for n, line in enumerate(lines):
        event = json.loads(line)["event"]
        event["transcript_path"] = None
        if event["hook_event_name"] == "PostToolUse":
            if skip_post:
                continue
            ran += 1
        clock.advance(20)
        answer = g.handle("claude-code", event)
        skip_post = _decision(answer) == "deny"
        if hinted_at is None and _context(answer):
            hinted_at = n // 2
        if denied_at is None and skip_post:
            denied_at = n // 2
    assert hinted_at is not None
    assert hinted_at <= 12
    assert denied_at is not None
    assert denied_at <= 40
    assert ran < 141


def test_a_user_message_is_news(db: SQLiteStore, clock: FakeClock) -> None:
    """After a new user prompt, a run of reworded searches starts again (no stale hint)."""
    s = Session("claude-code", [guard(db, clock)], clock)
    words = ["find the auth module", "find the auth package", "find the auth code"]
    for w in words:
        s.tool({"query": w}, "no results")
    _, flagged = s.tool({"query": "find the auth file"}, "no results")
    assert _context(flagged) is not None
    s.event("user_prompt_submit")
    _, after = s.tool({"query": "find the auth helper"}, "no results")
    assert _context(after) is None


def test_the_log_keeps_only_the_replay_window(db: SQLiteStore, clock: FakeClock) -> None:
    """However long the session, the store holds at most the replay window of its events."""
    g = guard(db, clock, loop_detection={"tool_window": 4, "break_at": 6, "critical_at": 5,
                                         "warn_at": 4, "global_break_at": 6,
                                         "global_critical_at": 5, "global_warn_at": 4,
                                         "cycle_max_period": 2})  # fmt: skip
    s = Session("claude-code", [g], clock)
    for i in range(50):
        s.tool({"command": f"cat file{i}"}, f"content {i}")
    window = replay_window(g.config.loop_detection)
    session = payload("claude-code", "pre_tool_use")["session_id"]
    assert 0 < len(db.items(f"hooks:loops:{session}", clock())) <= window


# -- budgets ---------------------------------------------------------------------------------


def _transcript(tmp_path: Path, agent: str, name: str) -> Path:
    target = tmp_path / name
    shutil.copy(DATA / agent / name, target)
    return target


def test_claude_transcript_usage_is_counted_once(tmp_path: Path, clock: FakeClock) -> None:
    """Usage read from a Claude Code transcript: cache reads and writes count as prompt, one
    message split over lines counts once (its largest output), and two hook processes reading
    the same lines count them once."""
    path = _transcript(tmp_path, "claude-code", "transcript.jsonl")
    stores = [SQLiteStore(tmp_path / "s.sqlite") for _ in range(2)]
    try:
        guards = [guard(store, clock) for store in stores]
        for g in guards:
            g.handle("claude-code", payload("claude-code", "stop", transcript_path=str(path)))
        session = payload("claude-code", "stop")["session_id"]
        assert guards[0].ledger.usage(session).session_tokens == (3 + 1520 + 14210 + 97) + (
            5 + 240 + 15730 + 21
        )
    finally:
        for store in stores:
            store.close()


def _counted_in_reads(
    content: bytes, cuts: list[int], schedule: list[tuple[int, int | None]]
) -> tuple[int, list[Cursor]]:
    """The session tokens counted when ``content`` is written in pieces (ending at each of
    ``cuts``, then the rest) and a Stop hook reads it after each piece, as ``schedule`` says:
    for each read, which of two hook processes (each on its own connection to one SQLite file)
    reads, and which cursor stored after an earlier read (if any) it finds instead of the
    latest — as when a hook that read less stores its cursor last. Returns the tokens counted
    and the cursors stored."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(b"")
        clock = FakeClock()
        stores = [SQLiteStore(Path(tmp) / "s.sqlite") for _ in range(2)]
        try:
            guards = [guard(store, clock) for store in stores]
            stop = payload("claude-code", "stop", transcript_path=str(path))
            session = stop["session_id"]
            stored: list[str | None] = []
            for i, end in enumerate([*cuts, len(content)]):
                with path.open("ab") as f:
                    f.write(content[cuts[i - 1] if i else 0 : end])
                who, stale = schedule[i % len(schedule)] if schedule else (0, None)
                if stale is not None and stored and stored[stale % len(stored)] is not None:
                    stores[0].put(
                        "hooks:cursor", session, str(stored[stale % len(stored)]), clock(), 60
                    )
                clock.advance(1)
                guards[who].handle("claude-code", stop)
                stored.append(stores[0].get("hooks:cursor", session, clock()))
            used = guards[0].ledger.usage(session).session_tokens
        finally:
            for store in stores:
                store.close()
    return used, [Cursor.loads(text, str(path)) for text in stored]


_reads = st.lists(st.tuples(st.integers(0, 1), st.none() | st.integers(0, 64)), max_size=8)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), schedule=_reads)
def test_a_message_split_over_reads_counts_its_largest_usage(
    data: st.DataObject, schedule: list[tuple[int, int | None]]
) -> None:
    """The transcript's lines written and read in any pieces (a hook between a message's text
    line, 8 output tokens, and its tool-use line, 97), by two hook processes, one finding a
    cursor another stored late: the tokens counted are those of one whole read."""
    content = (DATA / "claude-code" / "transcript.jsonl").read_bytes()
    whole, _ = _counted_in_reads(content, [], [])
    assert whole == (3 + 1520 + 14210 + 97) + (5 + 240 + 15730 + 21)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(content) - 1), max_size=6)))
    assert _counted_in_reads(content, cuts, schedule)[0] == whole


_line_usage = st.tuples(st.integers(0, 50_000), st.integers(0, 4_000))


@settings(max_examples=40, deadline=None)
@given(
    messages=st.lists(st.lists(_line_usage, min_size=1, max_size=4), min_size=1, max_size=12),
    data=st.data(),
    schedule=_reads,
)
def test_each_message_counts_its_largest_usage_once(
    messages: list[list[tuple[int, int]]],
    data: st.DataObject,
    schedule: list[tuple[int, int | None]],
) -> None:
    """Messages of one to four lines each, their usage rising or not from line to line, read in
    any pieces: each counts its largest prompt and its largest output, once; a cursor keeps at
    most a few messages' counts, however long the session."""
    template = json.loads((DATA / "claude-code" / "transcript.jsonl").read_bytes().splitlines()[1])
    user = (DATA / "claude-code" / "transcript.jsonl").read_bytes().splitlines()[0] + b"\n"
    content = b""
    for i, lines in enumerate(messages):
        for prompt, output in lines:
            line = copy.deepcopy(template)
            line["message"]["id"] = f"msg_{i:02d}"
            line["message"]["usage"] = {"input_tokens": prompt, "output_tokens": output}
            content += json.dumps(line).encode() + b"\n"
        content += user
    cuts = sorted(data.draw(st.sets(st.integers(1, len(content) - 1), max_size=8)))
    used, cursors = _counted_in_reads(content, cuts, schedule)
    assert used == sum(max(p for p, _ in m) + max(c for _, c in m) for m in messages)
    assert all(len(cursor.counted) <= transcripts._COUNTED for cursor in cursors)


def test_codex_rollout_usage_follows_the_running_total(tmp_path: Path, db: SQLiteStore) -> None:
    """Codex token_count events: the running total counts; a repeated report adds nothing."""
    path = _transcript(tmp_path, "codex", "rollout.jsonl")
    entries, cursor = read_usage("codex", Cursor(str(path)))
    assert [e.usage.total_tokens for e in entries] == [12_580, 12_760]
    assert cursor.total == 25_340
    assert cursor.offset == path.stat().st_size
    assert read_usage("codex", cursor) == ([], cursor)


def test_the_transcript_is_read_incrementally(tmp_path: Path) -> None:
    """Only lines appended since the cursor are read; a line still being written waits."""
    path = tmp_path / "t.jsonl"
    lines = (DATA / "claude-code" / "transcript.jsonl").read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1] + lines[2][:40])
    first, cursor = read_usage("claude-code", Cursor(str(path)))
    assert [e.usage.completion_tokens for e in first] == [8]
    assert cursor.offset == len(lines[0]) + len(lines[1])
    path.write_bytes(b"".join(lines))
    rest, cursor = read_usage("claude-code", cursor)
    # the message's second line adds what it shows beyond its first (97 - 8 output tokens)
    assert [e.usage.completion_tokens for e in rest] == [89, 21]
    assert [e.usage.prompt_tokens for e in rest] == [0, 5 + 240 + 15730]
    assert rest[0].message == first[0].message == first[0].event_id
    assert rest[0].event_id == f"{first[0].event_id}@{3 + 1520 + 14210}/8"
    assert Cursor.loads(cursor.dumps(), str(path)) == cursor
    assert Cursor.loads(cursor.dumps(), "other.jsonl") == Cursor("other.jsonl")
    assert Cursor.loads("not json", str(path)) == Cursor(str(path))
    assert cursor.counted == (
        (first[0].event_id, 3 + 1520 + 14210, 97),
        (rest[1].event_id, 5 + 240 + 15730, 21),
    )
    # a cursor stored before it kept counts reads on from its offset; a damaged one from the start
    assert Cursor.loads(json.dumps([str(path), 7, 0]), str(path)) == Cursor(str(path), 7)
    assert Cursor.loads(json.dumps([str(path), 7, 0, [["m", -1, 0]]]), str(path)) == Cursor(
        str(path)
    )


def test_a_transcript_path_cannot_make_the_hook_read_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device named as the transcript reads as empty; a line too long to be a usage line is
    passed over without being kept whole, and the lines after it are still read."""
    assert read_usage("claude-code", Cursor("/dev/zero")) == ([], Cursor("/dev/zero"))
    monkeypatch.setattr(transcripts, "_MAX_LINE", 800)
    monkeypatch.setattr(transcripts, "_CHUNK", 64)
    usage_line = (DATA / "claude-code" / "transcript.jsonl").read_bytes().splitlines()[4]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"type": "user", "content": "' + b"x" * 3000 + b'"}\n' + usage_line + b"\n")
    entries, cursor = read_usage("claude-code", Cursor(str(path)))
    assert [e.usage.completion_tokens for e in entries] == [21]
    assert cursor.offset == path.stat().st_size


def test_a_hard_stop_budget_refuses_tool_calls(
    tmp_path: Path, db: SQLiteStore, clock: FakeClock
) -> None:
    """Past the session budget under hard_stop, every tool call is refused with the budget named;
    under the default policy the model is told once; the user sees a notice at Stop, once."""
    path = _transcript(tmp_path, "claude-code", "transcript.jsonl")
    budget = {"per_session": 20_000, "per_hour": None}
    hard = guard(db, clock, token_budget={**budget, "policy": "hard_stop"})
    pre = payload("claude-code", "pre_tool_use", transcript_path=str(path))
    first = hard.handle("claude-code", pre)
    assert _decision(first) == "deny"
    assert (
        "token budget is used up (31,826 of 20,000 tokens)"
        in _specific(first)["permissionDecisionReason"]
    )
    assert _decision(hard.handle("claude-code", pre)) == "deny"
    stop = payload("claude-code", "stop", transcript_path=str(path))
    notice = hard.handle("claude-code", stop)
    assert notice.output is not None
    assert "used up" in notice.output["systemMessage"]
    assert hard.handle("claude-code", stop).output is None

    other = SQLiteStore(tmp_path / "other.sqlite")
    try:
        soft = guard(other, clock, token_budget=budget)
        told = soft.handle("claude-code", pre)
        assert _decision(told) is None
        assert "used up" in (_context(told) or "")
        assert soft.handle("claude-code", pre).output is None
    finally:
        other.close()


def test_a_budget_warning_is_said_once(tmp_path: Path, db: SQLiteStore, clock: FakeClock) -> None:
    """Past warn_ratio of a budget the model is told the share used, once."""
    path = _transcript(tmp_path, "claude-code", "transcript.jsonl")
    g = guard(db, clock, token_budget={"per_session": 35_000, "per_hour": None})
    pre = payload("claude-code", "pre_tool_use", transcript_path=str(path))
    said = _context(g.handle("claude-code", pre))
    assert said == (
        "agentguard: 90% of the session token budget is used (31,826 of 35,000 tokens). "
        "Work towards your answer."
    )
    assert g.handle("claude-code", pre).output is None


def test_a_missing_transcript_leaves_the_budget_alone(db: SQLiteStore, clock: FakeClock) -> None:
    """A transcript not written yet (or unreadable) is read later; the event is still judged."""
    g = guard(db, clock, token_budget={"per_session": 1})
    pre = payload("claude-code", "pre_tool_use", transcript_path="/nonexistent/t.jsonl")
    assert g.handle("claude-code", pre).output is None


# -- never leak, never block on a fault ------------------------------------------------------


def test_secrets_in_tool_inputs_reach_neither_store_nor_answers(
    db: SQLiteStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A key in a command, a credential field, a long file body: none of it is stored, none of
    it is answered; the loop is still judged."""
    secret = "sk-proj-Abc123Def456Ghi789Jkl"
    body = "SECRET-BODY " * 100
    call = {"command": f"curl -H 'Authorization: Bearer {secret}' https://api.example.com/v1/x",
            "api_key": "hunter2-very-secret", "content": body}  # fmt: skip
    s = Session("claude-code", [guard(db, clock)], clock)
    caplog.set_level(logging.DEBUG)
    answers = [a for _ in range(8) for a in s.tool(call, {"stdout": f"denied for {secret}"})]
    session = payload("claude-code", "pre_tool_use")["session_id"]
    stored = json.dumps(db.items(f"hooks:loops:{session}", clock()))
    said = json.dumps([a.output for a in answers if a is not None]) + caplog.text
    for leak in (secret, "hunter2", "SECRET-BODY"):
        assert leak not in stored
        assert leak not in said
    assert any(_decision(a) == "deny" for a in answers if a is not None)


def test_credentials_typed_in_shell_commands_are_not_stored(
    db: SQLiteStore, clock: FakeClock
) -> None:
    """What coding agents type: a variable assigned a key, an exported token, a credential
    header, a CLI setting a secret. The value is not stored (plain values: no key shape, only
    their names tell); each command repeated is still judged the same (its form is stable),
    and a command without a secret is stored as it came."""
    commands = {
        "OPENAI_API_KEY=Zq8mW3xK9pL2vN7rT4yB6cD1fG5hJ0sA python run.py": "Zq8mW3xK9pL2vN7rT4yB6cD1fG5hJ0sA",
        "export GITHUB_TOKEN=abcd1234efgh5678ijkl9012mnop3456": "abcd1234efgh5678ijkl9012mnop3456",
        "curl -H 'X-Api-Key: 77aa88bb99cc00dd11ee22ff33aa44bb' https://api.internal/v1": "77aa88bb99cc00dd11ee22ff33aa44bb",
        "aws configure set aws_secret_access_key wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY": "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
    }  # fmt: skip
    for command in commands:
        assert argument_form({"command": command}) == argument_form({"command": command})
    s = Session("claude-code", [guard(db, clock)], clock)
    for command in commands:
        s.tool({"command": command}, {"stdout": "ok"})
    s.tool({"command": "pytest -q tests/test_tokens.py"}, {"stdout": "ok"})
    session = payload("claude-code", "pre_tool_use")["session_id"]
    stored = json.dumps(db.items(f"hooks:loops:{session}", clock()))
    for value in commands.values():
        assert value not in stored
    assert "export GITHUB_TOKEN=***" in stored
    assert "pytest -q tests/test_tokens.py" in stored


def test_secret_keys_in_short_tool_results_are_redacted_as_in_inputs(
    db: SQLiteStore, clock: FakeClock
) -> None:
    """A short structured result (or failure) with a credential field: its value is not
    stored, as the same field in the tool's input is not."""
    secret = "q9Zx7LmN4pR2tVw8"
    s = Session("claude-code", [guard(db, clock)], clock)
    s.tool({"user": "me"}, {"token": secret})
    s.tool({"user": "you"}, {"error": "refused", "password": secret + "ERR"})
    session = payload("claude-code", "pre_tool_use")["session_id"]
    assert secret not in json.dumps(db.items(f"hooks:loops:{session}", clock()))


class _Broken(SQLiteStore):
    def items(self, namespace: str, now: float) -> list[tuple[str, str]]:
        raise RuntimeError("disk on fire: sk-proj-Abc123Def456Ghi789Jkl")


def test_faults_fail_open(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A store fault, a payload that is not JSON or not an event, an unknown agent: silence
    (the agent proceeds), and a log line that names the fault's type only."""
    store = _Broken(tmp_path / "broken.sqlite")
    try:
        g = guard(store, clock)
        caplog.set_level(logging.WARNING, "agentguard.hooks")
        for agent, data in [
            ("claude-code", payload("claude-code", "pre_tool_use")),
            ("claude-code", b"{not json"),
            ("claude-code", b"[1, 2]"),
            ("claude-code", {"hook_event_name": "PreToolUse"}),
            ("cursor", payload("claude-code", "pre_tool_use")),
        ]:
            assert g.handle(agent, data) == HookAnswer()
    finally:
        store.close()
    assert "RuntimeError" in caplog.text
    assert "sk-proj" not in caplog.text


class _Steps:
    """A store that counts the operations tried on it."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store, self.tried = store, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.tried += 1
            return method(*args, **kwargs)

        return counted


def test_a_write_locked_store_fails_the_event_open_at_its_first_step(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the store's write lock: each event is let through (and the fault
    logged) at the first store step that finds it locked — the budget read, the loop log, the
    turn's refusals are not waited for one after the other (each would wait the busy timeout)."""
    path = _transcript(tmp_path, "claude-code", "transcript.jsonl")
    real = SQLiteStore(tmp_path / "locked.sqlite", busy_timeout=0)  # busy: at once, not after 5 s
    holder = sqlite3.connect(tmp_path / "locked.sqlite", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        store = _Steps(real)
        g = guard(store, clock, token_budget={"per_session": 1_000})
        caplog.set_level(logging.WARNING, "agentguard.hooks")
        for name, changes in [
            ("pre_tool_use", {"transcript_path": None}),
            ("post_tool_use", {"transcript_path": None}),
            ("stop", {"transcript_path": None}),
            ("pre_tool_use", {"transcript_path": str(path)}),
            ("user_prompt_submit", {}),
        ]:
            store.tried = 0
            assert g.handle("claude-code", payload("claude-code", name, **changes)) == HookAnswer()
            assert store.tried == 1, name
        assert caplog.text.count("agentguard hook failed open (StoreUnavailable)") == 5
    finally:
        holder.close()
        real.close()


def test_redis_shares_sessions_too(redis_server: RedisServer, clock: FakeClock) -> None:
    """With a Redis store, guards on different connections judge one session together."""
    stores = [RedisStore(redis_server.url, key_prefix="hooks-test") for _ in range(2)]
    try:
        s = Session("codex", [guard(store, clock) for store in stores], clock)
        pres = [s.tool({"command": "rg -n missing_symbol"}, "")[0] for _ in range(8)]
    finally:
        for store in stores:
            store.close()
    assert [_decision(p) for p in pres][5:] == [None, "deny", "deny"]


# -- replay forms ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(json_values)
def test_argument_forms_are_stable_stored_data(value: Any) -> None:
    """The replay form of arguments is JSON, the same for equal arguments, and short."""
    form = argument_form(value)
    assert json.loads(json.dumps(form)) == form
    assert argument_form(copy.deepcopy(value)) == form
    assert all(len(t) <= 220 for t in _texts(form))


@given(json_values, st.integers(min_value=0, max_value=200))
def test_result_forms_keep_identity_and_informativeness(value: Any, min_chars: int) -> None:
    """A result's form is the same for equal results and at least ``min_chars`` long exactly
    when the result is (what the near-duplicate detector asks of a result)."""
    form = result_form(value, False, min_chars)
    assert result_form(copy.deepcopy(value), False, min_chars) == form
    size = len(value) if isinstance(value, str) else len(str(value))  # the detector's measure
    if form is not value:
        assert (len(form) >= min_chars) == (size >= min_chars)


def test_different_results_have_different_forms() -> None:
    """Two long results that differ (beyond timestamps) are told apart; timestamps are not."""
    a = {"stdout": "x" * 100, "at": "2026-11-24T10:00:00Z"}
    b = {"stdout": "x" * 100, "at": "2026-11-24T11:00:00Z"}
    c = {"stdout": "y" * 100, "at": "2026-11-24T10:00:00Z"}
    assert result_form(a, False, 48) == result_form(b, False, 48) != result_form(c, False, 48)


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _texts(k)
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


def test_open_guard_picks_the_shared_store(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--store`` (a SQLite file or a Redis URL) first, then the configuration's ``storage``,
    else the default SQLite file under ``$XDG_STATE_HOME``."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for key in [k for k in os.environ if k.startswith("AGENTGUARD_")]:
        monkeypatch.delenv(key)
    config = tmp_path / "agentguard.yaml"
    config.write_text(f"storage: {{backend: sqlite, path: {tmp_path / 'configured.sqlite'}}}\n")
    cases = [
        (None, str(tmp_path / "given.sqlite"), SQLiteStore, tmp_path / "given.sqlite"),
        (None, redis_server.url, RedisStore, None),
        (str(config), None, SQLiteStore, tmp_path / "configured.sqlite"),
        (None, None, SQLiteStore, tmp_path / "state" / "agentguard" / "hooks.sqlite"),
    ]
    for config_path, store, kind, file in cases:
        g = open_guard(config_path, store)
        try:
            assert type(g.store) is kind
            if file is not None:
                assert Path(g.store.path) == file  # type: ignore[attr-defined]
        finally:
            g.close()
    assert (tmp_path / "state" / "agentguard").stat().st_mode & 0o777 == 0o700


def test_a_damaged_log_record_is_skipped(db: SQLiteStore, clock: FakeClock) -> None:
    """A record that is not JSON (or not an event) in a session's log is passed over; the loop
    is still judged from the others."""
    s = Session("claude-code", [guard(db, clock)], clock, transcript_path=None)
    session = payload("claude-code", "pre_tool_use")["session_id"]
    for i, junk in enumerate(["{not json", "[1, 2]", '{"k": "call"}']):
        db.put(
            f"hooks:loops:{session}", f"{int(clock() * 1e6) - 10 + i:017d}-junk", junk, clock(), 60
        )
    pres = [s.tool({"command": "ls missing/"}, "")[0] for _ in range(7)]
    assert _decision(pres[-1]) == "deny"
