"""The public names of ``agentguard``, listed once: where each lives, and its home name.

``PUBLIC`` is the one list. ``agentguard/__init__.py`` loads each name from it on first use
(``__all__`` is its keys); its ``TYPE_CHECKING`` imports repeat it for type checkers and the
docs, and a test keeps the two equal. Every module a name is loaded from ends with
``publish(globals())``, so ``repr(agentguard.LoopDetector)`` says ``agentguard.LoopDetector``
however the class was first reached (httpx does the same), and pickle finds it here.

It imports nothing from agentguard, so even foundation modules call :func:`publish` without a
cycle.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: see agentguard/__init__.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["PUBLIC", "publish"]

#: Public name -> the module it is loaded from (relative to ``agentguard``).
PUBLIC: dict[str, str] = {
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
    "GuardFailure": ".exceptions",
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


def publish(namespace: dict[str, Any]) -> None:
    """Make ``agentguard`` the ``__module__`` of the public names loaded from this module.

    Call it at the bottom of a module ``PUBLIC`` points to, as ``publish(globals())``.

    Args:
        namespace: the calling module's globals.
    """
    here = namespace["__name__"]
    for name, module in PUBLIC.items():
        if f"agentguard{module}" == here:
            obj = namespace[name]
            if isinstance(obj, type):
                _resolve_annotations(obj)
            obj.__module__ = "agentguard"


def _resolve_annotations(cls: type) -> None:
    """Replace the class's own string annotations by what they name, while it can.

    ``typing.get_type_hints`` and pydantic resolve a class's annotations in the module its
    ``__module__`` names; once that is ``agentguard`` they would look in the wrong place, so
    they are resolved now, in the defining module. An annotation that cannot be resolved at
    run time (a name imported for type checkers only) could not be before either: all stay text.
    """
    own = vars(cls).get("__annotations__")
    if not isinstance(own, dict) or not any(isinstance(v, str) for v in own.values()):
        return
    import typing  # noqa: PLC0415 - not at import time of the package (see TYPE_CHECKING)

    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # unresolvable before publishing, equally so after
        return
    for key in own:
        own[key] = hints.get(key, own[key])
