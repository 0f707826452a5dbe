"""LoopDetector: every class of tool-call loop, the ladder, configuration and bounded state."""

from __future__ import annotations

import gc
import json
import weakref
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentguard.config import GuardConfig, LoopDetectionConfig
from agentguard.events import Event, LoopFlagged
from agentguard.exceptions import ConfigError
from agentguard.loops import LoopDetector, ToolLoopPolicy, Verdict, is_error_result
from agentguard.loops._detectors import NearDuplicate
from agentguard.testing import capture_events
from agentguard.types import Severity

OK, WARNING, CRITICAL, BREAK = Severity.OK, Severity.WARNING, Severity.CRITICAL, Severity.BREAK


def step(det: LoopDetector, name: str, args: Any, result: Any, *, error: bool = False) -> Verdict:
    """Check a call and, unless refused, record its result; return the check's verdict."""
    verdict = det.check_tool_call(name, args)
    if verdict.severity is not BREAK:
        det.record_tool_result(name, args, result, error=error)
    return verdict


def build_status(state: str, n: int, progress: int = 100) -> dict[str, Any]:
    """A CI status payload with the volatile noise a real API returns."""
    return {
        "build_id": 8812,
        "status": state,
        "progress": progress,
        "request_id": f"req-{n}",
        "checked_at": f"2026-11-20T09:{n % 60:02d}:00Z",
    }


def test_polling_a_finished_build_escalates_through_the_ladder() -> None:
    """Identical call + identical result: WARNING at 3, CRITICAL at 5, BREAK at 7 attempts."""
    det = LoopDetector()
    seen = [step(det, "get_build", {"build_id": 8812}, build_status("failed", i)) for i in range(8)]
    assert [v.severity for v in seen] == [
        OK,
        OK,
        WARNING,
        WARNING,
        CRITICAL,
        CRITICAL,
        BREAK,
        BREAK,
    ]
    assert seen[2].detector == "poll_no_progress"
    assert seen[2].count == 3
    assert "get_build" in seen[2].message
    assert "8812" not in seen[2].message  # arguments never leak into the hint


def test_polling_with_changing_results_gives_no_finding() -> None:
    """A build that advances on every poll is progress: no hint, however long (issue 16)."""
    det = LoopDetector()
    worst = OK
    for i in range(200):
        args = {"build_id": 1}
        worst = max(worst, det.check_tool_call("get_build", args).severity)
        v = det.record_tool_result("get_build", args, build_status("running", i, i))
        worst = max(worst, v.severity)
    assert worst == OK


def test_declared_polling_tool_with_changing_results_gives_no_finding() -> None:
    """A tool declared as polling is judged by its results only, never by call count."""
    det = LoopDetector(tools=[ToolLoopPolicy("job_status", polling=True)])
    verdicts = [step(det, "job_status", {"id": "j1"}, {"done": i}) for i in range(50)]
    assert all(v.ok for v in verdicts)


def test_declared_polling_tool_with_stable_result_still_escalates() -> None:
    """A polling tool whose answer no longer changes is a no-progress loop."""
    det = LoopDetector(tools=[ToolLoopPolicy("job_status", polling=True)])
    verdicts = [step(det, "job_status", {"id": "j1"}, {"state": "done"}) for _ in range(7)]
    assert verdicts[-1].severity is BREAK


def test_batch_writes_over_many_files_give_no_finding() -> None:
    """Distinct arguments are distinct work, even with identical acknowledgements."""
    det = LoopDetector()
    for i in range(300):
        args = {"path": f"src/module_{i}.py", "content": "from __future__ import annotations\n"}
        assert det.check_tool_call("write_file", args).ok
        assert det.record_tool_result("write_file", args, "ok").ok


@pytest.mark.parametrize(
    "ack", [{"status": "written"}, {"ok": True, "bytes": 120}, "File written successfully."]
)
def test_batch_writes_with_identical_structured_acks_give_no_finding(ack: Any) -> None:
    """Similar arguments with the same short acknowledgement are not near-duplicates."""
    det = LoopDetector()
    for i in range(60):
        args = {"path": f"src/handlers/handler_{i}.py", "content": "# generated\nVALUE = 1\n"}
        assert step(det, "write_file", args, ack).ok


def test_batch_reads_with_similar_paths_give_no_finding() -> None:
    """Near-identical arguments with different results are not near-duplicates."""
    det = LoopDetector()
    for i in range(100):
        args = {"path": f"src/pkg/mod_{i}.py"}
        assert step(det, "read_file", args, f"# module {i}\nVALUE = {i}\n" * 3).ok


def test_unrelated_calls_in_between_do_not_hide_a_loop() -> None:
    """A x B1 A x B2 A ... is still a loop on A."""
    det = LoopDetector()
    on_a = []
    for i in range(7):
        on_a.append(step(det, "search", {"q": "refund rounding"}, "3 results: ...").severity)
        step(det, "read_file", {"path": f"f{i}.py"}, f"content {i}")
    assert on_a == [OK, OK, WARNING, WARNING, CRITICAL, CRITICAL, BREAK]


def test_refused_call_does_not_reset_the_streak() -> None:
    """After BREAK the same call stays refused; nothing was recorded, nothing was forgiven."""
    det = LoopDetector()
    for i in range(7):
        step(det, "get_build", {"id": 1}, build_status("failed", i))
    for _ in range(5):
        assert det.check_tool_call("get_build", {"id": 1}).severity is BREAK


def test_identity_ignores_key_order_whitespace_and_number_form() -> None:
    """The loop is seen through key order, JSON text vs dict and 1 vs 1.0."""
    det = LoopDetector()
    forms = [{"a": 1, "b": [1, 2]}, '{"b": [1, 2], "a": 1}', {"b": [1.0, 2.0], "a": 1.0}]
    verdicts = [step(det, "t", forms[i % 3], "same result") for i in range(3)]
    assert verdicts[-1].severity is WARNING


def test_progress_resets_the_no_progress_ladder() -> None:
    """Once the result changes, a brief repeat afterwards does not start at the old level."""
    det = LoopDetector()
    for i in range(5):
        step(det, "get_build", {"id": 1}, build_status("running", i, 50))
    assert det.check_tool_call("get_build", {"id": 1}).severity is CRITICAL
    det.record_tool_result("get_build", {"id": 1}, build_status("passed", 9, 100))
    assert det.check_tool_call("get_build", {"id": 1}).severity is OK


def test_legitimate_repeat_after_progress_is_not_flagged() -> None:
    """Read, edit, read again (new content) is progress, not a loop."""
    det = LoopDetector()
    for i in range(4):
        assert step(det, "read_file", {"path": "app.py"}, f"version {i}").ok
        assert step(det, "edit_file", {"path": "app.py", "patch": f"p{i}"}, "ok").ok


def test_ping_pong_with_stable_results_escalates() -> None:
    """A-B-A-B with unchanged results is a ping-pong loop."""
    det = LoopDetector()
    verdicts = []
    for _ in range(5):
        verdicts.append(step(det, "open_page", {"url": "/a"}, "Page A: see /b"))
        verdicts.append(step(det, "open_page", {"url": "/b"}, "Page B: see /a"))
    flagged = [v for v in verdicts if not v.ok]
    assert flagged[0].detector == "ping_pong"
    assert verdicts[-1].severity is BREAK


@pytest.mark.parametrize("period", [3, 4])
def test_longer_cycles_with_stable_results_are_cycles(period: int) -> None:
    """A-B-C(-D) repeating with unchanged results is detected as a cycle."""
    det = LoopDetector()
    verdicts = []
    for _ in range(6):
        for k in range(period):
            verdicts.append(step(det, f"tool_{k}", {"k": k}, f"result {k}"))
    assert {v.detector for v in verdicts if not v.ok} == {"cycle"}
    assert verdicts[-1].severity is BREAK


def test_cycle_with_changing_results_is_progress() -> None:
    """A-B-A-B where both results advance (reading and summarising pages) is at most a WARNING."""
    det = LoopDetector()
    worst = OK
    for page in range(40):
        worst = max(worst, step(det, "next_page", {"doc": "d"}, f"page {page} text").severity)
        worst = max(worst, step(det, "summarise", {"doc": "d"}, f"summary of {page}").severity)
    assert worst <= WARNING


def test_same_call_failing_repeatedly_with_varying_error_text() -> None:
    """error_repeat fires on repeated failures even when the error text changes.

    The hint comes with the third failure, not before the third attempt: two failures and a
    retry that succeeds is healthy (loopbench ``healthy_retry_then_success``).
    """
    det = LoopDetector()
    verdicts = [
        step(det, "deploy", {"env": "prod"}, f"Error: timeout after {30 + i}s", error=True)
        for i in range(5)
    ]
    assert [v.severity for v in verdicts] == [OK, OK, OK, CRITICAL, BREAK]
    third = LoopDetector()
    for i in range(3):
        third.check_tool_call("deploy", {"env": "prod"})
        result = third.record_tool_result("deploy", {"env": "prod"}, f"Error {i}", error=True)
    assert (result.severity, result.detector) == (WARNING, "error_repeat")


def test_success_after_failures_resets_error_repeat() -> None:
    """A call that succeeds again is no longer an error loop."""
    det = LoopDetector()
    for i in range(2):
        step(det, "deploy", {"env": "prod"}, f"Error {i}", error=True)
    det.check_tool_call("deploy", {"env": "prod"})
    det.record_tool_result("deploy", {"env": "prod"}, {"deployed": True})
    assert det.check_tool_call("deploy", {"env": "prod"}).detector != "error_repeat"


def test_unknown_tool_from_declared_schemas() -> None:
    """With OpenAI tool schemas given, repeated calls to another name escalate at once."""
    schemas = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    det = LoopDetector(tools=schemas)
    verdicts = [det.check_tool_call("web_browse", {"url": f"u{i}"}) for i in range(4)]
    assert [v.severity for v in verdicts] == [OK, WARNING, CRITICAL, BREAK]
    assert verdicts[1].detector == "unknown_tool_repeat"
    assert det.check_tool_call("search", {"q": "x"}).ok


def test_unknown_tool_inferred_from_error_results() -> None:
    """Without schemas, an 'unknown tool' error marks the name; further calls escalate."""
    det = LoopDetector()
    first = det.check_tool_call("browse", {"url": "a"})
    det.record_tool_result("browse", {"url": "a"}, "Error: unknown tool 'browse'", error=True)
    second = det.check_tool_call("browse", {"url": "b"})
    assert first.ok
    assert (second.severity, second.detector) == (WARNING, "unknown_tool_repeat")


def test_paraphrased_queries_with_the_same_result_are_near_duplicates() -> None:
    """Rewording a search that keeps returning the same hits is a loop."""
    det = LoopDetector()
    hits = "1. asyncio.wait_for docs\n2. StackOverflow: asyncio timeout\n3. PEP 3156"
    queries = [
        "python asyncio timeout error",
        "asyncio timeout error python",
        "python asyncio error timeout",
        "timeout error in python asyncio",
        "asyncio python timeout error fix",
    ]
    verdicts = [step(det, "search", {"query": q}, hits) for q in queries]
    assert [v.severity for v in verdicts][:2] == [OK, OK]
    assert verdicts[2].detector == "near_duplicate"
    assert verdicts[4].severity is CRITICAL


def test_churning_timeout_argument_that_changes_nothing() -> None:
    """Retrying with a different timeout/offset and the same result is a near-duplicate loop."""
    det = LoopDetector()
    payload = {"error_rate": 0.031, "window": "5m", "service": "payments-api"}
    verdicts = [
        step(det, "query_metrics", {"service": "payments-api", "timeout": t}, payload)
        for t in (30, 60, 90, 120)
    ]
    assert max(v.severity for v in verdicts) >= WARNING


def test_global_breaker_counts_no_progress_across_tools() -> None:
    """Many stalled outcomes spread over many calls trip the global breaker."""
    cfg = LoopDetectionConfig(
        no_progress_warn_at=50, no_progress_critical_at=50, no_progress_break_at=50,
        cycle_warn_at=50, cycle_critical_at=50, cycle_break_at=50,
        global_warn_at=4, global_critical_at=6, global_break_at=8,
    )  # fmt: skip
    det = LoopDetector(cfg)
    verdicts = []
    for i in range(6):
        for k in range(3):
            verdicts.append(step(det, f"t{k}", {"k": k}, f"r{k}"))
        step(det, "fresh", {"i": i}, f"new {i}")
    assert "global_breaker" in {v.detector for v in verdicts}
    assert verdicts[-1].severity is BREAK


def test_severity_never_drops_while_the_loop_continues() -> None:
    """The ladder is sticky: each further identical attempt is at least as severe."""
    det = LoopDetector()
    previous = OK
    for i in range(40):
        v = step(det, "search", {"q": "x"}, "same")
        assert v.severity >= previous
        previous = v.severity
        step(det, "other", {"i": i}, f"r{i}")


def test_loop_flagged_event_emitted_above_ok_only() -> None:
    """A LoopFlagged event accompanies every verdict above OK, with no arguments in it."""
    seen: list[Event] = []
    det = LoopDetector(hooks=[seen.append], session="s-1")
    with capture_events() as captured:
        for i in range(3):
            det.check_tool_call("get_build", {"token": "sk-secret"})
            det.record_tool_result("get_build", {"token": "sk-secret"}, build_status("failed", i))
    assert len(seen) == 2  # the third check and the third result
    assert all(isinstance(e, LoopFlagged) and e.session == "s-1" for e in seen)
    assert seen[0].to_dict()["severity"] == "warning"
    assert "sk-secret" not in json.dumps([e.to_dict() for e in seen])
    assert captured.of_type(LoopFlagged) == seen


def test_accepts_guard_config_section_or_none() -> None:
    """GuardConfig, its loop_detection section and None are all valid configs."""
    cfg = GuardConfig.from_dict({"loop_detection": {"no_progress_warn_at": 2}})
    for det in (LoopDetector(cfg), LoopDetector(cfg.loop_detection)):
        step(det, "t", {}, "r")
        assert det.check_tool_call("t", {}).severity is WARNING
    assert LoopDetector(None).config == LoopDetectionConfig()
    with pytest.raises(TypeError):
        LoopDetector({"warn_at": 1})  # type: ignore[arg-type]


def test_disabled_detector_finds_nothing() -> None:
    """enabled: false turns every detector off."""
    det = LoopDetector(LoopDetectionConfig(enabled=False))
    assert all(step(det, "t", {}, "r").ok for _ in range(50))
    assert all(det.check_text("same text").ok for _ in range(10))


def test_disabled_detector_observes_whole_messages_without_finding_anything() -> None:
    """enabled: false with whole messages: calls with ids and their results pass, all OK."""
    det = LoopDetector(LoopDetectionConfig(enabled=False))
    call = {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
    for _ in range(10):
        assistant = det.observe({"role": "assistant", "content": None, "tool_calls": [call]})
        result = det.observe({"role": "tool", "tool_call_id": "c1", "content": "r"})
        assert all(v.ok for v in (*assistant, *result))


def test_text_then_tools_judges_as_a_detector_that_saw_only_tools() -> None:
    """The tool detectors are built on a run's first tool event: a run that answered and was
    told news first judges a tool loop as a fresh one does, and a result whose call it never
    saw (a tool message first) counts as a call."""
    fresh, late = LoopDetector(), LoopDetector()
    assert late.observe({"role": "assistant", "content": "Let me look at the build."})[0].ok
    assert late.observe({"role": "user", "content": "please go on"}) == []
    assert late.observe({"role": "tool", "name": "status", "content": "running"})[0].ok
    fresh.record_tool_result("status", None, "running")
    for _ in range(6):
        assert step(late, "status", {}, "running") == step(fresh, "status", {}, "running")
    assert step(late, "status", {}, "running").severity is BREAK


def test_unordered_ladder_is_a_config_error() -> None:
    """warn_at > critical_at in any ladder is rejected naming the fields."""
    with pytest.raises(ConfigError, match="no_progress_warn_at"):
        GuardConfig.from_dict({"loop_detection": {"no_progress_warn_at": 6}})


def test_state_stays_bounded_by_the_window() -> None:
    """Per-session state is O(window) however many calls the run makes."""
    det = LoopDetector()
    for i in range(5_000):
        step(det, "write_file", {"path": f"f{i}"}, f"wrote f{i} with a long enough ack")
    assert len(det._keys) <= det.config.tool_window
    near = next(d for d in det._detectors if isinstance(d, NearDuplicate))
    assert len(near.groups) <= det.config.tool_window


def test_record_without_check_still_counts() -> None:
    """Drivers that only record results still get loop verdicts."""
    det = LoopDetector()
    verdicts = [det.record_tool_result("t", {"a": 1}, "same") for _ in range(3)]
    assert verdicts[-1].severity is WARNING


class LadderMachine(RuleBasedStateMachine):
    """A looping call with unrelated calls interleaved: its severity never goes down."""

    def __init__(self) -> None:
        super().__init__()
        self.det = LoopDetector()
        self.last = OK
        self.since_loop = 0
        self.fresh = 0

    @rule(shape=st.sampled_from(["dict", "text", "float"]))
    def loop_call(self, shape: str) -> None:
        args: Any = {"q": 1, "page": 2}
        if shape == "text":
            args = '{ "page": 2, "q": 1 }'
        elif shape == "float":
            args = {"page": 2.0, "q": 1.0}
        v = self.det.check_tool_call("search", args)
        assert v.severity >= self.last, (v, self.last)
        self.last = v.severity
        if v.severity is not BREAK:
            self.det.record_tool_result("search", args, {"hits": ["a", "b"], "took_ms": 3})
        self.since_loop = 0

    @precondition(lambda self: self.since_loop < 20)
    @rule(same_result=st.booleans())
    def other_call(self, same_result: bool) -> None:
        self.fresh += 1
        self.det.check_tool_call("read", {"n": self.fresh})
        self.det.record_tool_result("read", {"n": self.fresh}, "x" if same_result else self.fresh)
        self.since_loop += 1

    @invariant()
    def severity_is_a_severity(self) -> None:
        assert self.last in Severity


TestLadderMachine = LadderMachine.TestCase
TestLadderMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# Where the live guard's and ``agentguard scan``'s old rules for a failed tool disagreed; the
# guard's rule (now ``is_error_result``, used by both) decides.
ERROR_RESULTS = [
    ("Errors found: 0", False),  # scan said failed: "error" was only a prefix
    ('{"error": null, "rows": 3}', False),  # scan said failed: the key was there, empty
    ("Traceback (most recent call last):\n  ValueError", True),  # scan said working
    ("Exception: quota exceeded", True),
    ('{"ok": false, "reason": "quota"}', True),
    ('{"success": false}', True),
    ('{ "error": "timeout" }', True),  # scan needed '{"error"' byte for byte
    ('{"rows": 3, "error": "partial"}', True),
    ([{"type": "text", "text": "Error: no such file"}], True),  # content parts
    ("error: disk full", True),  # both agreed
    ("all 3 files written", False),
]


@pytest.mark.parametrize(("content", "failed"), ERROR_RESULTS)
def test_is_error_result(content: Any, failed: bool) -> None:
    """One rule for a failed tool result, for the live guard and ``agentguard scan``."""
    assert is_error_result(content) is failed


@pytest.mark.parametrize(("content", "failed"), ERROR_RESULTS)
def test_observe_judges_failures_by_is_error_result(content: Any, failed: bool) -> None:
    """Fed as transcript messages, failed results count towards ``error_repeat``."""
    det = LoopDetector()
    fired: set[str | None] = set()
    for i in range(det.config.error_warn_at):
        fn = {"name": "lookup", "arguments": '{"q": "x"}'}
        det.observe({"role": "assistant", "tool_calls": [{"id": f"c{i}", "function": fn}]})
        result = {"role": "tool", "tool_call_id": f"c{i}", "content": content}
        fired |= {v.detector for v in det.observe(result)}
    assert ("error_repeat" in fired) is failed


def test_ok_verdicts_about_invented_tool_names_stay_bounded() -> None:
    """observe() reuses one OK verdict per recent tool name; a model inventing names without end
    does not grow that reuse without bound, and every verdict still names its own tool."""
    from agentguard.loops import _detector

    detector = LoopDetector()
    for n in range(3 * _detector._OK_NAMES):
        call = {"id": f"c{n}", "type": "function", "function": {"name": f"t{n}", "arguments": "{}"}}
        (verdict,) = detector.observe({"role": "assistant", "content": None, "tool_calls": [call]})
        assert verdict == Verdict(tool=f"t{n}")
        assert len(detector._oks) <= _detector._OK_NAMES


def _keyed(monkeypatch: pytest.MonkeyPatch, method: str) -> list[Any]:
    """The values LoopDetector's ``method`` (``_call_fp`` or ``_result_fp``) is asked to key."""
    keyed: list[Any] = []
    real = getattr(LoopDetector, method)

    def counting(self: LoopDetector, name: str, value: Any, policy: Any) -> str:
        keyed.append(value)
        return str(real(self, name, value, policy))

    monkeypatch.setattr(LoopDetector, method, counting)
    return keyed


def test_a_result_is_keyed_only_when_its_tool_returns_something_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool returning one text (or called once) never has its result decoded and keyed; its
    second, different text keys both, to tell whether they are the same result after all."""
    keyed = _keyed(monkeypatch, "_result_fp")
    det = LoopDetector()
    first = '{"state": "running", "checked_at": "2026-11-20T09:00:00Z"}'
    verdicts = [step(det, "status", {"job": 1}, first) for _ in range(3)]
    step(det, "lookup", {"id": 2}, "found it")
    assert keyed == []
    assert verdicts[-1].severity is WARNING  # (the third identical call: no progress)
    later = '{"checked_at": "2026-11-20T09:05:00Z", "state": "running"}'  # noise only
    step(det, "status", {"job": 1}, later)
    assert next(s for s in det._keys.values() if s.name == "status").same == 4  # the same result
    assert keyed == [later, first]


def test_a_declared_policy_judges_later_results_against_the_earlier_identity() -> None:
    """Declaring a tool's policy after its first result compares later results with what that
    result was under the policy it came with, as when every result was keyed at once."""
    det = LoopDetector()
    det.record_tool_result("status", {"job": 1}, '{"state": "running", "node": "a"}')
    det.declare(ToolLoopPolicy("status", volatile_results=frozenset({"node"})))
    det.record_tool_result("status", {"job": 1}, '{"state": "running", "node": "a"}')
    state = next(iter(det._keys.values()))
    assert state.same == 1  # keyed under the new policy: no longer the same result
    det.record_tool_result("status", {"job": 1}, '{"state": "running", "node": "b"}')
    assert state.same == 2


def test_a_call_is_keyed_only_when_its_tool_is_called_with_other_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Arguments a tool is always called with are never decoded and keyed; other arguments key
    both texts, and the same arguments written otherwise are the same call."""
    keyed = _keyed(monkeypatch, "_call_fp")
    det = LoopDetector()
    for _ in range(3):
        step(det, "search", '{"q": "rome", "n": 1}', "nothing found")
    assert keyed == []
    step(det, "search", '{"n": 1.0, "q": "rome"}', "nothing found")  # the same call
    assert set(keyed) == {'{"n": 1.0, "q": "rome"}', '{"q": "rome", "n": 1}'}
    assert [s.calls for s in det._keys.values()] == [4]


def test_a_declared_policy_identifies_later_calls_anew() -> None:
    """Declaring volatile arguments after a call identifies later calls under the new policy,
    while the earlier call keeps the identity it had."""
    det = LoopDetector()
    det.check_tool_call("search", '{"q": "rome", "nonce": 1}')
    det.declare(ToolLoopPolicy("search", volatile_arguments=frozenset({"nonce"})))
    det.check_tool_call("search", '{"q": "rome", "nonce": 2}')
    det.check_tool_call("search", '{"q": "rome", "nonce": 1}')
    assert sorted(s.calls for s in det._keys.values()) == [1, 2]


def test_a_detector_is_freed_as_soon_as_it_is_dropped() -> None:
    """A run's detector holds no reference cycle: dropping it frees it at once, without waiting
    for the garbage collector (a server drops one per finished session)."""
    det = LoopDetector()
    for i in range(3):
        step(det, "search", {"q": "rome"}, "nothing found")
        step(det, "read", f'{{"path": "f{i}"}}', f"line {i}")
    det.observe({"role": "assistant", "content": "x", "tool_calls": []})
    gone = weakref.ref(det)
    gc.disable()
    try:
        del det
        assert gone() is None
    finally:
        gc.enable()
