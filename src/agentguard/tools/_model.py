"""The values ToolGuard works with: a registered tool, an outcome, an error, a trace, a letter."""

from __future__ import annotations

import enum
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentguard._fingerprint import arguments_object, canonical_json, safe_canonical_text
from agentguard._frozen import fast_init
from agentguard.config import ToolBreakerConfig, ToolRetryConfig
from agentguard.resilience import Classifier

__all__ = [
    "Criticality",
    "DeadLetter",
    "Default",
    "GuardedTool",
    "HandOff",
    "ToolError",
    "ToolOutcome",
    "TraceEntry",
]


class Criticality(str, enum.Enum):
    """How much the agent needs a tool; sets its timeout tier (``tools.timeouts``)."""

    BLOCKING = "blocking"  # the agent cannot go on without it
    ENHANCING = "enhancing"  # it improves the answer
    OPTIONAL = "optional"  # nice to have


@dataclass(frozen=True, slots=True)
class Default:
    """A fallback that is a value, not a tool: ``fallbacks=["cache", Default([])]``.

    Attributes:
        value: what the call returns when everything before it in the chain failed.
    """

    value: Any


#: Error kinds of a tool that was not run, besides the error classes of one that failed.
REFUSALS = frozenset(
    {
        "breaker_open",
        "loop_detected",
        "not_approved",
        "duplicate_in_flight",
        "idempotency_conflict",
        "unknown_tool",
    }
)


@dataclass(frozen=True, slots=True)
class ToolError:
    """A structured error meant for the model: what failed, and what it can do about it.

    Attributes:
        kind: an error class (``transient``, ``rate_limited``, ``timeout``, ``client_error``,
            ``schema``, ``permanent``) or a refusal (``breaker_open``, ``loop_detected``,
            ``not_approved``, ``duplicate_in_flight``, ``idempotency_conflict``,
            ``unknown_tool``).
        tool: the tool called.
        message: the explanation, written for the model.
        retryable: whether calling the tool again (later) can help.
        retry_after: seconds to wait before calling again, when known.
        status_code: the HTTP status, when there was one.
        breaker: the tool's breaker state (``closed``, ``open``, ``half_open``).
        retry_at: when an open breaker lets a probe through (the guard's clock).
        alternatives: other tools the model may use instead.
        budget_exhausted: the turn's retry budget was spent: the guard stopped retrying.
    """

    kind: str
    tool: str
    message: str
    retryable: bool = False
    retry_after: float | None = None
    status_code: int | None = None
    breaker: str = "closed"
    retry_at: float | None = None
    alternatives: tuple[str, ...] = ()
    budget_exhausted: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON-ready data, with empty fields left out."""
        data = {"error": self.kind, **asdict(self)}
        del data["kind"]
        data["alternatives"] = list(self.alternatives)
        return {k: v for k, v in data.items() if v not in (None, (), [], False)}


@fast_init
@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a guarded call came to.

    Attributes:
        tool: the tool called.
        ok: it returned a value (perhaps a fallback's).
        value: the value (``None`` on failure).
        error: the structured error for the model (``None`` on success).
        attempts: attempts made, every tool of the fallback chain counted (0: never run).
        elapsed: seconds spent, waits included.
        fallback: the fallback that answered (a tool name or ``"default"``), else ``None``.
        replayed: the stored outcome of an earlier call with the same idempotency key.
        hint: a loop detector's warning to pass on to the model, else ``""``.
    """

    tool: str
    ok: bool
    value: Any = None
    error: ToolError | None = None
    attempts: int = 0
    elapsed: float = 0.0
    fallback: str | None = None
    replayed: bool = False
    hint: str = ""

    @property
    def content(self) -> str:
        """The text to put in the tool message: the value (JSON unless a string) or the error."""
        if self.ok:
            text = self.value if isinstance(self.value, str) else _json(self.value)
        else:
            assert self.error is not None
            text = _json(self.error.to_dict())
        return f"{text}\n\n[agentguard] {self.hint}" if self.hint else text

    def to_message(self, tool_call_id: str) -> dict[str, Any]:
        """The OpenAI-format ``tool`` message answering the call ``tool_call_id``."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.content}

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON-ready data (the form idempotency replays keep)."""
        return {
            "tool": self.tool,
            "ok": self.ok,
            "value": self.value,
            "error": None if self.error is None else asdict(self.error),
            "attempts": self.attempts,
            "elapsed": self.elapsed,
            "fallback": self.fallback,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, replayed: bool = False) -> ToolOutcome:
        """Rebuild an outcome from :meth:`to_dict` data."""
        error = data.get("error")
        if error is not None:
            error = ToolError(**{**error, "alternatives": tuple(error["alternatives"])})
        return cls(
            data["tool"],
            data["ok"],
            data.get("value"),
            error,
            data.get("attempts", 0),
            data.get("elapsed", 0.0),
            data.get("fallback"),
            replayed,
        )


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):  # cyclic, deep, a number too long
        return safe_canonical_text(value)


@fast_init
@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One guarded call of a turn, as the hand-off payload shows it.

    Attributes:
        tool: the tool called.
        arguments: the arguments it was called with.
        ok: whether it returned a value.
        error: the error kind on failure.
        attempts: attempts made.
        elapsed: seconds spent.
        fallback: the fallback that answered, if any.
    """

    tool: str
    arguments: Mapping[str, Any]
    ok: bool
    error: str | None
    attempts: int
    elapsed: float
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class HandOff:
    """What a person is shown when ToolGuard hands a decision over.

    Attributes:
        reason: ``retry_budget_exhausted``, ``breaker_open`` (a blocking tool's) or
            ``high_risk`` (the tool is about to run: the callback's truthy answer approves it).
        tool: the tool concerned.
        arguments: its arguments.
        error: the error that led here (``None`` for ``high_risk``).
        trace: every guarded call of the turn so far, in order.
        reasoning: the model's last reasoning, as given to the turn.
        turn: the turn's id.
        session: the session, when known.
    """

    reason: str
    tool: str
    arguments: Mapping[str, Any]
    error: ToolError | None
    trace: tuple[TraceEntry, ...]
    reasoning: str | None
    turn: str
    session: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A call that failed for good, kept for inspection and manual replay.

    Attributes:
        id: the letter's id (pass it to ``ToolGuard.replay``).
        tool: the tool called.
        arguments: the arguments.
        errors: each attempt's classified error (``{"error_class", "reason", "status_code"}``).
        attempts: attempts made.
        at: when it was recorded (the guard's clock).
        idempotency_key: the key a replay reuses (side-effecting tools).
        turn: the agent turn it failed in.
        session: the session, when known.
    """

    id: str
    tool: str
    arguments: Mapping[str, Any]
    errors: tuple[Mapping[str, Any], ...]
    attempts: int
    at: float
    idempotency_key: str | None = None
    turn: str | None = None
    session: str | None = None

    def to_json(self) -> str:
        """The letter as JSON (how a store keeps it)."""
        data = asdict(self)
        data["arguments"] = json.loads(canonical_json(self.arguments))
        return json.dumps(data, default=str)

    @classmethod
    def from_json(cls, text: str) -> DeadLetter:
        """A letter from :meth:`to_json` output."""
        data = json.loads(text)
        data["errors"] = tuple(data["errors"])
        return cls(**data)


@dataclass(slots=True)
class GuardedTool:
    """A registered tool and how it is guarded (see :meth:`ToolGuard.tool`).

    Attributes:
        name: the name the model calls it by.
        fn: the callable (sync or async), called with the arguments as keywords.
        criticality: its timeout tier.
        timeout: seconds per attempt (``None``: untimed).
        side_effecting: it changes something (sends, writes, pays): idempotency keys apply and
            retries need ``idempotent`` (or a key the tool accepts).
        idempotent: calling it twice does no more than once.
        high_risk: a person approves each call through the hand-off callback.
        fallbacks: tool names and :class:`Default` values tried in order when it fails.
        retry: its retry settings.
        breaker: its breaker settings.
        volatile_fields: result fields that change without meaning progress (loop detection).
        validate_result: checks a result (raises when it no longer matches its schema).
        classifiers: its own error classifiers, asked before the guard's.
        is_async: ``fn`` is a coroutine function.
        takes_key: ``fn`` accepts an ``idempotency_key`` keyword, and gets one.
    """

    name: str
    fn: Callable[..., Any]
    criticality: Criticality
    timeout: float | None
    side_effecting: bool
    idempotent: bool
    high_risk: bool
    fallbacks: tuple[str | Default, ...]
    retry: ToolRetryConfig
    breaker: ToolBreakerConfig
    volatile_fields: frozenset[str] = frozenset()
    validate_result: Callable[[Any], Any] | None = None
    classifiers: tuple[Classifier, ...] = ()
    is_async: bool = field(init=False)
    takes_key: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):  # builtins without a signature
            params = {}  # type: ignore[assignment]
        self.takes_key = "idempotency_key" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )

    @property
    def retries_safely(self) -> bool:
        """Whether any failure may be retried (else only a refusal before the work, a 429)."""
        return not self.side_effecting or self.idempotent or self.takes_key

    def fallback_names(self) -> tuple[str, ...]:
        """The tool names in the fallback chain."""
        return tuple(f for f in self.fallbacks if isinstance(f, str))


def schema_validator(schema: Mapping[str, Any] | Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A result check from a JSON schema (or a callable that raises on a bad result)."""
    if callable(schema):
        return schema
    import jsonschema  # noqa: PLC0415 - only tools with a result schema need it

    validator = jsonschema.validators.validator_for(schema)(schema)

    def check(value: Any) -> Any:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise ValueError(f"result does not match its schema at {where}: {error.message}")
        return value

    return check


decode_arguments = arguments_object  # the one argument decoder (agentguard._fingerprint)


def dead_letter_errors(classifications: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    """Each attempt's classification as plain data (for a dead letter)."""
    return tuple(
        {"error_class": c.error_class.value, "reason": c.reason, "status_code": c.status_code}
        for c in classifications
    )
