"""The sans-I/O engine: one plan, carried out by the sync and the async drivers alike."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agentguard._engine import (
    END,
    Ask,
    Emit,
    Open,
    Plan,
    Pull,
    Send,
    Sleep,
    arun,
    astream,
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

    def send(self, tier: Tier, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("reset")
        return ModelResponse({"role": "assistant", "content": f"ok from {tier.name}"})

    async def asend(self, tier: Tier, request: ModelRequest) -> ModelResponse:
        return self.send(tier, request)


def test_sync_driver_runs_every_action() -> None:
    """Errors are thrown into the plan, sleeps and questions are carried out in order."""
    log: list[str] = []
    clock = FakeClock(0)
    result = run(
        _retrying_plan(log), send=_Model().send, sleep=clock.sleep, ask=lambda p: Choice.RETRY
    )
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
        result = await arun(
            _retrying_plan(log), send=_Model().asend, sleep=clock.asleep, ask=answer
        )
        assert result == "ok from fast"
        assert log == ["error: reset", "choice: retry"]


def test_unhandled_error_propagates_from_the_plan() -> None:
    """An error the plan does not handle reaches the caller unchanged."""

    def plan() -> Plan[None]:
        yield Send(TIER, REQ)

    def fail(tier: Tier, request: ModelRequest) -> ModelResponse:
        raise TimeoutError("slow")

    with pytest.raises(TimeoutError, match="slow"):
        run(plan(), send=fail, sleep=lambda s: None, ask=lambda p: Choice.CANCEL)


def test_plan_cleanup_runs_when_the_call_fails() -> None:
    """A plan's finally block runs when an error passes through it (reservations released)."""
    cleaned: list[bool] = []

    def plan() -> Plan[None]:
        try:
            yield Send(TIER, REQ)
        finally:
            cleaned.append(True)

    def fail(tier: Tier, request: ModelRequest) -> ModelResponse:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(plan(), send=fail, sleep=lambda s: None, ask=lambda p: Choice.CANCEL)
    assert cleaned == [True]


def _echo_stream_plan() -> Plan[None]:
    yield Open(TIER, REQ)
    while True:
        chunk = yield Pull()
        if chunk is END:
            break
        yield Emit((chunk.content or "").upper())
    yield Emit("<done>")


def _chunks(tier: Tier, request: ModelRequest) -> Iterator[StreamChunk]:
    yield StreamChunk(content="ab")
    yield StreamChunk(content="cd")


async def _achunks(tier: Tier, request: ModelRequest) -> AsyncIterator[StreamChunk]:
    for chunk in _chunks(tier, request):
        yield chunk


def test_sync_stream_driver() -> None:
    """Pulled chunks go through the plan and come out as emitted."""
    out = list(
        stream(
            _echo_stream_plan(),
            send=_Model().send,
            open=_chunks,
            sleep=lambda s: None,
            ask=lambda p: Choice.CANCEL,
        )
    )
    assert out == ["AB", "CD", "<done>"]


@pytest.mark.anyio
async def test_async_stream_driver() -> None:
    """The async stream driver emits the same as the sync one."""
    out = [
        c
        async for c in astream(
            _echo_stream_plan(),
            send=_Model().asend,
            open=_achunks,
            sleep=FakeClock().asleep,
            ask=lambda p: Choice.CANCEL,
        )
    ]
    assert out == ["AB", "CD", "<done>"]


def test_closing_a_stream_early_closes_plan_and_upstream() -> None:
    """A caller that stops reading closes the upstream stream and the plan."""
    closed: list[str] = []

    def upstream(tier: Tier, request: ModelRequest) -> Iterator[StreamChunk]:
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

    out = stream(
        plan(), send=_Model().send, open=upstream, sleep=lambda s: None, ask=lambda p: Choice.CANCEL
    )
    assert next(out) == "X"
    out.close()  # type: ignore[attr-defined]
    assert sorted(closed) == ["plan", "upstream"]


def test_stream_actions_outside_a_stream_are_rejected() -> None:
    """A plan that emits in a non-streaming run is a programming error, surfaced as such."""

    def plan() -> Plan[Any]:
        yield Emit("x")

    with pytest.raises(TypeError, match="outside a stream"):
        run(plan(), send=_Model().send, sleep=lambda s: None, ask=lambda p: Choice.CANCEL)
