"""The detector registry: every registered detector is reached, and the fast path skips none."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard.config import GuardConfig, LoopDetectionConfig
from agentguard.events import Event, LoopFlagged
from agentguard.guard import Guard
from agentguard.loops import DETECTORS, LoopDetector
from agentguard.loops import _detector as detector_module
from agentguard.loops._detectors import (
    COUNTERS,
    ERROR_MARK,
    OK,
    REGISTRY,
    CallState,
    Detector,
    GlobalBreaker,
    ToolEvent,
    Verdict,
)
from agentguard.loops._identity import ToolLoopPolicy
from agentguard.testing import FakeClock, Reply, ScriptedModel
from agentguard.transport import ModelRequest, report_of
from agentguard.types import Severity

LONG = "Paris: 18°C, light rain in the afternoon, wind 12 km/h from the south-west."


def call(det: LoopDetector, name: str, args: Any, result: Any, *, error: bool = False) -> None:
    """One tool call, checked and then recorded."""
    det.check_tool_call(name, args)
    det.record_tool_result(name, args, result, error=error)


def generic_repeat(det: LoopDetector) -> None:
    for i in range(det.config.warn_at):  # results flip-flop: nothing new, only the count
        call(det, "search", {"q": "x"}, f"page {i % 2}")


def poll_no_progress(det: LoopDetector) -> None:
    for _ in range(det.config.no_progress_warn_at):
        call(det, "get_build", {"id": 7}, {"status": "running"})


def ping_pong(det: LoopDetector) -> None:
    for _ in range(det.config.cycle_warn_at + 1):
        call(det, "open", {"f": "a"}, "A")
        call(det, "open", {"f": "b"}, "B")


def cycle(det: LoopDetector) -> None:
    for _ in range(det.config.cycle_warn_at + 1):
        for f in "abc":
            call(det, "open", {"f": f}, f)


def global_breaker(det: LoopDetector) -> None:
    for i in range(det.config.global_warn_at):  # each call only twice: no call is a loop alone
        call(det, f"tool_{i}", {}, "same")
        call(det, f"tool_{i}", {}, "same")


def error_repeat(det: LoopDetector) -> None:
    for _ in range(det.config.error_warn_at):
        call(det, "deploy", {"env": "prod"}, "timeout", error=True)


def unknown_tool_repeat(det: LoopDetector) -> None:
    for _ in range(det.config.unknown_tool_warn_at):
        call(det, "search_web", {"q": "x"}, "Error: unknown tool search_web", error=True)


def near_duplicate(det: LoopDetector) -> None:
    for q in ["weather in paris today", "weather paris today", "today weather in paris"]:
        call(det, "search", {"q": q}, LONG)


def same_result(det: LoopDetector) -> None:
    for nonce in range(det.config.no_progress_warn_at):  # only a noise argument changes
        call(det, "get_order", {"order_id": "A-1", "nonce": nonce}, "[]")


def response_repeat(det: LoopDetector) -> None:
    for _ in range(det.config.duplicate_threshold):
        det.check_text("I could not find the file.")


def degenerate_text(det: LoopDetector) -> None:
    det.check_text("I will check the logs now.\n" * det.config.degenerate_min_repeats)


SCENARIOS: dict[str, Callable[[LoopDetector], None]] = {
    f.__name__: f
    for f in (
        generic_repeat,
        poll_no_progress,
        ping_pong,
        cycle,
        global_breaker,
        error_repeat,
        unknown_tool_repeat,
        near_duplicate,
        same_result,
        response_repeat,
        degenerate_text,
    )
}


def fired(scenario: Callable[[LoopDetector], None]) -> set[str]:
    """The detectors whose verdicts a scenario's events got (as emitted LoopFlagged events)."""
    events: list[Event] = []
    det = LoopDetector(hooks=[events.append], _process_hooks=False)
    scenario(det)
    return {e.detector for e in events if isinstance(e, LoopFlagged)}


@pytest.mark.parametrize("name", DETECTORS)
def test_every_registered_detector_fires_in_its_scenario(name: str) -> None:
    """Each registered detector has a scenario, and the scenario makes that detector fire."""
    assert name in SCENARIOS, f"no scenario for the registered detector {name!r}"
    assert name in fired(SCENARIOS[name])


def test_the_detectors_that_fired_are_the_registry() -> None:
    """Across the scenarios, the detectors that fired are exactly the registered ones."""
    every: set[str] = set()
    for scenario in SCENARIOS.values():
        every |= fired(scenario)
    assert every == set(DETECTORS) == {d.name for d in REGISTRY}
    assert len(DETECTORS) == len(set(DETECTORS))  # one name per unit


def test_a_detector_without_quiet_is_never_skipped_by_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new detector is reached on a healthy first call: the fast path asks every detector."""

    class EveryCall(Detector):
        name = "every_call"
        consumes = frozenset({"call"})
        hint = "`{tool}` was called ({count})."
        __slots__ = ()

        def check(self, event: ToolEvent) -> Verdict:
            return self.verdict(Severity.WARNING, 1, event.name)

    monkeypatch.setattr(detector_module, "REGISTRY", (*REGISTRY, EveryCall))
    verdict = LoopDetector().check_tool_call("read", {"path": "a.py"})
    assert verdict.detector == "every_call"


def test_the_fast_path_follows_each_detectors_thresholds() -> None:
    """With ``warn_at=1`` the first call already reaches the generic ladder (no silent skip)."""
    cfg = LoopDetectionConfig(warn_at=1, critical_at=2, break_at=3)
    verdict = LoopDetector(cfg).check_tool_call("read", {"path": "a.py"})
    assert (verdict.severity, verdict.detector) == (Severity.WARNING, "generic_repeat")


_CONFIGS = (
    LoopDetectionConfig(),
    LoopDetectionConfig(warn_at=1, critical_at=2, break_at=3, global_warn_at=1),
    LoopDetectionConfig(
        no_progress_warn_at=2, no_progress_critical_at=2, no_progress_break_at=3,
        error_warn_at=2, error_critical_at=2, error_break_at=3, cycle_warn_at=2,
        cycle_critical_at=2, cycle_break_at=3, global_warn_at=3, global_critical_at=4,
        global_break_at=5,
    ),
)  # fmt: skip


@given(
    st.sampled_from(_CONFIGS),
    st.sampled_from(["call", "result"]),
    st.tuples(*[st.integers(0, 12)] * 4),
    st.tuples(
        st.none() | st.tuples(st.integers(2, 8), st.integers(2, 6)),
        st.sampled_from([None, ERROR_MARK, "result"]),
        st.booleans(),
    ),
)
def test_a_detector_is_quiet_while_its_stated_precondition_is_not_reached(
    cfg: LoopDetectionConfig,
    kind: str,
    counts: tuple[int, int, int, int],
    rest: tuple[tuple[int, int] | None, str | None, bool],
) -> None:
    """What a detector states in ``wakes_at`` is a precondition of its ``quiet``: while no
    counter of the event reaches its floor, the detector is quiet (so the LoopDetector may skip
    asking it). ``rest``: the periodic run the call completes, the last result, polling."""
    cycle, last, polling = rest
    state = CallState("t")
    state.errors, state.same, state.calls, stalled = counts
    state.last_result = last
    policy = ToolLoopPolicy("t", polling=polling)
    event = ToolEvent(kind, "t", "{}", "fp", policy, state, stalled, cycle)  # type: ignore[arg-type]
    values = {
        "errors": state.errors + event.ahead,
        "same": state.same + event.ahead,
        "calls": state.calls + event.ahead,
        "stalled": stalled,
        "rounds": cycle[1] if cycle else 0,
    }
    assert set(values) == set(COUNTERS)
    for unit in REGISTRY:
        if not unit.wakes_at or kind not in unit.consumes or kind not in unit.sticky:
            continue
        floors = [at if isinstance(at, int) else getattr(cfg, at) for _, at in unit.wakes_at]
        if all(values[c] < f for (c, _), f in zip(unit.wakes_at, floors, strict=True)):
            assert unit(cfg, None).quiet(event), unit.name


def test_a_precondition_names_a_known_counter() -> None:
    """A detector stating a counter the LoopDetector does not keep fails on the first tool
    event, instead of never being asked."""

    class Misnamed(Detector):
        name = "misnamed"
        consumes = frozenset({"call"})
        hint = "`{tool}` ({count})."
        wakes_at = (("attempts", 3),)
        __slots__ = ()

    registry = (*REGISTRY, Misnamed)
    with pytest.raises(ValueError, match="attempts"):
        detector_module._plan(registry)


def test_detector_units_declare_their_shape() -> None:
    """Every unit names itself, says what it consumes, and has a hint with its count."""
    for unit in REGISTRY:
        assert unit.consumes
        assert unit.consumes <= {"call", "result", "text"}
        assert "{count}" in unit.hint


@pytest.mark.parametrize(
    ("first", "later", "same"),
    [
        ({"q": "cheap flights Oslo to Rome"}, '{"q": "low-cost flights from Oslo to Rome"}', True),
        ({"id": "A-1", "nonce": "c3891ea4"}, {"id": "A-1", "nonce": "ecf0743c"}, True),
        ({"id": "A-1", "page_size": 10}, {"id": "A-1", "pageSize": 20}, True),
        ({"origin": "EWR", "destination": "SFO"}, {"origin": "EWR", "destination": "SEA"}, False),
        ({"q": "flights Oslo Rome 2024-05-20"}, {"q": "flights Oslo Rome 2024-05-21"}, False),
        ({"path": "src/app/main.py"}, {"path": "src/app/utils.py"}, False),
        ({"q": "Oslo Rome cheap flights"}, {"q": "cheapest flight Oslo-Rome"}, True),
        ({"q": "budget airline Oslo Rome"}, {"q": "Oslo to Rome discount fares"}, True),
        ({"q": "cheap flights Oslo Rome"}, {"q": "Cheap flights OSLO rome"}, True),
        ({"q": "Oslo Rome"}, {"q": "Oslo Milan"}, False),
        ({"q": "OSL FCO"}, {"q": "OSL MXP"}, False),
        ({"q": "flights Oslo Rome"}, {"q": "flights Oslo Rome Ryanair"}, False),
        ({"cmd": "open chall.py"}, {"cmd": "open decrypt.py"}, False),
        ({"cmd": "python get_seed.py"}, {"cmd": "python recover_flag.py"}, False),
    ],
)
def test_same_question_tells_rewording_and_noise_from_another_question(
    first: Any, later: Any, same: bool
) -> None:
    """``same_result`` continues a run only for calls that ask the same thing."""
    from agentguard.loops._detectors import same_question
    from agentguard.loops._identity import decoded

    assert same_question(decoded(first), later) is same


# -- a flagged run goes on whatever the arguments -------------------------------------------------


def _routes(det: LoopDetector, *destinations: str) -> list[Verdict]:
    """``search_flights`` from Oslo to each destination; every search finds nothing."""
    out = []
    for to in destinations:
        det.check_tool_call("search_flights", {"origin": "OSL", "destination": to})
        args = {"origin": "OSL", "destination": to}
        out.append(det.record_tool_result("search_flights", args, "[]"))
    return out


def test_other_questions_after_a_flag_continue_the_run_and_climb() -> None:
    """Three identical empty searches are flagged; the searches after the hint ask other
    questions and find the same nothing: the loop goes on, one step per call."""
    det = LoopDetector()
    flagged = _routes(det, "FCO", "FCO", "FCO")[-1]
    assert (flagged.severity, flagged.detector) == (Severity.WARNING, "poll_no_progress")
    later = _routes(det, "MXP", "FLR", "NAP", "VCE")
    assert [(v.detector, v.severity, v.count) for v in later] == [
        ("same_result", Severity.WARNING, 4),
        ("same_result", Severity.CRITICAL, 5),
        ("same_result", Severity.CRITICAL, 6),
        ("same_result", Severity.BREAK, 7),
    ]


def test_other_questions_before_any_flag_stay_exploring() -> None:
    det = LoopDetector()
    assert all(v.ok for v in _routes(det, "FCO", "MXP", "FLR", "NAP", "VCE", "FCO"))


ITALY = ["Rome", "Milan", "Naples", "Venice", "Pisa", "Bari"]
ITALY_CODES = ["FCO", "MXP", "NAP", "VCE", "PSA", "BRI"]
FLIGHT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


def _searches(queries: list[str]) -> tuple[list[Any], ScriptedModel]:
    """A guarded agent calling ``search_flights`` once per query, each finding nothing, then
    answering: the report of each request, and the model (what went upstream)."""
    clock = FakeClock()
    config = GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    replies = [Reply.call("search_flights", {"query": q}) for q in queries]
    model = ScriptedModel([*replies, Reply.text("No flights on any of these routes.")])
    guard = Guard(model, config, clock=clock, sleep=clock.sleep, rng=random.Random(0))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Any flight Oslo to Italy?"}]
    reports = []
    for _ in range(len(queries) + 1):
        request = ModelRequest(model="gpt-x", messages=messages, params={"tools": FLIGHT_TOOLS})
        response = guard.complete(request)
        reports.append(report_of(response))
        calls = response.message.get("tool_calls") or []
        messages = [*messages, response.message]
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "[]"} for c in calls]
    return reports, model


@pytest.mark.parametrize(
    "queries",
    [[f"Oslo {city}" for city in ITALY], [f"OSL {code}" for code in ITALY_CODES]],
    ids=["names", "codes"],
)
def test_different_airports_that_each_find_nothing_take_no_rung(queries: list[str]) -> None:
    """Each query names another airport: exploring, not a loop, however many find ``[]`` —
    no warning, no rung, tools never switched off."""
    reports, model = _searches(queries)
    assert [(r.warnings, r.recovery) for r in reports] == [((), ())] * (len(queries) + 1)
    assert not any("tool_choice" in r.params for r in model.requests)


def test_rewordings_of_one_query_that_find_nothing_are_hinted_after_the_third() -> None:
    """The same route in other words: the request after the third empty search has the hint."""
    queries = [
        "cheap flights Oslo to Rome",
        "Oslo Rome cheap flights",
        "low-cost flights Oslo Rome",
    ]
    reports, _ = _searches(queries)
    assert [r.recovery for r in reports] == [(), (), (), ("hint",)]


def test_a_flagged_failure_goes_on_with_other_arguments() -> None:
    """The same error whatever the arguments, once ``error_repeat`` flagged it: the flag's
    severity is where the run stands on its own ladder."""
    det = LoopDetector()
    error = '{"error": "SMTP server unavailable (connection refused)"}'
    verdicts = [det.record_tool_result("send_email", {"to": "bob"}, error, True) for _ in "123"]
    assert (verdicts[-1].detector, verdicts[-1].severity) == ("error_repeat", Severity.WARNING)
    verdict = det.record_tool_result("send_email", {"to": "bob@example.com"}, error, True)
    assert (verdict.detector, verdict.severity, verdict.count) == (
        "same_result",
        Severity.WARNING,
        4,
    )


@pytest.mark.parametrize("news", ["another tool's new result", "a user message", "a new result"])
def test_news_ends_a_flagged_run(news: str) -> None:
    det = LoopDetector()
    _routes(det, "FCO", "FCO", "FCO")
    if news == "a user message":
        det.observe({"role": "user", "content": "Try Milan then."})
    elif news == "another tool's new result":
        det.record_tool_result("get_date", {}, "2024-05-20")
    else:
        det.record_tool_result("search_flights", {"origin": "OSL", "destination": "BGY"}, "[1]")
    assert all(v.ok for v in _routes(det, "MXP", "FLR"))


def test_verdicts_are_made_once_and_shared_across_sessions() -> None:
    """A loop gets the same verdict again and again: it is one frozen object, in every session,
    equal to the verdict made afresh (the hint formatted with its tool and count)."""

    def looping() -> list[Verdict]:
        d = LoopDetector(hooks=(), _process_hooks=False)
        out = []
        for _ in range(5):
            out.append(d.check_tool_call("status", {"job": 1}))
            out.append(d.record_tool_result("status", {"job": 1}, "pending"))
        return out

    first, second = looping(), looping()
    flagged = [(a, b) for a, b in zip(first, second, strict=True) if not a.ok]
    assert flagged
    for a, b in flagged:
        assert a is b
        made = next(c for c in REGISTRY if c.name == a.detector)(LoopDetectionConfig(), None)
        assert a == made._made(a.severity, a.count, a.tool)
    assert first[-1].tool == "status"
    assert "status" in first[-1].message


def test_the_shared_verdicts_stay_bounded() -> None:
    """Invented tool names do not grow the shared verdicts without bound."""
    from agentguard.loops import _detectors

    d = _detectors.PollNoProgress(LoopDetectionConfig(), None)
    for n in range(3 * _detectors._VERDICTS_KEPT):
        v = d.verdict(Severity.WARNING, 3, f"tool_{n}")
        assert v.tool == f"tool_{n}"
        assert f"`tool_{n}`" in v.message
        assert len(_detectors._VERDICTS) <= _detectors._VERDICTS_KEPT


def test_global_breaker_judges_each_event_though_the_count_stays() -> None:
    """A long loop keeps the breaker's count: the verdict still names each event's tool and
    follows the count when it moves (the latest verdict is reused only when both are equal)."""
    cfg = LoopDetectionConfig(global_warn_at=2, global_critical_at=3, global_break_at=4)
    breaker = GlobalBreaker(cfg, None)

    def judged(name: str, stalled: int) -> Verdict:
        event = ToolEvent("call", name, "{}", "fp-" + name, None, CallState(name), stalled)
        return breaker.check(event)

    first, again, other = judged("a", 3), judged("a", 3), judged("b", 3)
    assert first == again
    assert (first.tool, first.count) == ("a", 3)
    assert (other.tool, other.count, other.severity) == ("b", 3, Severity.CRITICAL)
    assert (judged("b", 4).severity, judged("b", 1)) == (Severity.BREAK, OK)
