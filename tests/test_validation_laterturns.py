"""What small models write in later turns: text calls after a result, invented results, calls
run together, half-written and empty answers; and the calls the transcript has answered."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from _localmodels import TOOLS
from agentguard.types import ToolCall
from agentguard.validation import ToolCallValidator, extract_calls
from agentguard.validation._known import (
    answered_calls,
    call_key,
    repeated,
    results_answer,
)

#: FIELD-NOTES, "What real runs showed": turn 2 of a real 0.5B model, verbatim
QWEN_TURN_2 = (
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n'
    '{"temperature_c": 18, "condition": "cloudy"}'
)


def _assistant(content: str | None) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def test_a_call_with_an_invented_result_is_the_call_alone() -> None:
    """Double-encoded arguments, then a made-up result: one structured call, the result gone."""
    report = ToolCallValidator(TOOLS).validate(_assistant(QWEN_TURN_2))
    assert report.ok
    (call,) = report.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert report.content is None
    assert report.invented
    kinds = [r.kind for r in report.repairs]
    assert "dropped_invented_result" in kinds
    assert "double_encoded" in kinds or "extracted_from_text" in kinds


def test_calls_run_together_are_each_a_call() -> None:
    """Two calls written back to back, with no separator, are two calls."""
    text = (
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        '{"name": "search_flights", "arguments": {"origin": "OSL", "destination": "FCO"}}'
    )
    report = ToolCallValidator(TOOLS).validate(_assistant(text))
    assert report.ok
    assert [c.name for c in report.tool_calls] == ["get_weather", "search_flights"]
    assert not report.invented


def test_a_known_call_inside_prose_is_found_and_an_unknown_one_is_not() -> None:
    """Prose around a call to an offered tool: the call; JSON naming no offered tool: text."""
    found = extract_calls(
        'Sure! {"name": "get_weather", "arguments": {"city": "Rome"}}', {"get_weather"}
    )
    assert found is not None
    assert found.calls == (("get_weather", {"city": "Rome"}),)
    assert found.remaining == "Sure!"
    text = 'For example {"name": "make_coffee", "arguments": {}} would be a call.'
    assert extract_calls(text, {"get_weather"}) is None
    assert ToolCallValidator(TOOLS).validate(_assistant(text)).ok


def test_the_wire_syntax_with_arguments_is_a_call() -> None:
    """``functions.NAME:`` then the arguments (llama.cpp's function-calling mode): a call."""
    report = ToolCallValidator(TOOLS).validate(
        _assistant('functions.get_weather:\n{"city": "Paris"}')
    )
    assert report.ok
    assert report.tool_calls[0].name == "get_weather"


def test_a_half_written_call_is_a_failed_call_naming_its_tool() -> None:
    """``functions.NAME:`` and nothing else: incomplete_call, with the tool to pin."""
    report = ToolCallValidator(TOOLS).validate(_assistant("functions.get_weather:"), "stop")
    assert not report.ok
    (error,) = report.errors
    assert (error.kind, error.tool_name) == ("incomplete_call", "get_weather")


def test_the_wire_syntax_with_unreadable_arguments_is_a_failed_call() -> None:
    """Recorded from SmolLM2 in llama-cpp-python's function-calling format, which HTML-escapes
    the prompt: ``functions.read_file:`` then arguments no call can be read from. A call
    begun, not an answer: incomplete_call, naming the tool."""
    report = ToolCallValidator(TOOLS).validate(
        _assistant("functions.get_weather:\n{&#34;error&#34;}"), "stop"
    )
    assert not report.ok
    (error,) = report.errors
    assert (error.kind, error.tool_name) == ("incomplete_call", "get_weather")
    assert "cannot be read" in error.message
    # the wire syntax named inside a text answer is not a call begun
    assert (
        ToolCallValidator(TOOLS)
        .validate(_assistant("I would call functions.get_weather: with the city."), "stop")
        .ok
    )


def test_an_empty_answer_when_tools_were_offered_is_a_failure() -> None:
    """An empty text that says it is complete, tools on offer: empty_answer."""
    report = ToolCallValidator(TOOLS).validate(_assistant(""), "stop")
    assert [e.kind for e in report.errors] == ["empty_answer"]
    assert "empty" in report.corrective_text()


def test_what_is_not_an_empty_answer() -> None:
    """No tools, other calls (finish tool_calls), no text at all, or the setting off: passed."""
    assert ToolCallValidator([]).validate(_assistant(""), "stop").ok
    assert ToolCallValidator(TOOLS).validate(_assistant(""), "tool_calls").ok
    assert ToolCallValidator(TOOLS).validate(_assistant(None), "stop").ok
    config = {"empty_answer_is_failure": False}
    from agentguard.config import ToolValidationConfig

    off = ToolValidationConfig(**config)
    assert ToolCallValidator(TOOLS, off).validate(_assistant(""), "stop").ok


def test_a_runaway_is_cut_off_never_a_call() -> None:
    """A report's ``cut_off()``: every call becomes a truncated error, nothing is repaired."""
    args = json.dumps({"city": "Paris", "extra": list(range(880))})
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
        ],
    }
    report = ToolCallValidator(TOOLS).validate(message, "length").cut_off()
    assert not report.ok
    assert "truncated" in [e.kind for e in report.errors]


def _run(*turns: tuple[str, dict[str, Any], str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    for i, (name, args, result) in enumerate(turns):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
    return messages


def test_answered_calls_count_identical_results_in_a_row() -> None:
    """The same call answered twice alike counts 2; a changed result starts over."""
    history = _run(
        ("get_weather", {"city": "Paris"}, "18C"), ("get_weather", {"city": "Paris"}, "18C")
    )
    known = answered_calls(history, 40)
    (only,) = known.values()
    assert (only.name, only.times, only.result) == ("get_weather", 2, "18C")
    history = _run(
        ("get_weather", {"city": "Paris"}, "18C"), ("get_weather", {"city": "Paris"}, "19C")
    )
    assert next(iter(answered_calls(history, 40).values())).times == 1


def test_a_correction_is_no_answer_and_the_window_is_bounded() -> None:
    """The guard's own feedback does not count as a result; old messages are not searched."""
    history = _run(("get_weather", {"city": "Paris"}, "[agentguard: automated feedback] bad"))
    assert answered_calls(history, 40) == {}
    history = _run(
        ("get_weather", {"city": "Paris"}, "18C"),
        *[("search_flights", {"origin": str(i), "destination": "x"}, "none") for i in range(30)],
    )
    assert call_key("get_weather", {"city": "Paris"}) not in answered_calls(history, 10)


def test_repeated_matches_whatever_the_spelling_of_the_arguments() -> None:
    """Key order and spacing do not matter; the threshold of identical answers does."""
    known = answered_calls(_run(("get_weather", {"city": "Paris", "unit": "c"}, "18C")), 40)
    again = ToolCall("get_weather", '{ "unit":"c",  "city": "Paris"}', "x")
    assert [a.name for a in repeated([again], known)] == ["get_weather"]
    assert repeated([again], known, times=2) == []
    assert repeated([ToolCall("get_weather", '{"city": "Rome"}', "y")], known) == []


def test_the_answer_from_results_lists_each_call_and_result() -> None:
    """The answer the guard gives when the model cannot: each call and what came back."""
    history = _run(("get_weather", {"city": "Paris"}, '{"temperature_c": 18}'))
    known = list(answered_calls(history, 40).values())
    text = results_answer(known)
    assert 'get_weather({"city": "Paris"}) -> {"temperature_c": 18}' in text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_extraction_and_validation_never_raise_on_any_text(text: str) -> None:
    """Any text: extraction returns nothing or calls; a validator never raises on it."""
    found = extract_calls(text, {"get_weather"})
    if found is not None:
        assert found.calls
    ToolCallValidator(TOOLS).validate(_assistant(text), "stop")
