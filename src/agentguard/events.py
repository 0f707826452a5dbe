"""Events: every decision the guard takes is a frozen dataclass handed to hooks.

A hook is any callable taking one event. Hooks are registered per instance (the ``hooks=``
argument of every component) and per process (:func:`add_hook`); the process default logs each
event through the stdlib logger ``"agentguard"``. A failing hook is logged and otherwise ignored:
observability never breaks the agent.

Events carry no secrets: components build them from redacted values, and the free-text fields
(an exception's message ...) pass :func:`agentguard._redact.redact` once more when the event is
made, so neither a hook nor the log it feeds ever sees a configured secret.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from agentguard._exports import publish
from agentguard._redact import redact

__all__ = [
    "BreakerStateChanged",
    "BudgetExhausted",
    "BudgetWarning",
    "CorrectionRequested",
    "Emitter",
    "Escalated",
    "Event",
    "GuardInternalError",
    "HandOffRequested",
    "Hook",
    "LoopFlagged",
    "LoopRecovery",
    "MemoryPressureChanged",
    "QualityDegraded",
    "RetryBudgetExhausted",
    "StoreFallback",
    "StoreRecovered",
    "ToolCallFailed",
    "ToolCallRefused",
    "ToolCallRejected",
    "ToolCallRepaired",
    "ToolCallReplayed",
    "ToolCallRetried",
    "ToolCallStarted",
    "ToolCallSucceeded",
    "ToolDeadLettered",
    "ToolFallbackUsed",
    "UsageCorrected",
    "add_hook",
    "default_hooks",
    "log_event",
    "remove_hook",
]

logger = logging.getLogger("agentguard")
# A library does not print: without logging configured by the application, events go nowhere.
logger.addHandler(logging.NullHandler())


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """The base of every event.

    Attributes:
        session: the session (agent run) the decision belongs to, when known.
    """

    #: Short, stable name of the event kind, used in logs and JSON (``"loop_detected"`` ...).
    kind: ClassVar[str] = "event"
    #: The stdlib logging level the default hook logs it at.
    level: ClassVar[int] = logging.INFO

    session: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The event as plain JSON-ready data, with its ``kind``."""
        data: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            data[f.name] = _plain(getattr(self, f.name))
        return data


def _redact_message(event: Any) -> None:
    """What ``__post_init__`` does for the events with a free-text ``message`` (an exception's
    text ...): redact it when the event is made, the last gate before hooks and logs, whoever
    built it. Only those events have one, so the others are made at no extra cost."""
    if isinstance(event.message, str):
        object.__setattr__(event, "message", redact(event.message))


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        return [_plain(v) for v in value]
    return str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardInternalError(Event):
    """agentguard itself failed; the protected call went through unguarded (fail-open).

    Attributes:
        component: where the fault happened.
        error_type: the exception's class name.
        message: the exception's (redacted) message.
    """

    kind: ClassVar[str] = "guard_internal_error"
    level: ClassVar[int] = logging.ERROR

    component: str
    error_type: str
    message: str

    def __post_init__(self) -> None:
        _redact_message(self)


class Hook(Protocol):
    """Receives events. Must not raise (if it does, the error is logged and ignored)."""

    def __call__(self, event: Event, /) -> None: ...


def log_event(event: Event) -> None:
    """The process-default hook: log ``event`` through the ``"agentguard"`` logger."""
    if not logger.isEnabledFor(event.level):
        return
    fields = " ".join(
        f"{k}={v!r}" for k, v in event.to_dict().items() if k != "kind" and v is not None
    )
    logger.log(event.level, "%s %s", event.kind, fields, extra={"agentguard_event": event})


_lock = threading.Lock()
_defaults: tuple[Hook, ...] = (log_event,)


def add_hook(hook: Hook) -> None:
    """Add a process-wide hook that receives every event of every component."""
    global _defaults  # noqa: PLW0603 - a copy-on-write registry, swapped atomically
    with _lock:
        _defaults = (*_defaults, hook)


def remove_hook(hook: Hook) -> None:
    """Remove a process-wide hook added with :func:`add_hook` (no error if absent)."""
    global _defaults  # noqa: PLW0603
    with _lock:
        hooks = list(_defaults)
        if hook in hooks:
            hooks.remove(hook)
        _defaults = tuple(hooks)


def default_hooks() -> tuple[Hook, ...]:
    """The process-wide hooks, in the order they are called."""
    return _defaults


class Emitter:
    """Delivers events to a component's own hooks, then to the process-wide hooks.

    Args:
        hooks: the instance's hooks.
        use_defaults: also call the process-wide hooks (the default).
    """

    __slots__ = ("_hooks", "_use_defaults")

    def __init__(self, hooks: Iterable[Hook] | None = None, *, use_defaults: bool = True) -> None:
        self._hooks = tuple(hooks or ())
        self._use_defaults = use_defaults

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """The instance's own hooks."""
        return self._hooks

    @property
    def active(self) -> bool:
        """Whether an emitted event reaches any hook (an event nobody hears need not be built)."""
        return bool(self._hooks) or (self._use_defaults and bool(_defaults))

    def emit(self, event: Event) -> None:
        """Hand ``event`` to every hook; a hook that raises is logged and skipped."""
        hooks = self._hooks + _defaults if self._use_defaults else self._hooks
        for hook in hooks:
            try:
                hook(event)
            except Exception:  # observability must never break the agent
                logger.warning("agentguard hook %r failed on %s", hook, event.kind, exc_info=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPressureChanged(Event):
    """The host's memory-pressure level changed.

    Attributes:
        pressure: the new level (``normal``, ``warning``, ``critical``, ``unknown``).
        previous: the level before.
        source: where it was read (``cgroup``, ``psi``, ``macos``, ``psutil``, ``none``).
    """

    kind: ClassVar[str] = "memory_pressure_changed"
    level: ClassVar[int] = logging.WARNING

    pressure: str
    previous: str
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class QualityDegraded(Event):
    """A model server answered, but what it answered shows its quality dropping.

    Attributes:
        tier: the tier that answered.
        signal: ``prompt_truncated``, ``stopped_parsing``, ``context_overflow`` or ``runaway``.
        detail: what was measured (token counts, failures in a row).
        sustained: the signals in the tier's recent window reached ``sustained_count``.
    """

    kind: ClassVar[str] = "quality_degraded"
    level: ClassVar[int] = logging.WARNING

    tier: str
    signal: str
    detail: str
    sustained: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerStateChanged(Event):
    """A circuit breaker changed state.

    Attributes:
        name: what the breaker protects (``tier:fast``, ``tool:search`` ...).
        previous: the state before (``closed``, ``open``, ``half_open``).
        state: the new state.
        failure_rate: the failure rate in its window when it changed.
        retry_at: when an open breaker will let a probe through (clock seconds), if open.
    """

    kind: ClassVar[str] = "breaker_state_changed"
    level: ClassVar[int] = logging.WARNING

    name: str
    previous: str
    state: str
    failure_rate: float
    retry_at: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopFlagged(Event):
    """The LoopDetector judged a tool call, tool result or text above ``OK``.

    Attributes:
        detector: which detector fired (``"poll_no_progress"``, ``"cycle"`` ...).
        severity: ``"warning"``, ``"critical"`` or ``"break"``.
        count: the repetition count the severity was judged on.
        tool: the tool name, or ``None`` for text detectors.
        message: the hint shown to the model (built from tool names and counts only).
    """

    kind: ClassVar[str] = "loop_flagged"
    level: ClassVar[int] = logging.WARNING

    detector: str
    severity: str
    count: int
    tool: str | None = None
    message: str = ""

    def __post_init__(self) -> None:
        _redact_message(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopRecovery(Event):
    """The guard took a rung of its loop recovery ladder for a looping run (``docs/loops.md``).

    Attributes:
        rung: ``hint``, ``summary``, ``prune``, ``force``, ``escalate`` or ``stop``.
        detector: the detector whose verdict it answers (``provider_refusal`` when the upstream
            refused the conversation as a loop).
        severity: the verdict's severity (``warning``, ``critical`` or ``break``).
        count: the verdict's repetition count.
        tool: the tool the loop is on, or ``None`` for text.
    """

    kind: ClassVar[str] = "loop_recovery"
    level: ClassVar[int] = logging.WARNING

    rung: str
    detector: str
    severity: str
    count: int = 0
    tool: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRepaired(Event):
    """A tool call was repaired locally, at no token cost.

    Attributes:
        repair: what was repaired (``extracted_from_text``, ``json_repaired``, ``tool_name`` ...).
        tool_call_id: the call concerned.
        path: where in the call.
    """

    kind: ClassVar[str] = "tool_call_repaired"

    repair: str
    tool_call_id: str | None
    path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRejected(Event):
    """A tool call is invalid and could not be repaired without guessing.

    Attributes:
        error: the error kind (``unknown_tool``, ``missing_required`` ...).
        tool_call_id: the call concerned.
        tool_name: the tool as the model named it (truncated).
        path: where in the call.
    """

    kind: ClassVar[str] = "tool_call_rejected"
    level: ClassVar[int] = logging.WARNING

    error: str
    tool_call_id: str | None
    tool_name: str
    path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrectionRequested(Event):
    """The answer's tool calls are invalid: the guard re-asks the same tier, naming each error.

    Attributes:
        error: the first error's kind (``missing_required``, ``unknown_tool`` ...).
        errors: how many errors the correction names.
        correction: which re-ask of this call it is (1 for the first).
        tier: the tier asked again.
    """

    kind: ClassVar[str] = "correction_requested"
    level: ClassVar[int] = logging.WARNING

    error: str
    errors: int
    correction: int
    tier: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Escalated(Event):
    """A guarded call moved to another model tier.

    Attributes:
        from_tier: the tier it left.
        to_tier: the tier it moved to.
        reason: the trigger (``server_error``, ``tool_validation_failure``, ``budget`` ...).
    """

    kind: ClassVar[str] = "escalated"
    level: ClassVar[int] = logging.WARNING

    from_tier: str
    to_tier: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetWarning(Event):
    """The usage counted against a token budget passed its warning ratio.

    Said once per passing, by the commit that takes the budget's committed tokens to
    ``warn_ratio * limit`` or past it — whichever guard, ledger or process sharing the store
    made it: committed usage only grows and every commit is one atomic step of the store. So a
    session's budget warns once (again only if the session is forgotten after
    ``session_ttl_seconds`` and starts over), and the rolling hour once each time its usage
    passes the line after having fallen below it as old usage left the window. Reservations
    past the line are each marked ``"warn"`` (a decision, not an event). While the store is
    unreachable each process judges on its own local totals, and may say it again.

    Attributes:
        budget: ``"session"`` or ``"hour"``.
        used: tokens committed against it, this call included.
        limit: the budget's limit.
        ratio: ``used / limit``.
    """

    kind: ClassVar[str] = "budget_warning"
    level: ClassVar[int] = logging.WARNING

    budget: str
    used: int
    limit: int
    ratio: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetExhausted(Event):
    """A token budget ran out.

    Under ``hard_stop`` it is emitted for every refused reservation (``action`` ``"refuse"``).
    Under the other policies, which go on, once per passing of the limit: by the commit that
    takes the budget's committed tokens past it, as :class:`BudgetWarning` is said (once across
    every guard sharing the store; the rolling hour again after it fell back under the limit).
    Reservations that reach past the limit are each marked ``"warn"`` or ``"escalate"`` before.

    Attributes:
        budget: ``"session"`` or ``"hour"``.
        used: tokens counted against the budget before this reservation (under ``hard_stop``:
            committed and held) or before this commit (committed).
        requested: tokens the reservation asked for, or the commit counted.
        limit: the budget's limit.
        policy: the policy in force.
        action: what happens: ``"continue"``, ``"escalate"`` or ``"refuse"``.
        resets_at: wall-clock time when the budget has room again, or ``None`` (a session
            budget never resets by itself).
    """

    kind: ClassVar[str] = "budget_exhausted"
    level: ClassVar[int] = logging.WARNING

    budget: str
    used: int
    requested: int
    limit: int
    policy: str
    action: str
    resets_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageCorrected(Event):
    """A token count the ledger was given could not be trusted and was replaced before counting.

    An upstream's usage that is negative, not a whole number, not finite or absurdly large
    (past :data:`agentguard.storage.MAX_TOKENS`) is never committed as given: the part is
    replaced by the guard's own estimate, or clamped to the maximum.

    Attributes:
        field: which number (``"prompt_tokens"``, ``"completion_tokens"``, ``"usage"``).
        reported: the number as given (its ``repr``, as it may not be a number at all).
        counted: what was counted instead.
    """

    kind: ClassVar[str] = "usage_corrected"
    level: ClassVar[int] = logging.WARNING

    field: str
    reported: str
    counted: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreFallback(Event):
    """The shared store could not be reached; the ledger serves from local state meanwhile.

    Attributes:
        store: the store's backend name.
        error_type: the failure's exception class.
        message: the failure, redacted.
    """

    kind: ClassVar[str] = "store_fallback"
    level: ClassVar[int] = logging.ERROR

    store: str
    error_type: str
    message: str

    def __post_init__(self) -> None:
        _redact_message(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreRecovered(Event):
    """The shared store is reachable again and the local usage recorded meanwhile is re-synced.

    Attributes:
        store: the store's backend name.
        outage_seconds: how long the ledger served from local state.
        resynced: commits replayed into the store (each counted once, by its event id).
    """

    kind: ClassVar[str] = "store_recovered"
    level: ClassVar[int] = logging.WARNING

    store: str
    outage_seconds: float
    resynced: int


# -- ToolGuard -------------------------------------------------------------------------------
# Tool events never carry arguments or results (they may hold secrets or personal data): the
# tool's name, the decision and its numbers only.


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStarted(Event):
    """ToolGuard took a tool call.

    Attributes:
        tool: the tool's name.
        turn: the agent turn the call belongs to.
    """

    kind: ClassVar[str] = "tool_call_started"
    level: ClassVar[int] = logging.DEBUG

    tool: str
    turn: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallSucceeded(Event):
    """A guarded tool call returned a value (perhaps through a fallback).

    Attributes:
        tool: the tool called.
        attempts: attempts made, every tool of the fallback chain counted.
        elapsed: seconds spent, waits included.
        fallback: the fallback that answered (a tool name or ``"default"``), else ``None``.
    """

    kind: ClassVar[str] = "tool_call_succeeded"
    level: ClassVar[int] = logging.DEBUG

    tool: str
    attempts: int
    elapsed: float
    fallback: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallFailed(Event):
    """A guarded tool call failed for good; the model gets a structured error.

    Attributes:
        tool: the tool called.
        error: the error kind (``timeout``, ``rate_limited``, ``breaker_open`` ...).
        retryable: whether calling again later can help.
        attempts: attempts made.
        elapsed: seconds spent.
    """

    kind: ClassVar[str] = "tool_call_failed"
    level: ClassVar[int] = logging.WARNING

    tool: str
    error: str
    retryable: bool
    attempts: int
    elapsed: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRetried(Event):
    """An attempt failed and the call is tried again after a wait.

    Attributes:
        tool: the tool called.
        attempt: the attempt that failed (1 for the first).
        error: its error class.
        delay: seconds waited before the next attempt.
        retry_after: the server's requested delay, when it asked for one.
    """

    kind: ClassVar[str] = "tool_call_retried"
    level: ClassVar[int] = logging.INFO

    tool: str
    attempt: int
    error: str
    delay: float
    retry_after: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRefused(Event):
    """A tool was not run at all.

    Attributes:
        tool: the tool named.
        reason: ``breaker_open``, ``loop_detected``, ``not_approved``, ``duplicate_in_flight``,
            ``idempotency_conflict`` or ``unknown_tool``.
        message: the explanation given to the model.
    """

    kind: ClassVar[str] = "tool_call_refused"
    level: ClassVar[int] = logging.WARNING

    tool: str
    reason: str
    message: str

    def __post_init__(self) -> None:
        _redact_message(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFallbackUsed(Event):
    """A tool failed and a fallback answered instead.

    Attributes:
        tool: the tool that failed.
        fallback: the tool that answered, or ``"default"`` for a default value.
        error: why the tool itself failed.
    """

    kind: ClassVar[str] = "tool_fallback_used"
    level: ClassVar[int] = logging.WARNING

    tool: str
    fallback: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallReplayed(Event):
    """A side-effecting call with an idempotency key already done: its stored outcome is returned.

    Attributes:
        tool: the tool called.
        key: the idempotency key (a fingerprint or the caller's key).
    """

    kind: ClassVar[str] = "tool_call_replayed"
    level: ClassVar[int] = logging.INFO

    tool: str
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolDeadLettered(Event):
    """A call that failed for good was recorded for inspection and manual replay.

    Attributes:
        tool: the tool called.
        letter: the dead letter's id.
        error: the final error kind.
        attempts: attempts made.
    """

    kind: ClassVar[str] = "tool_dead_lettered"
    level: ClassVar[int] = logging.ERROR

    tool: str
    letter: str
    error: str
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryBudgetExhausted(Event):
    """The turn's retry budget is spent: failures go back to the agent as they are.

    Emitted once per turn, by the failure that found the budget empty.

    Attributes:
        turn: the agent turn.
        total: retries the turn allowed.
        tool: the tool whose failure found the budget empty.
    """

    kind: ClassVar[str] = "retry_budget_exhausted"
    level: ClassVar[int] = logging.WARNING

    turn: str
    total: int
    tool: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HandOffRequested(Event):
    """ToolGuard handed a decision to a person (the ``on_hand_off`` callback).

    Attributes:
        reason: ``retry_budget_exhausted``, ``breaker_open`` (a blocking tool) or ``high_risk``.
        tool: the tool concerned.
        turn: the agent turn.
    """

    kind: ClassVar[str] = "hand_off_requested"
    level: ClassVar[int] = logging.WARNING

    reason: str
    tool: str
    turn: str


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
