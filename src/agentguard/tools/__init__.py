"""ToolGuard: resilient tool execution for custom agent loops.

Tiered timeouts, classified errors, bounded retries with a per-turn budget, a circuit breaker per
tool (shared through a store), idempotency keys for side-effecting tools, fallback chains,
dead letters and human hand-off; every call goes through the LoopDetector. See ``docs/tools.md``.
"""

from __future__ import annotations

from agentguard._exports import publish

from ._guard import ToolGuard
from ._model import (
    Criticality,
    DeadLetter,
    Default,
    GuardedTool,
    HandOff,
    ToolError,
    ToolOutcome,
    TraceEntry,
)
from ._run import ToolTimeout
from ._turns import Turn

__all__ = [
    "Criticality",
    "DeadLetter",
    "Default",
    "GuardedTool",
    "HandOff",
    "ToolError",
    "ToolGuard",
    "ToolOutcome",
    "ToolTimeout",
    "TraceEntry",
    "Turn",
]

publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
