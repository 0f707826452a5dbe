"""Idempotency keys of side-effecting tools: claimed before a call, settled after it.

A key is the caller's or, by default, a fingerprint of the session, the tool and the canonical
arguments. Claiming is one atomic store step (:meth:`~agentguard.storage.Store.claim`): the first
call owns the key for ``idempotency_lease_seconds``; a success is kept for replay for
``idempotency_ttl_seconds``; a failure frees the key so the operation can be tried again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentguard._engine import Plan, perform
from agentguard._fingerprint import canonical_json, fingerprint_bytes
from agentguard.events import ToolCallRefused, ToolCallReplayed
from agentguard.exceptions import StoreError

from ._model import GuardedTool, ToolError, ToolOutcome

if TYPE_CHECKING:
    from ._guard import ToolGuard

__all__ = ["claim", "derive_key", "namespace", "settle", "supplied_key"]


def namespace(g: ToolGuard) -> str:
    """Where the guard's idempotency records live in its store."""
    return f"idempotency:{g.scope}"


def derive_key(g: ToolGuard, name: str, arguments: Mapping[str, Any]) -> str:
    """The default key: a fingerprint of the session, the tool and the canonical arguments."""
    return fingerprint_bytes(canonical_json([g.session, name, arguments]))


def supplied_key(arguments: Mapping[str, Any]) -> str | None:
    """The ``idempotency_key`` the call's arguments carry, when they carry a non-empty text one.

    Honoured as the operation's key: the tool receives the key it was given, and the same key
    with other arguments is an ``idempotency_conflict``.
    """
    key = arguments.get("idempotency_key")
    return key if isinstance(key, str) and key else None


def claim(
    g: ToolGuard, tool: GuardedTool, arguments: Mapping[str, Any], key: str
) -> Plan[ToolOutcome | None]:
    """Claim ``key`` for this call; an outcome when the call must not run."""
    digest = fingerprint_bytes(canonical_json(arguments))
    mine = json.dumps({"fp": digest, "state": "running"})
    try:
        store = g._store
        held = yield from perform(
            store.claim,
            store.aclaim,
            namespace(g),
            key,
            mine,
            g._clock(),
            g.config.idempotency_lease_seconds,
        )
    except StoreError as exc:
        g._store_failed(exc)
        return None
    if held is None:
        return None
    record = json.loads(held)
    if record["fp"] != digest:
        message = (
            f"The idempotency key of this `{tool.name}` call was already used with different "
            "arguments; use a new key for a new operation."
        )
        reason = "idempotency_conflict"
    elif record["state"] == "running":
        message = (
            f"An identical `{tool.name}` call is still running; it was not started again. "
            "Wait for its result instead of repeating it."
        )
        reason = "duplicate_in_flight"
    else:
        g._emit(ToolCallReplayed(tool=tool.name, key=key, session=g.session))
        return ToolOutcome.from_dict(record["outcome"], replayed=True)
    g._emit(ToolCallRefused(tool=tool.name, reason=reason, message=message, session=g.session))
    error = ToolError(reason, tool.name, message, retryable=reason == "duplicate_in_flight")
    return ToolOutcome(tool.name, False, error=error)


def settle(
    g: ToolGuard, key: str, arguments: Mapping[str, Any], outcome: ToolOutcome
) -> Plan[None]:
    """Keep a success for replay; free the key of a failure so a later call can try again."""
    store, now = g._store, g._clock()
    try:
        if outcome.ok:
            digest = fingerprint_bytes(canonical_json(arguments))
            kept = outcome.to_dict()
            try:
                done = json.dumps({"fp": digest, "state": "done", "outcome": kept}, default=str)
            except (TypeError, ValueError, RecursionError):  # a cyclic, deep or huge result:
                kept["value"] = outcome.content  # replayed as its text
                done = json.dumps({"fp": digest, "state": "done", "outcome": kept}, default=str)
            ttl = g.config.idempotency_ttl_seconds
            yield from perform(store.put, store.aput, namespace(g), key, done, now, ttl)
        else:
            yield from perform(store.delete, store.adelete, namespace(g), key, now)
    except StoreError as exc:
        g._store_failed(exc)
