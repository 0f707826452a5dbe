"""Hostile battery: ``ToolGuard.call`` with hostile arguments and results.

Properties: ``call`` never raises for what the model sent or what the tool returned (the outcome
carries the error); a tool that has run is never followed by an exception that hides its result;
``outcome.content`` is always text; a caller-supplied idempotency key is honoured.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentguard as ag
from _hostile import (
    DEEP,
    bulk,
    cases,
    deep_json,
    finishes,
    hostile_json,
    hostile_text,
    nested,
    rand_json,
    seeds,
)
from agentguard.testing import FakeClock

CONFIG = ag.GuardConfig.from_dict(
    {"tools": {"sync_timeouts": False, "retry": {"max_attempts": 1}}}, env={}
)


def _tools() -> ag.ToolGuard:
    clock = FakeClock()
    return ag.ToolGuard(CONFIG, clock=clock, sleep=clock.sleep, asleep=clock.asleep, hooks=())


class _Echo:
    """A registered tool returning ``result``; records how often it ran."""

    def __init__(self, tools: ag.ToolGuard, result: Any = "ok") -> None:
        self.result = result
        self.ran = 0
        tools.register(self.__call__, name="echo")

    def __call__(self, **arguments: Any) -> Any:
        self.ran += 1
        return self.result


def _assert_outcome(outcome: Any) -> None:
    assert isinstance(outcome, ag.ToolOutcome)
    assert isinstance(outcome.content, str)


def _call(arguments: Any, result: Any = "ok") -> tuple[Any, int]:
    tools = _tools()
    echo = _Echo(tools, result)
    outcome = finishes(lambda: tools.call("echo", arguments))
    _assert_outcome(outcome)
    return outcome, echo.ran


@cases(400)
@given(
    arguments=st.one_of(
        st.dictionaries(hostile_text, hostile_json, max_size=4), hostile_text, st.none()
    ),
    result=hostile_json,
)
def test_any_json_arguments_and_results_give_an_outcome(arguments: Any, result: Any) -> None:
    """JSON-shaped arguments (a dict or a text) and any JSON result: an outcome with text."""
    _call(arguments, result)


@cases(200)
@given(seed=seeds)
def test_bulk_calls_give_an_outcome(seed: int) -> None:
    """20 generated calls per seed (4,000 in all), arguments and results any JSON value."""

    def make(rng: random.Random) -> tuple[Any, Any]:
        arguments = {str(k): rand_json(rng, 3) for k in range(rng.randint(0, 3))}
        return arguments, rand_json(rng, 3)

    bulk(seed, 20, make, lambda case: _call(*case))


def _cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(
            {"x": nested(DEEP, 1, "dict")},
            id="nested-deep",
        ),
        pytest.param(
            {"x": 10**5_000},
            id="5000-digit-int",
        ),
        pytest.param(
            _cyclic(),
            id="cyclic",
        ),
        pytest.param(
            {b"x": 1},
            id="bytes-key",
        ),
        pytest.param(
            '{"x": ' + deep_json(DEEP) + "}",
            id="text-nested-deep",
        ),
        pytest.param({"x": float("nan")}, id="nan"),
        pytest.param({1: 1}, id="int-key"),
        pytest.param("{", id="broken-text"),
        pytest.param("[1]", id="text-a-list"),
    ],
)
def test_hostile_arguments_give_an_outcome(arguments: Any) -> None:
    """Each input: an outcome (an error for the model if the arguments are unusable)."""
    _call(arguments)


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(
            10**5_000,
            id="5000-digit-int",
        ),
        pytest.param(
            _cyclic(),
            id="cyclic",
        ),
        pytest.param(
            nested(DEEP, 1, "dict"),
            id="nested-deep",
        ),
        pytest.param(float("nan"), id="nan"),
        pytest.param(b"\xff", id="bytes"),
        pytest.param(object(), id="object"),
        pytest.param({1, 2}, id="set"),
        pytest.param("\ud800", id="lone-surrogate"),
    ],
)
def test_a_tool_that_ran_is_never_hidden_by_an_exception(result: Any) -> None:
    """The tool ran once and returned: the caller gets that outcome, whatever the value."""
    outcome, ran = _call({"x": 1}, result)
    assert ran == 1
    assert outcome.ok


def test_acall_never_hides_a_result_either() -> None:
    """The async path: a cyclic result, an outcome."""
    tools = _tools()
    echo = _Echo(tools, _cyclic())

    async def main() -> Any:
        return await tools.acall("echo", {"x": 1})

    outcome = finishes(lambda: anyio.run(main))
    _assert_outcome(outcome)
    assert echo.ran == 1


# -- idempotency keys -----------------------------------------------------------------------------


class _Payments:
    def __init__(self, tools: ag.ToolGuard) -> None:
        self.keys: list[str] = []
        tools.register(self.pay, name="pay", side_effecting=True)

    def pay(self, amount: int, idempotency_key: str = "") -> str:
        self.keys.append(idempotency_key)
        return f"paid {amount}"


def test_a_key_in_the_arguments_reaches_the_tool() -> None:
    """The model's (or caller's) ``idempotency_key`` argument is the key the tool receives."""
    tools = _tools()
    payments = _Payments(tools)
    assert tools.call("pay", {"amount": 5, "idempotency_key": "caller-key-1"}).ok
    assert payments.keys == ["caller-key-1"]


def test_a_key_in_the_arguments_reused_with_other_arguments_is_a_conflict() -> None:
    """The same supplied key with different arguments: refused, the tool not run again."""
    tools = _tools()
    payments = _Payments(tools)
    tools.call("pay", {"amount": 5, "idempotency_key": "caller-key-1"})
    second = tools.call("pay", {"amount": 6, "idempotency_key": "caller-key-1"})
    assert not second.ok
    assert len(payments.keys) == 1


def test_a_keyword_key_is_honoured_and_conflicts() -> None:
    """``call(..., idempotency_key=)``: passed to the tool; reused with other arguments, refused."""
    tools = _tools()
    payments = _Payments(tools)
    assert tools.call("pay", {"amount": 5}, idempotency_key="kw-key").ok
    second = tools.call("pay", {"amount": 6}, idempotency_key="kw-key")
    assert payments.keys == ["kw-key"]
    assert second.error is not None
    assert second.error.kind == "idempotency_conflict"


def test_a_keyword_key_replays_the_same_call() -> None:
    """The same key and arguments twice: the tool runs once, the second outcome is replayed."""
    tools = _tools()
    payments = _Payments(tools)
    first = tools.call("pay", {"amount": 5}, idempotency_key="again")
    second = tools.call("pay", {"amount": 5}, idempotency_key="again")
    assert first.ok
    assert second.ok
    assert second.replayed
    assert payments.keys == ["again"]
