"""The values the ``TokenLedger`` hands out: reservations, settlements, snapshots and quotes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentguard._frozen import fast_init
from agentguard.types import Usage

__all__ = ["Decision", "Quote", "Reservation", "Settlement", "UsageSnapshot"]

#: What the budget policy says about a reservation, in increasing order of concern.
Decision = Literal["ok", "warn", "escalate"]


@fast_init
@dataclass(frozen=True, slots=True)
class Reservation:
    """Tokens held for one model call, and the policy's decision about it.

    Attributes:
        id: unique id; also the default event id of its commit.
        session: the session charged.
        tokens: tokens held: ``prompt_tokens`` plus the output held — all of
            ``output_tokens`` under ``reserve: strict``, a learned estimate of it (at most
            ``output_tokens``) under ``reserve: learned``.
        prompt_tokens: the estimated prompt tokens reserved.
        output_tokens: the output tokens the call may use: its worst case, checked against the
            budgets (the request's cap lowered to the configured one); ``0`` when no output
            limit was given.
        model: the model the call is priced as, if given.
        expires_at: wall-clock end of the lease; after it the tokens return to the budget.
        decision: ``"ok"``, ``"warn"`` (a budget passed its warning ratio, or is exhausted
            under ``warn_and_continue``) or ``"escalate"`` (exhausted under ``escalate``: move
            the rest of the session to a cheaper tier).
        budget: the budget behind a non-``ok`` decision (``"session"`` or ``"hour"``).
        session_used: session tokens committed and held, this reservation included.
        session_limit: the session budget, or ``None``.
        hour_used: rolling-window tokens committed and held, this reservation included.
        hour_limit: the hourly budget, or ``None``.
    """

    id: str
    session: str
    tokens: int
    prompt_tokens: int
    output_tokens: int
    model: str | None
    expires_at: float
    decision: Decision = "ok"
    budget: str | None = None
    session_used: int = 0
    session_limit: int | None = None
    hour_used: int = 0
    hour_limit: int | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Settlement:
    """The outcome of a commit.

    Attributes:
        reservation_id: the reservation settled.
        event_id: the idempotency key the usage was counted under.
        counted: ``False`` when this event id had been counted before (nothing changed).
        usage: the usage committed (``usage.estimated`` when it was estimated).
        cost: its price in the price table's currency.
        overrun: tokens used beyond the reservation (the estimate was too low); counted, and
            later reservations see them.
        session_tokens: the session's committed tokens afterwards.
        hour_tokens: the rolling window's committed tokens afterwards.
    """

    reservation_id: str
    event_id: str
    counted: bool
    usage: Usage
    cost: float
    overrun: int
    session_tokens: int
    hour_tokens: int


@fast_init
@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    """Tokens and cost of a session and of the rolling hour, at one moment.

    Attributes:
        session: the session, or ``None`` for the window alone.
        at: wall-clock time of the snapshot.
        session_tokens: tokens committed by the session.
        session_reserved: tokens the session holds in live reservations.
        session_cost: cost of the session's committed tokens.
        session_limit: the session budget, or ``None``.
        hour_tokens: tokens committed in the rolling hour, by every session.
        hour_reserved: tokens held in live reservations, by every session.
        hour_cost: cost of the rolling hour's committed tokens.
        hour_limit: the hourly budget, or ``None``.
    """

    session: str | None
    at: float
    session_tokens: int
    session_reserved: int
    session_cost: float
    session_limit: int | None
    hour_tokens: int
    hour_reserved: int
    hour_cost: float
    hour_limit: int | None

    @property
    def session_remaining(self) -> int | None:
        """Tokens the session may still reserve, or ``None`` without a session budget."""
        if self.session_limit is None:
            return None
        return max(0, self.session_limit - self.session_tokens - self.session_reserved)

    @property
    def hour_remaining(self) -> int | None:
        """Tokens the rolling hour still has room for, or ``None`` without an hourly budget."""
        if self.hour_limit is None:
            return None
        return max(0, self.hour_limit - self.hour_tokens - self.hour_reserved)


@fast_init
@dataclass(frozen=True, slots=True)
class Quote:
    """What a further call would cost, and whether the budgets have room for it (nothing held).

    Attributes:
        tokens: the tokens asked about.
        cost: their price for the model asked about.
        fits: whether a reservation of ``tokens`` would pass no limit right now.
        budget: the first budget it would pass, or ``None``.
        snapshot: the usage the answer is based on.
    """

    tokens: int
    cost: float
    fits: bool
    budget: str | None
    snapshot: UsageSnapshot = field(repr=False)
