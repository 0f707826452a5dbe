"""Identities of tool calls and results: canonical fingerprints without volatile noise."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentguard._fingerprint import fingerprint

__all__ = ["DEFAULT_VOLATILE_FIELDS", "ToolLoopPolicy", "call_fingerprint", "result_fingerprint"]

#: Result fields that change on every call without meaning progress (compared case- and
#: separator-insensitively: ``requestId``, ``request-id`` and ``request_id`` are one field).
DEFAULT_VOLATILE_FIELDS: frozenset[str] = frozenset(
    {
        "id", "uuid", "requestid", "runid", "messageid", "traceid", "spanid", "correlationid",
        "timestamp", "ts", "time", "date", "created", "createdat", "updatedat", "modifiedat",
        "checkedat", "fetchedat", "servertime", "pid", "duration", "durationms", "elapsed",
        "elapsedms", "latency", "latencyms", "took", "tookms", "etag",
    }
)  # fmt: skip

# Timestamps and identifiers inside free text results.
_TEXT_NOISE = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
    r"|\b[0-9a-f]{24,}\b",
    re.I,
)


def _field(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


@dataclass(frozen=True, slots=True)
class ToolLoopPolicy:
    """How the LoopDetector judges one tool.

    Attributes:
        name: the tool name.
        volatile_arguments: argument fields ignored in the call's identity (e.g. a ``nonce``).
        volatile_results: result fields ignored when comparing results, on top of
            :data:`DEFAULT_VOLATILE_FIELDS`.
        polling: the tool is meant to be called repeatedly with the same arguments (a job status);
            identical calls are then judged only by their results, never by count alone.
        fingerprint: maps a result to the part that signals progress (e.g. ``lambda r:
            r["state"]``); its return value is fingerprinted instead of the whole result.
    """

    name: str
    volatile_arguments: frozenset[str] = frozenset()
    volatile_results: frozenset[str] = frozenset()
    polling: bool = False
    fingerprint: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        # Field names are compared case- and separator-insensitively, like the defaults.
        for attr in ("volatile_arguments", "volatile_results"):
            object.__setattr__(self, attr, frozenset(map(_field, getattr(self, attr))))


def _decode(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("{", "["):
            try:
                return json.loads(stripped)
            except ValueError:
                return value
    return value


def _strip(value: Any, volatile: frozenset[str]) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip(v, volatile) for k, v in value.items() if _field(str(k)) not in volatile}
    if isinstance(value, (list, tuple)):
        return [_strip(v, volatile) for v in value]
    if isinstance(value, str):
        return _TEXT_NOISE.sub("<v>", value)
    return value


def call_fingerprint(name: str, arguments: Any, policy: ToolLoopPolicy | None = None) -> str:
    """The identity of a call: tool name plus canonical arguments (dict or JSON text alike)."""
    args = _decode(arguments)
    if policy is not None and policy.volatile_arguments and isinstance(args, Mapping):
        args = {k: v for k, v in args.items() if _field(str(k)) not in policy.volatile_arguments}
    return fingerprint([name, args])


def result_fingerprint(result: Any, policy: ToolLoopPolicy | None = None) -> str:
    """The identity of a result with volatile fields, timestamps and ids removed."""
    if policy is not None and policy.fingerprint is not None:
        return fingerprint(policy.fingerprint(_decode(result)))
    volatile = DEFAULT_VOLATILE_FIELDS
    if policy is not None and policy.volatile_results:
        volatile = volatile | policy.volatile_results
    return fingerprint(_strip(_decode(result), volatile))


def policies_from(
    tools: Iterable[Any] | Mapping[str, Any] | None,
) -> tuple[dict[str, ToolLoopPolicy], frozenset[str] | None]:
    """Split ``tools`` into per-tool policies and, when OpenAI tool schemas are given, known names.

    ``tools`` may be a mapping of name to :class:`ToolLoopPolicy`, or an iterable mixing
    policies and OpenAI-format tool schemas (``{"type": "function", "function": {"name": ...}}``).
    """
    policies: dict[str, ToolLoopPolicy] = {}
    known: set[str] | None = None
    items: Iterable[Any] = tools.values() if isinstance(tools, Mapping) else (tools or ())
    for item in items:
        if isinstance(item, ToolLoopPolicy):
            policies[item.name] = item
        elif isinstance(item, Mapping):
            fn = item.get("function", item)
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str):
                raise TypeError(f"tool schema without a function name: {sorted(item)!r}")
            known = (known or set()) | {name}
        else:
            raise TypeError(f"expected ToolLoopPolicy or an OpenAI tool schema, got {type(item)!r}")
    return policies, (frozenset(known) if known is not None else None)
