"""``TokenLedger``: reserve before a call, settle after, against shared budgets."""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from agentguard import _clock
from agentguard.config import GuardConfig, StorageConfig, TokenBudgetConfig
from agentguard.events import (
    BudgetExhausted,
    BudgetWarning,
    Emitter,
    Hook,
    UsageCorrected,
)
from agentguard.exceptions import AgentGuardError, BudgetExceeded
from agentguard.storage import FallbackStore, Store, store_from_config, with_fallback
from agentguard.storage._base import (
    MAX_TOKENS,
    NANOS,
    BudgetSpec,
    BudgetState,
    Charge,
    Hold,
    window_resets_at,
)
from agentguard.transport import write_output_cap
from agentguard.types import Clock, Usage

from ._learned import OutputEstimate
from ._pricing import PriceTable
from ._renewer import RENEWER, LeaseRenewer
from ._values import Decision, Quote, Reservation, Settlement, UsageSnapshot

__all__ = ["InvalidTokenCount", "TokenLedger", "caller_config", "clamp_output_tokens"]

_RANK = {"ok": 0, "warn": 1, "escalate": 2}
_SPAN = 3600
_OUTPUT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


class InvalidTokenCount(AgentGuardError, ValueError):
    """A token count passed to the ledger is not a whole number in ``[0, MAX_TOKENS]``.

    Raised where the caller passed it (``reserve``, ``commit``, ``output_cap``); nothing is
    held or counted. A ``ValueError`` too, for callers that catch that.
    """


def _whole(value: object) -> bool:
    """A plain integer (``bool`` is not a token count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(value: object, what: str) -> int:
    """A caller's token count, or :class:`InvalidTokenCount`."""
    if not _whole(value) or not 0 <= value <= MAX_TOKENS:  # type: ignore[operator]
        raise InvalidTokenCount(
            f"{what} must be a whole number from 0 to {MAX_TOKENS:,} (got {value!r})"
        )
    return value  # type: ignore[return-value]


def clamp_output_tokens(
    request: Mapping[str, Any],
    cap: int | None,
    *,
    default_key: str | None = "max_completion_tokens",
) -> dict[str, Any]:
    """A copy of a chat request whose output limit is at most ``cap``.

    ``max_tokens``, ``max_completion_tokens`` and (Responses API) ``max_output_tokens`` are each
    lowered to ``cap`` when present and larger. When none is present, ``default_key`` (if not
    ``None``) is set to ``cap``: ``max_completion_tokens`` by default, which every current chat
    model accepts (OpenAI's reasoning models reject ``max_tokens``); pass
    ``"max_output_tokens"`` for a Responses API request.

    Args:
        request: the request's keyword arguments (OpenAI chat format).
        cap: the output cap (:meth:`TokenLedger.output_cap`); ``None`` or ``0`` changes nothing.
        default_key: the key to add when the request sets no limit.
    """
    out = dict(request)
    write_output_cap(out, cap, _OUTPUT_KEYS, default_key)
    return out


def caller_config(config: GuardConfig, caller: str) -> GuardConfig:
    """``config`` with budgets of ``caller``'s own (a fingerprint, see ``caller_scope``): its
    ``token_budget.scope`` extended by the caller, so that one caller's sessions and hours never
    count against another's on a shared store (``agentguard serve``, the LiteLLM proxy)."""
    budget = config.token_budget
    scoped = budget.model_copy(update={"scope": f"{budget.scope}:{caller}"})
    return config.model_copy(update={"token_budget": scoped})


class TokenLedger:
    """Token budgets: reserve before a model call, commit the real usage after.

    Three budgets apply to every reservation: the per-request output cap (the reservation's
    ``output_tokens``), the session budget and the rolling hourly budget across all sessions of
    the scope. ``reserve`` checks and holds atomically in the store, so concurrent calls (threads,
    tasks, processes, hosts sharing the store) can never be admitted past a limit together.
    ``commit`` replaces the hold by the real usage, once per event id; ``release`` gives the hold
    back; a hold nobody settles returns by itself when its lease ends.

    What a reservation holds for the output follows ``token_budget.reserve``: ``strict`` holds
    the whole output cap; ``learned`` (the default) holds a running high percentile of the
    outputs seen for the model and admits the call only when its worst case fits (see
    ``docs/budgets.md`` for the overshoot bound). Every number is checked: a caller's token
    count that is not a whole number in ``[0, MAX_TOKENS]`` raises :class:`InvalidTokenCount`;
    an upstream's :class:`~agentguard.Usage` that is negative, fractional, not finite or past
    ``MAX_TOKENS`` is replaced by the guard's own estimate (or clamped) and said
    (:class:`~agentguard.events.UsageCorrected`), never counted as given.

    What happens when a budget runs out depends on the policy: ``warn_and_continue`` marks the
    reservation ``"warn"``, ``escalate`` marks it ``"escalate"`` (the pipeline moves the rest of
    the session to a cheaper tier), ``hard_stop`` refuses with :class:`~agentguard.BudgetExceeded`.
    Every policy marks a reservation past ``warn_ratio`` of a budget ``"warn"``, and says
    :class:`~agentguard.events.BudgetWarning` once, by the commit whose usage passes that line;
    under the policies that go on, :class:`~agentguard.events.BudgetExhausted` is said the same
    way, by the commit that passes the limit. A disabled ``token_budget`` still counts usage and
    cost but never warns or refuses.

    If the store cannot be reached, the ledger follows the outage policy of
    :class:`~agentguard.storage.FallbackStore` (the one ``ToolGuard`` follows too): it serves
    from local state (event :class:`~agentguard.events.StoreFallback`), retries every
    ``storage.retry_seconds`` and replays the commits it served locally when the store returns
    (:class:`~agentguard.events.StoreRecovered`). With ``storage.fail_mode: closed`` it raises
    :class:`~agentguard.StoreUnavailable` instead.

    Args:
        config: a :class:`~agentguard.GuardConfig` (its ``token_budget`` and ``storage``
            sections) or a :class:`~agentguard.config.TokenBudgetConfig`; ``None``: defaults.
        store: where the state lives; default: the one ``storage`` names (memory by default).
        clock: wall-clock seconds since the epoch (state is shared across processes).
        hooks: receive this ledger's events.
    """

    def __init__(
        self,
        config: GuardConfig | TokenBudgetConfig | None = None,
        *,
        store: Store | None = None,
        clock: Clock = _clock.wall,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        if isinstance(config, GuardConfig):
            budget, storage = config.token_budget, config.storage
        else:
            budget, storage = config or TokenBudgetConfig(), StorageConfig()
        self.config = budget
        self.storage_config = storage
        self.store: Store = store if store is not None else store_from_config(storage)
        self._store = with_fallback(
            self.store,
            fail_mode=storage.fail_mode,
            retry_seconds=storage.retry_seconds,
            hooks=hooks,
        )
        self.prices = PriceTable(budget.prices)
        self._clock = clock
        self._emitter = Emitter(hooks)
        self._spec = BudgetSpec(
            scope=budget.scope,
            session_limit=budget.per_session if budget.enabled else None,
            hour_limit=budget.per_hour if budget.enabled else None,
            enforce=budget.enabled and budget.policy == "hard_stop",
            bucket_seconds=budget.window_bucket_seconds,
            span_seconds=_SPAN,
            session_ttl=budget.session_ttl_seconds,
            event_ttl=budget.idempotency_ttl_seconds,
        )
        self._cap = budget.max_output_tokens if budget.enabled else None
        self._learned = (
            OutputEstimate(budget.reserve_floor) if budget.reserve == "learned" else None
        )
        # Usage below these (session, hour) needs no decision: under the warning line (a
        # warn_ratio of at most 1 puts it at or below the limit).
        ratio, spec = budget.warn_ratio, self._spec
        self._quiet = (
            None if spec.session_limit is None else ratio * spec.session_limit,
            None if spec.hour_limit is None else ratio * spec.hour_limit,
        )
        self._lease = budget.lease_seconds
        # Calls in flight, while renewals apply: reservation id -> (when its lease is next due
        # for renewal, when renewals stop: max_call_seconds after the reservation).
        renew_for = budget.max_call_seconds if budget.enabled else 0.0
        self._renew_for = renew_for
        self._renews = renew_for > budget.lease_seconds  # else every lease outlasts a call
        self._flights: dict[str, tuple[float, float]] = {}
        self._renewer: LeaseRenewer | None = None
        if self._renews and clock is _clock.wall:
            self._renewer = RENEWER
            RENEWER.add(self, budget.lease_seconds)
        # Reservation ids: a random per-ledger prefix and a counter — unique across processes
        # and hosts, and far cheaper than a uuid4 per call.
        self._ids = itertools.count(1)
        self._id_prefix = secrets.token_hex(8) + "-"

    # -- public API -----------------------------------------------------------------------

    @property
    def spec(self) -> BudgetSpec:
        """What the store is told about this budget (limits, window, retention)."""
        return self._spec

    @property
    def degraded(self) -> bool:
        """Whether the ledger is serving from local state because its store is unreachable."""
        return isinstance(self._store, FallbackStore) and self._store.degraded

    def output_cap(self, requested: int | None = None) -> int | None:
        """The output tokens a request may use: ``requested`` lowered to the per-request cap.

        ``None`` when neither the request nor the configuration limits the output.
        """
        cap = self._cap
        if requested is None:
            return cap
        requested = _checked(requested, "max output tokens")
        return requested if cap is None else min(requested, cap)

    def reserve(
        self,
        session: str,
        estimated_tokens: int,
        *,
        max_output_tokens: int | None = None,
        model: str | None = None,
        answers: int = 1,
    ) -> Reservation:
        """Check the budgets and hold the tokens of one call, atomically.

        The output may use up to ``max_output_tokens`` lowered to the configured
        ``max_output_tokens`` (or the latter alone): the reservation's ``output_tokens``.
        Under ``reserve: strict`` all of it is held beside ``estimated_tokens`` (the prompt);
        under ``reserve: learned`` only the learned estimate is held, but the call is admitted
        only if the whole worst case fits.

        Args:
            session: the session to charge.
            estimated_tokens: estimated prompt tokens (see :func:`estimate_tokens`).
            max_output_tokens: the output limit the request asks for, if any.
            model: the model, for pricing the commit.
            answers: the answers the call asks for (chat's ``n``): each may use the whole
                output limit, which applies to each answer.

        Returns:
            The reservation, carrying the policy's decision.

        Raises:
            BudgetExceeded: under ``hard_stop``, when the tokens would pass a limit.
            InvalidTokenCount: a token count is not a whole number in ``[0, MAX_TOKENS]``.
            StoreUnavailable: the store is unreachable and ``fail_mode`` is ``closed``.
        """
        hold, now = self._hold(session, estimated_tokens, max_output_tokens, model, answers)
        state = self._store.reserve(self._spec, hold, now)
        reservation = self._admit(hold, estimated_tokens, model, now, state)
        if self._renews:
            self._fly(reservation.id, now)
        return reservation

    async def areserve(
        self,
        session: str,
        estimated_tokens: int,
        *,
        max_output_tokens: int | None = None,
        model: str | None = None,
        answers: int = 1,
    ) -> Reservation:
        """Async twin of :meth:`reserve`."""
        hold, now = self._hold(session, estimated_tokens, max_output_tokens, model, answers)
        state = await self._store.areserve(self._spec, hold, now)
        reservation = self._admit(hold, estimated_tokens, model, now, state)
        if self._renews:
            self._fly(reservation.id, now)
        return reservation

    def commit(
        self, reservation: Reservation, usage: int | Usage, event_id: str | None = None
    ) -> Settlement:
        """Count the real usage of a call and release the rest of its reservation.

        Idempotent per ``event_id`` (default: the reservation's id): committing the same event
        again, from this or any other worker, counts nothing more.

        Args:
            reservation: what :meth:`reserve` returned.
            usage: the call's :class:`~agentguard.Usage` (as an upstream reported it: checked,
                corrected if absurd), or its total tokens (split into prompt and output as the
                reservation estimated, for pricing; past ``MAX_TOKENS``: clamped and said).
            event_id: the idempotency key. Keep it unique per call: the default, the
                reservation's own id, is; an upstream's response id is not (some servers
                answer ``chatcmpl-123`` every time, and their calls would count once).

        Raises:
            InvalidTokenCount: ``usage`` is a negative or non-integer count.
            StoreUnavailable: the store is unreachable and ``fail_mode`` is ``closed``.
        """
        charge, used, now = self._charge(reservation, usage, event_id)
        self._flights.pop(reservation.id, None)
        state = self._store.commit(self._spec, charge, now)
        return self._settled(reservation, charge, used, state)

    async def acommit(
        self, reservation: Reservation, usage: int | Usage, event_id: str | None = None
    ) -> Settlement:
        """Async twin of :meth:`commit`."""
        charge, used, now = self._charge(reservation, usage, event_id)
        self._flights.pop(reservation.id, None)
        state = await self._store.acommit(self._spec, charge, now)
        return self._settled(reservation, charge, used, state)

    def release(self, reservation: Reservation) -> bool:
        """Give back a reservation whose call failed; ``False`` if it was no longer held."""
        now = self._clock()
        self._flights.pop(reservation.id, None)
        return self._store.release(self._spec, reservation.id, now)

    async def arelease(self, reservation: Reservation) -> bool:
        """Async twin of :meth:`release`."""
        now = self._clock()
        self._flights.pop(reservation.id, None)
        return await self._store.arelease(self._spec, reservation.id, now)

    def renew(self, reservation: Reservation) -> bool:
        """Keep the hold of a call still running for another ``lease_seconds`` from now.

        The ledger does this by itself for its calls in flight (see ``max_call_seconds``);
        call it for a reservation you settle elsewhere. ``False`` when the reservation is no
        longer held (settled, released, or its lease already ended: its usage, when it
        settles, still counts). ``reservation.expires_at`` keeps the lease's first end.

        Raises:
            StoreUnavailable: the store is unreachable and ``fail_mode`` is ``closed``.
        """
        now = self._clock()
        return self._store.renew(self._spec, reservation.id, now + self._lease, now)

    async def arenew(self, reservation: Reservation) -> bool:
        """Async twin of :meth:`renew`."""
        now = self._clock()
        return await self._store.arenew(self._spec, reservation.id, now + self._lease, now)

    def renew_due(self) -> int:
        """Renew the leases of this ledger's calls in flight that have run half a lease since
        they were placed or last renewed; how many were renewed.

        A ledger on the wall clock has a thread call this (see
        :mod:`agentguard.budget._renewer`); on an injected clock, call it yourself. A call is
        renewed until it settles or ``max_call_seconds`` after it was reserved; one whose
        reservation is no longer held is forgotten.

        Raises:
            StoreUnavailable: the store is unreachable and ``fail_mode`` is ``closed``.
        """
        flights = self._flights
        if not flights:
            return 0
        now = self._clock()
        half = self._lease / 2
        spec, store, expires_at = self._spec, self._store, now + self._lease
        renewed = 0
        for rid, (due, until) in list(flights.items()):
            if now < due:
                continue
            if now >= until:  # a call this long is taken for abandoned: its hold lapses
                flights.pop(rid, None)
                continue
            if store.renew(spec, rid, expires_at, now):
                renewed += 1
                if rid in flights:  # not settled meanwhile
                    flights[rid] = (now + half, until)
            else:
                flights.pop(rid, None)
        return renewed

    def _fly(self, rid: str, now: float) -> None:
        """A call in flight: its lease is due for renewal after half of it."""
        self._flights[rid] = (now + self._lease / 2, now + self._renew_for)
        renewer = self._renewer
        if renewer is not None and renewer.idle:  # a forked child's first call
            renewer.start()

    def _forget_flights(self) -> None:
        self._flights.clear()

    def usage(self, session: str | None = None) -> UsageSnapshot:
        """Tokens and cost of ``session`` (if given) and of the rolling hour."""
        now = self._clock()
        return self._snapshot(session, now, self._store.snapshot(self._spec, session, now))

    async def ausage(self, session: str | None = None) -> UsageSnapshot:
        """Async twin of :meth:`usage`."""
        now = self._clock()
        state = await self._store.asnapshot(self._spec, session, now)
        return self._snapshot(session, now, state)

    def quote(
        self,
        session: str,
        prompt_tokens: int,
        completion_tokens: int = 0,
        *,
        model: str | None = None,
    ) -> Quote:
        """What a call of this size would cost on ``model``, and whether it fits now.

        Nothing is held: use it to show the price of a retry or a failover before choosing it.
        """
        return self._quote(prompt_tokens, completion_tokens, model, self.usage(session))

    async def aquote(
        self,
        session: str,
        prompt_tokens: int,
        completion_tokens: int = 0,
        *,
        model: str | None = None,
    ) -> Quote:
        """Async twin of :meth:`quote`."""
        snap = await self.ausage(session)
        return self._quote(prompt_tokens, completion_tokens, model, snap)

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    # -- decisions (pure) -----------------------------------------------------------------

    def _hold(
        self,
        session: str,
        estimated_tokens: int,
        max_output_tokens: int | None,
        model: str | None,
        answers: int = 1,
    ) -> tuple[Hold, float]:
        """The hold to place (the output beyond a learned estimate as headroom), and the time."""
        if not _whole(estimated_tokens) or not 0 <= estimated_tokens <= MAX_TOKENS:
            _checked(estimated_tokens, "estimated_tokens")
        if max_output_tokens is None:  # the common case, without a call
            output = self._cap or 0
        else:
            output = self.output_cap(max_output_tokens) or 0
        if answers != 1:
            output = min(output * _checked(answers, "answers"), MAX_TOKENS)
        held = output
        learned = self._learned
        if learned is not None and output:
            held = learned.hold(model, output)
        now = self._clock()
        rid = f"{self._id_prefix}{next(self._ids)}"
        hold = Hold(session, rid, estimated_tokens + held, now + self._lease, output - held)
        return hold, now

    def _admit(
        self,
        hold: Hold,
        prompt: int,
        model: str | None,
        now: float,
        state: BudgetState,
    ) -> Reservation:
        spec = self._spec
        session, tokens = hold.session, hold.tokens
        if state.refused is not None:
            self._refuse(session, tokens + hold.headroom, now, state)
        session_used = state.session_tokens + state.session_held
        hour_used = state.hour_tokens + state.hour_held
        quiet_session, quiet_hour = self._quiet
        decision: Decision = "ok"
        budget = None
        if not (
            (quiet_session is None or session_used < quiet_session)
            and (quiet_hour is None or hour_used < quiet_hour)
        ):  # past a warning line (the common case is below both: nothing to decide or say)
            decision, budget = self._decide(session_used, hour_used)
        return Reservation(
            hold.id,
            session,
            tokens,
            prompt,
            tokens + hold.headroom - prompt,  # the output the call may use
            model,
            hold.expires_at,
            decision,
            budget,
            session_used,
            spec.session_limit,
            hour_used,
            spec.hour_limit,
        )

    def _decide(self, session_used: int, hour_used: int) -> tuple[Decision, str | None]:
        """The policy's decision on a reservation past a warning line (the events that a
        budget passed a line are said by the commit that passes it: see :meth:`_said`)."""
        spec = self._spec
        decision: Decision = "ok"
        budget = None
        policy = self.config.policy
        warn_ratio = self.config.warn_ratio
        for name, limit, used in (
            ("session", spec.session_limit, session_used),
            ("hour", spec.hour_limit, hour_used),
        ):
            if limit is None:
                continue
            if used > limit:
                verdict: Decision = "escalate" if policy == "escalate" else "warn"
            elif used >= warn_ratio * limit:
                verdict = "warn"
            else:
                continue
            if _RANK[verdict] > _RANK[decision]:
                decision, budget = verdict, name
        return decision, budget

    def _refuse(self, session: str, tokens: int, now: float, state: BudgetState) -> None:
        spec = self._spec
        if state.refused == "session":
            assert spec.session_limit is not None
            budget, used, limit, resets = "session", state.session_used, spec.session_limit, None
        else:
            assert spec.hour_limit is not None
            budget, used, limit = "hour", state.hour_used, spec.hour_limit
            resets = window_resets_at(spec, state, tokens, now)
        self._emitter.emit(
            BudgetExhausted(
                session=session,
                budget=budget,
                used=used,
                requested=tokens,
                limit=limit,
                policy=self.config.policy,
                action="refuse",
                resets_at=resets,
            )
        )
        raise BudgetExceeded(
            budget=budget,
            used=used,
            requested=tokens,
            limit=limit,
            resets_at=resets,
            session=session,
        )

    def _charge(
        self, reservation: Reservation, usage: int | Usage, event_id: str | None
    ) -> tuple[Charge, Usage, float]:
        if isinstance(usage, Usage):
            used = self._trusted(reservation, usage)
        else:
            if not _whole(usage) or usage < 0:
                _checked(usage, "usage")
            if usage > MAX_TOKENS:  # the call happened: count it, clamped, and say so
                self._corrected(reservation, "usage", usage, MAX_TOKENS)
                usage = MAX_TOKENS
            # a bare total is split as the reservation estimated it, so it is priced sensibly
            prompt = min(usage, reservation.prompt_tokens)
            used = Usage(prompt, usage - prompt)
        learned = self._learned
        if learned is not None:
            learned.observe(reservation.model, used.completion_tokens)
        cost = self.prices.nanos(reservation.model, used.prompt_tokens, used.completion_tokens)
        charge = Charge(
            reservation.session,
            reservation.id,
            event_id or reservation.id,
            used.total_tokens,
            cost,
        )
        return charge, used, self._clock()

    def _trusted(self, reservation: Reservation, usage: Usage) -> Usage:
        """An upstream's usage, each absurd part replaced by the reservation's estimate."""
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        if (
            _whole(prompt)
            and _whole(completion)
            and 0 <= prompt <= MAX_TOKENS
            and 0 <= completion <= MAX_TOKENS - prompt
        ):
            return usage  # the common case
        fixed = []
        for name, value, estimate in (
            ("prompt_tokens", prompt, reservation.prompt_tokens),
            ("completion_tokens", completion, reservation.tokens - reservation.prompt_tokens),
        ):
            if _whole(value) and 0 <= value <= MAX_TOKENS:
                fixed.append(value)
                continue
            if isinstance(value, int | float) and not isinstance(value, bool):
                big = value > MAX_TOKENS and (_whole(value) or math.isfinite(value))
            else:
                big = False
            counted = MAX_TOKENS if big else estimate
            self._corrected(reservation, name, value, counted)
            fixed.append(counted)
        prompt, completion = fixed
        if prompt + completion > MAX_TOKENS:
            completion = MAX_TOKENS - prompt
        return Usage(prompt, completion, estimated=True)

    def _corrected(
        self, reservation: Reservation, field: str, reported: object, counted: int
    ) -> None:
        self._emitter.emit(
            UsageCorrected(
                session=reservation.session,
                field=field,
                reported=repr(reported)[:100],
                counted=counted,
            )
        )

    def _settled(
        self, reservation: Reservation, charge: Charge, used: Usage, state: BudgetState
    ) -> Settlement:
        if state.applied:
            self._said(reservation.session, charge.tokens, state)
        return Settlement(
            reservation.id,
            charge.event_id,
            state.applied,
            used,
            charge.cost / NANOS,
            max(0, charge.tokens - reservation.tokens),
            state.session_tokens,
            state.hour_tokens,
        )

    def _said(self, session: str, tokens: int, state: BudgetState) -> None:
        """The events of a budget whose committed usage this commit took past its warning line
        or past its limit (the latter under the policies that go on: ``hard_stop`` says each
        refusal instead).

        Said on committed usage, not at a reservation: a hold is mostly given back, so usage
        counted with holds goes up and down around a line, where committed usage only grows —
        and every commit is one atomic step of the store, so exactly one commit passes a line,
        whichever guard or process made it. The rolling hour can fall back under a line as
        usage leaves the window: its next passing is said again.
        """
        spec = self._spec
        policy = self.config.policy
        for name, limit, line, after in (
            ("session", spec.session_limit, self._quiet[0], state.session_tokens),
            ("hour", spec.hour_limit, self._quiet[1], state.hour_tokens),
        ):
            if line is None or limit is None or after < line:  # the common case
                continue
            before = after - tokens
            if before < line:
                self._emitter.emit(
                    BudgetWarning(
                        session=session, budget=name, used=after, limit=limit, ratio=after / limit
                    )
                )
            if before <= limit < after and not spec.enforce:
                self._emitter.emit(
                    BudgetExhausted(
                        session=session,
                        budget=name,
                        used=before,
                        requested=tokens,
                        limit=limit,
                        policy=policy,
                        action="escalate" if policy == "escalate" else "continue",
                    )
                )

    def _snapshot(self, session: str | None, now: float, state: BudgetState) -> UsageSnapshot:
        spec = self._spec
        return UsageSnapshot(
            session,
            now,
            state.session_tokens,
            state.session_held,
            state.session_cost / NANOS,
            spec.session_limit,
            state.hour_tokens,
            state.hour_held,
            state.hour_cost / NANOS,
            spec.hour_limit,
        )

    def _quote(
        self, prompt_tokens: int, completion_tokens: int, model: str | None, snap: UsageSnapshot
    ) -> Quote:
        tokens = prompt_tokens + completion_tokens
        cost = self.prices.cost(model, prompt_tokens, completion_tokens)
        budget = None
        if snap.session_remaining is not None and tokens > snap.session_remaining:
            budget = "session"
        elif snap.hour_remaining is not None and tokens > snap.hour_remaining:
            budget = "hour"
        return Quote(tokens, cost, budget is None, budget, snap)

    def __repr__(self) -> str:
        return f"TokenLedger(scope={self._spec.scope!r}, store={self.store!r})"
