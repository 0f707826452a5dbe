"""``agentguard scan`` reads every trace format: a real sample of each (``tests/data/``,
sources in ``tests/data/SOURCES.md``), format detection item by item, ``--format``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentguard.cli._audit import SessionAudit
from agentguard.cli._formats import FORMATS, InputError, detect, records
from agentguard.cli._scan import scan_file
from agentguard.config import GuardConfig
from agentguard.types import Severity

DATA = Path(__file__).parent / "data"
CONFIG = GuardConfig.from_dict({}, env={})


def scan(name: str, fmt: str | None = None) -> dict[str, SessionAudit]:
    """The audits of a sample, by session."""
    return {a.id: a for a in scan_file(str(DATA / name), CONFIG, fmt=fmt)}


def found(audit: SessionAudit) -> list[tuple[str, int, str | None]]:
    """``(detector, step, tool)`` of each finding."""
    return [(i.detector, i.step, i.tool) for i in audit.issues]


def test_atif_trajectory_of_a_recorded_claude_code_run() -> None:
    """ATIF: agent steps are answers with their calls, observations the results; usage is the
    steps' metrics; a healthy run has no finding."""
    doc = json.loads((DATA / "atif_claude_code.trajectory.json").read_text())
    (audit,) = scan("atif_claude_code.trajectory.json").values()
    assert audit.id == doc["session_id"]
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert audit.steps == len(agent_steps)
    assert audit.tokens == sum(
        s["metrics"]["prompt_tokens"] + s["metrics"]["completion_tokens"]
        for s in agent_steps
        if "metrics" in s
    )
    calls = sum(len(s.get("tool_calls") or ()) for s in agent_steps)
    assert sum(t.calls for t in audit.tools.values()) == calls
    assert not audit.estimated
    assert audit.issues == []


def test_claude_code_session_joins_blocks_and_reads_tool_results() -> None:
    """Claude Code: tool_use blocks are calls, tool_result blocks their results, usage counts
    prompt (cache included) and output."""
    text = (DATA / "claude_code_session.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    (audit,) = scan("claude_code_session.jsonl").values()
    assert audit.id == "test_session"
    usage = {
        line["message"]["id"]: line["message"]["usage"]
        for line in lines
        if line["type"] == "assistant"
    }
    assert audit.tokens == sum(
        u["input_tokens"]
        + u["cache_creation_input_tokens"]
        + u["cache_read_input_tokens"]
        + u["output_tokens"]
        for u in usage.values()
    )
    assert audit.steps == len(usage)
    assert {name: s.calls for name, s in audit.tools.items()} == {"Edit": 1, "Bash": 1}


def test_claude_code_session_of_a_real_claude_code_run() -> None:
    """A session Claude Code wrote (run offline against a scripted Messages API): its records
    of other kinds are skipped, the five identical polls are the loop the guard would hint at,
    and the usage is what Claude Code recorded per response."""
    text = (DATA / "claude_code_session_real.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    (audit,) = scan("claude_code_session_real.jsonl").values()
    assert audit.id == lines[0]["sessionId"]
    answers = {
        line["message"]["id"]: line["message"]["usage"]
        for line in lines
        if line["type"] == "assistant"
    }
    assert audit.steps == len(answers) == 6
    assert audit.tokens == sum(
        u["input_tokens"]
        + u["cache_creation_input_tokens"]
        + u["cache_read_input_tokens"]
        + u["output_tokens"]
        for u in answers.values()
    )
    assert audit.tools["Bash"].calls == 5
    assert [(i.detector, i.severity, i.step) for i in audit.issues] == [
        ("poll_no_progress", Severity.WARNING, 3),
        ("poll_no_progress", Severity.CRITICAL, 5),
    ]
    # the guard's ladder from the request after the first flagged poll: one rung per request
    assert audit.ladder.taken == [(4, "hint"), (5, "summary"), (6, "prune")]


def test_claude_code_results_flagged_as_errors_are_failed_results() -> None:
    """A ``tool_result`` Claude Code marks ``is_error`` (a command that failed, a tool it
    refused) counts as a failed result, as an error result of any other format does."""
    text = (DATA / "claude_code_session_real.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    results = [
        block
        for line in lines
        if line["type"] == "user" and isinstance(line["message"]["content"], list)
        for block in line["message"]["content"]
        if block.get("type") == "tool_result"
    ]
    assert len(results) == 5
    results[0]["is_error"] = True  # as Claude Code writes a command that exited non-zero
    results[0]["content"] = "Exit code 1\ncat: deploy_status.txt: No such file or directory"
    stream = io.StringIO("".join(json.dumps(line) + "\n" for line in lines))
    audit = SessionAudit("s", CONFIG, bytearray())
    for record in records(stream, "session.jsonl"):
        audit.feed(record.message)
    audit.finish()
    assert audit.tools["Bash"].calls == 5
    assert audit.tools["Bash"].errors == 1
    (plain,) = scan("claude_code_session_real.jsonl").values()
    assert plain.tools["Bash"].errors == 0


def test_claude_code_lines_of_one_response_are_one_answer() -> None:
    """Claude Code writes one line per content block of a response: they become one message."""
    base = {"sessionId": "s", "type": "assistant", "uuid": "u"}
    usage = {"input_tokens": 10, "output_tokens": 5}
    text = {"id": "m1", "role": "assistant", "usage": usage, "content": [
        {"type": "text", "text": "Reading it."}]}  # fmt: skip
    use = {"id": "m1", "role": "assistant", "usage": usage, "content": [
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a"}}]}  # fmt: skip
    result = {"sessionId": "s", "type": "user", "uuid": "v", "message": {"role": "user",
              "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}}  # fmt: skip
    text_lines = [{**base, "message": text}, {**base, "message": use}, result]
    stream = io.StringIO("".join(json.dumps(line) + "\n" for line in text_lines))
    messages = [r.message for r in records(stream, "s.jsonl")]
    assert messages == [
        {
            "role": "assistant",
            "content": "Reading it.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "x"},
    ]


def test_codex_rollout_of_a_real_codex_run() -> None:
    """Codex CLI: its calls and outputs, the model from turn_context, and the usage it wrote:
    the very total Codex printed at the end of the run (19,890 tokens)."""
    (audit,) = scan("codex_rollout.jsonl").values()
    assert audit.id == "01a20d49-e85d-7a11-a6c1-9284359ad0a2"
    assert audit.tokens == 19_890
    assert audit.steps == 6  # five polls, one answer
    assert audit.tools["exec_command"].calls == 5
    assert audit._model == "gpt-5-codex"
    # each output starts with a header whose values change (Chunk ID, Wall time): the five
    # identical polls are still no progress, judged as Claude Code's same polls are
    assert [(i.detector, i.severity, i.step) for i in audit.issues] == [
        ("poll_no_progress", Severity.WARNING, 3),
        ("poll_no_progress", Severity.CRITICAL, 5),
    ]


def test_swe_agent_traj_turns_text_actions_into_calls() -> None:
    """SWE-agent: each action is a call named after its command, the next observation its
    result."""
    (audit,) = scan("swe_agent_test_repo.traj").values()
    assert set(audit.tools) == {"find_file", "open", "edit", "bash"}
    assert all(s.errors == 0 for s in audit.tools.values())
    assert audit.issues == []


def test_swe_agent_trajectories_of_one_environment_are_sessions_of_their_instances(
    tmp_path: Path,
) -> None:
    """A SWE-agent trajectory's session is its instance (the problem statement's id in
    ``replay_config``, a JSON text as SWE-agent 1.x writes it, or an object), else its file's
    name; never the environment (``main``) every run of one environment shares."""
    doc = json.loads((DATA / "swe_agent_test_repo.traj").read_text())
    assert doc["environment"] == "main"
    other = json.loads(json.dumps(doc))
    other["replay_config"]["problem_statement"]["id"] = "SWE-agent__test-repo-i2"
    other["replay_config"] = json.dumps(other["replay_config"])
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps(doc) + "\n" + json.dumps(other) + "\n")
    audits = scan_file(str(both), CONFIG)
    assert [a.id for a in audits] == ["SWE-agent__test-repo-i1", "SWE-agent__test-repo-i2"]
    assert [a.messages for a in audits] == [10, 10]
    del doc["replay_config"]
    for name in ("6e44b9__sweagenttestrepo-1c2844", "7f55c0__sweagenttestrepo-2d3955"):
        (tmp_path / f"{name}.traj").write_text(json.dumps(doc, indent=2))
        (audit,) = scan_file(str(tmp_path / f"{name}.traj"), CONFIG)
        assert audit.id == name


def test_mini_swe_agent_trajectory_of_a_real_run() -> None:
    """A real mini-swe-agent 2 run (deepseek-chat on django__django-12453): detected as
    swe-agent; each answer's bash tool call is a call, the tool message answering it its
    result; the usage each answer's response recorded is the tokens; the closing exit message
    (status and patch) is no message; the one finding is the agent installing one missing
    package after another, and no real command is taken for a hallucinated tool."""
    doc = json.loads((DATA / "mini_swe_agent.traj.json").read_text())
    assert detect(doc) == "swe-agent"
    assert doc["trajectory_format"] == "mini-swe-agent-1.1"
    (audit,) = scan("mini_swe_agent.traj.json").values()
    answers = [m for m in doc["messages"] if m["role"] == "assistant"]
    assert audit.id == doc["instance_id"] == "django__django-12453"
    assert audit.messages == len(doc["messages"]) - 1  # all but the exit message
    assert doc["messages"][-1]["role"] == "exit"
    assert audit.steps == len(answers) == doc["info"]["model_stats"]["api_calls"] == 42
    assert set(audit.tools) == {"bash"}
    assert audit.tools["bash"].calls == 42
    assert audit.tokens == sum(m["extra"]["response"]["usage"]["total_tokens"] for m in answers)
    assert not audit.estimated
    with (DATA / "mini_swe_agent.traj.json").open() as stream:
        read = [r.message for r in records(stream, "t.json")]
    calls = [c["id"] for m in read if m["role"] == "assistant" for c in m["tool_calls"]]
    results = [m["tool_call_id"] for m in read if m["role"] == "tool"]
    assert results == calls[:-1]  # the last, submitting, answered by the exit message alone
    assert (
        "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        in answers[-1]["tool_calls"][0]["function"]["arguments"]
    )
    assert [i.category for i in audit.issues] == ["loop"]
    assert found(audit) == [("near_duplicate", 16, "bash")]
    installs = [json.loads(m["tool_calls"][0]["function"]["arguments"])["command"]
                for m in answers[11:16:2]]  # fmt: skip
    assert installs == [
        f"cd /testbed && pip install {p} -q" for p in ("asgiref", "pytz", "sqlparse")
    ]
    assert scan("mini_swe_agent.traj.json", "swe-agent")[audit.id].to_dict() == audit.to_dict()


def test_mini_swe_agent_text_based_answers_are_calls(tmp_path: Path) -> None:
    """mini-swe-agent 2 with a text-based model: the commands it parsed (``extra.actions``,
    from a ``mswea_bash_command`` block) are the calls, the next user message the output;
    mini-swe-agent 1: a fenced bash block is the call. Forced to read as plain chat, the
    same file has no calls."""
    block = "I will look.\n```mswea_bash_command\nls -la\n```"
    v2 = {
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "demo__2",
        "messages": [{"role": "user", "content": "fix it"}]
        + [
            {"role": "assistant", "content": block, "extra": {"actions": [{"command": "ls -la"}]}},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\ntotal 0\n</output>"},
        ]
        * 4
        + [{"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}],
    }
    v1 = {
        "trajectory_format": "mini-swe-agent-1",
        "info": {"instance_id": "demo__1"},
        "messages": [{"role": "user", "content": "fix it"}]
        + [
            {"role": "assistant", "content": "I will look.\n```bash\nls -la\n```"},
            {"role": "user", "content": "total 0"},
        ]
        * 4,
    }
    path = tmp_path / "mini.jsonl"
    path.write_text(json.dumps(v2) + "\n" + json.dumps(v1) + "\n")
    audits = {a.id: a for a in scan_file(str(path), CONFIG)}
    assert list(audits) == ["demo__2", "demo__1"]
    for audit in audits.values():
        assert audit.tools["bash"].calls == 4
        assert audit.messages == 9
        assert any(i.category == "loop" for i in audit.issues)
    plain = scan_file(str(path), CONFIG, fmt="openai")
    assert [a.tools for a in plain] == [{}, {}]


def test_tau_bench_runs_are_sessions_and_the_labelled_loop_is_found() -> None:
    """tau-bench: each run is a session; the run loopbench labels a loop has one, the other
    (a failure, no loop) has none."""
    audits = scan("tau_bench_airline.json")
    assert set(audits) == {"task 0 trial 0", "task 13 trial 0"}
    assert audits["task 0 trial 0"].issues == []
    loops = [i for i in audits["task 13 trial 0"].issues if i.category == "loop"]
    assert loops
    assert loops[0].tool == "update_reservation_flights"


def test_otlp_genai_spans_of_a_real_pydantic_ai_run() -> None:
    """OTLP JSON: chat spans read as request logs (history fed once), calls checked against
    gen_ai.tool.definitions like the live guard: the wrong type, the unknown tool, the poll."""
    (audit,) = scan("otlp_genai_spans.json").values()
    doc = json.loads((DATA / "otlp_genai_spans.json").read_text())
    spans = [s for r in doc["resourceSpans"] for sc in r["scopeSpans"] for s in sc["spans"]]
    usage = [
        int(a["value"]["intValue"])
        for s in spans
        for a in s["attributes"]
        if a["key"] in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
    ]
    assert audit.tokens == sum(usage)
    assert audit.steps == sum(1 for s in spans if s["name"].startswith("chat "))
    assert found(audit) == [
        ("type_mismatch", 1, "get_build_status"),
        ("unknown_tool", 2, "get_build_logs"),
        ("poll_no_progress", 5, "get_build_status"),
    ]
    assert [i.action for i in audit.issues] == ["recovery", "recovery", "warn"]
    assert audit.ladder.taken == [(6, "hint"), (7, "summary")]
    assert audit.first_action() == (1, "recovery", "type_mismatch")


def test_otlp_tool_results_that_were_errors_count_as_failures() -> None:
    """pydantic-ai records a retried call's result as its raw content (the validation errors,
    "Unknown tool name: ..."), as the conventions' parts have no error flag: the result of a
    call whose execute_tool span failed, or of a tool the span does not declare, is read as
    the error the model was sent and counted as a failed result; the working polls are not."""
    (audit,) = scan("otlp_genai_spans.json").values()
    assert audit.tools["get_build_status"].errors == 1  # the int_parsing retry, of 5 calls
    assert audit.tools["get_build_logs"].errors == 1  # no such tool
    with (DATA / "otlp_genai_spans.json").open() as stream:
        results = [r.message for r in records(stream, "t.json") if r.message["role"] == "tool"]
    assert json.loads(results[0]["content"])["error"][0]["type"] == "int_parsing"
    assert json.loads(results[1]["content"]) == {
        "error": "Unknown tool name: 'get_build_logs'. Available tools: 'get_build_status'"
    }
    assert [json.loads(r["content"]) for r in results[2:]] == [
        {"build_id": 7, "status": "failed"}
    ] * 4


def test_otlp_without_content_a_failed_execute_tool_span_is_a_failed_result() -> None:
    """The real sample without its messages (the conventions' default): the execute_tool span
    that ended in error is a failed result though it records one, the others are not."""
    doc = json.loads((DATA / "otlp_genai_spans.json").read_text())
    for scope in doc["resourceSpans"][0]["scopeSpans"]:
        for span in scope["spans"]:
            span["attributes"] = [
                a for a in span["attributes"] if not a["key"].endswith("put.messages")
            ]
    (audit,) = _audits([doc])
    assert audit.tools["get_build_status"].calls == 5
    assert audit.tools["get_build_status"].errors == 1
    assert "get_build_logs" not in audit.tools  # never run: no span


def test_otlp_without_content_reads_execute_tool_spans() -> None:
    """Without message content (the conventions' default), execute_tool spans give the calls
    and results, chat spans their tokens."""

    def attr(key: str, value: Any) -> dict[str, Any]:
        kind = "intValue" if isinstance(value, int) else "stringValue"
        return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}

    spans = []
    for n in range(4):
        spans.append({"traceId": "ab", "spanId": f"c{n}", "name": "chat m",
                      "startTimeUnixNano": str(2 * n), "attributes": [
                          attr("gen_ai.operation.name", "chat"),
                          attr("gen_ai.usage.input_tokens", 100),
                          attr("gen_ai.usage.output_tokens", 10)]})  # fmt: skip
        spans.append({"traceId": "ab", "spanId": f"t{n}", "name": "execute_tool get",
                      "startTimeUnixNano": str(2 * n + 1), "attributes": [
                          attr("gen_ai.operation.name", "execute_tool"),
                          attr("gen_ai.tool.name", "get"),
                          attr("gen_ai.tool.call.id", f"call{n}"),
                          attr("gen_ai.tool.call.arguments", '{"id": 1}'),
                          attr("gen_ai.tool.call.result", '{"status": "queued"}')]})  # fmt: skip
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": spans[::-1]}]}]}  # any order in file
    audits = list(_audits([doc]))
    (audit,) = audits
    assert audit.id == "ab"
    assert audit.tokens >= 4 * 110
    assert audit.tools["get"].calls == 4
    assert any(i.detector == "poll_no_progress" for i in audit.issues)


def _audits(items: list[Any]) -> list[SessionAudit]:
    stream = io.StringIO("".join(json.dumps(i) + "\n" for i in items))
    audits: dict[str, SessionAudit] = {}
    for r in records(stream, "t.jsonl"):
        audit = audits.setdefault(r.session, SessionAudit(r.session, CONFIG))
        if r.tools:
            audit.declare(r.tools)
        if r.message is None:
            audit.tokens += r.tokens or 0
            continue
        audit.feed(r.message, r.tokens, model=r.model, prompt_tokens=r.prompt_tokens)
    for a in audits.values():
        a.finish()
    return list(audits.values())


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("atif_claude_code.trajectory.json", "atif"),
        ("claude_code_session.jsonl", "claude-code"),
        ("claude_code_session_real.jsonl", "claude-code"),
        ("codex_rollout.jsonl", "codex"),
        ("swe_agent_test_repo.traj", "swe-agent"),
        ("mini_swe_agent.traj.json", "swe-agent"),
        ("tau_bench_airline.json", "tau-bench"),
        ("otlp_genai_spans.json", "otlp"),
        ("litellm_requests.jsonl", "litellm"),
        ("openhands_events.json", "openhands"),
    ],
)
def test_each_sample_is_detected_and_forcing_its_format_changes_nothing(
    name: str, fmt: str
) -> None:
    """Detection finds each sample's format; --format with that format gives the same audit."""
    detected = [a.to_dict() for a in scan(name).values()]
    forced = [a.to_dict() for a in scan(name, fmt).values()]
    assert detected == forced
    assert sum(a["messages"] for a in detected) > 0


def test_a_file_may_mix_formats() -> None:
    """Items are told apart one by one: a chat transcript and a Codex line in one file."""
    items = [
        {"id": "chat", "messages": [{"role": "user", "content": "hi"}]},
        {"timestamp": "t", "type": "session_meta", "payload": {"id": "cx"}},
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {"type": "message", "role": "user", "content": "hello"},
        },
    ]
    assert [detect(i) for i in items] == ["openai", "codex", "codex"]
    assert {a.id for a in _audits(items)} == {"chat", "cx"}


def test_an_unknown_item_names_its_line_and_the_formats() -> None:
    """An object of no known format is a one-line error naming the line and --format."""
    stream = io.StringIO('{"role": "user", "content": "hi"}\n{"hello": 1}\n')
    with pytest.raises(InputError, match=r"t\.jsonl:2: .*--format"):
        list(records(stream, "t.jsonl"))


_KEYS = st.sampled_from(
    ["type", "payload", "message", "sessionId", "uuid", "role", "content", "steps", "agent",
     "schema_version", "tool_calls", "observation", "results", "traj", "history", "messages",
     "resourceSpans", "scopeSpans", "spans", "attributes", "key", "value", "stringValue",
     "intValue", "name", "arguments", "function", "id", "call_id", "output", "usage", "action",
     "tool_call_metadata", "response", "choices", "info", "trajectory_format", "parts",
     "tool_use", "input", "metrics", "timestamp"]
)  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | _KEYS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_JSON, min_size=1, max_size=4), st.sampled_from([None, *sorted(FORMATS)]))
def test_any_item_in_any_format_reads_or_fails_with_an_input_error(
    items: list[Any], fmt: str | None
) -> None:
    """Whatever shape the items have, and whatever format is forced, reading them yields
    records or raises InputError, never another exception; the audit takes every record."""
    stream = io.StringIO("".join(json.dumps(i) + "\n" for i in items))
    try:
        found_records = list(records(stream, "f.jsonl", fmt))
    except InputError:
        return
    audits: dict[str, SessionAudit] = {}
    for r in found_records:
        audit = audits.setdefault(r.session, SessionAudit(r.session, CONFIG))
        if r.tools:
            audit.declare(r.tools)
        if r.message is not None:
            audit.feed(r.message, r.tokens, model=r.model, prompt_tokens=r.prompt_tokens)
    for a in audits.values():
        a.finish()
        json.dumps(a.to_dict())


_OBJECTS = st.dictionaries(
    st.text(max_size=6).filter(lambda k: k != "role"),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=10,
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_OBJECTS, min_size=1, max_size=6), st.sampled_from(["jsonl", "array", "lines"]))
def test_every_file_shape_streams_back_the_values_it_holds(
    values: list[dict[str, Any]], shape: str
) -> None:
    """JSONL, a JSON array on one line, and a JSON array over many lines (pretty-printed, the
    items split at any line) all stream back exactly the values written, in order."""
    from agentguard.cli._formats._stream import items

    if shape == "jsonl":
        text = "".join(json.dumps(v) + "\n" for v in values)
    elif shape == "array":
        text = json.dumps(values) + "\n"
    else:
        text = json.dumps(values, indent=2) + "\n"
    got = [v for _, v in items(io.StringIO(text), "f")]
    assert got == values


@settings(max_examples=100, deadline=None)
@given(_OBJECTS)
def test_a_document_over_many_lines_is_one_value(value: dict[str, Any]) -> None:
    """A pretty-printed object (an ATIF trajectory, a .traj) is read whole, once."""
    from agentguard.cli._formats._stream import items

    text = json.dumps({"doc": value}, indent=2)
    assert [v for _, v in items(io.StringIO(text), "f")] == [{"doc": value}]


def test_the_progress_counter_follows_the_bytes_read(tmp_path: Path) -> None:
    """The progress bar's counter is the file's position: the whole size once read to the end."""
    from agentguard.cli._formats import open_counted

    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": str(i)}]}) + "\n"
            for i in range(2000)
        )
    )
    stream, counter = open_counted(str(path))
    with stream:
        assert counter.count == 0
        for _ in stream:
            pass
        assert counter.count == path.stat().st_size
    assert counter.count == 0  # closed: no position, no error
