"""agentguard: a reliability layer for LLM agents.

Detects the ways agents fail (loops, malformed or hallucinated tool calls, runaway tokens,
flaky models and tools, memory pressure) and recovers: repair, re-ask, escalate, or stop with a
clear reason, always reporting what it did.
"""

from __future__ import annotations

import importlib

from . import _exports

# (not typing's: `import agentguard` imports no typing, so that the command line, which
# imports the package before its Ctrl-C handler can run, imports it under the handler)
TYPE_CHECKING = False

if TYPE_CHECKING:
    # For type checkers, IDEs and the docs: the names of _exports.PUBLIC, from the same modules
    # (a test keeps them equal). `X as X` marks each as re-exported for strict type checkers.
    from ._wrap import wrap as wrap
    from .budget import PriceTable as PriceTable
    from .budget import TokenLedger as TokenLedger
    from .config import GuardConfig as GuardConfig
    from .escalation import EscalationPolicy as EscalationPolicy
    from .events import Event as Event
    from .events import add_hook as add_hook
    from .events import remove_hook as remove_hook
    from .exceptions import (
        AgentGuardError as AgentGuardError,
    )
    from .exceptions import (
        BudgetExceeded as BudgetExceeded,
    )
    from .exceptions import (
        ConfigError as ConfigError,
    )
    from .exceptions import (
        EscalationRequired as EscalationRequired,
    )
    from .exceptions import (
        GuardFailure as GuardFailure,
    )
    from .exceptions import (
        LoopDetected as LoopDetected,
    )
    from .exceptions import (
        ModelError as ModelError,
    )
    from .exceptions import (
        ModelTimeout as ModelTimeout,
    )
    from .exceptions import (
        StoreError as StoreError,
    )
    from .exceptions import (
        StoreUnavailable as StoreUnavailable,
    )
    from .exceptions import (
        TiersExhausted as TiersExhausted,
    )
    from .exceptions import (
        ToolSchemaError as ToolSchemaError,
    )
    from .exceptions import (
        ToolValidationFailed as ToolValidationFailed,
    )
    from .guard import (
        AsyncGuard as AsyncGuard,
    )
    from .guard import (
        Guard as Guard,
    )
    from .guard import (
        GuardReport as GuardReport,
    )
    from .guard import (
        report_of as report_of,
    )
    from .guard import (
        session as session,
    )
    from .loops import (
        Finding as Finding,
    )
    from .loops import (
        LoopDetector as LoopDetector,
    )
    from .loops import (
        ToolLoopPolicy as ToolLoopPolicy,
    )
    from .loops import (
        Verdict as Verdict,
    )
    from .loops import (
        scan_transcript as scan_transcript,
    )
    from .pressure import (
        MemoryPressureProbe as MemoryPressureProbe,
    )
    from .pressure import (
        PressureLevel as PressureLevel,
    )
    from .pressure import (
        PressureReading as PressureReading,
    )
    from .resilience import CircuitBreaker as CircuitBreaker
    from .resilience import RetryPolicy as RetryPolicy
    from .storage import (
        MemoryStore as MemoryStore,
    )
    from .storage import (
        RedisStore as RedisStore,
    )
    from .storage import (
        SQLiteStore as SQLiteStore,
    )
    from .tools import (
        DeadLetter as DeadLetter,
    )
    from .tools import (
        HandOff as HandOff,
    )
    from .tools import (
        ToolError as ToolError,
    )
    from .tools import (
        ToolGuard as ToolGuard,
    )
    from .tools import (
        ToolOutcome as ToolOutcome,
    )
    from .types import Severity as Severity
    from .types import Tier as Tier
    from .types import ToolCall as ToolCall
    from .types import Usage as Usage
    from .validation import (
        ToolCallValidator as ToolCallValidator,
    )
    from .validation import (
        ValidationReport as ValidationReport,
    )

# Public names are imported on first use (PEP 562): `import agentguard` stays cheap, and a
# program that only scans transcripts or only wraps a client loads only what it uses.
__all__ = sorted([*_exports.PUBLIC, "__version__"])  # noqa: PLE0605 - derived from the one list

__version__ = "0.1.0.dev0"

if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name is an error there

    def __getattr__(name: str) -> object:
        module = _exports.PUBLIC.get(name)
        if module is None:
            raise AttributeError(f"module 'agentguard' has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
