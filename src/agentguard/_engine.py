"""Sans-I/O: the pipeline's logic is a generator of actions, carried out by two thin drivers.

The pipeline never calls a model, sleeps, asks the user or touches a store itself. It *yields*
what it wants done (:class:`Send`, :class:`Sleep`, :class:`Ask`, a :class:`Call` of a ledger or
store operation, and for streams :class:`Open`, :class:`Pull`, :class:`Emit`) and receives the
result, or the exception,
back. :func:`run` / :func:`stream` carry the actions out synchronously, :func:`arun` /
:func:`astream` asynchronously, each action by a handler for its type: one implementation of the
logic, two small drivers (the shape of tenacity's ``iter()`` with its sync and asyncio drivers).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeAlias, TypeVar

from ._frozen import fast_init
from .transport import ModelRequest, StreamChunk
from .types import EscalationPrompt, Tier

__all__ = [
    "END",
    "Action",
    "Ask",
    "Call",
    "Emit",
    "Handler",
    "Handlers",
    "Open",
    "Plan",
    "Pull",
    "Send",
    "Sleep",
    "acall",
    "arun",
    "astream",
    "call",
    "perform",
    "run",
    "stream",
]

T = TypeVar("T")
P = ParamSpec("P")


@fast_init
@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """Call a component's method: the sync one in a sync driver, its async twin in an async one.

    A sync driver runs ``sync(*args, **kwargs)``, an async driver awaits
    ``async_(*args, **kwargs)``; the result is the return value (or the exception, thrown in).

    Yield it through :func:`perform`, which types the result: ``reservation = yield from
    perform(ledger.reserve, ledger.areserve, session, tokens)`` is a ``Reservation`` to mypy,
    and a reader follows the call straight to the method that runs it.

    Attributes:
        sync: the callable a sync driver runs.
        async_: its async twin, which an async driver awaits.
        args: positional arguments of either.
        kwargs: keyword arguments of either.
    """

    sync: Callable[..., T]
    async_: Callable[..., Awaitable[T]]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def perform(
    sync: Callable[P, T], async_: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
) -> Generator[Call[T], Any, T]:
    """Yield a :class:`Call` of ``sync`` / ``async_`` with these arguments; return its result.

    Use with ``yield from`` inside a plan; both callables must take the same arguments.
    """
    result: T = yield Call(sync, async_, args, kwargs)
    return result


def call(action: Call[T]) -> T:
    """The sync drivers' handler of :class:`Call`."""
    return action.sync(*action.args, **action.kwargs)


def acall(action: Call[T]) -> Awaitable[T]:
    """The async drivers' handler of :class:`Call` (the driver awaits what it returns)."""
    return action.async_(*action.args, **action.kwargs)


@dataclass(frozen=True, slots=True)
class Send:
    """Call ``tier`` with ``request``; the result is a ModelResponse (or the error, thrown in).

    ``session`` names the call's session, for telemetry (``gen_ai.conversation.id``).
    """

    tier: Tier
    request: ModelRequest
    session: str | None = None


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
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Pull:
    """Read the next chunk of the open stream; the result is a StreamChunk or :data:`END`."""


@fast_init  # one per chunk handed on
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

Action: TypeAlias = "Send | Sleep | Ask | Call[Any] | Open | Pull | Emit"
#: A plan yields actions (these, or others its drivers have handlers for) and returns a T.
Plan: TypeAlias = Generator[Any, Any, T]

#: Carries out one kind of action and returns its result (sync drivers).
Handler = Callable[[Any], Any]
#: Async drivers accept handlers returning a value or an awaitable.
Handlers = Mapping[type, Handler]
OpenFn = Callable[[Open], Iterator[StreamChunk]]
AOpenFn = Callable[[Open], AsyncIterator[StreamChunk]]


def _step(plan: Plan[T], value: Any, error: BaseException | None) -> Any:
    return plan.throw(error) if error is not None else plan.send(value)


def _handler(handlers: Handlers, action: Any) -> Handler:
    handler = handlers.get(type(action))
    if handler is None:
        raise TypeError(f"no handler for {action!r} here")
    return handler


def run(plan: Plan[T], handlers: Handlers) -> T:
    """Carry out a plan synchronously, each action by ``handlers[type(action)]``."""
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
            value = _handler(handlers, action)(action)
        except BaseException as exc:  # handed to the plan, which decides (and re-raises)
            error = exc


async def arun(plan: Plan[T], handlers: Handlers) -> T:
    """Carry out a plan asynchronously; handlers may return awaitables."""
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
            value = _handler(handlers, action)(action)
            if inspect.isawaitable(value):
                value = await value
        except BaseException as exc:
            error = exc


def stream(plan: Plan[T], handlers: Handlers, *, open: OpenFn) -> Generator[Any, None, T]:
    """Carry out a streaming plan synchronously, yielding what it emits; returns its result."""
    value: Any = None
    error: BaseException | None = None
    chunks: Iterator[StreamChunk] | None = None
    try:
        while True:
            try:
                action = _step(plan, value, error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            value, error = None, None
            try:
                if isinstance(action, Emit):
                    yield action.chunk
                elif isinstance(action, Pull):
                    if chunks is None:
                        raise RuntimeError("Pull before Open")
                    value = next(chunks, END)
                elif isinstance(action, Open):
                    _close(chunks)
                    chunks = open(action)
                else:
                    value = _handler(handlers, action)(action)
            except GeneratorExit:
                raise
            except BaseException as exc:
                error = exc
    finally:
        _close(chunks)
        plan.close()


async def astream(
    plan: Plan[Any], handlers: Handlers, *, open: AOpenFn, done: Callable[[Any], None] | None = None
) -> AsyncIterator[Any]:
    """Carry out a streaming plan asynchronously, yielding what it emits.

    An async generator cannot return a value: the plan's result goes to ``done``.
    """
    value: Any = None
    error: BaseException | None = None
    chunks: AsyncIterator[StreamChunk] | None = None
    try:
        while True:
            try:
                action = _step(plan, value, error)
            except StopIteration as stop:
                if done is not None:
                    done(stop.value)
                return
            value, error = None, None
            try:
                if isinstance(action, Emit):
                    yield action.chunk
                elif isinstance(action, Pull):
                    if chunks is None:
                        raise RuntimeError("Pull before Open")
                    value = await anext(chunks, END)
                elif isinstance(action, Open):
                    await _aclose(chunks)
                    chunks = open(action)
                else:
                    value = _handler(handlers, action)(action)
                    if inspect.isawaitable(value):
                        value = await value
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
