"""Grounding checks (``validation/_grounding.py``) and the ``choices`` re-ask they lead to."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard.types import ToolCall
from agentguard.validation import ToolCallValidator, specs_from
from agentguard.validation._grounding import (
    current_request,
    ignored_results,
    invented_numbers,
    salient_values,
    stated_numbers,
    uncovered_values,
    ungrounded_arguments,
)
from agentguard.validation._reask import CHOOSE_TOOL, CorrectionLadder

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
FLIGHTS = {
    "type": "function",
    "function": {
        "name": "search_flights",
        "description": "Flights between two cities.",
        "parameters": {
            "type": "object",
            "properties": {"origin": {"type": "string"}, "destination": {"type": "string"}},
            "required": ["origin", "destination"],
        },
    },
}
SPECS = specs_from([WEATHER, FLIGHTS])


def _call(name: str, args: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _exchange(name: str, args: dict[str, Any], result: Any, call_id: str = "c1") -> list[Any]:
    return [
        {"role": "assistant", "content": "", "tool_calls": [_call(name, args, call_id)]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
    ]


def test_salient_values_are_the_names_a_request_gives() -> None:
    """Places, file names, codes and quoted strings; not the word that opens a sentence."""
    assert salient_values("What is the weather in Oslo and in Madrid?") == ["Oslo", "Madrid"]
    assert salient_values("Read todo.txt and tell me the first item.") == ["todo.txt"]
    assert salient_values("Convert 100 USD to EUR.") == ["USD", "EUR"]
    assert salient_values('Hi, I am in New York. Open "the plan" in /tmp/a.txt') == [
        "the plan",
        "New York",
        "/tmp/a.txt",
    ]
    assert salient_values("what is the weather like today?") == []


@given(st.text(max_size=200))
def test_salient_values_never_raise_and_come_from_the_text(text: str) -> None:
    """Any text: each value found occurs in it, once."""
    values = salient_values(text)
    assert all(value in text or value.replace(" ", "") in text for value in values)
    assert len({v.lower() for v in values}) == len(values)


def test_the_current_request_starts_after_the_last_final_answer() -> None:
    """An earlier exchange (its question and answer) is not the current request."""
    messages = [
        {"role": "user", "content": "What time is it in Lima?"},
        {"role": "assistant", "content": "It is 10:00 in Lima."},
        {"role": "user", "content": "And the weather in Oslo?"},
        *_exchange("get_weather", {"city": "Oslo"}, {"temperature_c": 4}),
    ]
    request = current_request(messages)
    assert request.values == ("Oslo",)
    assert request.calls == (("get_weather", {"city": "Oslo"}, '{"temperature_c": 4}'),)
    assert not request.grounds("Lima")
    assert request.grounds("oslo")


def test_a_value_from_nowhere_is_ungrounded_with_the_request_values_as_suggestions() -> None:
    """Recorded from SmolLM2-135M: 'Lisbon' for a request naming Oslo and Madrid."""
    request = current_request(
        [{"role": "user", "content": "What is the weather in Oslo and in Madrid?"}]
    )
    (error,) = ungrounded_arguments(
        [ToolCall("get_weather", '{"city": "Lisbon", "unit": "x"}', "c1")], request, SPECS
    )
    assert (error.kind, error.path, error.value) == ("ungrounded_argument", "$.city", "Lisbon")
    assert error.suggestions == ("Oslo", "Madrid")


def test_grounded_enum_and_long_values_are_not_flagged() -> None:
    """A value the request or a result states, an enum argument, a long text: no error."""
    messages = [
        {"role": "user", "content": "Weather in Paris, and then the city with the best fog?"},
        *_exchange("get_weather", {"city": "Paris"}, {"foggiest": "London"}),
    ]
    request = current_request(messages)
    calls = [
        ToolCall("get_weather", '{"city": "PARIS", "unit": "f"}', "a"),
        ToolCall("get_weather", '{"city": "London"}', "b"),
        ToolCall("get_weather", json.dumps({"city": "a b c d e f g"}), "c"),
    ]
    assert ungrounded_arguments(calls, request, SPECS) == []


# Recorded from SmolLM2-135M in llama.cpp's grammar function-calling mode, pinned to get_weather
# for "Weather in Madrid please." (the arguments after the guard's JSON repair).
DEBRIS = (
    "./data.jsonp?key=1&#34;name&#34;: &#34;Cairo&#34;, &#34;temperature_c&#34;: 16, "
    "&#34;condition&#34;: &#34;mist&#34;}\n{ "
)


def test_long_markup_debris_in_a_value_is_ungrounded() -> None:
    """A long value is text the model wrote and is not checked, unless it holds HTML character
    references the request does not: then it is debris of the wire, not a value."""
    request = current_request([{"role": "user", "content": "Weather in Madrid please."}])
    (error,) = ungrounded_arguments(
        [ToolCall("get_weather", json.dumps({"city": DEBRIS}), "c1")], request, SPECS
    )
    assert (error.kind, error.path, error.suggestions) == (
        "ungrounded_argument",
        "$.city",
        ("Madrid",),
    )
    plain = DEBRIS.replace("&#34;", '"')
    assert (
        ungrounded_arguments(
            [ToolCall("get_weather", json.dumps({"city": plain}), "c1")], request, SPECS
        )
        == []
    )
    quoting = current_request(
        [{"role": "user", "content": 'Weather in "Madrid" — the page says &#34;Madrid&#34;.'}]
    )
    long_quote = "the page says &#34;Madrid&#34; and more words here"
    assert (
        ungrounded_arguments(
            [ToolCall("get_weather", json.dumps({"city": long_quote}), "c1")], quoting, SPECS
        )
        == []
    )


def test_a_request_that_names_nothing_flags_nothing() -> None:
    """No values in the request: no list to choose from, so no error."""
    request = current_request([{"role": "user", "content": "what is the weather like?"}])
    assert (
        ungrounded_arguments([ToolCall("get_weather", '{"city": "Rome"}', "c")], request, SPECS)
        == []
    )


def test_an_answer_that_ignores_a_result_is_found() -> None:
    """Recorded: "Linden, I'm sorry for your loss." after a flight search."""
    messages = [
        {"role": "user", "content": "Find me a flight from Berlin to Rome."},
        *_exchange(
            "search_flights",
            {"origin": "Berlin", "destination": "Rome"},
            {"flights": [{"flight": "LH 1234", "price_eur": 129}]},
        ),
    ]
    request = current_request(messages)
    assert ignored_results("Linden, I'm sorry for your loss.", request) == ["search_flights"]
    # the call's own words are not the result's facts: naming the cities grounds nothing
    assert ignored_results("There are flights from Berlin to Rome.", request) == ["search_flights"]
    assert ignored_results("LH 1234 costs 129.00 EUR.", request) == []


def test_numbers_no_result_states_are_found() -> None:
    """Recorded: "Lindsfest 2018: 1234" for flight LH 1234 (shares 1234, invents 2018) and
    "$234.67 ... since 2022" beside ACME's 189.5. A number the user, an argument or a result
    states grounds itself in any spelling; small counts and list marks are any answer's."""
    flights = current_request(
        [
            {"role": "user", "content": "Find me a flight from Berlin to Rome for 2 people."},
            *_exchange(
                "search_flights",
                {"origin": "Berlin", "destination": "Rome", "max_price": 300},
                {"flights": [{"flight": "LH 1234", "price_eur": 129.0}]},
            ),
        ]
    )
    assert invented_numbers("Lindsfest 2018: 1234\nFlight from Berlin to Rome.", flights) == [
        "2018"
    ]
    assert invented_numbers("1. LH 1234, 129 EUR for 2 people, under 300.", flights) == []
    assert invented_numbers("LH 1234 costs 1,290 EUR or 45.5 a day.", flights) == ["1,290", "45.5"]
    stock = current_request(
        [
            {"role": "user", "content": "What is the stock price of ACME?"},
            *_exchange("get_weather", {"city": "ACME"}, {"symbol": "ACME", "price_usd": 189.5}),
        ]
    )
    assert invented_numbers(
        "ACME is currently selling at $189.50 USD, and it has been increasing its price to "
        "$234.67 USD since 2022.",
        stock,
    ) == ["234.67", "2022"]


def test_no_number_is_invented_without_a_result_in_hand() -> None:
    """No call answered, or only with errors: the answer had nothing to take numbers from."""
    messages = [
        {"role": "user", "content": "How far is the moon?"},
        *_exchange("get_weather", {"city": "moon"}, {"error": "not found"}),
    ]
    assert invented_numbers("About 384,400 km.", current_request(messages)) == []
    assert invented_numbers("About 384,400 km.", current_request(messages[:1])) == []


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9), st.text())
def test_a_number_a_result_states_is_never_invented(value: float, prose: str) -> None:
    """Whatever else an answer says, quoting a result's number (as the result spells it) is
    never flagged; and every number flagged is one the answer states."""
    messages = [
        {"role": "user", "content": "What is it?"},
        *_exchange("get_weather", {"city": "x"}, {"value": value}),
    ]
    request = current_request(messages)
    answer = f"{prose} It is {value!r}."
    found = invented_numbers(answer, request)
    assert repr(value) not in found
    assert all(number in answer for number in found)


def test_error_and_contentless_results_ground_nothing_and_ask_nothing() -> None:
    """An error result, or one that states nothing but a status: any answer passes."""
    messages = [
        {"role": "user", "content": "Delete draft.txt"},
        *_exchange("get_weather", {"city": "x"}, {"error": "not found"}, "a"),
        *_exchange("get_weather", {"city": "y"}, {"status": "ok"}, "b"),
    ]
    assert ignored_results("Done.", current_request(messages)) == []


def test_values_no_call_covered_are_found() -> None:
    """Two cities asked, one looked up: the other is uncovered."""
    messages = [
        {"role": "user", "content": "What is the weather in Oslo and in Madrid?"},
        *_exchange("get_weather", {"city": "Madrid"}, {"city": "Madrid", "temperature_c": 27}),
    ]
    assert uncovered_values(current_request(messages)) == ["Oslo"]


def test_no_value_is_uncovered_when_the_calls_looked_none_up() -> None:
    """A request whose calls use none of its values (a greeting's name): nothing to cover."""
    messages = [
        {"role": "user", "content": "Hi, I am John. How warm is it here?"},
        *_exchange("get_weather", {"city": "here"}, {"temperature_c": 20}),
    ]
    assert uncovered_values(current_request(messages)) == []


def test_the_choices_reask_pins_the_tool_and_narrows_the_values() -> None:
    """The re-ask offers the tool alone, pinned, its flagged arguments an enum of the
    request's values — distinct values in the order the request names them."""
    validator = ToolCallValidator([WEATHER, FLIGHTS])
    answer = {
        "role": "assistant",
        "content": '{"name": "search_flights", "arguments": {"origin": "Cairo", "destination": "Nairobi"}}',
    }
    report = validator.validate(answer, "stop")
    messages = [{"role": "user", "content": "Search flights from London to Paris."}]
    errors = ungrounded_arguments(report.tool_calls, current_request(messages), report.specs)
    failed = report.__class__(
        False, report.tool_calls, tuple(errors), report.repairs, report.message, report.specs
    )
    reask = CorrectionLadder([WEATHER, FLIGHTS], messages[0]["content"]).next(failed)
    assert reask is not None
    assert reask.rung == "choices"
    assert reask.tool_choice == {"type": "function", "function": {"name": "search_flights"}}
    (tool,) = reask.tools or []
    props = tool["function"]["parameters"]["properties"]
    assert props["origin"]["enum"] == ["London", "Paris"]
    assert props["destination"]["enum"] == ["Paris"]
    assert "Use the tool search_flights" in reask.messages[-1]["content"]


CONVERT = {
    "type": "function",
    "function": {
        "name": "convert_currency",
        "description": "Convert an amount of money.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "from_currency": {"type": "string"},
                "to_currency": {"type": "string"},
            },
            "required": ["amount", "from_currency", "to_currency"],
        },
    },
}
CUR = {"from_currency": "USD", "to_currency": "EUR"}


def _failed(question: str, name: str, args: dict[str, Any]) -> Any:
    """The report of a valid call ``name(args)`` judged against ``question``'s values."""
    validator = ToolCallValidator([WEATHER, FLIGHTS, CONVERT])
    answer = {"role": "assistant", "content": json.dumps({"name": name, "arguments": args})}
    report = validator.validate(answer, "stop")
    request = current_request([{"role": "user", "content": question}])
    errors = ungrounded_arguments(report.tool_calls, request, report.specs)
    return report.__class__(
        not errors, report.tool_calls, tuple(errors), report.repairs, report.message, report.specs
    )


def test_stated_numbers_are_the_numbers_standing_alone() -> None:
    """Amounts, decimals, thousands; not the digits of a file name or a code."""
    assert stated_numbers("How much is 50 EUR in JPY?") == ["50"]
    assert stated_numbers("Pay 1,000 or 1000.0 now, then 2.5.") == ["1,000", "2.5"]
    assert stated_numbers("Open todo2.txt and flight LH1234 at gate B7") == []
    assert stated_numbers("no numbers here") == []


@given(st.text(max_size=200))
def test_stated_numbers_never_raise_and_come_from_the_text(text: str) -> None:
    """Any text: each number found occurs in it, and is a number."""
    for number in stated_numbers(text):
        assert number in text
        float(number.replace(",", ""))


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_a_number_argument_is_grounded_exactly_when_the_request_states_it(
    stated: int, written: int
) -> None:
    """A number the request states grounds itself in any spelling (50 and 50.0); another
    number is flagged, the request's numbers its suggestions."""
    failed = _failed(
        f"Convert {stated} USD to EUR.",
        "convert_currency",
        {"amount": float(written), "from_currency": "USD", "to_currency": "EUR"},
    )
    if stated == written:
        assert failed.errors == ()
    else:
        (error,) = failed.errors
        assert (error.kind, error.path, error.suggestions) == (
            "ungrounded_argument",
            "$.amount",
            (str(stated),),
        )


def test_numbers_are_not_judged_when_the_request_states_none() -> None:
    """No number in the request: a number argument has nothing to come from, no error."""
    failed = _failed("Convert some USD to EUR.", "convert_currency", {"amount": 10.9} | CUR)
    assert failed.errors == ()


def test_the_choices_narrow_the_arguments_taken_from_the_request_too() -> None:
    """Recorded on SmolLM2-135M ("How much is 50 EUR in JPY?"): to_currency USD narrowed alone
    freed from_currency (JPY, then USD). The arguments that took one of the request's values
    are narrowed with it, in the request's order; a number narrowed is an enum of numbers."""
    question = "How much is 50 EUR in JPY?"
    failed = _failed(
        question, "convert_currency", {"amount": 50, "from_currency": "JPY", "to_currency": "USD"}
    )
    ladder = CorrectionLadder([WEATHER, FLIGHTS, CONVERT], question)
    reask = ladder.next(failed)
    assert reask is not None
    assert reask.rung == "choices"
    props = (reask.tools or [])[0]["function"]["parameters"]["properties"]
    assert props["from_currency"]["enum"] == ["EUR", "JPY"]
    assert props["to_currency"]["enum"] == ["JPY"]
    assert "enum" not in props["amount"]  # grounded, and no number was doubted
    # the next answer gets the amount wrong: the amount is narrowed to the request's numbers
    again = _failed(
        question, "convert_currency", {"amount": 10, "from_currency": "EUR", "to_currency": "JPY"}
    )
    assert ladder.owes(again)
    reask = ladder.next(again)
    assert reask is not None
    assert reask.rung == "choices"
    props = (reask.tools or [])[0]["function"]["parameters"]["properties"]
    assert props["amount"]["enum"] == [50]
    assert props["to_currency"]["enum"] == ["JPY"]  # narrowed before: stays narrowed
    assert not ladder.owes(again)


def test_the_choices_are_owed_until_each_doubted_argument_was_offered_them() -> None:
    """``owes``: a doubted argument no choices re-ask offered the request's values for; a
    report with no doubt owes nothing."""
    question = "Search flights from London to Paris."
    ladder = CorrectionLadder([WEATHER, FLIGHTS, CONVERT], question)
    lhr = _failed(question, "search_flights", {"origin": "LHR", "destination": "Paris"})
    assert ladder.owes(lhr)
    assert ladder.next(lhr) is not None
    assert not ladder.owes(lhr)
    right = _failed(question, "search_flights", {"origin": "London", "destination": "Paris"})
    assert right.ok
    assert not ladder.owes(right)


def _empty(question: str) -> tuple[CorrectionLadder, Any]:
    validator = ToolCallValidator([WEATHER, FLIGHTS, CONVERT])
    report = validator.validate({"role": "assistant", "content": ""}, "stop")
    assert not report.ok
    return CorrectionLadder([WEATHER, FLIGHTS, CONVERT], question), report


def test_an_empty_answer_naming_no_tool_is_asked_which_tool_once() -> None:
    """Empty answers to a question sharing no word with any tool: the correction, then (the
    answer the same, nothing to narrow or pin) the chooser, once; its answer names the tool to
    pin, and with none named no rung is left."""
    ladder, empty = _empty("Is it raining in Tokyo?")
    assert ladder.picked({"role": "assistant", "content": "get_weather"}) is None  # not asked
    first = ladder.next(empty)
    assert first is not None
    assert first.rung == "correction"
    asked = ladder.next(empty)
    assert asked is not None
    assert asked.rung == "asked"
    assert asked.tool_choice == {"type": "function", "function": {"name": CHOOSE_TOOL}}
    (chooser,) = asked.tools or []
    choice = chooser["function"]["parameters"]["properties"]["tool"]
    assert choice["enum"] == ["get_weather", "search_flights", "convert_currency"]
    assert "get_weather: Current weather in a city." in choice["description"]
    chose = {"name": CHOOSE_TOOL, "arguments": '{"tool": "get_weather"}'}
    picked = ladder.picked({"role": "assistant", "tool_calls": [{"id": "c", "function": chose}]})
    assert picked == (empty, "get_weather")
    pinned = ladder.next(empty)
    assert pinned is not None
    assert (pinned.rung, pinned.tool_choice["function"]["name"]) == ("pinned", "get_weather")
    again, report = _empty("Is it raining in Tokyo?")
    again.next(report)
    assert again.next(report) is not None  # asked
    assert again.picked({"role": "assistant", "content": "get_weather or convert_currency"}) == (
        report,
        None,
    )
    assert again.next(report) is None  # nothing named: no rung left, never asked twice


def test_the_chooser_is_not_asked_when_the_question_names_a_tool() -> None:
    """A question sharing words with a tool has its narrowed and pinned rungs instead."""
    ladder, empty = _empty("What is the weather in Paris?")
    rungs = []
    while (reask := ladder.next(empty)) is not None:
        rungs.append(reask.rung)
    assert rungs == ["correction", "narrowed"]  # narrowed to one tool: pinned already


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ({"content": "get_weather"}, "get_weather"),
        ({"content": "The tool: Get Weather."}, "get_weather"),
        ({"content": "search_flights, then get_weather"}, None),
        ({"content": "a library called Aeropex"}, None),
        (
            {"tool_calls": [{"function": {"name": "search_flights", "arguments": "{}"}}]},
            "search_flights",
        ),
        (
            {"tool_calls": [{"function": {"name": CHOOSE_TOOL, "arguments": '{"tool": "nope"}'}}]},
            None,
        ),
    ],
)
def test_what_an_answer_to_the_chooser_names(message: dict[str, Any], named: str | None) -> None:
    """The chooser's argument, a call of a tool itself, or the one tool name a text holds."""
    ladder, empty = _empty("Is it raining in Tokyo?")
    ladder.next(empty)
    ladder.next(empty)
    assert ladder.picked({"role": "assistant", **message}) == (empty, named)
