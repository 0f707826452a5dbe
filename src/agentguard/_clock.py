"""The only place that touches the real clock.

Components take ``clock=`` (and ``sleep=`` where they wait) so tests can inject a
:class:`agentguard.testing.FakeClock`; these are the defaults they fall back to.
"""

from __future__ import annotations

import time

__all__ = ["monotonic", "sleep", "wall"]

#: Monotonic seconds, for durations inside one process.
monotonic = time.monotonic  # noqa: TID251 - the one sanctioned default
#: Wall-clock seconds since the epoch, for state shared across processes and hosts.
wall = time.time  # noqa: TID251 - the one sanctioned default
#: Blocking sleep, for sync drivers.
sleep = time.sleep  # noqa: TID251 - the one sanctioned default
