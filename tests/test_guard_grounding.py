"""The small-model profile's grounding checks through the guard, on recorded real answers.

``tests/data/smollm2_grounding.jsonl``: guarded calls of the agent-task benchmark
(``benchmarks/bench_agenttasks.py``) with SmolLM2-135M-Instruct on llama-cpp-python 0.3.36 (its
own chat template), recorded on the wire: each line is one guarded call — the task's part of the
history and every answer the server gave to it, the guard's re-asks included, in order. Replayed
as the upstream's answers, the guard must take the same path: the same number of requests, the
same re-ask at each step, the same final answer. The healthy lines (a right call, a final answer
that states its result) must pass with one request and no warning, with the profile on.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentguard import GuardConfig
from agentguard.guard import Guard
from agentguard.testing import FakeClock, Reply, ScriptedModel, capture_events
from agentguard.transport import ModelRequest, ModelResponse, report_of
from agentguard.types import Usage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import agenttasks
from agentguard.validation._reask import CHOOSE_TOOL
from bench_agenttasks import SMALL_MODEL_PROFILE

DATA = Path(__file__).parent / "data" / "smollm2_grounding.jsonl"
#: single-turn prompts of the benchmark, recorded the same way (issue 17: the owed choices)
OWED = Path(__file__).parent / "data" / "smollm2_owed_choices.jsonl"
#: the same in llama.cpp's grammar function-calling mode (sent with tool_choice "auto"): markup
#: debris written as an argument's value; empty answers naming no tool (the asked rung)
FC_MODE = Path(__file__).parent / "data" / "smollm2_fc_mode.jsonl"
CASES = {
    line["case"]: line
    for path in (DATA, OWED, FC_MODE)
    for line in (json.loads(text) for text in path.read_text(encoding="utf-8").splitlines())
}
ONE_TIER = {
    "tiers": {"small": {"model": "smollm2"}},
    "escalation": {"chain": ["small"]},
    "memory_pressure": {"enabled": False},
}
HEALTHY = sorted(name for name in CASES if name.startswith("healthy"))


def _reply(answer: dict[str, Any]) -> Reply:
    usage = answer["usage"]
    return Reply(
        answer["content"],
        tuple(answer["tool_calls"] or ()),
        answer["finish_reason"],
        Usage(usage["prompt_tokens"], usage["completion_tokens"]),
    )


def _run(
    case: str,
    *,
    profile: bool = True,
    extra: dict[str, Any] | None = None,
    answers: list[dict[str, Any]] | None = None,
) -> tuple[ScriptedModel, ModelResponse]:
    line = CASES[case]
    model = ScriptedModel([_reply(a) for a in answers or line["answers"]])
    clock = FakeClock()
    tool_validation = SMALL_MODEL_PROFILE if profile else {}
    config = GuardConfig.from_dict(
        {**ONE_TIER, "tool_validation": tool_validation, **(extra or {})}, env={}
    )
    guard = Guard(model, config, clock=clock, sleep=clock.sleep, rng=random.Random(0))
    request = ModelRequest(
        model="smollm2",
        messages=[*agenttasks.SEED_MESSAGES, *line["messages"]],
        params={
            "tools": agenttasks.TOOLS,
            "temperature": 0,
            "max_tokens": 160,
            **({"tool_choice": line["tool_choice"]} if "tool_choice" in line else {}),
        },
    )
    return model, guard.complete(request)


def _two_tiers(
    small: ScriptedModel, strong: ScriptedModel, messages: list[dict[str, Any]]
) -> ModelResponse:
    """One guarded call of the task's history with the profile, the small model first and a
    stronger tier behind it."""
    clock = FakeClock()
    config = GuardConfig.from_dict(
        {
            "tiers": {"small": {"model": "smollm2"}, "strong": {"model": "big"}},
            "escalation": {"chain": ["small", "strong"]},
            "memory_pressure": {"enabled": False},
            "tool_validation": SMALL_MODEL_PROFILE,
        },
        env={},
    )
    tiers = {"small": small, "strong": strong}
    guard = Guard(
        config=config,
        tier_transport=lambda tier: tiers[tier.name],
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
    )
    request = ModelRequest(
        model="smollm2",
        messages=[*agenttasks.SEED_MESSAGES, *messages],
        params={"tools": agenttasks.TOOLS, "temperature": 0, "max_tokens": 160},
    )
    return guard.complete(request)


def _warnings(response: ModelResponse) -> tuple[str, ...]:
    report = report_of(response)
    assert report is not None
    return tuple(report.warnings)


def _calls(response: ModelResponse) -> list[tuple[str, Any]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in response.message.get("tool_calls") or ()
    ]


def test_the_profile_is_a_valid_configuration_that_turns_every_check_on() -> None:
    """The benchmark's profile (the one docs/local-models.md shows) loads, checks on."""
    cfg = GuardConfig.from_dict({"tool_validation": SMALL_MODEL_PROFILE}, env={}).tool_validation
    assert cfg.ungrounded_arguments
    assert cfg.ungrounded_answers
    assert cfg.uncovered_values
    assert cfg.cut_off_text_is_failure
    default = GuardConfig().tool_validation
    assert not (default.ungrounded_arguments)
    assert not (default.ungrounded_answers)
    assert not (default.uncovered_values)
    assert not (default.cut_off_text_is_failure)


def test_the_profile_is_the_one_the_docs_show() -> None:
    """docs/local-models.md's profile block is the benchmark's."""
    docs = (Path(__file__).parents[1] / "docs" / "local-models.md").read_text(encoding="utf-8")
    block = docs.split("<!-- small-model profile -->", 1)[1].split("```yaml", 1)[1]
    block = block.split("```", 1)[0]
    loaded = yaml.safe_load(block)["reliability"]["tool_validation"]
    assert loaded == SMALL_MODEL_PROFILE


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_answers_pass_untouched_with_the_profile(case: str) -> None:
    """A right call, or a final answer that states its result: one request, no warning."""
    model, response = _run(case)
    assert len(model.requests) == 1
    assert _warnings(response) == ()
    answer = CASES[case]["answers"][0]
    if answer["tool_calls"] is None and not answer["content"].startswith("{"):
        assert response.message["content"] == answer["content"]


@pytest.mark.parametrize("case", ["ungrounded_path", "ungrounded_answer", "uncovered_city"])
def test_without_the_profile_the_guard_does_not_judge_grounding(case: str) -> None:
    """Default configuration: a value from nowhere, an answer ignoring its result, a value left
    out — all passed as the model wrote them (one request)."""
    model, _ = _run(case, profile=False)
    assert len(model.requests) == 1


def test_a_made_up_path_is_reasked_with_the_request_values_as_choices() -> None:
    """Recorded: read_file of a made-up path for "Read todo.txt"; the re-ask pins read_file with
    path an enum of ["todo.txt"], and the model (grammar-constrained) writes todo.txt."""
    with capture_events() as events:
        model, response = _run("ungrounded_path")
    assert len(model.requests) == 2
    reask = model.requests[1]
    assert reask.params["tool_choice"] == {"type": "function", "function": {"name": "read_file"}}
    (tool,) = reask.tools
    assert tool["function"]["parameters"]["properties"]["path"]["enum"] == ["todo.txt"]
    assert _calls(response) == [("read_file", {"path": "todo.txt"})]
    assert any(
        "re-asked with the request's values as the choices" in w for w in _warnings(response)
    )
    kinds = [getattr(e, "error", None) for e in events]
    assert "ungrounded_argument" in kinds  # ToolCallRejected, then CorrectionRequested


def test_a_city_from_nowhere_becomes_one_the_request_names() -> None:
    """Recorded: 'Lisbon' for Oslo and Madrid; with the choices, Madrid."""
    model, response = _run("ungrounded_city")
    enum = model.requests[1].tools[0]["function"]["parameters"]["properties"]["city"]["enum"]
    assert enum == ["Oslo", "Madrid"]
    assert _calls(response) == [("get_weather", {"city": "Madrid"})]


def test_an_answer_that_ignores_the_result_is_asked_again_from_the_results() -> None:
    """Recorded: "Linden, I'm sorry for your loss." after the flight search; the recovery turn
    (the request and its results, tool_choice none) gets an answer naming LH 1234."""
    model, response = _run("ungrounded_answer")
    assert len(model.requests) == 2
    forced = model.requests[1]
    assert forced.params["tool_choice"] == "none"
    note = forced.messages[-1]["content"]
    assert note.startswith("Find me a flight from Berlin to Rome.\nTool results:")
    assert "LH 1234" in note
    assert "LH 1234" in response.message["content"]
    assert any("ignores the results of search_flights" in w for w in _warnings(response))


def test_an_answer_that_still_ignores_a_result_is_answered_from_the_results_on_one_tier() -> None:
    """Recorded: asked again, the model still leaves the weather out ("You have found the
    flight to Paris from London to Paris."); with no tier above, the results in hand are the
    answer (never an exception, never the suspect answer), and the report says so."""
    model, response = _run("ignored_result_kept")
    assert len(model.requests) == 2
    content = response.message["content"]
    assert content.startswith("The results in hand:")
    assert "AF 1081" in content
    assert "cloudy" in content
    assert response.message.get("tool_calls") is None
    assert response.finish_reason == "stop"
    assert any(
        w.startswith("the answer ignores the results of get_weather, search_flights after")
        and w.endswith("answered from results")
        for w in _warnings(response)
    )


def test_an_answer_that_still_ignores_a_result_moves_up_a_tier_when_there_is_one() -> None:
    """Two tiers: the second answer ignoring a result hands the call to the stronger tier."""
    line = CASES["ignored_result_kept"]
    small = ScriptedModel([_reply(a) for a in line["answers"]])
    strong = ScriptedModel([Reply.text("AF 1081 costs 88 EUR; Paris is 18 °C and cloudy.")])
    response = _two_tiers(small, strong, line["messages"])
    assert len(strong.requests) == 1
    report = report_of(response)
    assert report is not None
    assert report.tier == "strong"
    assert "AF 1081" in response.message["content"]


@pytest.mark.parametrize("case", ["invented_number", "invented_number_stock"])
def test_an_answer_stating_numbers_no_result_holds_is_asked_again_from_the_results(
    case: str,
) -> None:
    """Recorded: "Lindsfest 2018: 1234" after flight LH 1234 was found (the answer shares 1234
    with the result, so it does not ignore it), and ACME "increasing its price to $234.67 since
    2022" beside its 189.5. The recovery turn gets an answer stating the result's values."""
    model, response = _run(case)
    assert len(model.requests) == 2
    assert model.requests[1].params["tool_choice"] == "none"
    assert response.message["content"] == CASES[case]["answers"][-1]["content"]
    assert any("states numbers no result holds" in w for w in _warnings(response))
    # without the profile the first answer is the answer
    model, response = _run(case, profile=False)
    assert len(model.requests) == 1
    assert response.message["content"] == CASES[case]["answers"][0]["content"]


def test_an_answer_still_inventing_numbers_moves_up_a_tier_when_there_is_one() -> None:
    """Two tiers: the recovery turn's answer inventing a number again hands the call to the
    stronger tier; on one tier the results in hand are the answer."""
    line = CASES["invented_number"]
    again = [line["answers"][0], line["answers"][0]]
    model, response = _run("invented_number", answers=again)
    assert len(model.requests) == 2
    content = response.message["content"]
    assert content.startswith("The results in hand:")
    assert "LH 1234" in content
    assert "2018" not in content
    assert any(
        w.startswith("the answer states numbers no result holds (2018)")
        and w.endswith("answered from results")
        for w in _warnings(response)
    )
    small = ScriptedModel([_reply(a) for a in again])
    strong = ScriptedModel([Reply.text("Flight LH 1234 from Berlin to Rome costs 129 EUR.")])
    response = _two_tiers(small, strong, line["messages"])
    assert len(small.requests) == 2
    assert len(strong.requests) == 1
    report = report_of(response)
    assert report is not None
    assert report.tier == "strong"
    assert "LH 1234" in response.message["content"]


def test_a_value_the_request_names_and_no_call_covered_gets_its_call() -> None:
    """Recorded: Madrid looked up, the answer about Madrid only; the guard asks for the call for
    Oslo (get_weather pinned, city an enum of ["Oslo"]) and hands that call back."""
    model, response = _run("uncovered_city")
    assert len(model.requests) == 2
    cover = model.requests[1]
    assert cover.tools[0]["function"]["parameters"]["properties"]["city"]["enum"] == ["Oslo"]
    assert "You have not looked up Oslo yet" in cover.messages[-1]["content"]
    assert _calls(response) == [("get_weather", {"city": "Oslo"})]


def test_no_call_is_asked_for_once_the_answer_was_asked_for_from_the_results() -> None:
    """Seen on the real model (``docs_empty`` of the loop-recovery benchmark): the guard asked
    for the answer from the results in hand, tools off, then asked the answer's uncovered value
    back as a pinned call; the pinned calls came back broken and the run ended in
    ToolValidationFailed with its answer in the transcript. On the forcing rung the guard asks
    for no further call: the answer given there is the run's answer."""
    line = CASES["uncovered_city"]
    empty = {
        "content": "",
        "tool_calls": None,
        "finish_reason": "stop",
        "usage": line["answers"][0]["usage"],
    }
    model, response = _run("uncovered_city", answers=[empty, line["answers"][0]])
    assert len(model.requests) == 2
    assert model.requests[1].params["tool_choice"] == "none"
    assert response.message["content"] == line["answers"][0]["content"]
    assert not response.message.get("tool_calls")


def test_a_tool_the_request_asks_for_and_no_call_made_gets_its_call() -> None:
    """Recorded: weather looked up, no flight search; the guard pins search_flights, the model
    writes Cairo to Nairobi (the prompt's example), the choices mend it to London to Paris."""
    model, response = _run("uncovered_tool")
    assert len(model.requests) == 3
    assert model.requests[1].params["tool_choice"]["function"]["name"] == "search_flights"
    assert _calls(response) == [("search_flights", {"origin": "London", "destination": "Paris"})]


def test_an_empty_answer_after_the_results_is_asked_for_from_them() -> None:
    """Recorded: an empty message right after two weather results; the recovery turn restates
    the request and both results, tools off. The answer that comes back ("The weather in Madrid
    is sunny.") leaves Oslo's out: on one tier the results in hand are the answer."""
    model, response = _run("empty_after_results")
    assert len(model.requests) == 2
    assert model.requests[1].params["tool_choice"] == "none"
    assert "Madrid" in model.requests[1].messages[-1]["content"]
    content = response.message["content"]
    assert content.startswith("The results in hand:")
    assert '"condition": "sunny"' in content
    assert '"condition": "snow"' in content


def test_a_cut_off_text_with_no_call_is_reasked_for_the_call() -> None:
    """Recorded: a runaway made-up file text (finish_reason length) for "What does notes.txt
    say?"; re-asked (narrowed to the tool the request names), it ends as read_file(notes.txt)."""
    model, response = _run("cut_off_text")
    assert len(model.requests) == 3
    assert model.requests[1].tools[0]["function"]["name"] == "read_file"
    assert _calls(response) == [("read_file", {"path": "notes.txt"})]


def _props(request: ModelRequest) -> dict[str, Any]:
    (tool,) = request.tools
    props: dict[str, Any] = tool["function"]["parameters"]["properties"]
    return props


@pytest.mark.parametrize(
    ("case", "tool", "choices", "right"),
    [
        (
            "owed_choices_airport",
            "search_flights",
            {"origin": ["London", "Paris"], "destination": ["Paris"]},
            {"origin": "London", "destination": "Paris"},
        ),
        ("owed_choices_file", "read_file", {"path": ["todo.txt"]}, {"path": "todo.txt"}),
    ],
)
def test_a_value_from_nowhere_after_the_plain_reasks_still_gets_its_choices(
    case: str, tool: str, choices: dict[str, list[str]], right: dict[str, str]
) -> None:
    """Recorded (SmolLM2-135M, its own chat template): a made-up tool name takes the three
    plain re-asks (max_retries), and the pinned call that comes back holds a value from nowhere
    (LHR for London, file_to_do.txt for todo.txt). The choices re-ask is owed past
    max_retries: the request's values are offered, and the model writes the right call."""
    model, response = _run(case)
    assert len(model.requests) == 5  # the first answer, three re-asks, the owed choices
    pinned, owed = model.requests[3], model.requests[4]
    assert all("enum" not in p for p in _props(pinned).values())
    assert owed.params["tool_choice"] == {"type": "function", "function": {"name": tool}}
    assert {k: p["enum"] for k, p in _props(owed).items() if "enum" in p} == choices
    assert _calls(response) == [(tool, right)]
    assert any(
        "re-asked with the request's values as the choices" in w for w in _warnings(response)
    )


def test_the_owed_choices_are_asked_once_then_the_call_is_kept() -> None:
    """A model that writes the value from nowhere again after its choices (a server without
    grammar-constrained calls may): nothing more is owed, the call is kept with a warning —
    one request more than max_retries, never an exception."""
    answers = CASES["owed_choices_airport"]["answers"]
    model, response = _run("owed_choices_airport", answers=[*answers[:4], answers[3]])
    assert len(model.requests) == 5
    assert _calls(response) == [("search_flights", {"origin": "LHR", "destination": "Paris"})]
    assert any(w.startswith("kept a call with values") for w in _warnings(response))


def test_the_choices_hold_the_values_taken_from_the_request_and_the_numbers() -> None:
    """Recorded ("How much is 50 EUR in JPY?"): the pinned call writes JPY to USD; the choices
    narrow to_currency and from_currency (it took one of the request's values) in the request's
    order; the answer then gets the currencies right and the amount wrong (10, a number the
    request never states); the amount's own choices (owed, past max_retries) mend it."""
    model, response = _run("choices_free_the_others")
    assert len(model.requests) == 5
    first, second = _props(model.requests[3]), _props(model.requests[4])
    assert (first["from_currency"]["enum"], first["to_currency"]["enum"]) == (
        ["EUR", "JPY"],
        ["JPY"],
    )
    assert "enum" not in first["amount"]
    assert second["amount"]["enum"] == [50]
    assert second["to_currency"]["enum"] == ["JPY"]
    assert _calls(response) == [
        ("convert_currency", {"amount": 50, "from_currency": "EUR", "to_currency": "JPY"})
    ]


@pytest.mark.parametrize(
    "case", ["owed_choices_airport", "owed_choices_file", "choices_free_the_others"]
)
def test_without_the_profile_nothing_is_owed(case: str) -> None:
    """Default configuration: no grounding, so the pinned call is the answer (four requests)."""
    model, _ = _run(case, profile=False)
    assert len(model.requests) <= 4


@pytest.mark.parametrize(
    ("case", "tool", "right"),
    [
        ("fc_debris_weather", "get_weather", {"city": "Madrid"}),
        ("fc_debris_time", "get_time", {"city": "Sydney"}),
    ],
)
def test_markup_debris_as_a_value_is_asked_again_with_the_request_values(
    case: str, tool: str, right: dict[str, str]
) -> None:
    """Recorded (SmolLM2-135M, llama.cpp's grammar function-calling mode): empty answers, then
    the pinned tool's call with debris of the wire as its city (``./data.jsonp?key=1&#34;name
    &#34;: ...``: too long to be checked as a looked-up value, but its HTML character
    references are in no text of the request). It is re-asked with the request's values as the
    choices, and the model writes the right call."""
    model, response = _run(case)
    assert len(model.requests) == len(CASES[case]["answers"])
    debris = [
        c["function"]["arguments"]
        for a in CASES[case]["answers"]
        for c in a["tool_calls"] or ()
        if "&#34;" in c["function"]["arguments"]
    ]
    assert debris  # the recording holds the debris
    assert _calls(response) == [(tool, right)]
    assert any(
        "re-asked with the request's values as the choices" in w for w in _warnings(response)
    )


def test_an_empty_answer_naming_no_tool_asks_the_model_which_tool_on_one_tier() -> None:
    """Recorded (SmolLM2-135M, llama.cpp's grammar function-calling mode): "Is it raining in
    Tokyo?" shares no word with any tool, and the model answers with nothing twice. On one tier
    the guard asks which tool the request needs through its chooser (pinned, the tool names an
    enum), pins the tool chosen, and the model writes the call (after the choices re-ask for a
    made-up city)."""
    model, response = _run("fc_asked_rain")
    assert len(model.requests) == len(CASES["fc_asked_rain"]["answers"]) == 5
    asked = model.requests[2]
    assert asked.params["tool_choice"] == {"type": "function", "function": {"name": CHOOSE_TOOL}}
    (chooser,) = asked.tools
    names = [t["function"]["name"] for t in agenttasks.TOOLS]
    assert chooser["function"]["parameters"]["properties"]["tool"]["enum"] == names
    assert model.requests[3].params["tool_choice"]["function"]["name"] == "get_weather"
    assert _calls(response) == [("get_weather", {"city": "Tokyo"})]
    assert "asked which tool the request needs: get_weather" in _warnings(response)


def test_with_a_tier_above_the_model_is_not_asked_which_tool() -> None:
    """The same empty answers with a stronger tier behind: it answers, rather than the small
    model's guess."""
    answers = CASES["fc_asked_rain"]["answers"]
    small = ScriptedModel([_reply(a) for a in answers[:2]])
    strong = ScriptedModel([Reply.call("get_weather", {"city": "Tokyo"})])
    response = _two_tiers(small, strong, CASES["fc_asked_rain"]["messages"])
    assert len(small.requests) == 2
    assert all(CHOOSE_TOOL not in json.dumps(r.tools) for r in small.requests)
    assert len(strong.requests) == 1
    assert _calls(response) == [("get_weather", {"city": "Tokyo"})]


#: Recorded (SmolLM2-135M, llama.cpp's grammar function-calling mode, the loop task
#: ``ticket_open`` with the profile): the fourth lookup of a ticket, whose id string runs on into
#: made-up arguments and a Python snippet. By default the made-up arguments are re-asked, and the
#: re-asks ran away (1,401 completion tokens against a cap of 160: the turn cost 5,272 tokens).
INVENTED = json.loads(
    (Path(__file__).parent / "data" / "smollm2_invented_arguments.json").read_text("utf-8")
)


def _ticket(tool_validation: dict[str, Any]) -> tuple[ScriptedModel, ModelResponse]:
    fixed = Reply.call("get_ticket", {"ticket_id": "552"})
    model = ScriptedModel([*(_reply(a) for a in INVENTED["answers"]), fixed])
    clock = FakeClock()
    config = GuardConfig.from_dict({**ONE_TIER, "tool_validation": tool_validation}, env={})
    guard = Guard(model, config, clock=clock, sleep=clock.sleep, rng=random.Random(0))
    sent = INVENTED["request"]
    params = {k: v for k, v in sent.items() if k != "messages"}
    return model, guard.complete(ModelRequest("smollm2", sent["messages"], params))


def test_made_up_arguments_beside_real_ones_are_dropped_with_the_profile() -> None:
    """The profile drops what the tool does not take (``unexpected_arguments: drop``): the call
    goes on with the argument it does take, the drops reported, and nothing is re-asked."""
    model, response = _ticket(SMALL_MODEL_PROFILE)
    assert len(model.requests) == 1
    assert _calls(response) == [("get_ticket", {"ticket_id": "123.456"})]
    report = report_of(response)
    assert report is not None
    dropped = [r for r in report.repairs if r.startswith("dropped_argument")]
    assert dropped == [
        "dropped_argument at $.ticket_type: 'Foo' -> '(removed)'",
        "dropped_argument at $.ticket_status: 'pending' -> '(removed)'",
    ]


def test_by_default_made_up_arguments_are_re_asked() -> None:
    """Without the profile the same answer is a failed call: corrected, naming the arguments."""
    model, response = _ticket({})
    assert len(model.requests) == 2
    correction = json.dumps(model.requests[1].messages[-1])
    assert "takes no argument 'ticket_type'" in correction
    assert _calls(response) == [("get_ticket", {"ticket_id": "552"})]
