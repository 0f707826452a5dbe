"""agentguard: a reliability layer for LLM agents.

Detects the ways agents fail (loops, malformed or hallucinated tool calls, runaway tokens,
flaky models and tools, memory pressure) and recovers: repair, re-ask, escalate, or stop with a
clear reason, always reporting what it did.
"""

from __future__ import annotations

from ._report import GuardReport, report_of
from ._session import session
from ._wrap import wrap
from .config import GuardConfig
from .escalation import EscalationPolicy, Tier
from .events import Event, add_hook, remove_hook
from .exceptions import (
    AgentGuardError,
    BudgetExceeded,
    ConfigError,
    EscalationRequired,
    LoopDetected,
    ModelError,
    ModelTimeout,
    StoreError,
    StoreUnavailable,
    TiersExhausted,
    ToolSchemaError,
    ToolValidationFailed,
)
from .guard import AsyncGuard, Guard
from .memory import MemoryPressureProbe, PressureLevel, PressureReading
from .types import Severity, ToolCall, Usage

__version__ = "0.1.0.dev0"

__all__ = [
    "AgentGuardError",
    "AsyncGuard",
    "BudgetExceeded",
    "ConfigError",
    "EscalationPolicy",
    "EscalationRequired",
    "Event",
    "Guard",
    "GuardConfig",
    "GuardReport",
    "LoopDetected",
    "MemoryPressureProbe",
    "ModelError",
    "ModelTimeout",
    "PressureLevel",
    "PressureReading",
    "Severity",
    "StoreError",
    "StoreUnavailable",
    "Tier",
    "TiersExhausted",
    "ToolCall",
    "ToolSchemaError",
    "ToolValidationFailed",
    "Usage",
    "__version__",
    "add_hook",
    "remove_hook",
    "report_of",
    "session",
    "wrap",
]
