"""The guarded model call, as one plan of actions (ARCHITECTURE §3).

:class:`Pipeline` holds the components and the per-session state; :meth:`Pipeline.plan` turns
one request into a generator of actions (see :mod:`agentguard._engine`) that the sync and async
guards carry out. Every step of the architecture is here, in order:

1. session; 2. memory pressure picks the starting tier; ledger reservation and output cap;
3. incremental transcript loop check (a hint on WARNING, escalate or stop on BREAK);
4. the call, through the tier's circuit breaker and the one retry layer;
5. validation with local repair, corrective re-asks, then escalation;
6. response loop check; 7. ledger commit; 8. events and the report.

Components decide, the plan acts: every model call, wait, question to the user and ledger
operation is yielded, never performed here, so the same plan runs sync and async.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import json
import logging
import math
import random
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from agentguard import _clock
from agentguard._engine import END, Ask, Emit, Open, Plan, Pull, Send, Sleep, perform
from agentguard._fingerprint import fingerprint, fingerprint_bytes
from agentguard._redact import redact, redact_exception, register_credentials
from agentguard.budget import PriceTable, TokenLedger, estimate_tokens, estimate_usage
from agentguard.budget._estimate import REPLY_PRIMING, UNCAPPED_OUTPUT, holds_media
from agentguard.budget._values import Reservation, Settlement
from agentguard.config import GuardConfig
from agentguard.escalation import EscalationDecision, EscalationPolicy
from agentguard.events import (
    CorrectionRequested,
    Emitter,
    Escalated,
    Hook,
    LoopRecovery,
    ToolCallRejected,
)
from agentguard.exceptions import (
    AgentGuardError,
    BudgetExceeded,
    LoopDetected,
    TiersExhausted,
    ToolValidationFailed,
)
from agentguard.loops import LoopDetector, Verdict
from agentguard.pressure import MemoryPressureProbe
from agentguard.resilience import (
    CircuitBreaker,
    Classification,
    ErrorClass,
    RetryPolicy,
    classify,
)
from agentguard.resilience._classify import unanswered
from agentguard.storage import Store
from agentguard.transport import (
    ModelRequest,
    ModelResponse,
    StreamChunk,
    split_session_header,
)
from agentguard.types import Attempt, Choice, Severity, Tier, Usage, _money
from agentguard.validation import ToolCallValidator, ValidationReport
from agentguard.validation._grounding import (
    current_request,
    ignored_results,
    invented_numbers,
    uncovered_values,
    ungrounded_arguments,
)
from agentguard.validation._known import Answered, answered_calls, repeated, results_answer
from agentguard.validation._reask import Rework
from agentguard.validation._validator import asks_for_call, other_kind

from . import _recovery as recovery
from ._quality import QualityMonitor, context_overflow, runaway
from ._report import GuardReport, ReportBuilder
from ._session import CallRuns, SessionSource, resolve_session, scope_of
from ._stream import Accumulator, CallGate, DegenerationWatch, tool_call_chunks
from ._transcript import New, Run, Runs, message_key, thread_of

logger = logging.getLogger("agentguard")

__all__ = ["Pipeline"]

#: The store namespace of the sessions' shared ladder state (``Pipeline.session_store``).
_SESSIONS = "guard:sessions"
#: The store namespace of the tiers keeping conversations upstream (see ``Pipeline._home``).
_THREADS = "guard:threads"
#: Breakers kept for tiers that are not configured (a model name no tier has is a tier of its
#: own): the least recently used go first. Model names are the caller's to choose, so without a
#: bound a server would keep (and read) one breaker per name it has ever been sent.
IMPLICIT_BREAKERS = 256
# attempts whose model call answered (usably or not): their output sizes the next one's estimate
_ANSWERED = frozenset({"ok", "tool_validation_failure", "loop_detected"})
#: The roles of a conversation's standing instructions, kept in a compact conversation.
_INSTRUCTIONS = frozenset({"system", "developer"})
# what a stream's plan yields for each chunk: it holds nothing, one serves every read
_PULL = Pull()
#: Seconds after which a tier's half-open probe that never reported stops counting (as long as
#: the breaker stays open: the store's default lease).
_PROBE_LEASE = 30.0
_TRIGGER_OF = {
    ErrorClass.TIMEOUT: "timeout",
    ErrorClass.RATE_LIMITED: "rate_limited",
    ErrorClass.TRANSIENT: "server_error",
}


class Pipeline:
    """The components and per-session state behind a guard, and the plan of one call.

    Args:
        config: the configuration (defaults when ``None``).
        ledger: the token ledger; by default one over a store built from ``config.storage``
            when budgets are enabled.
        probe: the memory-pressure probe; by default one when memory pressure is enabled.
        clock: monotonic seconds, for breakers and loop windows. An HTTP-date
            ``Retry-After`` is read on the wall clock: the clock's own ``wall()`` when it has
            one (``FakeClock`` does), else the real one.
        rng: randomness for backoff jitter.
        hooks: event hooks of this guard.
        max_sessions: sessions remembered at once (least recently used are forgotten).
    """

    def __init__(
        self,
        config: GuardConfig | None = None,
        *,
        ledger: TokenLedger | None = None,
        probe: MemoryPressureProbe | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        hooks: Iterable[Hook] | None = None,
        max_sessions: int = 10_000,
    ) -> None:
        cfg = config or GuardConfig()
        self.config = cfg
        self.clock = clock or _clock.monotonic
        self.wall = _clock.wall_of(clock)
        self.emitter = Emitter(hooks)
        self.policy = EscalationPolicy(cfg)
        self.ledger = (
            ledger
            if ledger is not None
            else (TokenLedger(cfg, hooks=self.emitter.hooks) if cfg.token_budget.enabled else None)
        )
        self.probe = (
            probe
            if probe is not None
            else (
                MemoryPressureProbe(cfg, clock=self.clock, hooks=self.emitter.hooks)
                if cfg.memory_pressure.enabled
                else None
            )
        )
        self.retry = RetryPolicy(
            max_attempts=cfg.escalation.max_retries_before_escalate + 1,
            max_retry_after=cfg.escalation.max_retry_after,
            rng=rng or random.Random(),
        )
        self.quality = QualityMonitor(cfg, hooks=self.emitter.hooks)
        #: The tier breakers by tier name, least recently used first. Pipelines may share one
        #: dict (``agentguard serve`` gives each caller a pipeline, and every caller the same
        #: breakers). Those of the configured tiers are kept; of the others (implicit tiers, one
        #: per model name no tier has) at most :data:`IMPLICIT_BREAKERS`.
        self.breakers: collections.OrderedDict[str, CircuitBreaker] = collections.OrderedDict()
        #: Where breakers made from now on keep their state: ``None`` (the default) in the
        #: breaker; a store shares it with every process on the store (a fleet of servers opens
        #: and closes a tier's breaker together).
        self.breaker_store: Store | None = None
        #: Where the loop ladder state of named sessions is kept between requests: ``None``
        #: (the default) in this pipeline only; a store shares it with every process on the
        #: store, so that a fleet of servers behind a load balancer judges a session as one
        #: server would (read at the start of a request, written at its end; see ``_synced``).
        self.session_store: Store | None = None
        #: Seconds a session's shared state is kept after its last request.
        self.session_ttl = 86_400.0
        #: The session of each tool call handed back, by its id (see ``Guard.run_of_call``).
        #: A sync and an async guard serving one agent share one (``twin_guards``).
        self.call_runs = CallRuns()
        self._validators: collections.OrderedDict[str, tuple[ToolCallValidator, int]] = (
            collections.OrderedDict()
        )
        self._runs = Runs(
            lambda: LoopDetector(cfg, clock=self.clock, hooks=self.emitter.hooks),
            memory=4 * cfg.loop_detection.tool_window,
            max_runs=max_sessions,
        )
        self._last_tools: tuple[list[Any], tuple[ToolCallValidator, int]] | None = None

    @staticmethod
    def _prompt_tokens(call: _Call) -> int:
        """The prompt estimate of the call's current messages: the base, plus any re-ask."""
        extra = call.messages[len(call.base_messages) :]
        if not extra:
            return call.prompt_tokens
        return call.prompt_tokens + estimate_tokens(extra) - REPLY_PRIMING

    def _tools(self, tools: Sequence[Mapping[str, Any]]) -> tuple[ToolCallValidator, int]:
        """The validator of a tool set and the tokens its schemas add to a prompt (cached)."""
        # An agent sends the same tools with every call: comparing with a snapshot of the last
        # set (a C-level deep ==) is far cheaper than encoding them for the keyed cache below.
        last = self._last_tools
        if last is not None and last[0] == (tools if isinstance(tools, list) else list(tools)):
            return last[1]
        # plain sorted JSON is canonical enough for a cache key (a miss only costs a rebuild)
        key = fingerprint_bytes(json.dumps(list(tools), sort_keys=True, default=str).encode())
        entry = self._validators.get(key)
        if entry is None:
            # the request's tools are the caller's to send: one the guard cannot read is not
            # a reason to refuse the call, unless the guard is to fail closed
            validator = ToolCallValidator(
                tools,
                self.config,
                hooks=self.emitter.hooks,
                lenient=self.config.fail_mode == "open",
            )
            entry = (validator, estimate_tokens([], tools=tools) - REPLY_PRIMING)
            self._validators[key] = entry
            if len(self._validators) > 256:
                self._validators.popitem(last=False)
        # a snapshot, so a caller mutating its list in place cannot make a stale entry match
        self._last_tools = (copy.deepcopy(list(tools)), entry)
        return entry

    # -- state ---------------------------------------------------------------------------------

    def _locate(
        self, request: ModelRequest, session: str | None
    ) -> tuple[Run, SessionSource, list[New], int, tuple[str, int]]:
        """The run a request continues (see :class:`Runs`), where its session came from, its
        unseen messages, the estimated tokens of its history, and its realm (who may follow
        its answer as a thread: see :meth:`Runs.follow`) with the index its answer takes."""
        sid, source = resolve_session(request.messages, explicit=session, headers=request.headers)
        thread = thread_of(request.params)
        if source == "fingerprint":
            # No session named: the conversation finds its own run, among the caller's runs
            # with the same opening (``sid`` names it); each run is a session of its own for
            # budgets and reports.
            realm = scope_of(request)
            if thread is not None:  # the opening is kept upstream: the thread names the run
                sid = "auto-" + fingerprint(thread)[:12]
            namespace = f"{sid}:{realm}"
            new_id = lambda: f"{sid[:17]}-{uuid.uuid4().hex[:8]}"  # noqa: E731
        else:
            realm = namespace = f"session:{sid}"
            new_id = lambda: sid  # noqa: E731
        if thread is None:
            found_by = realm if source == "fingerprint" else None
            run, new, tokens = self._runs.locate(
                namespace, request.messages, new_id, realm=found_by
            )
            end = len(request.messages)
        else:
            run, new, tokens = self._runs.follow(realm, thread, namespace, request.messages, new_id)
            end = new[-1][0] + 1 if new else (run.last[0] + 1 if run.last else 0)
        return run, source, new, tokens, (realm, end)

    def breaker(self, tier: Tier) -> CircuitBreaker:
        """The circuit breaker of ``tier`` (one per tier, shared by every session)."""
        breakers = self.breakers
        breaker = breakers.get(tier.name)
        if breaker is not None:
            with contextlib.suppress(KeyError):  # (dropped by another thread meanwhile)
                breakers.move_to_end(tier.name)
            return breaker
        store = self.breaker_store
        breaker = CircuitBreaker(  # a shared breaker runs on wall-clock time, as its store
            name=f"tier:{tier.name}",
            # a probe that never reports (its worker gone, a fault no one foresaw) stops
            # counting after this, in memory too: a tier is never wedged half-open
            probe_lease=_PROBE_LEASE,
            clock=self.clock if store is None else None,
            hooks=self.emitter.hooks,
            store=store,
        )
        breakers[tier.name] = breaker
        chain = self.policy.chain
        if len(breakers) > IMPLICIT_BREAKERS + len(chain):
            configured = {t.name for t in chain}
            implicit = [name for name in list(breakers) if name not in configured]
            for name in implicit[: len(implicit) - IMPLICIT_BREAKERS]:
                breakers.pop(name, None)
        return breaker

    def _escapes(self) -> tuple[Tier, ...]:
        """The tiers a request may move to or skip: the chain, when escalation can move (an
        implicit tier has nowhere to go: its breaker is never read for it)."""
        cfg = self.policy.config
        return self.policy.chain if cfg.enabled and cfg.mode != "off" else ()

    def _read_degraded(self, call: _Call) -> Plan[None]:
        """Read which of the tiers escalation may move to are degraded (open breakers) into
        ``call.degraded``, for :meth:`_closed`. One read per tier of the chain, never per tier
        ever seen; a breaker kept in a store is read asynchronously by an async guard."""
        open_: list[str] = []
        for tier in self._escapes():
            breaker = self.breaker(tier)
            if breaker.store is None:
                state = breaker.state
            else:
                state = (yield from perform(breaker.snapshot, breaker.asnapshot)).state
            if state == "open":
                open_.append(tier.name)
        call.degraded = frozenset(open_)

    def _home(
        self, state: Run, request: ModelRequest, realm: str
    ) -> Plan[tuple[Tier, str, tuple[str | None, str | None] | None]]:
        """Where a request starts (the tier, and the name the policy is given for it), and, for
        one following a conversation kept upstream, the endpoint every call of it goes to: the
        one that gave the answer it follows (a tier elsewhere would not know it). A process
        that did not give that answer reads its tier from the shared store (see
        :meth:`_thread_store`)."""
        if state.forced_tier is not None:
            home, named = state.forced_tier, state.forced_tier.name
        else:
            home, named = self.policy.tier_for(request.model), request.model
        thread = thread_of(request.params)
        if thread is None:
            return home, named, None
        held = self._runs.held_by(realm, thread)
        if held is None:
            held = yield from self._held_elsewhere(request, thread)
        if held is not None and held.endpoint != home.endpoint:
            home, named = held, held.name
        return home, named, home.endpoint

    def _thread_store(self) -> Store | None:
        """The session store, where the tiers keeping conversations upstream are shared with
        the other processes on it, when there is one and the tiers are at more than one
        endpoint (else every conversation is kept where it starts anyway)."""
        store = self.session_store
        if store is None or len({t.endpoint for t in self.policy.chain}) < 2:
            return None
        return store

    @staticmethod
    def _thread_key(request: ModelRequest, thread: str) -> str:
        return fingerprint(["thread", scope_of(request), thread])[:32]

    def _held_elsewhere(self, request: ModelRequest, thread: str) -> Plan[Tier | None]:
        """The tier another process recorded as keeping ``thread`` (see :meth:`_share_threads`),
        or ``None``: none recorded, a tier this configuration does not have, a store fault."""
        store = self._thread_store()
        if store is None:
            return None
        key = self._thread_key(request, thread)
        try:
            name = yield from perform(store.get, store.aget, _THREADS, key, _clock.wall())
        except Exception:  # fail open: the request starts where its model says
            return None
        return next((t for t in self.policy.chain if t.name == name), None)

    def _share_threads(self, call: _Call) -> Plan[None]:
        """Record, for the other processes on the store, the tier that answered the threads
        ``call``'s answer continues (see :meth:`_check_response`); a store that fails is
        ignored."""
        store = self._thread_store()
        if store is None:
            return
        for thread in call.kept:
            with contextlib.suppress(Exception):  # fail open: this process still remembers
                yield from perform(
                    store.put,
                    store.aput,
                    _THREADS,
                    self._thread_key(call.request, thread),
                    call.tier.name,
                    _clock.wall(),
                    self.session_ttl,
                )
        call.kept = []

    def _closed(self, call: _Call) -> frozenset[str]:
        """Tiers ``call`` may not move to: degraded ones (as last read by
        :meth:`_read_degraded`), and, for a conversation kept upstream, those at another
        endpoint than the one keeping it."""
        closed = call.degraded
        if call.kept_at is not None:
            closed |= {t.name for t in self.policy.chain if t.endpoint != call.kept_at}
        return closed

    # -- the plan ------------------------------------------------------------------------------

    def plan(
        self, request: ModelRequest, *, session: str | None = None
    ) -> Plan[tuple[ModelResponse, GuardReport]]:
        """The plan of one non-streaming guarded call; its result is the response and report."""
        call = yield from self._prepare(request, session)
        try:
            while True:
                response = yield from self._attempt(call)
                if response is None:
                    continue
                final = yield from self._check(call, response)
                if final is not None:
                    self.call_runs.answered(final.message, call.b.session)
                    return final, (yield from self._report(call))
        except Exception as exc:
            _record(call, exc)
            raise

    def stream_plan(
        self, request: ModelRequest, *, session: str | None = None
    ) -> Plan[GuardReport]:
        """The plan of one streaming call: content flows through, tool calls wait until valid."""
        call = yield from self._prepare(request, session)
        try:
            while True:
                response = yield from self._attempt(call, stream=True)
                if response is None:
                    continue
                if call.cut:
                    reason = call.cut_reason or self._check_response(call, response).message
                    call.b.warnings.append(f"stream cut: {reason}")
                    final: ModelResponse | None = response
                else:
                    final = yield from self._check(call, response)
                if final is not None:
                    held = final.message.get("content")
                    held = held if isinstance(held, str) else ""
                    gate = call.gate
                    if not call.content_sent and held:
                        # a text held until judged (see _stream_once): released whole, once it
                        # is the answer
                        call.content_sent = True
                        yield Emit(StreamChunk(content=held))
                    elif gate is not None and held.startswith(gate.sent) and held != gate.sent:
                        # what the gate held back, once no call was in it (or the text beside
                        # the calls taken out of it)
                        call.content_sent = True
                        yield Emit(StreamChunk(content=held[len(gate.sent) :]))
                    for chunk in tool_call_chunks(final):
                        yield Emit(chunk)
                    if final.finish_reason:  # (a stream that ended without one: none made)
                        yield Emit(StreamChunk(finish_reason=final.finish_reason, raw=None))
                    if call.usage_chunk is not None:  # asked for with stream_options.include_usage
                        yield Emit(call.usage_chunk)
                    self.call_runs.answered(final.message, call.b.session)
                    return (yield from self._report(call))
        except Exception as exc:
            _record(call, exc)
            raise

    # -- steps ---------------------------------------------------------------------------------

    def _prepare(self, request: ModelRequest, session: str | None) -> Plan[_Call]:
        problems: list[str] = []
        try:
            state, source, new, message_tokens, (realm, end) = self._locate(request, session)
        except (AttributeError, TypeError):
            # Checked only when reading failed (a check on every call would cost a pass over
            # the history): entries that are not message objects are left out, and the guard
            # guards and sends the rest (an upstream refuses such entries anyway).
            readable = _message_objects(request.messages)
            if readable is request.messages:
                raise  # the messages were fine: a fault of the guard's own
            problems.append(
                "messages holds entries that are not message objects: they were left out"
            )
            request = dataclasses.replace(request, messages=readable)
            state, source, new, message_tokens, (realm, end) = self._locate(request, session)
        sid = state.id
        shared, judged_from = None, -1
        if self.session_store is not None and source != "fingerprint":
            # a named session may have moved on through another process since this one saw it
            shared = fingerprint(["session", scope_of(request), state.id])[:32]
            new, judged_from = yield from self._synced(shared, state, new, request.messages)
        _, headers = split_session_header(request.headers)
        if headers is not request.headers:  # the guard's own header: never sent upstream
            request = dataclasses.replace(request, headers=headers)
        if headers:  # an Authorization / api-key header sent upstream: redacted by value
            register_credentials(headers)
        request = _readable_output_cap(request, problems)  # last: replace() would undo it
        b = ReportBuilder(sid, source)
        b.warnings.extend(problems)
        tools = list(request.tools)
        validator, tool_tokens = self._tools(tools) if tools else (None, 0)
        prompt_tokens = REPLY_PRIMING + message_tokens + tool_tokens
        requested_output = request.max_output_tokens

        # 2. memory pressure picks the starting tier
        sustained = False
        if self.probe is not None:
            b.memory = str(self.probe.level())
            sustained = self.probe.sustained()
        complex_request = self.policy.is_complex(
            has_tools=bool(tools), prompt_tokens=prompt_tokens, max_output_tokens=requested_output
        )
        home, named, kept_at = yield from self._home(state, request, realm)
        b.start = b.tier = home
        call = _Call(
            request=request,
            state=state,
            b=b,
            tools=tools,
            prompt_tokens=prompt_tokens,
            validator=validator,
            shared=shared,
            kept_at=kept_at,
            choice=request.params.get("tool_choice"),
        )
        decision = yield from self._start(
            call, home, named, sustained=sustained, complex_request=complex_request
        )
        if decision.action != "stay":
            call.tier = yield from self._move(call, home, decision, error=None)
        else:
            call.tier = decision.target or home
        b.tier = call.tier

        # 3. the transcript, incrementally: only messages this session has not seen
        verdict = self._check_transcript(state, new, judged_from)
        # never mutated (a hint or a re-ask builds a new list): no copy of a long history
        messages = (
            request.messages if isinstance(request.messages, list) else list(request.messages)
        )
        call.base_messages = call.messages = messages
        call.history = (end, message_tokens)
        call.realm = realm
        if verdict.severity >= Severity.WARNING:
            yield from self._recover(call, verdict)
        return call

    def _classified(self, call: _Call, error: BaseException) -> Classification:
        """What the tier's error was; one that shows degraded quality is a warning too."""
        call.b.warnings.extend(self.quality.failed(call.tier.name, error, session=call.b.session))
        return classify(error, now=self.wall())

    def _start(
        self, call: _Call, home: Tier, named: str, *, sustained: bool, complex_request: bool
    ) -> Plan[EscalationDecision]:
        """Where ``call`` starts (see :meth:`EscalationPolicy.start`), once the breakers of the
        tiers it could start at instead are read."""
        yield from self._read_degraded(call)
        decision = self.policy.start(
            named,
            pressure_sustained=sustained,
            complex_request=complex_request,
            degraded=self._closed(call),
        )
        if decision.action == "stay" and complex_request:
            decision = self._degraded_start(call, decision, home)
        return decision

    def _degraded_start(
        self, call: _Call, decision: EscalationDecision, home: Tier
    ) -> EscalationDecision:
        """A complex request starts one tier up while its tier's quality is degraded."""
        tier = decision.target or home
        if not self.quality.sustained(tier.name):
            return decision
        moved = self.policy.on_failure(tier, "quality_degraded", degraded=self._closed(call))
        return moved if moved.action != "stop" else decision

    def _attempt(self, call: _Call, *, stream: bool = False) -> Plan[ModelResponse | None]:
        """One model call on the current tier; ``None`` means "try again" (tier may have moved)."""
        b, tier = call.b, call.tier
        # the cap sent: the caller's own, lowered to a configured one; none when neither is set
        max_output_tokens = call.request.max_output_tokens
        ledger = self.ledger
        reservation: Reservation | None = None
        if ledger is not None:
            # a limit that is no token count (-5, 1.5) is sent as it came, for the upstream to
            # reject; the budget still applies, with the configured cap
            requested = _token_count(max_output_tokens)
            if requested is not None or max_output_tokens is None:
                max_output_tokens = ledger.output_cap(requested)
            reservation = yield from perform(
                ledger.reserve,
                ledger.areserve,
                b.session,
                self._prompt_tokens(call),
                max_output_tokens=_token_count(max_output_tokens) or UNCAPPED_OUTPUT,
                model=tier.model,
                answers=_answers(call.request.params.get("n")),
            )
            if reservation.decision != "ok":
                b.budget = "warning"
                b.warnings.append(f"{reservation.budget} token budget past its warning ratio")
            if reservation.decision == "escalate" and call.state.forced_tier is None:
                yield from self._release(reservation)
                cheaper = yield from self._trigger(call, "budget", None)
                call.state.forced_tier = cheaper
                return None
        try:
            return (yield from self._send(call, stream, reservation, max_output_tokens))
        except BaseException:
            # Escaped the attempt (cancelled, a stream broken off, a fault of the guard's): a
            # hold the attempt did not settle is given back now, not kept (and renewed) as a
            # call in flight. One blocking store operation, as for an abandoned stream.
            self._abandon(reservation)
            self._abandon_room(call)
            raise

    def _send(
        self,
        call: _Call,
        stream: bool,
        reservation: Reservation | None,
        max_output_tokens: Any,
    ) -> Plan[ModelResponse | None]:
        """The attempt once its tokens are held: send, then settle the hold."""
        b, tier, ledger = call.b, call.tier, self.ledger
        request = dataclasses.replace(
            call.rework.request(call.request, _token_count(max_output_tokens)),
            model=tier.model,
            messages=call.messages,
            max_output_tokens=max_output_tokens,
            timeout=tier.timeout or call.request.timeout,
        )
        breaker = self.breaker(tier)
        admitted = breaker.allow()
        if not admitted.allowed and not call.chosen:  # (a retry chosen in confirm mode is sent)
            yield from self._release(reservation)
            b.attempts.append(Attempt(tier.name, tier.model, "breaker_open"))
            call.tier = b.tier = yield from self._trigger(call, "server_error", None)
            return None
        settled = False  # whether the breaker was told how the attempt ended
        try:
            try:
                if stream:
                    response = yield from self._stream_settled(call, tier, request, reservation)
                else:
                    response = yield from self._answer(call, tier, request, reservation)
            except Exception as exc:
                broken_off = stream and call.handed_on
                classification = yield from self._failed_attempt(call, exc, reservation, broken_off)
                settled = True
                if classification.error_class is not ErrorClass.RATE_LIMITED:
                    breaker.record_failure(classification)
                elif admitted.probe:
                    # a 429 is the upstream alive and metering: never held against its tier
                    # (the retry waits what it asks; a limit that lasts escalates after
                    # max_retries_before_escalate), a probe's slot given back
                    breaker.record_ignored()
                b.attempts.append(
                    Attempt(
                        tier.name,
                        tier.model,
                        classification.error_class.value,
                        classification.reason,
                    )
                )
                if broken_off:
                    # Part of this answer reached the caller: no other attempt can go on from it
                    # (a retry's text would be held back, the caller left with a cut answer
                    # ending as if whole). The stream ends on the error, as it would straight
                    # from upstream.
                    raise
                decision = self.retry.decide(call.transient, classification)
                if decision.retry and breaker.state != "open":  # a just-opened breaker: move on
                    call.transient += 1
                    b.retries += 1
                    yield Sleep(decision.delay)
                    return None
                call.tier = b.tier = yield from self._failed(call, classification.error_class, exc)
                return None
            settled = True
            breaker.record_success()
        finally:
            if not settled and admitted.probe:
                # The probe ended with no outcome: its stream closed (or dropped) by the caller,
                # the call cancelled, a fault of the guard's. It says nothing of the tier, and
                # its slot is given back: kept, no other call would ever probe the tier again.
                self._probe_abandoned(breaker)
        usage = response.usage or _estimated(call, response.message)
        cost = None
        if ledger is not None and reservation is not None:
            # keyed on the reservation (one per call), never on the upstream's response id:
            # servers that answer "chatcmpl-123" every time would have their calls count once
            settlement = yield from perform(ledger.commit, ledger.acommit, reservation, usage)
            usage, cost = settlement.usage, settlement.cost  # checked: absurd numbers corrected
            yield from self._free_room(call)  # (after the commit: its overrun is counted now)
        b.add_usage(usage, cost)
        b.attempts.append(Attempt(tier.name, tier.model, "ok"))
        return response

    def _failed_attempt(
        self, call: _Call, exc: Exception, reservation: Reservation | None, broken_off: bool
    ) -> Plan[Classification]:
        """Settle the hold of an attempt that failed with ``exc``; what the failure was."""
        spent = yield from self._free(
            call, reservation, delivered=broken_off, unanswered=unanswered(exc)
        )
        yield from self._free_room(call)
        if spent is not None:
            call.b.add_usage(spent.usage, spent.cost)
        return self._classified(call, exc)

    @staticmethod
    def _probe_abandoned(breaker: CircuitBreaker) -> None:
        """Give a half-open probe's slot back where nothing can be yielded (a plan being
        closed). Never raises: a close must not fail; a store that cannot be told leaves the
        slot to the probe's lease."""
        try:
            breaker.record_ignored()
        except Exception:  # see the docstring
            logger.debug("could not free an abandoned probe's slot", exc_info=True)

    def _answer(
        self, call: _Call, tier: Tier, request: ModelRequest, reservation: Reservation | None
    ) -> Plan[ModelResponse]:
        """Send a whole call and wait for its answer; cancelled while it waits, the call is
        charged what its reservation held: the upstream has the request and may go on with it
        (see :meth:`_charge_hold`)."""
        try:
            response: ModelResponse = yield Send(tier, request, call.b.session)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled (a framework's timeout, a task
                self._charge_hold(reservation)  # cancelled, an interrupt)
            raise
        return response

    def _charge_hold(self, reservation: Reservation | None) -> None:
        """Charge a call sent and never answered what its reservation held — the prompt, and
        the output held for it (all of its cap under ``reserve: strict``, so ``hard_stop`` holds
        whatever the upstream went on to bill) — where nothing can be yielded (see
        :meth:`_settle_abandoned`). Never raises: the lease frees a hold it cannot settle."""
        ledger = self.ledger
        if ledger is None or reservation is None:
            return
        try:
            ledger.commit(reservation, reservation.tokens)
        except Exception:  # see the docstring
            logger.debug("could not charge an unanswered call", exc_info=True)

    def _stream_settled(
        self, call: _Call, tier: Tier, request: ModelRequest, reservation: Reservation | None
    ) -> Plan[ModelResponse]:
        """:meth:`_stream_once`, settling the reservation if the caller abandons the stream."""
        call.room = _room(reservation, call.request, self.config.token_budget.chars_per_token)
        try:
            return (yield from self._stream_once(call, tier, request))
        except GeneratorExit:  # the caller closed (or dropped) the stream mid-answer
            self._settle_abandoned(call, reservation)
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled mid-answer (a task cancelled by a
                self._settle_abandoned(call, reservation)  # client gone, a server stopping)
            raise

    def _more_room(self, call: _Call, room: _Room) -> Plan[bool]:
        """Hold more of the budget for a stream past the output its call was admitted for,
        until it covers what streamed; ``False`` when the budget refuses (``hard_stop``): the
        stream is cut there, before a limit is passed."""
        ledger = self.ledger
        assert ledger is not None  # (a room is made only with a ledger)
        while room.streamed > room.allowed:
            try:
                extra = yield from perform(
                    ledger.reserve,
                    ledger.areserve,
                    call.b.session,
                    room.step,
                    max_output_tokens=0,
                )
            except BudgetExceeded as exc:
                call.cut_reason = (
                    f"the answer passed the {room.allowed:,} output tokens its budget held "
                    f"room for ({exc.budget} budget exhausted)"
                )
                return False
            room.extra.append(extra)
            room.allowed += room.step
        return True

    def _free_room(self, call: _Call) -> Plan[None]:
        """Give back what the budget held for a stream past its admitted output (the attempt's
        own reservation settled first: the output it counts is held until then)."""
        room, call.room = call.room, None
        if room is not None:
            for extra in room.extra:
                yield from self._release(extra)

    def _abandon_room(self, call: _Call) -> None:
        """:meth:`_free_room` where nothing can be yielded (see :meth:`_abandon`)."""
        room, call.room = call.room, None
        if room is not None:
            for extra in room.extra:
                self._abandon(extra)

    def _settle_abandoned(self, call: _Call, reservation: Reservation | None) -> None:
        """Count what an abandoned stream delivered and free the rest of its hold, right away.

        Runs while the plan is being closed, where nothing can be yielded: the ledger's
        blocking ``commit`` is called directly (also under the async driver: one store
        operation). It never raises — a close must not fail — so a store that cannot settle
        leaves the hold to its lease.
        """
        ledger = self.ledger
        if ledger is None or reservation is None:
            return
        try:
            ledger.commit(reservation, _delivered_usage(call))
        except Exception:  # see the docstring: the lease frees the hold
            logger.debug("could not settle an abandoned stream", exc_info=True)
        self._abandon_room(call)

    def _abandon(self, reservation: Reservation | None) -> None:
        """Give back a hold its attempt did not settle (one it settled stays settled).

        Never raises: the attempt's own exception goes on; a store that cannot release leaves
        the hold to its lease."""
        ledger = self.ledger
        if ledger is None or reservation is None:
            return
        try:
            ledger.release(reservation)
        except Exception:  # see the docstring
            logger.debug("could not release an abandoned reservation", exc_info=True)

    def _free(
        self,
        call: _Call,
        reservation: Reservation | None,
        *,
        delivered: bool,
        unanswered: bool = False,
    ) -> Plan[Settlement | None]:
        """Settle the hold of a failed attempt; returns what was charged, if anything.

        - ``delivered``, part of a stream reached the caller: that part was spent, counted (its
          usage chunk, else an estimate), the rest of the hold freed;
        - ``unanswered``, the request reached the upstream and no answer came back (a read
          timed out, the connection was lost after sending): the upstream may have read the
          prompt and written the answer, and bills them. A stream that had begun is charged what
          it received; a call that got nothing, what its reservation held (as a cancelled one,
          :meth:`_answer`);
        - otherwise (an error status, no connection made) the hold is given back.
        """
        ledger = self.ledger
        if not (delivered or unanswered):
            yield from self._release(reservation)
            return None
        if ledger is None or reservation is None:
            return None
        usage: int | Usage
        if delivered or call.streamed is not None:
            usage = _delivered_usage(call)
        else:
            usage = reservation.tokens
        return (yield from perform(ledger.commit, ledger.acommit, reservation, usage))

    def _release(self, reservation: Reservation | None) -> Plan[None]:
        """Give a failed call's reservation back to the ledger."""
        ledger = self.ledger
        if ledger is not None and reservation is not None:
            yield from perform(ledger.release, ledger.arelease, reservation)

    def _stream_once(self, call: _Call, tier: Tier, request: ModelRequest) -> Plan[ModelResponse]:
        """Pass content deltas through as they come; assemble tool calls, which are held back.

        Text goes out live only until some has been sent: a re-ask's or another tier's text is
        held, so the caller never reads the same sentence twice. Text that degenerates is cut.
        """
        call.streamed = None  # (until the upstream answers: see _free)
        yield Open(tier, request, call.b.session)
        call.usage_chunk = None
        call.handed_on = False
        call.cut_reason = None
        room = call.room
        acc = call.streamed = Accumulator()
        cfg = self.config.tool_validation
        checked = call.validator is not None and cfg.enabled
        # reasoning goes out live unless text went out already (never one sentence twice)
        thinking = not call.content_sent and not call.rework.note
        # text too, unless the checks may still reject it once complete: then it is held until
        # judged and released whole (see stream_plan) — the answer to a recovery turn or to a
        # correction (a small model may only copy the guard's words back), and any text answer
        # under the answer checks (ungrounded, uncovered values, cut off at the cap)
        corrected = call.rework.ladder is not None and call.rework.ladder.last is not None
        # and any text where tool_choice asks for a call: it is re-asked (enforce_tool_choice)
        held = checked and (
            cfg.judges_answers or (cfg.enforce_tool_choice and asks_for_call(_asked_choice(call)))
        )
        live = thinking and not corrected and not held
        watch = DegenerationWatch(self.config) if thinking else None
        # a call the model writes as text is handed over as a call: its text never goes out
        gate = call.gate = CallGate() if live and checked and cfg.repair else None
        while True:
            chunk = yield _PULL
            if chunk is END:
                break
            if chunk.comment is not None:
                # an upstream's keep-alive: on to the caller as it came, while text or a call
                # is held back too (the proxies between keep the stream open); no part of the
                # answer, and nothing of it handed on (a retry can still replace this attempt)
                yield Emit(chunk)
                continue
            acc.add(chunk)
            if (
                room is not None
                and room.counted(chunk)
                and not (yield from self._more_room(call, room))
            ):
                call.cut = True  # (this chunk not handed on: the budget holds no room for it)
                return acc.response(cut=True)
            if (
                chunk.usage is not None
                and acc.finish is not None  # before the finish: a running count
                and not chunk.content
                and not chunk.tool_calls
            ):
                call.usage_chunk = chunk  # passed on at the end, after the finish chunk
            if (chunk.content and live) or (chunk.reasoning and thinking):
                content = chunk.content if live else None
                if gate is not None and content:
                    text = content if isinstance(content, str) else acc.content[-1]
                    content = gate.feed(text) or None
                # text held back, in part or whole: the chunk is no longer that event
                raw = chunk.raw if (content or None) == (chunk.content or None) else None
                call.content_sent = call.content_sent or bool(content)
                if content or chunk.reasoning:
                    call.handed_on = True
                    yield Emit(StreamChunk(content=content, raw=raw, reasoning=chunk.reasoning))
            # text held back is watched too: a degenerating answer is cut, whoever reads it
            if (chunk.content or chunk.reasoning) and watch is not None and watch.degenerate(acc):
                call.cut = True
                return acc.response(cut=True)
        if acc.split:
            # parallel calls streamed at one index (Ollama): released at an index each
            call.b.warnings.append(
                f"{len(acc.calls)} tool calls streamed at {len(acc.calls) - acc.split} "
                "index(es): handed on at an index each"
            )
        return acc.response()

    def _uncopied(self, call: _Call, response: ModelResponse) -> ModelResponse:
        """``response`` without its text when, beside its calls, the text copies the guard's
        own words back (a correction, a recovery turn): they are never the model's answer."""
        content = response.message.get("content")
        rework = call.rework
        if not response.message.get("tool_calls") or not isinstance(content, str) or not content:
            return response
        ladder = rework.ladder
        if not (ladder is not None and ladder.copies(content)) and not (
            rework.note and recovery.echoes(content, rework.note, quoted=rework.quoted)
        ):
            return response
        call.b.warnings.append(
            "the answer's text copied the guard's correction back: left out, its calls kept"
        )
        return dataclasses.replace(response, message={**response.message, "content": None})

    def _check(self, call: _Call, response: ModelResponse) -> Plan[ModelResponse | None]:
        """Validation and the response loop check; ``None`` means re-ask or move on."""
        b = call.b
        usage = response.usage
        done = usage.completion_tokens if usage is not None else None
        ran_away = runaway(done, call.rework.cap, self.config.quality.runaway_factor)
        if ran_away:  # past its cap: cut off, whatever the server says (never repaired)
            b.warnings.append(
                f"runaway answer: {done} completion tokens against a cap of {call.rework.cap}; "
                "treated as cut off"
            )
        parsed = None
        note = call.rework.note
        if note and not response.message.get("tool_calls"):
            content = response.message.get("content")
            text = content if isinstance(content, str) else ""
            if recovery.echoes(text, note, quoted=call.rework.quoted):
                return (yield from self._parroted(call, response))
        if call.validator is not None and self.config.tool_validation.enabled:
            # what this attempt asked: a re-ask's own tool_choice (a pinned tool, or tools
            # off to force an answer) when the guard set one, else the caller's
            report: ValidationReport = call.validator.validate(
                response.message,
                finish_reason="length" if ran_away else response.finish_reason,
                tool_choice=_asked_choice(call),
                parallel_tool_calls=call.request.params.get("parallel_tool_calls"),
            )
            if ran_away:
                report = report.cut_off()
            parsed = report.ok
            b.warnings.extend(self._judged(call, response, parsed, ran_away))
            if report.repairs:
                b.repairs.extend(str(r) for r in report.repairs)
                response = _with_tool_calls(response, report)
            # the answer to "which tool does the request need" (tools off) is no answer: the
            # answer it was asked for is re-asked, pinned to the tool it names
            asked = call.rework.picked(response.message)
            if asked is not None:
                report, named = asked
                b.warnings.append(
                    f"asked which tool the request needs: {named or 'the answer named none'}"
                )
            # a text answer that copies the correction back failed as the answer corrected
            report = call.rework.echoed(response.message) or report
            cfg = self.config.tool_validation
            if report.ok and report.tool_calls and cfg.ungrounded_arguments:
                report = self._grounded(call, report)
            if not report.ok:
                mended = yield from self._invalid(call, response, report)
                if mended is None:
                    return None
                response, report = mended
            known = yield from self._known(call, response, report)
            if known is None:
                return None
            response = self._uncopied(call, known)
            if not known.message.get("tool_calls") and (
                cfg.ungrounded_answers or cfg.uncovered_values
            ):
                answer = yield from self._answered(call, response)
                if answer is None:
                    return None
                response = answer
        else:
            b.warnings.extend(self._judged(call, response, parsed, ran_away))
        verdict = self._check_response(call, response)
        if verdict.severity >= Severity.BREAK:
            _relabel(b, "loop_detected", verdict.detector or "")
            yield from self._recover(call, verdict, reask=True)
            return None
        if verdict.severity >= Severity.WARNING:
            b.warnings.append(verdict.message)
        return response

    def _judged(
        self, call: _Call, response: ModelResponse, parsed: bool | None, ran_away: bool
    ) -> list[str]:
        """The quality monitor's warnings on one answer of the call's tier."""
        return self.quality.answered(
            call.tier.name,
            usage=response.usage,
            # the caller's own prompt is judged for truncation, not the guard's re-asks of it
            sent_prompt_tokens=call.prompt_tokens if call.messages is call.base_messages else 0,
            parsed=parsed,
            ran_away=ran_away,
            session=call.b.session,
            # the text alone differs only where images or audio were sent (re-estimating the
            # history is O(history): only then)
            text_prompt_tokens=(
                (lambda: estimate_tokens(call.messages, tools=call.tools, media=False))
                if call.state.media
                else None
            ),
        )

    def _known(
        self, call: _Call, response: ModelResponse, report: ValidationReport
    ) -> Plan[ModelResponse | None]:
        """Calls the transcript has answered already are not sent back to the agent.

        New calls go on (the repeats dropped); when every call repeats an answered one, the
        model is asked once for its answer from the results in hand (the loop ladder's forcing
        rung, ``_recovery.force_answer``), then the call moves up a tier, and with no tier left
        the results in hand are the answer (see ``validation/_known.py``). ``None``: ask again.
        """
        cfg = self.config.tool_validation
        if not report.tool_calls or cfg.answered_repeats == "pass":
            return response
        # a call written with a result the model made up: it thinks it knows the answer
        times = 1 if report.invented else cfg.answered_repeats_after
        if times is None:
            return response
        # the caller's own history: what the guard left out of the request sent (a context
        # overflow's repeated results, a pruned loop) was answered all the same
        known = answered_calls(call.request.messages, cfg.known_results_window)
        repeats = repeated(report.tool_calls, known, times) if known else []
        if not repeats:
            return response
        b = call.b
        names = ", ".join(sorted({a.name for a in repeats}))
        fresh = tuple(c for c in report.tool_calls if not repeated([c], known, times))
        if fresh:
            b.warnings.append(f"dropped calls the transcript has answered: {names}")
            return _with_tool_calls(response, dataclasses.replace(report, tool_calls=fresh))
        _relabel(b, "loop_detected", "answered_repeat")
        if not call.rework.recovered:
            b.warnings.append(f"repeated answered calls ({names}): asked for the answer")
            # the loop ladder's forcing rung: repeats pruned, the results in a recovery turn
            # where the model reads them, tools off (see _recovery.force_answer)
            cfg_recovery = self.config.loop_detection.recovery
            note = recovery.summary(
                call.base_messages,
                cfg_recovery,
                reason=f"You called {names} again, but its result is already here.",
                forced=True,
            )
            forced = recovery.force_answer(
                call.request,
                call.base_messages,
                config=cfg_recovery,
                tool=repeats[0].name,
                note=note,
            )
            call.rework.force(forced.params, note)
            call.messages = list(forced.messages)
            return None
        decision = self.policy.on_failure(call.tier, "loop_detected", degraded=self._closed(call))
        if decision.action != "stop" and decision.target is not None:
            error = LoopDetected(
                f"the model repeats answered calls ({names})",
                detector="answered_repeat",
                count=2,
                session=b.session,
                tool=repeats[0].name,
            )
            call.tier = b.tier = yield from self._move(call, call.tier, decision, error=error)
            return None
        b.warnings.append(f"the model repeats answered calls ({names}): answered from results")
        return _from_results_in_hand(response, repeats)

    def _invalid(
        self, call: _Call, response: ModelResponse, report: ValidationReport
    ) -> Plan[tuple[ModelResponse, ValidationReport] | None]:
        """A failed answer: re-asked (the correction ladder) or moved up a tier (``None``); a
        call whose only fault is a value the request does not state is kept when nothing better
        came back and no tier is above (``tool_validation.ungrounded_arguments``)."""
        b, cfg = call.b, self.config.tool_validation
        kind = report.errors[0].kind if report.errors else ""
        if (
            cfg.ungrounded_answers
            and not call.rework.recovered
            and kind == "empty_answer"
            and call.base_messages
            and call.base_messages[-1].get("role") == "tool"
        ):
            # nothing said right after the results: the answer from them is what is missing
            _relabel(b, "tool_validation_failure", kind)
            b.warnings.append("an empty answer after the tool results: asked from the results")
            self._from_results(call, kind)
            return None
        in_hand = self._in_hand(call) if call.rework.recovered else []
        if in_hand:
            # the answer was asked for from the results in hand, tools off, and what came
            # back is none: the guard asks for no call now (a correction pins a tool); the
            # next tier answers, and with none above, the results in hand are the answer
            _relabel(b, "tool_validation_failure", kind)
            if self._above(call):
                error = ToolValidationFailed(report)
                call.tier = b.tier = yield from self._trigger(
                    call, "tool_validation_failure", error
                )
                return None
            b.warnings.append(f"no answer from the results in hand ({kind}): answered from results")
            answered = _from_results_in_hand(response, in_hand)
            return answered, dataclasses.replace(
                report, ok=True, errors=(), tool_calls=(), message=answered.message
            )
        reask = None
        # a call doubted only for its values is kept only once the request's values were
        # offered as choices for each: that re-ask is owed even past max_retries
        owed = _soft(report) and call.rework.owes(report)
        if cfg.retry_with_correction and (call.corrections < cfg.max_retries or owed):
            # the model is asked which tool only where no stronger tier could answer instead
            reask = call.rework.reask(report, call.request, ask=not self._above(call))
        if reask is None and report.tool_calls and _soft(report) and not self._above(call):
            # a value the request does not state may still be right: with nothing better back
            # and no tier above, the call is the model's answer
            b.warnings.append(
                f"kept a call with values the request does not state ({_paths(report)})"
            )
            report = dataclasses.replace(report, ok=True, errors=())
            return _with_tool_calls(response, report), report
        _relabel(b, "tool_validation_failure", kind)
        if reask is not None:
            if reask.rung == "choices":
                b.warnings.append(
                    f"values the request does not state ({_paths(report)}): re-asked with the "
                    "request's values as the choices"
                )
            elif reask.rung == "asked":
                b.warnings.append(
                    "the correction changed nothing and no tool is named: asked which one"
                )
            elif reask.rung != "correction":
                b.warnings.append(f"the correction changed nothing: re-asked {reask.rung}")
            call.messages = [*call.base_messages, *reask.messages]
            self._correction(call, kind, len(report.errors))
            return None
        error = ToolValidationFailed(report)
        call.tier = b.tier = yield from self._trigger(call, "tool_validation_failure", error)
        return None

    def _grounded(self, call: _Call, report: ValidationReport) -> ValidationReport:
        """``report`` with an ``ungrounded_argument`` error for each call argument whose value
        the current request never states (``tool_validation.ungrounded_arguments``)."""
        request = current_request(
            call.base_messages, self.config.tool_validation.known_results_window
        )
        errors = ungrounded_arguments(report.tool_calls, request, report.specs)
        if not errors:
            return report
        for e in errors:
            self.emitter.emit(
                ToolCallRejected(
                    error=e.kind, tool_call_id=e.tool_call_id, tool_name=e.tool_name, path=e.path
                )
            )
        return dataclasses.replace(report, ok=False, errors=tuple(errors))

    def _above(self, call: _Call, trigger: str = "tool_validation_failure") -> bool:
        """Whether a call failed by ``trigger`` could move to another tier (nothing is moved)."""
        decision = self.policy.on_failure(call.tier, trigger, degraded=self._closed(call))
        return decision.action != "stop" and decision.target is not None

    def _answered(self, call: _Call, response: ModelResponse) -> Plan[ModelResponse | None]:
        """A final answer after tool calls, checked against the request (both opt-in): values
        the request names that no call covered get their call asked for, once, unless the
        answer was already asked for from the results in hand (``uncovered_values``); an
        answer that shares no value with a result is asked for once more from the results in
        hand, then moved up a tier, else answered with the results in hand
        (``ungrounded_answers``); so is one that states numbers nothing in the request states
        (a flight ``Lindsfest 2018``).
        ``None``: ask again."""
        cfg, b = self.config.tool_validation, call.b
        content = response.message.get("content")
        if not isinstance(content, str) or not content.strip():
            return response
        request = current_request(call.base_messages, cfg.known_results_window)
        if not request.calls:
            return response
        # once the answer was asked for from the results in hand (tools off), the guard asks
        # for no further call: a run on that rung ends on an answer, never on a new call
        cover = cfg.uncovered_values and not call.rework.recovered
        missing = uncovered_values(request) if cover else []
        if missing and call.request.tools:
            called = [(name, args) for name, args, _ in request.calls]
            reask = call.rework.cover(
                call.request, missing, request.values, called, response.message
            )
            if reask is not None:
                _relabel(b, "tool_validation_failure", "uncovered_value")
                b.warnings.append(
                    f"the answer leaves out {', '.join(missing)}, which the request names: "
                    "asked for the call"
                )
                self._correction(call, "uncovered_value", len(missing))
                call.messages = [*call.base_messages, *reask.messages]
                return None
        if not cfg.ungrounded_answers:
            return response
        ignored = ignored_results(content, request)
        invented = [] if ignored else invented_numbers(content, request)
        if ignored:
            fault = f"ignores the results of {', '.join(ignored)}"
        elif invented:
            fault = f"states numbers no result holds ({', '.join(invented[:4])})"
        else:
            return response
        _relabel(b, "tool_validation_failure", "ungrounded_answer")
        if not call.rework.recovered:
            b.warnings.append(f"the answer {fault}: asked from the results")
            self._from_results(call, "ungrounded_answer")
            return None
        if self._above(call):
            error = ToolValidationFailed(ValidationReport(False, (), (), (), response.message))
            call.tier = b.tier = yield from self._trigger(call, "tool_validation_failure", error)
            return None
        in_hand = self._in_hand(call)
        if not in_hand:
            b.warnings.append(f"kept an answer that {fault}: no tier left")
            return response
        # asked from the results and still not grounded in them, with no tier above: the
        # results in hand are the answer, as when the model gives none (never a suspect one)
        b.warnings.append(
            f"the answer {fault} after the results were restated: answered from results"
        )
        return _from_results_in_hand(response, in_hand)

    def _from_results(
        self,
        call: _Call,
        error: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        compact: bool = False,
    ) -> None:
        """Ask, once, for the answer from the results in hand: the forcing rung
        (``_recovery.force_answer``: tools off) with a turn that restates the request and its
        results (``_recovery.results_turn``), built from ``messages`` (the call's own when
        ``None``). ``compact``: that turn follows the conversation's system messages alone
        (the turn carries the request and the results; the exchanges do not fit)."""
        self._correction(call, error, 1)
        cfg = self.config.loop_detection.recovery
        source = call.base_messages if messages is None else messages
        question = current_request(source).text.strip()
        note = recovery.results_turn(source, cfg, question)
        sent = [m for m in source if m.get("role") in _INSTRUCTIONS] if compact else source
        forced = recovery.force_answer(call.request, sent, config=cfg, note=note)
        call.rework.force(forced.params, note)
        call.rework.restated = True
        call.rework.quoted = question
        call.messages = list(forced.messages)

    def _parroted(self, call: _Call, response: ModelResponse) -> Plan[ModelResponse | None]:
        """An answer to a recovery turn that copies the turn back (see ``_recovery.echoes``):
        asked once more with the request and its results restated (a turn with almost nothing
        to copy); copied again, the call moves up a tier, and with no tier left the results in
        hand are the answer. The guard's own words are never delivered as the model's answer.
        ``None``: ask again."""
        b = call.b
        _relabel(b, "loop_detected" if b.recovery else "tool_validation_failure", "parroted")
        if not call.rework.restated:
            b.warnings.append(
                "the answer copied the recovery turn back: asked again with the request and "
                "its results"
            )
            # the caller's conversation, not one the guard added its notes to; after a
            # context overflow only its system messages and the restated turn (the whole
            # conversation is known not to fit: it is what overflowed)
            self._from_results(
                call, "parroted_recovery", call.request.messages, compact=call.shrunk
            )
            return None
        if self._above(call, "loop_detected"):
            error = LoopDetected(
                "the model copies the recovery turn back instead of answering",
                detector="parroted_recovery",
                count=2,
                session=b.session,
            )
            call.tier = b.tier = yield from self._trigger(call, "loop_detected", error)
            return None
        answered = self._in_hand(call)
        if not answered:
            b.warnings.append("the answer copied the recovery turn back; no results to give")
            return response
        b.warnings.append("the answer copied the recovery turn back: answered with the results")
        return _from_results_in_hand(response, answered)

    def _in_hand(self, call: _Call) -> list[Answered]:
        """The answered calls of the caller's own conversation (not one the guard added its
        notes to or left exchanges out of), each once: the results in hand."""
        window = self.config.tool_validation.known_results_window
        return list(answered_calls(call.request.messages, window).values())

    def _correction(self, call: _Call, error: str, errors: int) -> None:
        call.corrections += 1
        call.b.corrections += 1
        self.emitter.emit(
            CorrectionRequested(
                session=call.b.session,
                error=error,
                errors=errors,
                correction=call.corrections,
                tier=call.tier.name,
            )
        )

    def _report(self, call: _Call) -> Plan[GuardReport]:
        if call.shared is not None:
            yield from self._share(call)
        if call.kept:
            yield from self._share_threads(call)
        b = call.b
        ledger = self.ledger
        if ledger is None:
            return b.build()
        snapshot = yield from perform(ledger.usage, ledger.ausage, b.session)
        if b.budget == "off":
            b.budget = "ok"
        return b.build(session_tokens=snapshot.session_tokens, session_cost=snapshot.session_cost)

    # -- escalation ----------------------------------------------------------------------------

    def _trigger(self, call: _Call, trigger: str, error: BaseException | None) -> Plan[Tier]:
        """Move ``call`` off its tier because of ``trigger``, or raise when it cannot move."""
        yield from self._read_degraded(call)
        decision = self.policy.on_failure(call.tier, trigger, degraded=self._closed(call))
        return (yield from self._move(call, call.tier, decision, error=error))

    def _move(
        self,
        call: _Call,
        current: Tier,
        decision: EscalationDecision,
        *,
        error: BaseException | None,
    ) -> Plan[Tier]:
        b = call.b
        if decision.action == "stop" or decision.target is None:
            _raise(call, decision.reason, error)
        target = decision.target
        if decision.action == "confirm":
            tokens, prices = self._next_attempt(call), self._prices()
            message = _what_failed(error, decision)
            breaker = self.breakers.get(current.name)
            if breaker is not None and breaker.state == "open":
                message += "; its circuit breaker is open (a retry is sent to it anyway)"
            prompt = self.policy.prompt(
                decision,
                current,
                message=message,
                tokens_spent=b.usage.total_tokens,
                cost_spent=b.cost,
                attempts=len(b.attempts),
                estimated_tokens=tokens.total_tokens,
                retry_cost=_price_of(prices, current, tokens),
                backup_cost=_price_of(prices, target, tokens),
            )
            try:
                answer = yield Ask(prompt)
            except Exception as exc:  # EscalationRequired (no callback), or the callback's own
                _record(call, exc)
                raise
            choice = self.policy.read_answer(prompt, answer)
            if choice is None:  # not a yes: never taken as consent to move (or spend)
                b.warnings.append(
                    f"the confirm callback answered {_shown(answer)}, none of the options "
                    f"({', '.join(o.value for o in prompt.options)}): taken as cancel"
                )
                choice = Choice.CANCEL
            if choice == Choice.CANCEL:
                _raise(call, decision.reason, error)
            if choice == Choice.RETRY:
                call.reset()
                # the user's choice is the probe: sent even while the tier's breaker is open
                call.chosen = True
                return current
        b.reasons.append(decision.reason)
        self.emitter.emit(
            Escalated(
                session=b.session,
                from_tier=current.name,
                to_tier=target.name,
                reason=decision.reason,
            )
        )
        call.reset()
        return target

    def _next_attempt(self, call: _Call) -> Usage:
        """What one more attempt is expected to spend, for the confirm-mode options.

        The prompt is the request's own (a retry or another tier starts without re-asks); the
        answer is as long as this call's answers so far, else bounded by the request's cap.
        """
        answered = [a for a in call.b.attempts if a.outcome in _ANSWERED]
        if answered and call.b.usage.completion_tokens:
            output = -(-call.b.usage.completion_tokens // len(answered))  # rounded up
        else:
            output = call.request.max_output_tokens or 0
        return Usage(call.prompt_tokens, output, estimated=True)

    def _prices(self) -> PriceTable:
        """The price table in force: the ledger's (it may be a shared one), else the config's."""
        if self.ledger is not None:
            return self.ledger.prices
        return PriceTable(self.config.token_budget.prices)

    # -- loops ---------------------------------------------------------------------------------

    def _failed(self, call: _Call, error_class: ErrorClass, error: Exception) -> Plan[Tier]:
        """The tier after an upstream error retries did not cure: another one when the error
        is a trigger; else the error is raised, unless the upstream refused the conversation as
        a loop (``400 Repetitive tool calls detected``), which the ladder answers as a loop at
        BREAK (first forcing an answer from the pruned conversation)."""
        trigger = _TRIGGER_OF.get(error_class)
        if trigger is not None:
            return (yield from self._trigger(call, trigger, error))
        if self._shrunk(call, error) or self._compacted(call, error):
            return call.tier
        refusal = recovery.provider_refusal(error, session=call.b.session)
        if refusal is None:
            raise error
        yield from self._recover(
            call,
            Verdict(Severity.BREAK, refusal.detector, refusal.count, refusal.message),
            reask=True,
        )
        return call.tier

    def _shrunk(self, call: _Call, error: Exception) -> bool:
        """A context-length 400: the call is sent again, once, without the tool exchanges that
        repeat an earlier result of their tool (``_recovery.shrink``; a looping run is what
        outgrows the context most). ``False``: nothing to leave out, or done already."""
        if call.shrunk or not context_overflow(error):
            return False
        sent, base = call.messages, call.base_messages
        kept = recovery.shrink(sent)
        if len(kept) == len(sent):
            return False
        call.shrunk = True
        # what a later re-ask is built on goes without them too
        call.base_messages = kept if sent is base else recovery.shrink(base)
        call.messages = kept
        call.prompt_tokens += estimate_tokens(call.base_messages) - estimate_tokens(base)
        call.b.warnings.append(
            f"context overflow: sent again without {len(sent) - len(kept)} messages of "
            "repeated tool results"
        )
        return True

    def _compacted(self, call: _Call, error: Exception) -> bool:
        """A context-length 400 that leaving out repeated results did not cure, or that found
        none to leave out: when the caller's conversation holds tool results, the answer is
        asked for, once, from them, tools off, in a compact conversation (its system messages
        and one turn restating the request with the results, ``_from_results``). A run whose
        transcript holds its answer does not end in the server's 400.

        This also gets past a server that overflows on its own generation: llama-cpp-python's
        function-calling format writes a call's arguments without the request's cap until the
        context is full (``docs/loops.md``), a path a tools-off request does not take. ``False``: no
        results to answer from, or the answer was asked for from them already."""
        if call.rework.recovered or not context_overflow(error):
            return False
        source = call.request.messages
        if not any(ex.result_at is not None for ex in recovery.exchanges(source)):
            return False
        call.b.warnings.append(
            "context overflow: asked for the answer from the tool results in a compact conversation"
        )
        self._from_results(call, "context_overflow", source, compact=True)
        return True

    def _recover(self, call: _Call, verdict: Verdict, *, reask: bool = False) -> Plan[None]:
        """Take the next rung of the recovery ladder for a looping run (see ``_recovery``).

        The rung's conversation, built from the caller's messages, becomes the call's; ``force``
        also sends ``tool_choice: "none"``; ``escalate`` moves the call on; ``stop`` (or an
        escalation with nowhere to go) raises :class:`LoopDetected`. A ``reask`` (the answer
        itself looped, or the upstream refused) that finds no higher rung stops: one call never
        asks the same way twice.
        """
        b, cfg = call.b, self.config.loop_detection.recovery
        before = call.state.rung
        call.state.rung = recovery.climb(
            before, verdict.severity, cfg, tool_loop=verdict.detector not in recovery.TEXT_DETECTORS
        )
        rung = "stop" if reask and call.state.rung <= before else cfg.rungs[call.state.rung]
        if reask:  # the answer asked again for replaces the one not delivered: it streams live
            call.content_sent = False
        b.recovery.append(rung)
        b.warnings.append(verdict.message)
        if call.shared is not None:  # the rung reached, before a stop or a move can raise
            yield from self._share(call)
        self.emitter.emit(
            LoopRecovery(
                session=b.session,
                rung=rung,
                detector=verdict.detector or "loop",
                severity=verdict.severity.name.lower(),
                count=verdict.count,
                tool=verdict.tool,
            )
        )
        error = LoopDetected(
            verdict.message,
            detector=verdict.detector or "loop",
            count=verdict.count,
            session=b.session,
            tool=verdict.tool,
        )
        if rung == "stop":
            _raise(call, "loop_detected", error)
        if rung == "force":  # the note kept: an answer that only copies it back is none
            note = recovery.summary(call.request.messages, cfg, reason=verdict.message, forced=True)
            sent = recovery.force_answer(call.request, config=cfg, tool=verdict.tool, note=note)
            call.rework.force(sent.params, note)
        else:
            sent = recovery.rung_request(
                rung, call.request, cfg, hint=verdict.message, tool=verdict.tool
            )
        if sent.params is not call.request.params:  # force: tools off
            call.request = recovery.replaced(call.request, params=sent.params)
        messages = list(sent.messages)
        call.prompt_tokens += estimate_tokens(messages) - estimate_tokens(call.base_messages)
        call.base_messages = call.messages = messages
        if rung == "escalate":
            call.tier = b.tier = yield from self._trigger(call, "loop_detected", error)

    def _check_transcript(self, state: Run, new: Sequence[New], judged_from: int = -1) -> Verdict:
        """Remember and judge the messages the run had not seen (see :meth:`Runs.locate`).

        ``judged_from``: the index of the latest message the session has had judged elsewhere
        (another process on the shared store); the detector reads the messages up to it, and
        only the later ones give the verdict.
        """
        worst = Verdict()
        judged = False
        for index, key, tokens, message in new:
            self._runs.remember(state, key, index, tokens)
            if not state.media and holds_media(message.get("content")):
                state.media = True
            # a user message is news to the detector: the runs it flagged start again
            if message.get("role") in ("assistant", "tool", "user"):
                verdicts = state.detector.observe(message)
                if index > judged_from:
                    worst = _worst([worst, *verdicts])
            judged = judged or index > judged_from
        if judged and worst.ok:
            state.rung = -1  # out of the loop: a later one starts the ladder again
        return worst

    def _synced(
        self,
        shared: str,
        state: Run,
        new: list[New],
        messages: Sequence[Mapping[str, Any]],
    ) -> Plan[tuple[list[New], int]]:
        """The run brought up to the session's shared state: its unseen messages, and the index
        of the latest message the session has had judged (-1: none; see ``_check_transcript``).

        The shared record names the session's latest message (index and key) and the ladder
        rung it reached. When this process's run is at that message, nothing changes. When the
        session moved on elsewhere, a fresh detector reads the transcript (as it would for a
        history it never saw), only the messages after that one are judged, and the ladder
        goes on from the shared rung. A store that fails is ignored (the run judged here alone).
        """
        store = self.session_store
        assert store is not None
        try:
            text = yield from perform(store.get, store.aget, _SESSIONS, shared, _clock.wall())
            record = json.loads(text or "{}")
            at, key, rung = int(record["at"]), str(record["key"]), int(record["rung"])
        except Exception:  # no record, a damaged one, or a store fault: this process alone
            return new, -1
        last = state.last
        if last is not None and (last[0], last[1]) == (at, key):
            return new, -1  # this process served the session's latest request
        if not (0 <= at < len(messages) and message_key(messages[at]) == key):
            return new, -1  # another line of the conversation (a fork, an edit)
        state.rung = max(-1, min(rung, len(self.config.loop_detection.recovery.rungs) - 1))
        if last is not None:  # what this process remembers of the run is out of date
            new = self._runs.restart(state, messages)
        return new, at

    def _share(self, call: _Call) -> Plan[None]:
        """Write the run's latest message and ladder rung to the shared store (see ``_synced``);
        a store that fails is ignored."""
        store, shared, last = self.session_store, call.shared, call.state.last
        if store is None or shared is None or last is None:
            return
        record = json.dumps({"at": last[0], "key": last[1], "rung": call.state.rung})
        with contextlib.suppress(Exception):  # fail open: the session is judged here alone
            yield from perform(
                store.put,
                store.aput,
                _SESSIONS,
                shared,
                record,
                _clock.wall(),
                self.session_ttl,
            )

    def _check_response(self, call: _Call, response: ModelResponse) -> Verdict:
        """Remember and judge the answer, which the next request will carry after the history
        (or name, by its id, as the thread it follows: see :meth:`Runs.follow`)."""
        message = response.message
        index, tokens = call.history
        tokens += estimate_tokens([message]) - REPLY_PRIMING
        runs, run = self._runs, call.state
        runs.remember(run, message_key(message), index, tokens, answer=True)
        threads = []
        if isinstance(response.id, str) and response.id:
            threads.append("response:" + response.id)
        thread = thread_of(call.request.params)
        if thread is not None and thread.startswith("conversation:"):
            threads.append(thread)
        for thread in threads:
            runs.answered(run, call.realm, thread, call.tier)
        # answered away from where the caller's model starts: shared, so that the next turn
        # goes to this tier through any process (see _home); answered there, nothing to share
        if threads and call.tier.endpoint != self.policy.tier_for(call.request.model).endpoint:
            call.kept = threads if self._thread_store() is not None else []
        return _worst(run.detector.observe(message))


#: The least a stream past its admitted output holds of the budget at a time.
_ROOM_STEP = 512


class _Room:
    """The output a streamed attempt may produce within what its budget holds: the worst case
    its call was admitted for (``allowed``), then what it holds more as it runs past that
    (``extra``, ``step`` at a time: see :meth:`Pipeline._more_room`). A server that ignores the
    cap, or an uncapped answer longer than the output the ledger counts for it, would otherwise
    pass a ``hard_stop`` limit by everything it streams past its hold.

    What streamed is estimated as a whole answer without usage is (the text, reasoning and
    call fragments; characters, not tokens), kept as two running counts: a check per chunk,
    not a pass over the answer.
    """

    __slots__ = ("allowed", "answers", "ascii", "extra", "other", "rate", "step")

    def __init__(self, allowed: int, answers: int, rate: float) -> None:
        self.allowed = allowed
        self.answers = answers
        self.rate = rate
        self.step = max(allowed // 4, _ROOM_STEP)
        self.ascii = self.other = 0
        self.extra: list[Reservation] = []

    @property
    def streamed(self) -> int:
        """The output streamed so far, estimated (each of ``n`` answers as long as the first)."""
        return (math.ceil(self.ascii / self.rate) + self.other) * self.answers

    def counted(self, chunk: StreamChunk) -> bool:
        """Count ``chunk``'s output; whether the stream is now past its room."""
        pieces: list[Any] = [chunk.content, chunk.reasoning]
        for fragment in chunk.tool_calls or ():
            fn = fragment.get("function") if isinstance(fragment, Mapping) else None
            if isinstance(fn, Mapping):
                pieces += (fn.get("name"), fn.get("arguments"))
        for piece in pieces:
            if piece.__class__ is str and piece:
                if piece.isascii():
                    self.ascii += len(piece)
                else:
                    ascii_chars = len(piece.encode("ascii", "ignore"))
                    self.ascii += ascii_chars
                    self.other += len(piece) - ascii_chars
        return self.streamed > self.allowed


def _room(reservation: Reservation | None, request: ModelRequest, rate: float) -> _Room | None:
    """The room of a streamed attempt held by ``reservation``; ``None`` without a budget limit
    (nothing to pass) or an output count to start from."""
    if reservation is None or not reservation.output_tokens:
        return None
    if reservation.session_limit is None and reservation.hour_limit is None:
        return None
    return _Room(reservation.output_tokens, _answers(request.params.get("n")), rate)


@dataclass
class _Call:
    """The mutable state of one guarded call while its plan runs."""

    request: ModelRequest
    state: Run
    b: ReportBuilder
    tools: list[Mapping[str, Any]]
    prompt_tokens: int
    validator: ToolCallValidator | None = None
    tier: Tier = field(default_factory=lambda: Tier("", ""))
    messages: list[Mapping[str, Any]] = field(default_factory=list)
    base_messages: list[Mapping[str, Any]] = field(default_factory=list)
    transient: int = 0
    corrections: int = 0
    history: tuple[int, int] = (0, 0)  # the index its answer takes, and the tokens before it
    realm: str = ""  # who may follow its answer as a thread (see Runs.follow)
    # the endpoint keeping the conversation a thread request follows (see Pipeline._closed)
    kept_at: tuple[str | None, str | None] | None = None
    choice: Any = None  # the caller's tool_choice (the guard may turn tools off: _asked_choice)
    content_sent: bool = False  # streaming: some text already reached the caller
    usage_chunk: StreamChunk | None = None  # streaming: the served attempt's usage chunk
    cut: bool = False  # streaming: the answer was cut (degenerated, or past its budget)
    cut_reason: str | None = None  # streaming: why, when not degeneration
    room: _Room | None = None  # streaming: the output the budget holds room for (see _room)
    streamed: Accumulator | None = None  # streaming: what the current attempt has delivered
    handed_on: bool = False  # streaming: the current attempt passed part of its answer on
    gate: CallGate | None = None  # streaming: the live attempt's hold on text-written calls
    rework: Rework = field(default_factory=Rework)  # re-asks and recovery turns on this tier
    shrunk: bool = False  # sent again without repeated tool results after a context-length 400
    shared: str | None = None  # the session's key in the pipeline's session store
    kept: list[str] = field(default_factory=list)  # threads to share (see _share_threads)
    chosen: bool = False  # confirm mode: the user chose to retry this tier (see _move)
    degraded: frozenset[str] = frozenset()  # tiers with an open breaker (see _read_degraded)

    def reset(self) -> None:
        """A new tier (or a fresh try): retry and correction counts start over."""
        self.transient = 0
        self.corrections = 0
        self.messages = self.base_messages
        self.rework = Rework()
        self.chosen = False


def _what_failed(error: BaseException | None, decision: EscalationDecision) -> str:
    """What went wrong, briefly, for the confirm-mode question (redacted by ``classify``)."""
    if error is None:
        return decision.reason.replace("_", " ")
    classification = classify(error)
    if classification.status_code is not None:
        return f"HTTP {classification.status_code} ({classification.error_class.value})"
    return classification.reason


def _shown(answer: object) -> str:
    """A confirm callback's answer, briefly and redacted, for a warning."""
    if isinstance(answer, str):
        text = redact(repr(str(answer[:200])))
        return text if len(text) <= 40 else text[:37] + "..."
    if answer is None or isinstance(answer, bool):
        return repr(answer)
    if isinstance(answer, int) and -(10**6) < answer < 10**6:  # (repr fails on huge ones)
        return str(int(answer))
    return f"an answer of type {type(answer).__name__}"


def _worst(verdicts: Sequence[Verdict]) -> Verdict:
    """The most severe verdict (the first of equals), or an OK one."""
    worst = Verdict()
    for verdict in verdicts:
        if verdict.severity > worst.severity:
            worst = verdict
    return worst


def _raise(call: _Call, reason: str, error: BaseException | None) -> NoReturn:
    """Give up: every tier tried, or the one error there is (an upstream error keeps its type).

    Either way the error carries the guard's record of the call (see :func:`_record`).
    """
    moved = len({a.tier for a in call.b.attempts}) > 1
    if error is not None:
        # its message may be the upstream's body echoing a key the guard sent (a tier's): the
        # error stays the cause (its type, status and response), its text redacted
        redact_exception(error)
    if moved or error is None:
        exhausted = TiersExhausted(call.b.attempts, reason)
        _record(call, exhausted)
        raise exhausted from error
    _record(call, error)
    raise error


def _asked_choice(call: _Call) -> Any:
    """The ``tool_choice`` an answer is held to: the caller's, unless the guard turned tools
    off to force an answer: then none (a text answer is what it wants, and a call despite it
    is the loop going on, for the recovery ladder to judge, not a call to correct). A tool the
    guard pins in a re-ask is its own hint, not a demand: text that answers it is judged as
    the caller's choice says."""
    asked = call.choice
    if asked != "none" and "none" in (
        (call.rework.params or {}).get("tool_choice"),
        call.request.params.get("tool_choice"),
    ):
        return None
    return asked


def _answers(n: Any) -> int:
    """The answers a chat request asks for (``n``): each may use the whole output cap. A value
    that is no count is one answer here (the upstream refuses it)."""
    return n if n.__class__ is int and 1 <= n <= 128 else 1


def _token_count(value: object) -> int | None:
    """A request's output limit if it is a whole, non-negative number; else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _record(call: _Call, error: BaseException) -> None:
    """Attach what the guard did so far to ``error``: attempts, tokens and cost, the report.

    An :class:`AgentGuardError` gets its ``attempts`` and ``agentguard_report``; any other
    exception (an upstream SDK error that keeps its type) the same ``agentguard_report``
    attribute. Both get a one-line note for tracebacks. The innermost record wins: an error
    passing through several frames of the plan is recorded once. The text of the error and of
    the errors chained to it is redacted (see :func:`~agentguard._redact.redact_exception`).
    """
    # its text (and that of what is chained to it) may be an upstream's body echoing a key the
    # guard sent: redacted, the error itself kept (its type, status, response)
    redact_exception(error)
    if getattr(error, "agentguard_report", None) is not None:
        return
    report = call.b.build()
    if isinstance(error, BudgetExceeded):
        report = dataclasses.replace(report, budget="exceeded")
    with contextlib.suppress(AttributeError):  # a type with __slots__: the note still tells
        error.agentguard_report = report  # type: ignore[attr-defined]
    if isinstance(error, AgentGuardError):
        error.attempts = report.attempts
    tried = ", ".join(f"{a.tier} {a.outcome}" for a in report.attempts) or "no model call"
    cost = "" if report.cost is None else f" (~{_money(report.cost)})"
    note = (
        f"agentguard: {len(report.attempts)} attempt(s) [{tried}], "
        f"{report.usage.total_tokens:,} tokens{cost}, session {report.session}"
    )
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:  # pragma: no cover - Python 3.10 has no add_note; its tracebacks ignore __notes__
        error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]


def _soft(report: ValidationReport) -> bool:
    """Whether every error of ``report`` is a doubt about a value, not a broken call."""
    return bool(report.errors) and all(e.kind == "ungrounded_argument" for e in report.errors)


def _paths(report: ValidationReport) -> str:
    return ", ".join(f"{e.tool_name} {e.path.removeprefix('$.')}" for e in report.errors)


def _from_results_in_hand(response: ModelResponse, answered: Sequence[Answered]) -> ModelResponse:
    """``response`` with the results in hand as its answer (the model could not give one)."""
    message = {"role": "assistant", "content": results_answer(answered)}
    return dataclasses.replace(response, message=message, finish_reason="stop")


def _relabel(b: ReportBuilder, outcome: str, detail: str) -> None:
    """The last attempt answered, but not usably: say what happened instead of ``ok``."""
    if b.attempts and b.attempts[-1].outcome == "ok":
        b.attempts[-1] = dataclasses.replace(b.attempts[-1], outcome=outcome, detail=detail)


def _price_of(prices: PriceTable, tier: Tier | None, tokens: Usage) -> float | None:
    """The cost of ``tokens`` on ``tier``, or ``None`` when no price applies to its model."""
    if tier is None or prices.price(tier.model) is None:
        return None
    return prices.cost(tier.model, tokens.prompt_tokens, tokens.completion_tokens)


def _message_objects(messages: Any) -> list[Mapping[str, Any]]:
    """The message objects of a request's ``messages``, whatever it holds (the same list when
    every entry is one): a lone message object is a list of one, anything else none."""
    if isinstance(messages, Mapping):
        return [messages]
    if not isinstance(messages, (list, tuple)):
        return []
    if all(isinstance(m, Mapping) for m in messages):
        return messages if isinstance(messages, list) else list(messages)
    return [m for m in messages if isinstance(m, Mapping)]


def _readable_output_cap(request: ModelRequest, problems: list[str]) -> ModelRequest:
    """``request`` with an output cap the budget can hold, the problem noted in ``problems``.

    A cap that is no token count (negative, a flag) is not the guard's to hold: the budget holds
    its configured cap instead, so such a cap never switches the budget off. The request still
    goes upstream as the caller wrote it (the upstream refuses it as it would unguarded)."""
    cap = request.max_output_tokens
    if cap is None or (cap.__class__ is int and cap >= 0):
        return request
    problems.append(f"max_output_tokens={cap!r} is not a token count: the budget holds its cap")
    readable = dataclasses.replace(request)
    # set on the copy, not through replace(), which would read the cap from params again
    object.__setattr__(readable, "max_output_tokens", None)
    return readable


def _delivered_usage(call: _Call) -> Usage:
    """What the current attempt's stream delivered so far: its usage chunk's count, else an
    estimate of the text and calls received (a stream that stopped before its end: a call's
    fragments were written, and billed, whole or not)."""
    if call.usage_chunk is not None and call.usage_chunk.usage is not None:
        return call.usage_chunk.usage
    streamed = call.streamed
    message = streamed.response().message if streamed is not None else None
    return _estimated(call, message)


def _estimated(call: _Call, message: Mapping[str, Any] | None) -> Usage:
    """The estimated usage of an answer that came without its count: the prompt, and the
    output of each of the ``n`` answers asked for, which the guard reads only the first of
    (the others counted as long as it: a call asking for three answers is charged three)."""
    usage = estimate_usage(call.messages, message, tools=call.tools)
    answers = _answers(call.request.params.get("n"))
    if answers == 1:
        return usage
    return dataclasses.replace(usage, completion_tokens=usage.completion_tokens * answers)


def _with_tool_calls(response: ModelResponse, report: ValidationReport) -> ModelResponse:
    """``response`` carrying the report's (repaired) calls, each with the fields its original
    entry had besides the call (Gemini's ``extra_content``: see :meth:`ToolCall.to_openai`),
    found by id, else by place when the calls are as many as the entries."""
    message = dict(response.message)
    sent = message.get("tool_calls")
    entries = [c for c in sent if isinstance(c, Mapping)] if isinstance(sent, list) else []
    originals = [c for c in entries if not other_kind(c)]
    by_id = {c["id"]: c for c in originals if isinstance(c.get("id"), str) and c["id"]}
    placed = len(originals) == len(report.tool_calls)
    calls = [
        c.to_openai(by_id.get(c.id) or (originals[i] if placed else None))
        for i, c in enumerate(report.tool_calls)
    ]
    calls += [dict(c) for c in entries if other_kind(c)]  # custom tools' calls, as they came
    message["tool_calls"] = calls or None
    if report.extracted:
        message["content"] = report.content
    finish = "tool_calls" if calls else response.finish_reason
    return dataclasses.replace(response, message=message, finish_reason=finish)
