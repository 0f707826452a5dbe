"""agentguard: a reliability layer for LLM agents.

Detects the ways agents fail (loops, malformed or hallucinated tool calls, runaway tokens,
flaky models and tools, memory pressure) and recovers: repair, re-ask, escalate, or stop with a
clear reason, always reporting what it did.
"""

from __future__ import annotations

from ._session import session
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
)
from .loops import Finding, LoopDetector, ToolLoopPolicy, Verdict, scan_transcript
from .memory import MemoryPressureProbe, PressureLevel, PressureReading
from .types import Severity, ToolCall, Usage
from .validation import ToolCallValidator, ValidationReport

__version__ = "0.1.0.dev0"

__all__ = [
    "AgentGuardError",
    "BudgetExceeded",
    "ConfigError",
    "EscalationPolicy",
    "EscalationRequired",
    "Event",
    "Finding",
    "GuardConfig",
    "LoopDetected",
    "LoopDetector",
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
    "ToolCallValidator",
    "ToolLoopPolicy",
    "ToolSchemaError",
    "Usage",
    "ValidationReport",
    "Verdict",
    "__version__",
    "add_hook",
    "remove_hook",
    "scan_transcript",
    "session",
]
