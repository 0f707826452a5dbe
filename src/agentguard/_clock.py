"""The only place that touches the real clock.

Components take ``clock=`` (and ``sleep=`` where they wait) so tests can inject a
:class:`agentguard.testing.FakeClock`; these are the defaults they fall back to.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["monotonic", "sleep", "wall", "wall_of"]

#: Monotonic seconds, for durations inside one process.
monotonic = time.monotonic  # noqa: TID251 - the one sanctioned default
#: Wall-clock seconds since the epoch, for state shared across processes and hosts.
wall = time.time  # noqa: TID251 - the one sanctioned default
#: Blocking sleep, for sync drivers.
sleep = time.sleep  # noqa: TID251 - the one sanctioned default


def wall_of(clock: Callable[[], float] | None) -> Callable[[], float]:
    """The wall clock that goes with an injected ``clock`` (to read an HTTP date): its own
    ``wall()`` when it has one (a ``FakeClock``, whose time stands for both), else the real
    one (a monotonic clock's seconds are no date)."""
    own = getattr(clock, "wall", None)
    return own if callable(own) else wall
