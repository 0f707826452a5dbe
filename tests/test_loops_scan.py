"""scan_transcript and TranscriptScanner over OpenAI-format transcripts."""

from __future__ import annotations

import json
from typing import Any

from agentguard.config import GuardConfig
from agentguard.loops import Finding, LoopDetector, TranscriptScanner, scan_transcript
from agentguard.types import Severity


def call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with one tool call (arguments as JSON text, as the API sends)."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


def result(i: int, content: Any) -> dict[str, Any]:
    """The tool message answering call ``i``."""
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def polling_transcript(polls: int, status: str = "failed") -> list[dict[str, Any]]:
    """A user asks about a build; the agent polls it ``polls`` times."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why is build 8812 red?"}]
    for i in range(polls):
        messages.append(call(i, "get_build", {"build_id": 8812}))
        messages.append(result(i, {"status": status, "request_id": f"r{i}"}))
    return messages


def test_findings_carry_message_indexes_and_escalate() -> None:
    """Each escalation of a loop is one finding at the message where it happened."""
    findings = scan_transcript(polling_transcript(8))
    assert [(f.index, f.severity) for f in findings] == [
        (5, Severity.WARNING),
        (9, Severity.CRITICAL),
        (13, Severity.BREAK),
    ]
    assert all(f.detector == "poll_no_progress" and f.tool == "get_build" for f in findings)


def test_healthy_transcript_has_no_findings() -> None:
    """Distinct work and a final answer give nothing."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Type the utils."}]
    for i, path in enumerate(["a.py", "b.py", "c.py"]):
        messages += [call(i, "write_file", {"path": path}), result(i, "ok")]
    messages.append({"role": "assistant", "content": "Done: typed a.py, b.py and c.py."})
    assert scan_transcript(messages) == []


def test_feeding_message_by_message_equals_the_explicit_api() -> None:
    """observe() gives the verdicts check_tool_call/record_tool_result would."""
    messages = polling_transcript(6)
    fed = LoopDetector(hooks=())
    explicit = LoopDetector(hooks=())
    got: list[Severity] = []
    want: list[Severity] = []
    for m in messages:
        got += [v.severity for v in fed.observe(m)]
    for i in range(6):
        want.append(explicit.check_tool_call("get_build", '{"build_id": 8812}').severity)
        want.append(
            explicit.record_tool_result(
                "get_build", {"build_id": 8812}, json.dumps({"status": "failed", "request_id": i})
            ).severity
        )
    assert got == want


def test_incremental_feed_matches_whole_scan() -> None:
    """Feeding new messages in slices gives the same findings as one scan."""
    messages = polling_transcript(9)
    scanner = TranscriptScanner()
    found: list[Finding] = []
    for start in range(0, len(messages), 4):
        for m in messages[start : start + 4]:
            found += scanner.feed(m)
    assert found == scan_transcript(messages)
    assert scanner.messages_seen == len(messages)


def test_error_results_are_recognised_in_tool_messages() -> None:
    """Tool messages reporting errors feed error_repeat even with varying text."""
    messages: list[dict[str, Any]] = []
    for i in range(4):
        messages += [call(i, "deploy", {"env": "prod"}), result(i, f"Error: timed out after {i}s")]
    findings = scan_transcript(messages)
    assert findings[0].detector == "error_repeat"
    assert findings[-1].severity is Severity.CRITICAL


def test_repeated_final_answers_are_response_repeats() -> None:
    """The same assistant answer three times is found with its index."""
    answer = {"role": "assistant", "content": "I need more information to continue."}
    findings = scan_transcript([answer, {"role": "user", "content": "go on"}] * 3)
    assert [(f.index, f.detector) for f in findings] == [(4, "response_repeat")]


def test_content_parts_are_read_as_text() -> None:
    """Assistant content given as a list of text parts is judged as text."""
    part = {"role": "assistant", "content": [{"type": "text", "text": "Same again."}]}
    assert scan_transcript([part] * 3)[0].detector == "response_repeat"


def test_config_is_applied() -> None:
    """A stricter config finds the loop earlier."""
    cfg = GuardConfig.from_dict({"loop_detection": {"no_progress_warn_at": 2}})
    assert scan_transcript(polling_transcript(2), config=cfg)[0].index == 3


def test_finding_to_dict_is_json_ready() -> None:
    """Findings serialise to plain JSON."""
    data = scan_transcript(polling_transcript(3))[0].to_dict()
    assert json.loads(json.dumps(data))["severity"] == "warning"


def test_new_loop_after_progress_is_reported_again() -> None:
    """After a subject is judged OK again, a later loop on it is a new finding."""
    messages = polling_transcript(3, "running")
    messages += [call(50, "get_build", {"build_id": 8812}), result(50, {"status": "passed"})]
    messages += [call(51, "get_build", {"build_id": 8812}), result(51, {"status": "passed"})]
    for i in range(52, 54):
        messages += [call(i, "get_build", {"build_id": 8812}), result(i, {"status": "passed"})]
    warnings = [f for f in scan_transcript(messages) if f.severity is Severity.WARNING]
    assert len(warnings) == 2


def test_last_failed_is_the_detectors_judgement_of_a_result() -> None:
    """``last_failed`` after a tool result: whether it reports a failure, by the rule the
    detectors judged it by; ``None`` for a result naming no tool (not judged)."""
    scanner = TranscriptScanner()
    scanner.feed(call(0, "get_build", {"build_id": 1}))
    scanner.feed(result(0, "Error: build 1 not found"))
    assert scanner.last_failed is True
    scanner.feed(call(1, "get_build", {"build_id": 2}))
    scanner.feed(result(1, {"status": "passed"}))
    assert scanner.last_failed is False
    scanner.feed({"role": "tool", "tool_call_id": "nowhere", "content": "Error: lost"})
    assert scanner.last_failed is None
