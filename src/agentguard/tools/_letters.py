"""Dead letters: the calls that failed for good, kept in the store for inspection and replay."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentguard._engine import Plan, perform
from agentguard.events import ToolDeadLettered
from agentguard.exceptions import StoreError

from ._model import DeadLetter, GuardedTool, dead_letter_errors

if TYPE_CHECKING:
    from ._guard import ToolGuard
    from ._plan import Result
    from ._turns import Turn

__all__ = ["namespace", "record"]


def namespace(g: ToolGuard) -> str:
    """Where the guard's dead letters live in its store."""
    return f"dead_letters:{g.scope}"


def record(
    g: ToolGuard,
    turn: Turn,
    tool: GuardedTool,
    arguments: Mapping[str, Any],
    *,
    key: str | None,
    result: Result,
) -> Plan[None]:
    """Keep a call that failed for good, for a person to inspect or replay."""
    assert result.error is not None
    letter = DeadLetter(
        id=uuid.uuid4().hex[:16],
        tool=tool.name,
        arguments=arguments,
        errors=dead_letter_errors(result.errors)
        or (
            {
                "error_class": result.error.kind,
                "reason": result.error.message,
                "status_code": None,
            },
        ),
        attempts=result.attempts,
        at=g._clock(),
        idempotency_key=key,
        turn=turn.id,
        session=g.session,
    )
    try:
        store = g._store
        yield from perform(
            store.put,
            store.aput,
            namespace(g),
            letter.id,
            letter.to_json(),
            letter.at,
            g.config.dead_letter_ttl_seconds,
        )
    except StoreError as exc:
        g._store_failed(exc)
        return
    g._emit(
        ToolDeadLettered(
            tool=tool.name,
            letter=letter.id,
            error=result.error.kind,
            attempts=result.attempts,
            session=g.session,
        )
    )
