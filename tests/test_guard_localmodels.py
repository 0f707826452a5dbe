"""Recovery for small local models, end to end through the guard: re-asks that change something,
answers from the results in hand, runaways, empty and half-written answers, quality signals."""

from __future__ import annotations

import base64
import json
import os
import random
import struct
import zlib
from typing import Any

import pytest

from _localmodels import TOOLS
from agentguard import GuardConfig, ToolValidationFailed
from agentguard.events import QualityDegraded
from agentguard.guard import Guard
from agentguard.guard._quality import QualityMonitor, runaway
from agentguard.guard._recovery import NOTE_PREFIX
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, capture_events
from agentguard.transport import ModelRequest, report_of
from agentguard.types import Usage

ONE_TIER = {
    "tiers": {"small": {"model": "small"}},
    "escalation": {"chain": ["small"]},
    "memory_pressure": {"enabled": False},
}
TWO_TIERS = {
    "tiers": {"small": {"model": "small"}, "strong": {"model": "strong"}},
    "escalation": {"chain": ["small", "strong"]},
    "memory_pressure": {"enabled": False},
}
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]
#: after one call and its result: the history of turn 2
ANSWERED = [
    *ASKED,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": '{"temperature_c": 18}'},
]
#: FIELD-NOTES: the call again, double-encoded, and a result the model made up
REPEAT_WITH_RESULT = (
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n'
    '{"temperature_c": 25, "condition": "sunny"}'
)


def _guard(model: ScriptedModel, config: dict[str, Any] | None = None, **extra: Any) -> Guard:
    data = {**(config or ONE_TIER), **extra}
    clock = FakeClock()
    return Guard(
        model,
        GuardConfig.from_dict(data, env={}),
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
    )


def _req(messages: list[dict[str, Any]], model: str = "small", **params: Any) -> ModelRequest:
    return ModelRequest(model=model, messages=messages, params={"tools": TOOLS, **params})


# -- answers from the results in hand ----------------------------------------------------------


def test_a_repeat_with_an_invented_result_is_answered_from_the_results() -> None:
    """The model repeats its answered call with a made-up result: the guard does not hand the
    call back; it asks once for the answer from the results, with tool_choice none."""
    model = ScriptedModel([Reply.text(REPEAT_WITH_RESULT), Reply.text("It is 18 C in Paris.")])
    response = _guard(model).complete(_req(ANSWERED))
    assert response.message["content"] == "It is 18 C in Paris."
    assert not response.message.get("tool_calls")
    recovery = model.requests[1]
    assert recovery.params["tool_choice"] == "none"
    turn = recovery.messages[-1]
    assert turn["role"] == "user"  # after the results, where the model reads it
    assert turn["content"].startswith(NOTE_PREFIX)
    assert "final answer now" in turn["content"]
    assert '{"temperature_c": 18}' in turn["content"]  # the real result, not the invented one
    assert list(recovery.messages[: len(ANSWERED)]) == ANSWERED  # the history as the caller sent it
    report = report_of(response)
    assert report is not None
    assert any("asked for the answer" in w for w in report.warnings)


def test_a_model_that_repeats_again_gets_the_next_tier() -> None:
    """The forced answer repeats the call again: with a stronger tier, the call moves up."""
    model = ScriptedModel(
        {
            "small": [Reply.text(REPEAT_WITH_RESULT), Reply.text(REPEAT_WITH_RESULT)],
            "strong": [Reply.text("18 C")],
        }
    )
    response = _guard(model, TWO_TIERS).complete(_req(ANSWERED))
    assert response.message["content"] == "18 C"
    assert [r.model for r in model.requests] == ["small", "small", "strong"]
    report = report_of(response)
    assert report is not None
    assert report.reasons == ("loop_detected",)


def test_one_tier_ends_with_the_results_never_an_exception() -> None:
    """No tier left: the results in hand are the answer (reported), never LoopDetected."""
    model = ScriptedModel([Reply.text(REPEAT_WITH_RESULT)] * 2)
    response = _guard(model).complete(_req(ANSWERED))
    assert '{"temperature_c": 18}' in response.message["content"]
    assert response.finish_reason == "stop"
    report = report_of(response)
    assert report is not None
    assert any("answered from results" in w for w in report.warnings)


def test_one_tier_ends_with_the_results_in_a_stream_too() -> None:
    """Streamed, the results-in-hand answer reaches the caller as text (it was left out): the
    model repeats the answered call as a structured call, which is never streamed."""
    model = ScriptedModel([Reply.call("get_weather", {"city": "Paris"})] * 2)
    stream = _guard(model, tool_validation={"answered_repeats_after": 1}).stream(_req(ANSWERED))
    chunks = list(stream)
    text = "".join(chunk.content or "" for chunk in chunks)
    assert text.startswith("The results in hand:")
    assert '{"temperature_c": 18}' in text
    assert not any(chunk.tool_calls for chunk in chunks)
    assert chunks[-1].finish_reason == "stop"


def test_a_new_call_beside_a_repeat_goes_on_alone() -> None:
    """An answer holding a repeat and a new call: the new call is handed back, the repeat not."""
    text = (
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '{"name": "search_flights", "arguments": {"origin": "OSL", "destination": "CDG"}}'
    )
    model = ScriptedModel([Reply.text(text)])
    guard = _guard(model, tool_validation={"answered_repeats_after": 1})
    response = guard.complete(_req(ANSWERED))
    (call,) = response.message["tool_calls"]
    assert call["function"]["name"] == "search_flights"
    assert len(model.requests) == 1


def test_a_poll_may_repeat_by_default() -> None:
    """Without an invented result a repeat is left to the loop ladder (a poll may repeat)."""
    model = ScriptedModel([Reply.call("get_weather", {"city": "Paris"})])
    response = _guard(model).complete(_req(ANSWERED))
    assert response.message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert len(model.requests) == 1


def test_answered_repeats_after_counts_identical_results() -> None:
    """answered_repeats_after=2: one answered result lets the repeat through, two do not."""
    guard_config = {"answered_repeats_after": 2}
    model = ScriptedModel([Reply.call("get_weather", {"city": "Paris"})])
    response = _guard(model, tool_validation=guard_config).complete(_req(ANSWERED))
    assert response.message["tool_calls"]
    twice = [*ANSWERED, *ANSWERED[1:]]
    model = ScriptedModel([Reply.call("get_weather", {"city": "Paris"}), Reply.text("18 C")])
    response = _guard(model, tool_validation=guard_config).complete(_req(twice))
    assert response.message["content"] == "18 C"


def test_answered_repeats_pass_hands_the_call_back() -> None:
    """``answered_repeats: pass`` switches the recovery off."""
    model = ScriptedModel([Reply.text(REPEAT_WITH_RESULT)])
    guard = _guard(model, tool_validation={"answered_repeats": "pass"})
    response = guard.complete(_req(ANSWERED))
    assert response.message["tool_calls"][0]["function"]["name"] == "get_weather"


# -- empty and half-written answers -------------------------------------------------------------


def test_a_half_written_call_is_re_asked_with_its_tool_pinned() -> None:
    """``functions.get_weather:`` alone: re-asked, tool_choice naming get_weather."""
    model = ScriptedModel(
        [Reply.text("functions.get_weather:"), Reply.call("get_weather", {"city": "Paris"})]
    )
    response = _guard(model).complete(_req(ASKED))
    assert response.message["tool_calls"][0]["function"]["name"] == "get_weather"
    pinned = model.requests[1].params["tool_choice"]
    assert pinned == {"type": "function", "function": {"name": "get_weather"}}


def test_an_empty_answer_is_re_asked() -> None:
    """An empty message with tools on offer is re-asked, the correction saying so."""
    model = ScriptedModel([Reply.text(""), Reply.text("It is sunny.")])
    response = _guard(model).complete(_req(ASKED))
    assert response.message["content"] == "It is sunny."
    assert "empty" in json.dumps(model.requests[1].messages[len(ASKED) :])


#: recorded from SmolLM2 (loop-recovery benchmark, ``file_missing``): its answer on the forcing
#: rung, the wire syntax of a call with HTML-escaped arguments
BEGUN = "functions.get_weather:\n{&#34;error&#34;}"


@pytest.mark.parametrize("failed", [BEGUN, "", "functions.get_weather:"])
def test_no_answer_on_the_forcing_rung_is_answered_from_the_results(failed: str) -> None:
    """Asked for its answer from the results in hand (tools off), the model answers with no
    answer. The guard asks for no call now (a correction would pin the tool): with no tier
    above, the results in hand are the answer."""
    model = ScriptedModel([Reply.call("get_weather", {"city": "Paris"}), Reply.text(failed)])
    guard = _guard(model, tool_validation={"answered_repeats_after": 1})
    response = guard.complete(_req(ANSWERED))
    assert response.message["content"].startswith("The results in hand:")
    assert '{"temperature_c": 18}' in response.message["content"]
    assert not response.message.get("tool_calls")
    assert [r.params.get("tool_choice") for r in model.requests] == [None, "none"]
    report = report_of(response)
    assert report is not None
    assert any("no answer from the results in hand" in w for w in report.warnings)


def test_no_answer_on_the_forcing_rung_is_streamed_as_the_results() -> None:
    model = ScriptedModel([Reply.call("get_weather", {"city": "Paris"}), Reply.text(BEGUN)])
    guard = _guard(model, tool_validation={"answered_repeats_after": 1})
    chunks = list(guard.stream(_req(ANSWERED)))
    text = "".join(chunk.content or "" for chunk in chunks)
    assert text.startswith("The results in hand:")
    assert "functions." not in text
    assert not any(chunk.tool_calls for chunk in chunks)


def test_no_answer_on_the_forcing_rung_moves_up_a_tier_when_there_is_one() -> None:
    small = ScriptedModel([Reply.call("get_weather", {"city": "Paris"}), Reply.text(BEGUN)])
    strong = ScriptedModel([Reply.text("It is 18 C in Paris.")])
    clock = FakeClock()
    guard = Guard(
        config=GuardConfig.from_dict(
            {**TWO_TIERS, "tool_validation": {"answered_repeats_after": 1}}, env={}
        ),
        tier_transport=lambda tier: {"small": small, "strong": strong}[tier.name],
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
    )
    response = guard.complete(_req(ANSWERED))
    assert response.message["content"] == "It is 18 C in Paris."
    assert len(small.requests) == 2
    assert all(r.params.get("tool_choice") in (None, "none") for r in small.requests)


# -- corrections that change something ----------------------------------------------------------


def test_the_same_wrong_answer_changes_the_correction_never_the_same_request() -> None:
    """A hallucinated tool name answered three times alike: corrected, then the tool list
    narrowed to the closest name and pinned; no request is ever sent twice."""
    wrong = Reply.call("get_forecast", {"city": "Paris"})
    model = ScriptedModel([wrong] * 4)
    with pytest.raises(ToolValidationFailed):
        _guard(model, escalation={"enabled": False}).complete(_req(ASKED))
    bodies = [r.to_body() for r in model.requests]
    assert len({json.dumps(b, sort_keys=True) for b in bodies}) == len(bodies)
    assert "tool_choice" not in bodies[0]
    assert [t["function"]["name"] for t in bodies[2]["tools"]] == ["get_weather"]
    assert bodies[2]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_a_changed_answer_keeps_the_plain_correction() -> None:
    """Each answer different: the classic correction each time, the tools as the caller sent."""
    model = ScriptedModel(
        [
            Reply.call("get_forecast", {"city": "Paris"}),
            Reply.call("get_weather", {"town": "Paris"}),
            Reply.call("get_weather", {"city": "Paris"}),
        ]
    )
    response = _guard(model).complete(_req(ASKED))
    assert response.message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert all(len(r.tools) == 2 and "tool_choice" not in r.params for r in model.requests)


# -- runaways -----------------------------------------------------------------------------------


def test_a_runaway_labelled_tool_calls_is_never_repaired_into_a_call() -> None:
    """4,070 completion tokens against max_tokens 256, finish_reason tool_calls: cut off,
    re-asked, counted and reported."""
    cut = '{"city": "Paris", "days": [' + ", ".join(["1"] * 880)
    runaway_reply = Reply.call("get_weather", cut, usage=Usage(100, 4070))
    model = ScriptedModel([runaway_reply, Reply.call("get_weather", {"city": "Paris"})])
    with capture_events() as events:
        response = _guard(model).complete(_req(ASKED, max_tokens=256))
    assert response.message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    report = report_of(response)
    assert report is not None
    assert any("runaway answer: 4070" in w for w in report.warnings)
    assert [e.signal for e in events.of_type(QualityDegraded)] == ["runaway"]
    assert report.corrections == 1


def test_runaway_needs_a_cap_and_a_count() -> None:
    """Far past the cap is a runaway; within the factor, or without a cap, it is not."""
    assert runaway(4070, 256, 2.0)
    assert not runaway(400, 256, 2.0)
    assert not runaway(4070, None, 2.0)
    assert not runaway(None, 256, 2.0)


# -- quality degradation ------------------------------------------------------------------------


def test_a_prompt_the_server_truncated_is_reported() -> None:
    """Usage far below what was sent (Ollama past its context): a quality warning and event."""
    long = [{"role": "user", "content": "word " * 8000}]
    model = ScriptedModel([Reply.text("ok", usage=Usage(512, 1))])
    with capture_events() as events:
        response = _guard(model).complete(ModelRequest(model="small", messages=long))
    report = report_of(response)
    assert report is not None
    assert any("prompt_truncated" in w for w in report.warnings)
    assert [e.signal for e in events.of_type(QualityDegraded)] == ["prompt_truncated"]


def _screenshot(text: str) -> list[dict[str, Any]]:
    """A user turn with a 300 kB 1280 x 800 PNG screenshot (a browser agent's every turn)."""
    header = struct.pack(">II5B", 1280, 800, 8, 2, 0, 0, 0)
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + header))
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + header + crc
    url = "data:image/png;base64," + base64.b64encode(png + os.urandom(300_000)).decode()
    parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": parts}]


def test_a_screenshot_is_neither_over_budget_nor_a_truncated_prompt() -> None:
    """A 300 kB screenshot that the server counts as 785 tokens: admitted under a 50,000-token
    session budget and not reported as a truncated prompt (before: estimated as 100,000 tokens
    of base64, so refused by the budget, or, without one, ``prompt_truncated`` on every call)."""
    budget = {"token_budget": {"per_session": 50_000, "policy": "hard_stop"}}
    model = ScriptedModel([Reply.text("A login form.", usage=Usage(785, 4)) for _ in range(2)])
    guard = _guard(model, {**ONE_TIER, **budget})
    with capture_events() as events:
        for turn in range(2):
            response = guard.complete(_req(_screenshot(f"what is on screen {turn}?")))
            report = report_of(response)
            assert report is not None
            assert not report.warnings
    assert not events.of_type(QualityDegraded)


def test_a_truncated_prompt_with_an_image_is_still_reported() -> None:
    """Its text alone is far more than the server counted: truncated, image or not."""
    model = ScriptedModel([Reply.text("ok", usage=Usage(512, 1))])
    response = _guard(model).complete(_req(_screenshot("word " * 8000)))
    report = report_of(response)
    assert report is not None
    assert any("prompt_truncated" in w for w in report.warnings)


def test_answers_that_stop_parsing_and_sustained_degradation_move_complex_requests_up() -> None:
    """Answers that parsed, then failures in a row: stopped_parsing; once sustained, a request
    with tools starts on the next tier."""
    monitor = QualityMonitor(GuardConfig.from_dict({"quality": {"sustained_count": 2}}, env={}))
    assert monitor.answered("small", usage=None, sent_prompt_tokens=10, parsed=True) == []
    for _ in range(2):
        assert monitor.answered("small", usage=None, sent_prompt_tokens=10, parsed=False) == []
    (warning,) = monitor.answered("small", usage=None, sent_prompt_tokens=10, parsed=False)
    assert "stopped_parsing" in warning
    assert not monitor.sustained("small")
    monitor.failed("small", Exception("unrelated"))
    overflow = _http_error(400, "This model's maximum context length is 4096 tokens.")
    assert monitor.failed("small", overflow)
    assert monitor.sustained("small")
    assert not monitor.sustained("strong")


def test_quality_is_watched_for_a_bounded_number_of_model_names() -> None:
    """Each model name no tier has is a tier of its own, and names are the caller's to choose:
    the monitor keeps the recent answers of the last 1,024 tiers judged, the tier just judged
    among them (it used to keep every name it was ever given)."""
    from agentguard.guard._quality import _TIERS_KEPT

    monitor = QualityMonitor(GuardConfig.from_dict({"quality": {"sustained_count": 2}}, env={}))
    overflow = _http_error(400, "This model's maximum context length is 4096 tokens.")
    monitor.failed("small", overflow)
    for i in range(_TIERS_KEPT + 10):
        monitor.answered(f"model-{i}", usage=None, sent_prompt_tokens=10, parsed=True)
        if i % 100 == 0:
            monitor.failed("small", overflow)  # in use: kept
    assert monitor.sustained("small")
    assert len(monitor._tiers) == _TIERS_KEPT
    assert "model-0" not in monitor._tiers


def test_context_overflows_make_the_next_complex_request_start_up_a_tier() -> None:
    """Context-length 400s on the small tier, sustained: the next request with tools starts on
    the strong tier, the reason quality_degraded."""
    model = ScriptedModel(
        {"small": [Fault.context_length()] * 2 + [Reply.text("short")], "strong": [Reply.text("a")]}
    )
    guard = _guard(model, TWO_TIERS, quality={"sustained_count": 2})
    for _ in range(2):
        with pytest.raises(Exception, match="context length"):
            guard.complete(_req(ASKED, model="small"))
    response = guard.complete(_req(ASKED, model="small"))
    report = report_of(response)
    assert report is not None
    assert report.tier == "strong"
    assert report.reasons == ("quality_degraded",)
    plain = guard.complete(ModelRequest(model="small", messages=ASKED))  # not complex: stays
    assert plain.message["content"] == "short"


def _http_error(status: int, message: str) -> Exception:
    from agentguard.exceptions import ModelError

    return ModelError(f"HTTP {status}: {message}", status_code=status, headers={}, model="m")


def test_through_the_real_openai_client_the_agent_gets_the_answer() -> None:
    """The real openai client, wrapped: the repeat with an invented result never reaches the
    agent; the answer from the results does, and the request sent for it is valid JSON with
    tool_choice none."""
    from _openai_upstream import wrapped_client

    model = ScriptedModel([Reply.text(REPEAT_WITH_RESULT), Reply.text("It is 18 C in Paris.")])
    client = wrapped_client(model, GuardConfig.from_dict(ONE_TIER, env={}))
    answer = client.chat.completions.create(model="small", messages=ANSWERED, tools=TOOLS)
    assert answer.choices[0].message.content == "It is 18 C in Paris."
    assert answer.choices[0].message.tool_calls is None
    assert model.requests[1].params["tool_choice"] == "none"


def test_the_same_empty_answer_pins_the_tool_the_question_asks_for() -> None:
    """Empty twice: the errors name no tool, so the re-ask narrows to the tool whose name and
    description share words with the question, and pins it."""
    model = ScriptedModel([Reply.text("")] * 2 + [Reply.call("get_weather", {"city": "Paris"})])
    response = _guard(model).complete(_req(ASKED))
    assert response.message["tool_calls"][0]["function"]["name"] == "get_weather"
    third = model.requests[2].to_body()
    assert [t["function"]["name"] for t in third["tools"]] == ["get_weather"]
    assert third["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_a_question_naming_no_tool_leaves_the_tools_alone() -> None:
    """No tool shares a word with the question: nothing to narrow to; the model is asked which
    tool through the chooser, once, and when its answer names none the ladder gives up rather
    than send a request again."""
    model = ScriptedModel([Reply.text("")] * 4)
    with pytest.raises(ToolValidationFailed):
        _guard(model, escalation={"enabled": False}).complete(
            _req([{"role": "user", "content": "Hello there."}])
        )
    assert len(model.requests) == 3
    assert [t["function"]["name"] for t in model.requests[2].tools] == ["agentguard_choose_tool"]


def test_an_answer_that_copies_the_correction_back_is_no_answer() -> None:
    """Recorded from SmolLM2: after a correction the model writes the correction itself as its
    answer. That is the failure again: the next re-ask spells the call out in a few words."""
    wrong = '{"name": "get_flight", "arguments": {"city": "Berlin", "origin": "Rome"}}'
    echo = "Your previous tool call was not executed because it is invalid.\n- unknown_tool"
    fixed = '{"name": "search_flights", "arguments": {"origin": "Berlin", "destination": "Rome"}}'
    model = ScriptedModel([Reply.text(wrong), Reply.text(echo), Reply.text(fixed)])
    asked = [{"role": "user", "content": "Find me a flight from Berlin to Rome."}]
    response = _guard(model).complete(_req(asked))
    (call,) = response.message["tool_calls"]
    assert call["function"]["name"] == "search_flights"
    spelled = model.requests[2].messages[-1]["content"]
    assert spelled.startswith("Use the tool search_flights.")
    assert '"origin": ...' in spelled
    assert "not executed" not in spelled
