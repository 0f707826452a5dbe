"""Running one attempt of a tool, under its timeout: the only place ToolGuard calls user code.

Async tools run under :func:`anyio.fail_after`, which cancels them at the deadline. A sync
callable cannot be cancelled in Python: with a timeout it runs on a worker thread and the caller
stops *waiting* at the deadline; the thread runs on until the callable returns, and its result is
dropped (the tool is abandoned, not killed). Give blocking I/O its own timeouts inside the tool
too, or make the tool async, when abandoned threads would pile up.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from agentguard._frozen import fast_init

from ._model import GuardedTool

__all__ = ["DaemonPool", "Invoke", "ToolTimeout", "Workers", "ainvoke", "invoke"]


class _Job:
    """One call handed to a worker: the caller waits on ``done``, a lock the worker releases.

    A bare lock is the cheapest hand-back between two threads: a ``Future`` builds a condition
    and its waiter locks on every call, which costs the hop more than twice as much.
    """

    __slots__ = ("abandoned", "done", "error", "fn", "future", "value")

    def __init__(
        self, fn: Callable[[], Any], future: concurrent.futures.Future[Any] | None = None
    ) -> None:
        self.fn = fn
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.future = future  # the Future of a submit(), cancelled with the job

    def abandon(self) -> None:
        """Never start this job (a worker that already did runs it to the end, unheard)."""
        self.abandoned = True
        if self.future is not None:
            self.future.cancel()

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # handed to the waiting caller
            self.error = exc


class DaemonPool(concurrent.futures.Executor):
    """Worker threads for timed sync tools that never hold up interpreter exit.

    ``ThreadPoolExecutor`` joins its workers when the interpreter exits, so one hung tool would
    hang the agent's exit too. These workers are daemon threads: an abandoned tool is left
    behind, not waited for. A worker is started only when none is idle (an abandoned tool keeps
    its worker busy), and idle workers are reused.
    """

    def __init__(self, name: str = "agentguard-tool") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._workers = 0
        self._closed = False
        self._ids = itertools.count(1)

    def call(self, fn: Callable[[], Any], timeout: float, late: Callable[[], BaseException]) -> Any:
        """Run ``fn()`` on a worker thread and wait for it at most ``timeout`` seconds.

        Returns its result or raises its exception. When it does not finish in time it is
        abandoned (it may never start, or finish unheard) and ``late()`` is raised.
        """
        job = _Job(fn)
        self._dispatch(job)
        if not job.done.acquire(timeout=timeout):
            job.abandon()
            raise late()
        if job.error is not None:
            raise job.error
        return job.value

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` on a worker thread."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        call = functools.partial(fn, *args, **kwargs)

        def settle() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = call()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        self._dispatch(_Job(settle, future))
        return future

    def _dispatch(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a closed DaemonPool")
            spawn = self._idle == 0
            if spawn:
                self._workers += 1
            else:
                self._idle -= 1
        self._queue.put(job)
        if spawn:
            name = f"{self._name}-{next(self._ids)}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            if not job.abandoned:
                job.run()
            with self._lock:  # idle before the caller hears back: its next call reuses us
                self._idle += 1
            job.done.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the idle workers; busy (abandoned) ones end when their tool returns."""
        with self._lock:
            self._closed = True
            workers = self._workers
        if cancel_futures:
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job.abandon()
                    job.done.release()
        for _ in range(workers):
            self._queue.put(None)


class Workers:
    """Where timed sync tools run: the executor given, or a :class:`DaemonPool` of our own.

    The pool starts on first use and stops with :meth:`close`.
    """

    def __init__(self, executor: concurrent.futures.Executor | None = None) -> None:
        self._given = executor
        self._own: DaemonPool | None = None

    def __call__(self) -> concurrent.futures.Executor:
        if self._given is not None:
            return self._given
        if self._own is None:
            self._own = DaemonPool("agentguard-tool")
        return self._own

    def close(self) -> None:
        """Stop the pool's idle workers (busy, abandoned tools finish on their own)."""
        if self._own is not None:
            self._own.shutdown(wait=False, cancel_futures=True)
            self._own = None


class ToolTimeout(TimeoutError):
    """A tool did not answer within its timeout (classified as ``timeout``).

    Attributes:
        seconds: the timeout that passed.
    """

    def __init__(self, tool: str, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"tool {tool!r} did not answer within {seconds:g}s")


@fast_init
@dataclass(frozen=True, slots=True)
class Invoke:
    """Run one attempt of ``tool``; the result is its return value (or its exception, thrown in).

    Attributes:
        tool: the tool.
        arguments: keyword arguments.
        key: the idempotency key, passed when the tool takes one.
        timeout: seconds before the attempt is abandoned (``None``: untimed).
    """

    tool: GuardedTool
    arguments: dict[str, Any]
    key: str | None
    timeout: float | None

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments the tool is called with."""
        if self.key is None or not self.tool.takes_key:
            return self.arguments
        return {**self.arguments, "idempotency_key": self.key}


def invoke(action: Invoke, executor: Callable[[], concurrent.futures.Executor] | None) -> Any:
    """Run the attempt from sync code: inline, on a worker thread (timed), or in an event loop.

    Args:
        action: the attempt.
        executor: returns the executor sync tools with a timeout run on; ``None``: run inline.
    """
    tool, kwargs, timeout = action.tool, action.kwargs(), action.timeout
    if tool.is_async:
        return anyio.run(functools.partial(_timed, tool, kwargs, timeout))
    if timeout is None or executor is None:
        return tool.fn(**kwargs)
    pool = executor()
    if isinstance(pool, DaemonPool):  # the default: the cheap hand-off
        call = functools.partial(tool.fn, **kwargs)
        return pool.call(call, timeout, lambda: ToolTimeout(tool.name, timeout))
    future = pool.submit(tool.fn, **kwargs)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        if future.done():  # the tool's own TimeoutError
            raise
        future.cancel()  # still queued: never starts; running: abandoned
        raise ToolTimeout(tool.name, timeout) from None


async def ainvoke(action: Invoke, *, threads: bool) -> Any:
    """Run the attempt from async code.

    Args:
        action: the attempt.
        threads: run a sync tool on a worker thread (timed, the loop never blocks); otherwise
            inline and untimed.
    """
    tool, kwargs, timeout = action.tool, action.kwargs(), action.timeout
    if tool.is_async:
        return await _timed(tool, kwargs, timeout)
    if not threads:
        return tool.fn(**kwargs)
    call = functools.partial(tool.fn, **kwargs)
    if timeout is None:
        return await anyio.to_thread.run_sync(call)
    with anyio.move_on_after(timeout) as scope:
        return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
    assert scope.cancelled_caught
    raise ToolTimeout(tool.name, timeout)


async def _timed(tool: GuardedTool, kwargs: dict[str, Any], timeout: float | None) -> Any:
    if timeout is None:
        return await tool.fn(**kwargs)
    with anyio.move_on_after(timeout) as scope:
        return await tool.fn(**kwargs)
    assert scope.cancelled_caught
    raise ToolTimeout(tool.name, timeout)
