"""The sans-I/O engine: one plan, carried out by the sync and the async drivers alike."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agentguard._engine import (
    END,
    Ask,
    Call,
    Emit,
    Open,
    Plan,
    Pull,
    Send,
    Sleep,
    acall,
    arun,
    astream,
    call,
    perform,
    run,
    stream,
)
from agentguard.escalation import Choice, EscalationPrompt, Tier
from agentguard.testing import FakeClock
from agentguard.transport import ModelRequest, ModelResponse, StreamChunk

TIER = Tier("fast", "m")
REQ = ModelRequest(model="m", messages=[])
PROMPT = EscalationPrompt("timeout", "slow", TIER, None, (Choice.RETRY, Choice.CANCEL))


def _retrying_plan(log: list[str]) -> Plan[str]:
    """Fails once, sleeps, asks, then succeeds: exercises every non-stream action."""
    try:
        yield Send(TIER, REQ)
    except ConnectionError as exc:
        log.append(f"error: {exc}")
    yield Sleep(1.5)
    choice = yield Ask(PROMPT)
    log.append(f"choice: {choice.value}")
    response = yield Send(TIER, REQ)
    return str(response.message["content"])


class _Model:
    def __init__(self) -> None:
        self.calls = 0

    def send(self, action: Send) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("reset")
        return ModelResponse({"role": "assistant", "content": f"ok from {action.tier.name}"})

    async def asend(self, action: Send) -> ModelResponse:
        return self.send(action)


def _handlers(send: Any, sleep: Any, ask: Any) -> dict[type, Any]:
    return {Send: send, Sleep: lambda a: sleep(a.seconds), Ask: lambda a: ask(a.prompt)}


def test_sync_driver_runs_every_action() -> None:
    """Errors are thrown into the plan, sleeps and questions are carried out in order."""
    log: list[str] = []
    clock = FakeClock(0)
    handlers = _handlers(_Model().send, clock.sleep, lambda p: Choice.RETRY)
    result = run(_retrying_plan(log), handlers)
    assert result == "ok from fast"
    assert log == ["error: reset", "choice: retry"]
    assert clock.sleeps == [1.5]


@pytest.mark.anyio
async def test_async_driver_runs_the_same_plan() -> None:
    """The async driver gives the same result; sync and async ask callbacks both work."""

    async def ask(prompt: EscalationPrompt) -> Choice:
        return Choice.RETRY

    for answer in (ask, lambda p: Choice.RETRY):
        log: list[str] = []
        clock = FakeClock(0)
        result = await arun(_retrying_plan(log), _handlers(_Model().asend, clock.asleep, answer))
        assert result == "ok from fast"
        assert log == ["error: reset", "choice: retry"]


def test_unhandled_error_propagates_from_the_plan() -> None:
    """An error the plan does not handle reaches the caller unchanged."""

    def plan() -> Plan[None]:
        yield Send(TIER, REQ)

    def fail(action: Send) -> ModelResponse:
        raise TimeoutError("slow")

    with pytest.raises(TimeoutError, match="slow"):
        run(plan(), {Send: fail})


def test_plan_cleanup_runs_when_the_call_fails() -> None:
    """A plan's finally block runs when an error passes through it (reservations released)."""
    cleaned: list[bool] = []

    def plan() -> Plan[None]:
        try:
            yield Send(TIER, REQ)
        finally:
            cleaned.append(True)

    def fail(action: Send) -> ModelResponse:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(plan(), {Send: fail})
    assert cleaned == [True]


def _echo_stream_plan() -> Plan[None]:
    yield Open(TIER, REQ)
    while True:
        chunk = yield Pull()
        if chunk is END:
            break
        yield Emit((chunk.content or "").upper())
    yield Emit("<done>")


def _chunks(action: Open) -> Iterator[StreamChunk]:
    yield StreamChunk(content="ab")
    yield StreamChunk(content="cd")


async def _achunks(action: Open) -> AsyncIterator[StreamChunk]:
    for chunk in _chunks(action):
        yield chunk


def test_sync_stream_driver() -> None:
    """Pulled chunks go through the plan and come out as emitted."""
    out = list(stream(_echo_stream_plan(), {}, open=_chunks))
    assert out == ["AB", "CD", "<done>"]


@pytest.mark.anyio
async def test_async_stream_driver() -> None:
    """The async stream driver emits the same as the sync one."""
    out = [c async for c in astream(_echo_stream_plan(), {}, open=_achunks)]
    assert out == ["AB", "CD", "<done>"]


def test_closing_a_stream_early_closes_plan_and_upstream() -> None:
    """A caller that stops reading closes the upstream stream and the plan."""
    closed: list[str] = []

    def upstream(action: Open) -> Iterator[StreamChunk]:
        try:
            while True:
                yield StreamChunk(content="x")
        finally:
            closed.append("upstream")

    def plan() -> Plan[None]:
        try:
            yield from _echo_stream_plan()
        finally:
            closed.append("plan")

    out = stream(plan(), {}, open=upstream)
    assert next(out) == "X"
    out.close()
    assert sorted(closed) == ["plan", "upstream"]


def test_actions_without_a_handler_are_rejected() -> None:
    """A plan that emits in a non-streaming run is a programming error, surfaced as such."""

    def plan() -> Plan[Any]:
        yield Emit("x")

    with pytest.raises(TypeError, match="no handler"):
        run(plan(), {Send: _Model().send})


def test_stream_returns_the_plan_result() -> None:
    """The sync stream driver's return value is the plan's result."""

    def plan() -> Plan[str]:
        yield Emit(1)
        return "report"

    gen = stream(plan(), {}, open=_chunks)
    assert next(gen) == 1
    with pytest.raises(StopIteration) as info:
        next(gen)
    assert info.value.value == "report"


@pytest.mark.anyio
async def test_async_stream_hands_the_result_to_done() -> None:
    """An async generator cannot return: the plan's result goes to done()."""
    results: list[str] = []

    def plan() -> Plan[str]:
        yield Emit(1)
        return "report"

    out = [c async for c in astream(plan(), {}, open=_achunks, done=results.append)]
    assert out == [1]
    assert results == ["report"]


class _Counter:
    """A component with a sync method and its async twin, as the ledger and the stores have."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def add(self, a: int, b: int = 0, *, scale: int = 1) -> int:
        self.calls.append("sync")
        return (a + b) * scale

    async def aadd(self, a: int, b: int = 0, *, scale: int = 1) -> int:
        self.calls.append("async")
        return (a + b) * scale


def _counting_plan(counter: _Counter) -> Plan[int]:
    total = yield from perform(counter.add, counter.aadd, 1, 2, scale=10)
    try:
        yield from perform(counter.add, counter.aadd, "x")  # a str: TypeError inside add()
    except TypeError:
        total += 1
    return total


def test_call_runs_the_sync_callable_in_the_sync_driver() -> None:
    """A Call's sync callable runs with its arguments; its errors are thrown into the plan."""
    counter = _Counter()
    assert run(_counting_plan(counter), {Call: call}) == 31
    assert counter.calls == ["sync", "sync"]


@pytest.mark.anyio
async def test_call_awaits_the_async_callable_in_the_async_driver() -> None:
    """The async driver awaits the Call's async twin, same arguments, same result."""
    counter = _Counter()
    assert await arun(_counting_plan(counter), {Call: acall}) == 31
    assert counter.calls == ["async", "async"]


def test_a_call_names_its_callables_not_a_method_string() -> None:
    """The action holds the bound methods themselves, so a reader can follow it to the code."""
    counter = _Counter()
    plan = perform(counter.add, counter.aadd, 1, scale=2)
    action = next(plan)
    assert action == Call(counter.add, counter.aadd, (1,), {"scale": 2})
