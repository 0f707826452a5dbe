"""Hostile battery: tool-call arguments and assistant messages, for the validator, the loop
detector and the guarded client.

Properties: a verdict for every input (never an untyped exception), ``ok`` only for calls that
really satisfy their schema, an invalid call gets a correction however deep or large it is, and
the work done grows linearly with the number of calls and arguments.
"""

from __future__ import annotations

import json
import logging
import random
import reprlib
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentguard as ag
from _hostile import (
    DEEP,
    MESSAGES,
    TOOL_SCHEMA,
    TOOLS,
    RawUpstream,
    assert_linear,
    assert_only,
    bulk,
    call,
    cases,
    completion,
    deep_json,
    dumps,
    encode,
    guarded_client,
    hostile_json,
    hostile_message,
    hostile_text,
    nested,
    outcome,
    rand_arguments_text,
    rand_json,
    rand_message,
    rand_scalar,
    sane_arguments,
    seeds,
)

VALIDATOR = ag.ToolCallValidator(TOOLS)
JSON = "application/json"
argument_texts = st.one_of(sane_arguments, hostile_text, st.builds(dumps, hostile_json))
names = st.one_of(st.sampled_from(["read_file", "read_fil", "Read_File", "wipe"]), hostile_text)


def _message(*calls: Any, content: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def _assert_ok_means_valid(report: Any) -> None:
    if report.ok:
        for tool_call in report.tool_calls:
            assert tool_call.name == "read_file"
            jsonschema.validate(json.loads(tool_call.arguments), TOOL_SCHEMA)


# -- the validator ------------------------------------------------------------------------------


@cases(600)
@given(name=names, arguments=argument_texts)
def test_any_arguments_text_gets_a_verdict_and_ok_means_valid(name: str, arguments: str) -> None:
    """Any name and argument text: a report, never an exception; ``ok`` only for valid calls."""
    report = VALIDATOR.validate(_message(call(name, arguments)), "tool_calls")
    _assert_ok_means_valid(report)


@cases(300)
@given(arguments=hostile_json)
def test_arguments_given_as_objects_get_a_verdict(arguments: Any) -> None:
    """Arguments already decoded (any JSON value): a report, never an exception."""
    report = VALIDATOR.validate(_message(call("read_file", arguments)))
    _assert_ok_means_valid(report)


sane_messages = st.fixed_dictionaries(
    {"role": st.just("assistant")},
    optional={
        "content": st.one_of(st.none(), hostile_text, hostile_json),
        "tool_calls": st.one_of(
            st.none(),
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "id": st.one_of(st.none(), hostile_text),
                        "type": st.sampled_from(["function", "custom", ""]),
                        "function": st.one_of(
                            st.none(),
                            st.fixed_dictionaries(
                                {}, optional={"name": hostile_json, "arguments": hostile_json}
                            ),
                        ),
                    },
                ),
                max_size=3,
            ),
        ),
    },
)


@cases(300)
@given(message=sane_messages)
def test_any_message_with_a_list_of_calls_gets_a_verdict(message: dict[str, Any]) -> None:
    """Messages whose ``tool_calls`` is a list of objects, any field any JSON: a report."""
    VALIDATOR.validate(message)


@cases(300)
@given(seed=seeds)
def test_bulk_argument_texts_get_a_verdict_and_ok_means_valid(seed: int) -> None:
    """60 generated calls per seed (18,000 in all): a report each, ``ok`` only when valid."""

    def make(rng: random.Random) -> dict[str, Any]:
        name = rng.choice(["read_file", "read_fil", "wipe", str(rand_scalar(rng))])
        return _message(call(name, rand_arguments_text(rng)))

    bulk(seed, 60, make, lambda m: _assert_ok_means_valid(VALIDATOR.validate(m, "tool_calls")))


@cases(200)
@given(seed=seeds)
def test_bulk_well_shaped_messages_get_a_verdict(seed: int) -> None:
    """50 generated messages per seed (10,000 in all), ``tool_calls`` a list of objects."""
    bulk(seed, 50, rand_message, VALIDATOR.validate)


@cases(300, shrink=False)
@given(message=hostile_message.filter(lambda m: isinstance(m, dict)))
def test_any_message_object_gets_a_verdict(message: dict[str, Any]) -> None:
    """Any message object (a dict), malformed ones included: a report or a typed error."""
    try:
        VALIDATOR.validate(message)
    except Exception as exc:
        assert_only(exc)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(
            _message(call("read_file", deep_json(DEEP))),
            id="arguments-nested-deep",
        ),
        pytest.param(
            _message(call("read_file", '{"path": ' + deep_json(DEEP, "dict") + "}")),
            id="argument-value-nested-deep",
        ),
        pytest.param(
            _message(call("read_file", '{"n": ' + "9" * 5_000 + "}")),
            id="argument-a-5000-digit-number",
        ),
        pytest.param(
            _message(call("read_file", {"path": nested(DEEP, "a", "dict")})),
            id="decoded-arguments-deep",
        ),
        pytest.param(
            {"role": "assistant", "tool_calls": "read_file"},
            id="tool-calls-a-string",
        ),
        pytest.param(
            {"role": "assistant", "tool_calls": [None]},
            id="tool-calls-[null]",
        ),
        pytest.param(_message(call("read_file", '{"n": ' + "9" * 4_300 + "}")), id="4300-digits"),
        pytest.param(_message(call("read_file", deep_json(100))), id="arguments-100-deep"),
    ],
)
def test_hostile_arguments_are_invalid_not_a_crash(message: dict[str, Any]) -> None:
    """Each input: ``validate`` returns a report saying the call is invalid."""
    report = VALIDATOR.validate(message)
    assert not report.ok


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(
            '{"path": "\\ud83d\\ude00"',
            id="escaped-pair-unclosed",
        ),
        pytest.param(
            "{'path': '\\ud83d\\ude00',}",
            id="escaped-pair-python-style",
        ),
        pytest.param('{"path": "\\ud83d\\ude00"}', id="escaped-pair-valid"),
        pytest.param('{"path": "\U0001f600"}', id="emoji-as-is"),
    ],
)
def test_repaired_arguments_keep_their_text(arguments: str) -> None:
    """Whatever repair does, the path is the emoji the model wrote, encodable as UTF-8."""
    report = VALIDATOR.validate(_message(call("read_file", arguments)))
    assert report.ok
    text = report.tool_calls[0].arguments
    text.encode("utf-8")
    assert json.loads(text) == {"path": "\U0001f600"}


# -- the guarded client: the invalid call gets a correction ------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(
            deep_json(DEEP),
            id="nested-deep",
        ),
        pytest.param(
            '{"path": ' + deep_json(DEEP, "dict") + "}",
            id="value-nested-deep",
        ),
        pytest.param(
            '{"n": ' + "9" * 5_000 + "}",
            id="5000-digit-number",
        ),
        pytest.param('{"n": ' + "9" * 4_000 + "}", id="4000-digit-number"),
        pytest.param('{"path": ' + deep_json(500) + "}", id="value-nested-500-deep"),
    ],
)
def test_an_invalid_call_gets_a_correction_however_deep_or_large(arguments: str) -> None:
    """The upstream answers an invalid call, then a valid one: the agent sees the valid one."""
    bad = encode(
        completion(content=None, finish="tool_calls", tool_calls=[call("read_file", arguments)])
    )
    good = encode(completion(content=None, finish="tool_calls", tool_calls=[call()]))
    upstream = RawUpstream([(200, JSON, bad), (200, JSON, good)])
    client = guarded_client(upstream)
    got = outcome(
        lambda: client.chat.completions.create(model="fast", messages=MESSAGES, tools=TOOLS)
    )
    assert got.error is None, got
    assert len(upstream.requests) == 2
    assert json.loads(got.value.choices[0].message.tool_calls[0].function.arguments) == {
        "path": "a"
    }


# -- bounded work -------------------------------------------------------------------------------


def _many_invalid(n: int) -> None:
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "wipe", "arguments": "{}"}}
        for i in range(n)
    ]
    VALIDATOR.validate(_message(*calls)).corrective_messages()


def test_the_correction_for_many_invalid_calls_is_linear() -> None:
    """n invalid calls in one answer: validating and building the correction is O(n)."""
    assert_linear(_many_invalid, 200)


def test_validating_many_calls_is_linear() -> None:
    """n calls (valid and invalid) in one answer: the verdict alone is O(n)."""

    def run(n: int) -> None:
        VALIDATOR.validate(_message(*[call("read_file", '{"path": "a", "x": 1}')] * n))

    assert_linear(run, 200)


def _warnings_for(unknown: int, caplog: pytest.LogCaptureFixture) -> int:
    arguments = json.dumps({f"extra_{i}": i for i in range(unknown)})
    bad = encode(
        completion(content=None, finish="tool_calls", tool_calls=[call("read_file", arguments)])
    )
    client = guarded_client(RawUpstream([(200, JSON, bad)]))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentguard"):
        outcome(
            lambda: client.chat.completions.create(model="fast", messages=MESSAGES, tools=TOOLS)
        )
    return sum(1 for r in caplog.records if r.levelno >= logging.WARNING)


def test_warnings_do_not_grow_with_the_number_of_unknown_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call with 100 unknown arguments logs no more warnings than one with 2."""
    few, many = _warnings_for(2, caplog), _warnings_for(100, caplog)
    assert many <= few, f"{few} warnings for 2 unknown arguments, {many} for 100"


# -- the loop detector --------------------------------------------------------------------------

detector_messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["assistant", "user", "tool", "system"])},
    optional={
        "content": st.one_of(hostile_text, hostile_json),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "id": hostile_text,
                    "function": st.one_of(
                        st.none(),
                        st.fixed_dictionaries(
                            {}, optional={"name": hostile_json, "arguments": hostile_json}
                        ),
                    ),
                },
            ),
            max_size=3,
        ),
        "tool_call_id": hostile_text,
        "name": hostile_text,
    },
)


@cases(300)
@given(messages=st.lists(detector_messages, min_size=1, max_size=4))
def test_the_loop_detector_observes_any_well_shaped_transcript(messages: list[Any]) -> None:
    """Message objects whose ``tool_calls`` is a list of objects: verdicts, never a crash."""
    detector = ag.LoopDetector()
    for message in messages:
        for verdict in detector.observe(message):
            assert isinstance(verdict, ag.Verdict)


@cases(300)
@given(name=hostile_text, arguments=hostile_json)
def test_the_loop_detector_fingerprints_any_json_arguments(name: str, arguments: Any) -> None:
    """``check_tool_call`` on any name and JSON value, twice: the same call is the same call."""
    detector = ag.LoopDetector()
    detector.check_tool_call(name, arguments)
    detector.check_tool_call(name, arguments)


@cases(300)
@given(seed=seeds)
def test_bulk_transcripts_through_the_loop_detector(seed: int) -> None:
    """60 generated well-shaped messages per seed (18,000 in all), each transcript observed."""
    detector = ag.LoopDetector()
    bulk(seed, 60, rand_message, detector.observe)


@cases(400)
@given(seed=seeds)
def test_bulk_arguments_through_the_fingerprint(seed: int) -> None:
    """100 generated argument values per seed (40,000 in all): the same call twice is seen."""
    detector = ag.LoopDetector()

    def check(arguments: Any) -> None:
        detector.check_tool_call("read_file", arguments)
        detector.check_tool_call("read_file", arguments)

    bulk(seed, 100, lambda rng: rand_json(rng, 4), check)


@cases(300, shrink=False)
@given(message=hostile_message)
def test_the_loop_detector_observes_any_message(message: Any) -> None:
    """Any value as a message: verdicts or a typed error."""
    try:
        ag.LoopDetector().observe(message)
    except Exception as exc:
        assert_only(exc)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(None, id="null"),
        pytest.param("text", id="a-string"),
        pytest.param(
            {"role": "assistant", "tool_calls": "x"},
            id="tool-calls-a-string",
        ),
        pytest.param(
            {"role": "assistant", "tool_calls": [None]},
            id="tool-calls-[null]",
        ),
        pytest.param(
            _message({"function": {"name": "a", "arguments": nested(DEEP, 1, "dict")}}),
            id="arguments-deep",
        ),
        pytest.param({"role": None}, id="role-null"),
        pytest.param(_message({"function": None}), id="function-null"),
    ],
)
def test_the_loop_detector_survives_malformed_messages(message: Any) -> None:
    """Each malformed message: verdicts or a typed error, never AttributeError/RecursionError."""
    try:
        ag.LoopDetector().observe(message)
    except Exception as exc:
        assert_only(exc)


def test_the_loop_detector_fingerprints_deep_arguments() -> None:
    """Arguments nested 100,000 levels: a verdict, never a RecursionError."""
    ag.LoopDetector().check_tool_call("t", nested(DEEP, 1, "dict"))


def test_reprlib_keeps_failures_readable() -> None:
    """The battery's own messages stay printable on deep values (a guard for the harness)."""
    assert len(reprlib.repr(nested(2_000))) < 100
