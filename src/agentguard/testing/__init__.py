"""Test helpers shipped for your own tests: a scripted model, a fake clock and event capture.

``ScriptedModel`` answers from a script and fails on demand (malformed, hallucinated and
text-embedded tool calls, loops, 429 with Retry-After, 5xx, timeouts, degenerate text, missing
usage), as a transport or behind the real openai client::

    model = ScriptedModel([Fault.rate_limit(retry_after=2), Reply.call("search", {"q": "x"})])

``FakeClock`` stands in for every ``clock=`` and ``sleep=`` argument, so code under test never
waits and never reads the real time::

    clock = FakeClock()
    detector = LoopDetector(clock=clock)
    clock.advance(30)

``capture_events()`` collects every event emitted while it is active::

    with capture_events() as events:
        ...
    assert events.kinds() == ["loop_detected"]
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from agentguard.events import Event, add_hook, remove_hook

from ._scripted import Fault, Reply, ScriptedModel, ScriptExhausted, Step

__all__ = [
    "CapturedEvents",
    "FakeClock",
    "Fault",
    "Reply",
    "ScriptExhausted",
    "ScriptedModel",
    "Step",
    "capture_events",
]

E = TypeVar("E", bound=Event)


class FakeClock:
    """A clock that moves only when told to.

    Call it for the current time. ``sleep`` and ``asleep`` advance it instead of waiting, and
    record each requested delay in :attr:`sleeps`.

    Args:
        start: the initial time in seconds. The default is a realistic epoch time, so the same
            clock can stand in for wall-clock time too.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        #: Every delay passed to :meth:`sleep` / :meth:`asleep`, in order.
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self._now

    def time(self) -> float:
        """The current time (same as calling the clock)."""
        return self._now

    def wall(self) -> float:
        """The current time as wall-clock time (same as calling the clock): what a component
        given this clock reads an HTTP date against."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (must not be negative); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance({seconds}))")
        with self._lock:
            self._now += seconds
            return self._now

    def sleep(self, seconds: float) -> None:
        """Record the delay and advance the clock by it, without waiting."""
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))

    async def asleep(self, seconds: float) -> None:
        """Async twin of :meth:`sleep`."""
        self.sleep(seconds)

    def __repr__(self) -> str:
        return f"FakeClock({self._now!r})"


class CapturedEvents(list[Event]):
    """The events captured by :func:`capture_events`, in order, with a few helpers."""

    def kinds(self) -> list[str]:
        """The ``kind`` of each captured event."""
        return [e.kind for e in self]

    def of_type(self, cls: type[E]) -> list[E]:
        """The captured events that are instances of ``cls``."""
        return [e for e in self if isinstance(e, cls)]


@contextmanager
def capture_events() -> Iterator[CapturedEvents]:
    """Collect every event any component emits (through the process-wide hooks) while active."""
    captured = CapturedEvents()

    def hook(event: Event) -> None:
        captured.append(event)

    add_hook(hook)
    try:
        yield captured
    finally:
        remove_hook(hook)
