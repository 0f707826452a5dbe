"""agentguard: a reliability layer for LLM agents.

Detects the ways agents fail (loops, malformed or hallucinated tool calls, runaway tokens,
flaky models and tools, memory pressure) and recovers: repair, re-ask, escalate, or stop with a
clear reason, always reporting what it did.
"""

from __future__ import annotations

from ._report import GuardReport, report_of
from ._session import session
from ._wrap import wrap
from .budget import PriceTable, TokenLedger
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
from .loops import Finding, LoopDetector, ToolLoopPolicy, Verdict, scan_transcript
from .memory import MemoryPressureProbe, PressureLevel, PressureReading
from .resilience import CircuitBreaker, RetryPolicy
from .storage import MemoryStore, RedisStore, SQLiteStore
from .tools import DeadLetter, HandOff, ToolError, ToolGuard, ToolOutcome
from .types import Severity, ToolCall, Usage
from .validation import ToolCallValidator, ValidationReport

__version__ = "0.1.0.dev0"

__all__ = [
    "AgentGuardError",
    "AsyncGuard",
    "BudgetExceeded",
    "CircuitBreaker",
    "ConfigError",
    "DeadLetter",
    "EscalationPolicy",
    "EscalationRequired",
    "Event",
    "Finding",
    "Guard",
    "GuardConfig",
    "GuardReport",
    "HandOff",
    "LoopDetected",
    "LoopDetector",
    "MemoryPressureProbe",
    "MemoryStore",
    "ModelError",
    "ModelTimeout",
    "PressureLevel",
    "PressureReading",
    "PriceTable",
    "RedisStore",
    "RetryPolicy",
    "SQLiteStore",
    "Severity",
    "StoreError",
    "StoreUnavailable",
    "Tier",
    "TiersExhausted",
    "TokenLedger",
    "ToolCall",
    "ToolCallValidator",
    "ToolError",
    "ToolGuard",
    "ToolLoopPolicy",
    "ToolOutcome",
    "ToolSchemaError",
    "ToolValidationFailed",
    "Usage",
    "ValidationReport",
    "Verdict",
    "__version__",
    "add_hook",
    "remove_hook",
    "report_of",
    "scan_transcript",
    "session",
    "wrap",
]
