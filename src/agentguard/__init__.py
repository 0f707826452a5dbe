"""agentguard: a reliability layer for LLM agents.

Detects the ways agents fail (loops, malformed or hallucinated tool calls, runaway tokens,
flaky models and tools, memory pressure) and recovers: repair, re-ask, escalate, or stop with a
clear reason, always reporting what it did.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers and IDEs
    from ._wrap import wrap
    from .budget import PriceTable, TokenLedger
    from .config import GuardConfig
    from .escalation import EscalationPolicy
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
    from .guard import AsyncGuard, Guard, GuardReport, report_of, session
    from .loops import Finding, LoopDetector, ToolLoopPolicy, Verdict, scan_transcript
    from .pressure import MemoryPressureProbe, PressureLevel, PressureReading
    from .resilience import CircuitBreaker, RetryPolicy
    from .storage import MemoryStore, RedisStore, SQLiteStore
    from .tools import DeadLetter, HandOff, ToolError, ToolGuard, ToolOutcome
    from .types import Severity, Tier, ToolCall, Usage
    from .validation import ToolCallValidator, ValidationReport

# Public names are imported on first use (PEP 562): `import agentguard` stays cheap, and a
# program that only scans transcripts or only wraps a client loads only what it uses.
_LAZY = {
    "AgentGuardError": ".exceptions",
    "AsyncGuard": ".guard",
    "BudgetExceeded": ".exceptions",
    "CircuitBreaker": ".resilience",
    "ConfigError": ".exceptions",
    "DeadLetter": ".tools",
    "EscalationPolicy": ".escalation",
    "EscalationRequired": ".exceptions",
    "Event": ".events",
    "Finding": ".loops",
    "Guard": ".guard",
    "GuardConfig": ".config",
    "GuardReport": ".guard",
    "HandOff": ".tools",
    "LoopDetected": ".exceptions",
    "LoopDetector": ".loops",
    "MemoryPressureProbe": ".pressure",
    "MemoryStore": ".storage",
    "ModelError": ".exceptions",
    "ModelTimeout": ".exceptions",
    "PressureLevel": ".pressure",
    "PressureReading": ".pressure",
    "PriceTable": ".budget",
    "RedisStore": ".storage",
    "RetryPolicy": ".resilience",
    "SQLiteStore": ".storage",
    "Severity": ".types",
    "StoreError": ".exceptions",
    "StoreUnavailable": ".exceptions",
    "Tier": ".types",
    "TiersExhausted": ".exceptions",
    "TokenLedger": ".budget",
    "ToolCall": ".types",
    "ToolCallValidator": ".validation",
    "ToolError": ".tools",
    "ToolGuard": ".tools",
    "ToolLoopPolicy": ".loops",
    "ToolOutcome": ".tools",
    "ToolSchemaError": ".exceptions",
    "ToolValidationFailed": ".exceptions",
    "Usage": ".types",
    "ValidationReport": ".validation",
    "Verdict": ".loops",
    "add_hook": ".events",
    "remove_hook": ".events",
    "report_of": ".guard",
    "scan_transcript": ".loops",
    "session": ".guard",
    "wrap": "._wrap",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
