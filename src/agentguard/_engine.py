"""Sans-I/O: the pipeline's logic is a generator of actions, carried out by two thin drivers.

The pipeline never calls a model, sleeps or asks the user itself. It *yields* what it wants
done (:class:`Send`, :class:`Sleep`, :class:`Ask`, and for streams :class:`Open`, :class:`Pull`,
:class:`Emit`) and receives the result, or the exception, back. :func:`run` carries the actions
out synchronously, :func:`arun` / :func:`astream` asynchronously: one implementation of the
logic, two small drivers (the shape of tenacity's ``iter()`` with its sync and asyncio drivers).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from .escalation import Choice, EscalationPrompt, Tier
from .transport import ModelRequest, ModelResponse, StreamChunk

__all__ = [
    "END",
    "Action",
    "Ask",
    "Emit",
    "Open",
    "Plan",
    "Pull",
    "Send",
    "Sleep",
    "arun",
    "astream",
    "run",
    "stream",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Send:
    """Call ``tier`` with ``request``; the result is a ModelResponse (or the error, thrown in)."""

    tier: Tier
    request: ModelRequest


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (a backoff or a Retry-After)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Ask:
    """Confirm mode: ask the user; the result is a :class:`~agentguard.escalation.Choice`."""

    prompt: EscalationPrompt


@dataclass(frozen=True, slots=True)
class Open:
    """Open a stream on ``tier`` (closing any stream still open); the result is ``None``."""

    tier: Tier
    request: ModelRequest


@dataclass(frozen=True, slots=True)
class Pull:
    """Read the next chunk of the open stream; the result is a StreamChunk or :data:`END`."""


@dataclass(frozen=True, slots=True)
class Emit:
    """Hand ``chunk`` to the caller of a stream; the result is ``None``."""

    chunk: Any


class _End:
    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


#: What :class:`Pull` returns when the stream is finished.
END: Any = _End()

Action: TypeAlias = "Send | Sleep | Ask | Open | Pull | Emit"
Plan: TypeAlias = Generator[Action, Any, T]

SendFn = Callable[[Tier, ModelRequest], ModelResponse]
OpenFn = Callable[[Tier, ModelRequest], Iterator[StreamChunk]]
AskFn = Callable[[EscalationPrompt], Choice]
ASendFn = Callable[[Tier, ModelRequest], Awaitable[ModelResponse]]
AOpenFn = Callable[[Tier, ModelRequest], AsyncIterator[StreamChunk]]
AAskFn = Callable[[EscalationPrompt], "Choice | Awaitable[Choice]"]


def _step(plan: Plan[T], value: Any, error: BaseException | None) -> Action:
    return plan.throw(error) if error is not None else plan.send(value)


def run(plan: Plan[T], *, send: SendFn, sleep: Callable[[float], None], ask: AskFn) -> T:
    """Carry out a non-streaming plan synchronously and return its result."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            action = _step(plan, value, error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value, error = None, None
        try:
            if isinstance(action, Send):
                value = send(action.tier, action.request)
            elif isinstance(action, Sleep):
                sleep(action.seconds)
            elif isinstance(action, Ask):
                value = ask(action.prompt)
            else:
                raise TypeError(f"{action!r} cannot be run outside a stream")
        except BaseException as exc:  # handed to the plan, which decides (and re-raises)
            error = exc


async def arun(
    plan: Plan[T],
    *,
    send: ASendFn,
    sleep: Callable[[float], Awaitable[None]],
    ask: AAskFn,
) -> T:
    """Carry out a non-streaming plan asynchronously and return its result."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            action = _step(plan, value, error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value, error = None, None
        try:
            if isinstance(action, Send):
                value = await send(action.tier, action.request)
            elif isinstance(action, Sleep):
                await sleep(action.seconds)
            elif isinstance(action, Ask):
                answer = ask(action.prompt)
                value = await answer if inspect.isawaitable(answer) else answer
            else:
                raise TypeError(f"{action!r} cannot be run outside a stream")
        except BaseException as exc:
            error = exc


def stream(
    plan: Plan[Any], *, send: SendFn, open: OpenFn, sleep: Callable[[float], None], ask: AskFn
) -> Iterator[Any]:
    """Carry out a streaming plan synchronously, yielding what it emits."""
    value: Any = None
    error: BaseException | None = None
    chunks: Iterator[StreamChunk] | None = None
    try:
        while True:
            try:
                action = _step(plan, value, error)
            except StopIteration:
                return
            value, error = None, None
            try:
                if isinstance(action, Emit):
                    yield action.chunk
                elif isinstance(action, Pull):
                    assert chunks is not None, "Pull before Open"
                    value = next(chunks, END)
                elif isinstance(action, Open):
                    _close(chunks)
                    chunks = open(action.tier, action.request)
                elif isinstance(action, Send):
                    value = send(action.tier, action.request)
                elif isinstance(action, Sleep):
                    sleep(action.seconds)
                else:
                    value = ask(action.prompt)
            except GeneratorExit:
                raise
            except BaseException as exc:
                error = exc
    finally:
        _close(chunks)
        plan.close()


async def astream(
    plan: Plan[Any],
    *,
    send: ASendFn,
    open: AOpenFn,
    sleep: Callable[[float], Awaitable[None]],
    ask: AAskFn,
) -> AsyncIterator[Any]:
    """Carry out a streaming plan asynchronously, yielding what it emits."""
    value: Any = None
    error: BaseException | None = None
    chunks: AsyncIterator[StreamChunk] | None = None
    try:
        while True:
            try:
                action = _step(plan, value, error)
            except StopIteration:
                return
            value, error = None, None
            try:
                if isinstance(action, Emit):
                    yield action.chunk
                elif isinstance(action, Pull):
                    assert chunks is not None, "Pull before Open"
                    value = await anext(chunks, END)
                elif isinstance(action, Open):
                    await _aclose(chunks)
                    chunks = open(action.tier, action.request)
                elif isinstance(action, Send):
                    value = await send(action.tier, action.request)
                elif isinstance(action, Sleep):
                    await sleep(action.seconds)
                else:
                    answer = ask(action.prompt)
                    value = await answer if inspect.isawaitable(answer) else answer
            except GeneratorExit:
                raise
            except BaseException as exc:
                error = exc
    finally:
        await _aclose(chunks)
        plan.close()


def _close(chunks: Iterator[Any] | None) -> None:
    close = getattr(chunks, "close", None)
    if callable(close):
        close()


async def _aclose(chunks: AsyncIterator[Any] | None) -> None:
    aclose = getattr(chunks, "aclose", None)
    if callable(aclose):
        await aclose()
