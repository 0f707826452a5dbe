"""The guarded model call: :class:`Guard` and :class:`AsyncGuard` drive one plan (the pipeline)
through a transport.

- ``_pipeline``: the plan of one call, every step of ARCHITECTURE §3 in order;
- ``_transcript``: what a session remembers, so each call judges only what is new;
- ``_session``: which session a call belongs to;
- ``_stream``: stream accumulation, the degeneration watch, releasing held tool calls;
- ``_report``: the :class:`GuardReport` and its builder;
- ``_guard``: the sync and async drivers, fail-open, and the guarded stream objects.
"""

from __future__ import annotations

from agentguard._exports import publish

from ._guard import AsyncGuard, AsyncGuardedStream, Confirm, Guard, GuardedStream
from ._report import GuardReport, report_of
from ._session import current_session, session

__all__ = [
    "AsyncGuard",
    "AsyncGuardedStream",
    "Confirm",
    "Guard",
    "GuardReport",
    "GuardedStream",
    "current_session",
    "report_of",
    "session",
]

publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
