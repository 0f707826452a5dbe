"""The exceptions agentguard raises.

Every exception derives from one root, so ``except agentguard.AgentGuardError`` catches all of
them. The tree::

    AgentGuardError
    ├── ConfigError              a configuration value is invalid (also a ValueError)
    ├── ToolSchemaError          a tool definition cannot be used (also a ValueError)
    ├── LoopDetected             the guard refused to continue a loop
    ├── BudgetExceeded           a token budget is spent (hard_stop policy)
    ├── EscalationRequired       confirm mode: the user must choose retry / backup / cancel
    ├── TiersExhausted           every tier of the chain failed (carries the attempt history)
    ├── ToolValidationFailed     tool calls still invalid after every correction
    ├── ModelError               a model endpoint answered with an error (status, headers)
    │   └── ModelTimeout         ... or did not answer in time (also a TimeoutError)
    └── StoreError               a state store failed
        └── StoreUnavailable     the store cannot be reached

Each exception carries the structured context a caller needs to act (which key, which budget,
when it resets ...) as attributes; the message repeats it for people. No exception text ever
contains a secret: every message passes :func:`agentguard._redact.redact` (the secrets the guard
was configured with, and anything that looks like a key) when the exception is made.

Every error a guarded call raises also carries the guard's work up to that point, as Instructor's
errors carry ``n_attempts`` / ``total_usage``: :attr:`AgentGuardError.attempts`,
:attr:`~AgentGuardError.n_attempts`, :attr:`~AgentGuardError.total_usage`,
:attr:`~AgentGuardError.total_cost` and the whole :class:`~agentguard.GuardReport` as
:attr:`~AgentGuardError.agentguard_report`. An upstream error the guard lets through keeps its
own type (``openai.APIStatusError`` ...) and gets the same record as an ``agentguard_report``
attribute and a note in its traceback (``add_note``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentguard._exports import publish
from agentguard._redact import redact

from .types import Attempt, Usage

if TYPE_CHECKING:
    from .guard import GuardReport
    from .types import EscalationPrompt

__all__ = [
    "AgentGuardError",
    "BudgetExceeded",
    "ConfigError",
    "EscalationRequired",
    "LoopDetected",
    "ModelError",
    "ModelTimeout",
    "StoreError",
    "StoreUnavailable",
    "TiersExhausted",
    "ToolSchemaError",
    "ToolValidationFailed",
]


class AgentGuardError(Exception):
    """The root of every exception agentguard raises.

    Raised by a guarded call, it carries what the guard did before giving up (empty when the
    error did not come from a guarded call, e.g. a :class:`ConfigError`).

    Attributes:
        attempts: every model call made, in order (tier, model, what happened).
        agentguard_report: the guard's whole record of the call (session, retries,
            corrections, usage, cost, warnings ...), or ``None``.
    """

    attempts: tuple[Attempt, ...] = ()

    @property
    def agentguard_report(self) -> GuardReport | None:
        """The guard's record of the call, or ``None`` (see the class docstring)."""
        report: GuardReport | None = self.__dict__.get("_agentguard_report")
        return report

    @agentguard_report.setter
    def agentguard_report(self, report: GuardReport | None) -> None:
        # a property, not an annotated attribute: GuardReport lives above this module, and
        # typing.get_type_hints(AgentGuardError) must resolve without importing it
        self.__dict__["_agentguard_report"] = report

    @property
    def n_attempts(self) -> int:
        """How many model calls were made (Instructor's name)."""
        return len(self.attempts)

    @property
    def total_usage(self) -> Usage:
        """Tokens spent by every attempt, the failed ones included (Instructor's name)."""
        report = self.agentguard_report
        return report.usage if report is not None else Usage()

    @property
    def total_cost(self) -> float | None:
        """Their cost from the price table, or ``None`` when no price applies."""
        report = self.agentguard_report
        return report.cost if report is not None else None

    def __init__(self, *args: object) -> None:
        # The one place every message passes: a secret echoed by an upstream, a store or a
        # caller's value never reaches str(), repr() or args.
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))

    def __reduce__(self) -> tuple[Any, ...]:
        # The default calls cls(*args), but subclasses take other arguments than their message:
        # rebuild from the state instead, so every exception survives pickling (process pools,
        # task queues) with its attributes.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[AgentGuardError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    error.args = args  # set here: OSError's __new__ (ModelTimeout) leaves it to __init__
    error.__dict__.update(state)
    return error


class ConfigError(AgentGuardError, ValueError):
    """A configuration is invalid.

    Attributes:
        problems: one entry per problem, each with ``path`` (dotted key path, e.g.
            ``reliability.loop_detection.window_size``), ``value`` (the offending value, redacted
            when the key looks secret) and ``allowed`` (what would be accepted).
    """

    def __init__(self, problems: Sequence[Mapping[str, Any]], *, source: str | None = None) -> None:
        self.problems = [dict(p) for p in problems]
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"invalid agentguard configuration{where}:"]
        for p in self.problems:
            lines.append(f"  {p['path']}: got {p['value']!r}; {p['allowed']}")
        super().__init__("\n".join(lines))


class ToolSchemaError(AgentGuardError, ValueError):
    """A tool definition cannot be used (raised once, when the tools are registered).

    Attributes:
        tool_name: the tool whose definition is wrong (``None`` when it has no usable name).
        problem: what is wrong with it.
    """

    def __init__(self, tool_name: str | None, problem: str) -> None:
        self.tool_name = tool_name
        self.problem = problem
        name = repr(tool_name) if tool_name is not None else "(unnamed)"
        super().__init__(f"tool {name}: {problem}")


class LoopDetected(AgentGuardError):
    """The guard refused to continue: the agent is looping.

    Attributes:
        detector: which detector fired (``generic_repeat``, ``poll_no_progress`` ...).
        count: how many times the repeated pattern was seen.
        message: the explanation, fit to show to the model or a person.
        retry_after: seconds after which trying again may make sense, or ``None``.
        session: the session the loop happened in, when known.
        tool: the tool being called in a loop, or ``None`` when the loop is in the text.
    """

    def __init__(
        self,
        message: str,
        *,
        detector: str,
        count: int,
        retry_after: float | None = None,
        session: str | None = None,
        tool: str | None = None,
    ) -> None:
        self.message = message
        self.detector = detector
        self.count = count
        self.retry_after = retry_after
        self.session = session
        self.tool = tool
        super().__init__(message)

    def to_error(self) -> dict[str, Any]:
        """The structured error an agent framework can act on."""
        return {
            "type": "loop_detected",
            "message": self.message,
            "detector": self.detector,
            "tool": self.tool,
            "count": self.count,
            "retry_after": self.retry_after,
        }


class BudgetExceeded(AgentGuardError):
    """A token budget is spent and the policy is ``hard_stop``.

    Attributes:
        budget: which budget: ``"session"``, ``"hour"`` or ``"request"``.
        used: tokens counted against it (committed plus reserved).
        requested: tokens the refused request asked for.
        limit: the budget's limit.
        resets_at: wall-clock time (seconds since the epoch) when enough of the budget is free
            again, or ``None`` when it never resets by itself (a session budget).
        session: the session, when the budget is a session budget.
    """

    def __init__(
        self,
        *,
        budget: str,
        used: int,
        requested: int,
        limit: int,
        resets_at: float | None,
        session: str | None = None,
    ) -> None:
        self.budget = budget
        self.used = used
        self.requested = requested
        self.limit = limit
        self.resets_at = resets_at
        self.session = session
        who = f" for session {session!r}" if session is not None and budget == "session" else ""
        when = "never resets by itself" if resets_at is None else f"frees up at t={resets_at:.0f}"
        super().__init__(
            f"{budget} token budget{who} exceeded: {used} used + {requested} requested "
            f"> limit {limit} ({when})"
        )


class EscalationRequired(AgentGuardError):
    """Confirm mode: the guard will not change tier without the user's word.

    Raised when ``escalation.mode`` is ``confirm`` and no callback was given. Catch it, show
    ``prompt.render()`` (the reason, the options and the tokens and cost spent so far), and call
    again with the user's choice.

    Attributes:
        prompt: the :class:`~agentguard.escalation.EscalationPrompt` with reason, current and
            proposed tier, options, tokens and cost spent.
    """

    def __init__(self, prompt: EscalationPrompt) -> None:
        self.prompt = prompt
        super().__init__(prompt.render())


class TiersExhausted(AgentGuardError):
    """Every tier that could serve the request failed.

    Attributes:
        attempts: one :class:`~agentguard.escalation.Attempt` per try, in order (tier, model,
            what went wrong).
        reason: the last failure's trigger (``server_error``, ``tool_validation_failure`` ...).
    """

    def __init__(self, attempts: Sequence[Attempt], reason: str) -> None:
        self.attempts = tuple(attempts)
        self.reason = reason
        tried = ", ".join(f"{a.tier} ({a.outcome})" for a in self.attempts) or "none"
        super().__init__(
            f"no tier could serve the request (last failure: {reason}); tried: {tried}"
        )


class ToolValidationFailed(AgentGuardError):
    """The model's tool calls were still invalid after local repair and every corrective re-ask.

    Attributes:
        report: the last :class:`~agentguard.validation.ValidationReport`, whose ``errors``
            say what is wrong with each call.
    """

    def __init__(self, report: Any) -> None:
        self.report = report
        errors = list(getattr(report, "errors", ()))
        shown = "; ".join(str(getattr(e, "message", e)) for e in errors[:3])
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(f"tool calls still invalid after corrections: {shown}{more}")


class _Response:
    """The part of an HTTP response that error classification reads (``.headers``)."""

    __slots__ = ("headers", "status_code")

    def __init__(self, status_code: int | None, headers: Mapping[str, str]) -> None:
        self.status_code = status_code
        self.headers = headers


class ModelError(AgentGuardError):
    """A model endpoint answered with an error.

    Raised by transports that have no SDK exceptions of their own (e.g. the scripted model);
    the openai transport lets the SDK's own exceptions through. Shaped like them: the status is
    ``status_code`` and the headers (``Retry-After`` ...) are ``response.headers``.

    Attributes:
        status_code: the HTTP status, or ``None`` when there was no answer.
        response: an object with ``status_code`` and ``headers``.
        model: the model the request was for.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None,
        headers: Mapping[str, str] | None = None,
        model: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.response = _Response(status_code, dict(headers or {}))
        self.model = model
        super().__init__(message)


class ModelTimeout(ModelError, TimeoutError):
    """A model endpoint did not answer in time."""

    def __init__(self, message: str, *, model: str | None = None) -> None:
        super().__init__(message, status_code=None, model=model)


class StoreError(AgentGuardError):
    """A state store (SQLite, Redis ...) failed."""


class StoreUnavailable(StoreError):
    """The state store cannot be reached (raised only when configured fail-closed)."""


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
