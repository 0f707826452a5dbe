"""What adapters share about running a framework's tool calls through a
:class:`~agentguard.ToolGuard`: each tool registered once (with the options given for its
name) as a runner that makes an attempt through the framework's own call in progress, and the
ToolGuard's sync call made safely from inside a running event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import anyio.to_thread

from agentguard.tools import ToolGuard, ToolOutcome

#: An attempt: the registered target (a framework tool, a name ...) and the arguments.
Attempt = Callable[[Any, dict[str, Any]], Awaitable[Any]]

# The framework's tool call in progress, for the runners (which only get the arguments).
_CURRENT: contextvars.ContextVar[Attempt] = contextvars.ContextVar("agentguard_tool_attempt")


class PassThrough(BaseException):
    """A framework's control flow raised in a tool (LangGraph's ``interrupt()`` ...), carried
    through the ToolGuard, which would take an ``Exception`` for the tool's failure, and raised
    again once out of it."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Runner:
    """A framework tool as the ToolGuard calls it: an attempt through the call in progress. Its
    signature says whether it takes an ``idempotency_key`` (the ToolGuard then passes one)."""

    def __init__(self, target: Any, takes_key: bool) -> None:
        self.target = target
        key = inspect.Parameter("idempotency_key", inspect.Parameter.KEYWORD_ONLY)
        self.__signature__ = inspect.Signature([key] if takes_key else [])

    async def __call__(self, **arguments: Any) -> Any:
        return await _CURRENT.get()(self.target, arguments)


class FrameworkTools:
    """A framework's tools run through a :class:`~agentguard.ToolGuard`.

    Args:
        guard: the ToolGuard.
        options: :meth:`ToolGuard.register <agentguard.ToolGuard.register>` options by name.
        keep_registered: a tool the ToolGuard already has under that name runs as registered
            there (``False``: the framework's tool replaces it on first use).
    """

    def __init__(
        self,
        guard: ToolGuard,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        keep_registered: bool = True,
    ) -> None:
        self.guard = guard
        self._options = {k: dict(v) for k, v in (options or {}).items()}
        self._keep = keep_registered
        self._registered: set[str] = set()

    def register(self, name: str, target: Any = None, *, takes_key: bool = False) -> None:
        """Register ``name`` (once) as a runner handing ``target`` to the attempt in progress."""
        if name in self._registered:
            return
        if not (self._keep and name in self.guard.tools):
            runner = _Runner(target, takes_key)
            self.guard.register(runner, name=name, **self._options.get(name, {}))
        self._registered.add(name)

    def call(
        self, name: str, arguments: dict[str, Any], attempt: Attempt, *, run: str | None = None
    ) -> ToolOutcome:
        """``ToolGuard.call``, each attempt made by ``attempt`` (from sync code, even inside a
        running event loop: see :func:`off_loop`); ``run``: the agent run making the call, whose
        loop state judges it (``None``: unknown)."""
        with _serving(attempt):
            call = functools.partial(self.guard.call, name, arguments, run=run)
            return off_loop(call)  # type: ignore[no-any-return]

    async def acall(
        self, name: str, arguments: dict[str, Any], attempt: Attempt, *, run: str | None = None
    ) -> ToolOutcome:
        """Async twin of :meth:`call`."""
        with _serving(attempt):
            return await self.guard.acall(name, arguments, run=run)


@contextmanager
def _serving(attempt: Attempt) -> Iterator[None]:
    token = _CURRENT.set(attempt)
    try:
        yield
    except PassThrough as carried:
        raise carried.exc from None
    finally:
        _CURRENT.reset(token)


async def attempt_with(handler: Callable[[Any], Any], request: Any, is_async: bool) -> Any:
    """``handler(request)``, awaited; a sync handler on a worker thread, so the ToolGuard's
    timeout abandons a sync tool that hangs."""
    if is_async:
        return await handler(request)
    call = functools.partial(handler, request)
    return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)


def off_loop(fn: Callable[[], Any]) -> Any:
    """``fn()`` (a ToolGuard call, which runs each attempt in an event loop of its own) in a copy
    of this context that names no running async library, on a thread of its own when an event
    loop runs in this one (a sync agent run from a notebook or an async web handler: LangGraph
    copies the context that says so into its worker threads)."""
    context = contextvars.copy_context()
    sniffio = sys.modules.get("sniffio")
    if sniffio is not None:
        context.run(sniffio.current_async_library_cvar.set, None)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return context.run(fn)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(context.run, fn).result()
