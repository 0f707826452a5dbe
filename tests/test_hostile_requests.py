"""Hostile battery: request-side bad input through the guarded openai client.

Property: whatever the raw client does with a request (sends it, or raises its own error), the
guarded client answers or raises an ``AgentGuardError`` or that same SDK exception; a request
the guard cannot read never switches the guard off, and no choice of an ``n > 1`` answer is lost.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _hostile import (
    MESSAGES,
    TOOLS,
    Outcome,
    RawUpstream,
    assert_typed,
    call,
    cases,
    completion,
    encode,
    guarded_client,
    hostile_request,
    hostile_text,
    outcome,
    raw_client,
)

JSON = "application/json"
ANSWER = encode(completion())


def _both(kwargs: dict[str, Any], body: bytes = ANSWER) -> tuple[Outcome, Outcome]:
    raw = raw_client(RawUpstream([(200, JSON, body)]))
    guarded = guarded_client(RawUpstream([(200, JSON, body)]))
    return (
        outcome(lambda: raw.chat.completions.create(**kwargs)),
        outcome(lambda: guarded.chat.completions.create(**kwargs)),
    )


sane_requests = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["fast", "small", "unknown-model"]),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "assistant"]), "content": hostile_text}
            ),
            min_size=1,
            max_size=3,
        ),
    },
    optional={
        "max_tokens": st.integers(0, 10**6),
        "temperature": st.floats(0, 2),
        "n": st.integers(1, 3),
        "tools": st.just(TOOLS),
        "stop": st.one_of(st.none(), hostile_text),
    },
)


@cases(300)
@given(kwargs=sane_requests)
def test_well_formed_requests_end_in_an_answer_or_a_typed_error(kwargs: dict[str, Any]) -> None:
    """Well-typed requests with odd values (empty, surrogate, RTL text; unknown models)."""
    raw, guarded = _both(kwargs)
    assert_typed(guarded, raw)


@cases(300)
@given(kwargs=hostile_request)
def test_any_request_ends_in_an_answer_or_a_typed_error(kwargs: dict[str, Any]) -> None:
    """Any request (missing fields, wrong types, absurd numbers)."""
    raw, guarded = _both(kwargs)
    assert_typed(guarded, raw)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"model": "fast", "messages": "text"}, id="messages-a-string"),
        pytest.param({"model": "fast", "messages": [None]}, id="messages-[null]"),
        pytest.param({"model": "fast", "messages": {"role": "user"}}, id="messages-an-object"),
        pytest.param({"messages": MESSAGES}, id="no-model"),
        pytest.param({"model": "fast"}, id="no-messages"),
        pytest.param({"model": None, "messages": MESSAGES}, id="model-null"),
        pytest.param({"model": "fast", "messages": [{"content": "x"}]}, id="message-no-role"),
        pytest.param({"model": "fast", "messages": MESSAGES, "tools": "x"}, id="tools-a-string"),
        pytest.param({"model": "fast", "messages": MESSAGES, "tools": [None]}, id="tools-[null]"),
        pytest.param({"model": "fast", "messages": MESSAGES, "max_tokens": 10**20}, id="max-1e20"),
        pytest.param(
            {"model": "fast", "messages": MESSAGES, "temperature": float("nan")}, id="temp-nan"
        ),
        pytest.param(
            {"model": "fast", "messages": [{"role": "user", "content": "\ud800"}]},
            id="lone-surrogate",
        ),
    ],
)
def test_bad_requests(kwargs: dict[str, Any]) -> None:
    """Each bad request: what the raw client does, or a typed error."""
    raw, guarded = _both(kwargs)
    assert_typed(guarded, raw)


def test_every_choice_of_an_n3_answer_comes_back() -> None:
    """Three choices, the first repaired (Python-style JSON): three choices come back."""
    body = completion()
    body["choices"] = [
        {
            "index": i,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("read_file", "{'path': 'a',}" if i == 0 else '{"path": "b"}')],
            },
            "finish_reason": "tool_calls",
        }
        for i in range(3)
    ]
    raw, guarded = _both(
        {"model": "fast", "messages": MESSAGES, "tools": TOOLS, "n": 3}, encode(body)
    )
    assert raw.error is None, raw
    assert guarded.error is None, guarded
    assert len(guarded.value.choices) == len(raw.value.choices) == 3
