"""``HookGuard``: judges coding-agent hook events with the session's loop and budget state."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agentguard import _clock
from agentguard.budget import Reservation, TokenLedger
from agentguard.config import GuardConfig
from agentguard.exceptions import StoreUnavailable
from agentguard.storage import RedisStore, SQLiteStore, Store, store_from_config
from agentguard.types import Severity

from ._protocol import (
    ALLOW,
    HookAnswer,
    HookEvent,
    context_answer,
    deny_answer,
    notice_answer,
    parse_event,
)
from ._state import SessionLoops
from ._transcript import Cursor, read_usage

__all__ = ["HookGuard", "default_store_path", "judge_once", "open_guard"]

logger = logging.getLogger("agentguard.hooks")

_PREFIX = "agentguard: "
_TURN = "hooks:refused"  # tool calls refused in the current turn, per session
_NAMES = {"session": "session", "hour": "hourly"}


@dataclass(frozen=True, slots=True)
class _Budget:
    """A budget past its warning line: ``level`` ``warn`` or ``exhausted``."""

    level: Literal["warn", "exhausted"]
    name: str
    used: int
    limit: int

    def text(self, *, for_model: bool) -> str:
        """What the model (or the user) is told."""
        amount = f"{self.used:,} of {self.limit:,} tokens"
        if self.level == "exhausted":
            said = f"the {_NAMES[self.name]} token budget is used up ({amount})."
            if for_model:
                said += " Do not start new work: give your final answer with what you have."
            return _PREFIX + said
        share = 100 * self.used // self.limit
        said = f"{share}% of the {_NAMES[self.name]} token budget is used ({amount})."
        return _PREFIX + said + (" Work towards your answer." if for_model else "")


class HookGuard:
    """Answers Claude Code and Codex CLI hook events: loop hints and refusals, token budgets.

    Unlike a hook that judges each tool call alone, it keeps each session's state (the
    :class:`~agentguard.LoopDetector`'s view of its tool calls and results, the tokens its
    transcript shows spent) in a store shared by every hook process, so the hundredth
    near-identical ``grep`` is judged as the hundredth. What it answers, in the agent's own
    format (see :mod:`agentguard.hooks`):

    - ``PreToolUse``: nothing for a healthy call; the loop hint as added context at WARNING and
      CRITICAL; a refusal, with the reason shown to the model, at BREAK or when a ``hard_stop``
      budget is used up;
    - ``PostToolUse`` / ``PostToolUseFailure``: the loop hint as added context;
    - ``UserPromptSubmit``: nothing (news: runs of unchanged results start again);
    - ``Stop``: a message to the user when a budget passes its warning line or runs out.

    Token use is read from the transcript the event names, incrementally, and counted in a
    :class:`~agentguard.TokenLedger` (``token_budget``: per session, per rolling hour across
    sessions) once per model call, however many hook processes read it.

    Every internal fault fails open: the event is let through silently (and logged, without
    its text) — a guard fault never blocks the agent. The first store fault ends the event: a
    store another process keeps write-locked is waited for once (its busy timeout), not once
    per step.

    Args:
        config: the guard configuration (``loop_detection``, ``token_budget``, ``storage``).
        store: where session state lives; default: the one ``config.storage`` names. Command
            hooks are separate processes: give them a shared store (SQLite or Redis).
        clock: wall-clock seconds since the epoch.
    """

    def __init__(
        self,
        config: GuardConfig | None = None,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = _clock.wall,
    ) -> None:
        self.config = config = config if config is not None else GuardConfig()
        self.store = store if store is not None else store_from_config(config.storage)
        self._clock = clock
        self.loops = SessionLoops(self.store, config.loop_detection, clock=clock)
        self._budget = budget = config.token_budget
        # The ledger only counts what the transcript shows was spent (it happened: nothing to
        # refuse); the hook applies the policy itself, to the next tool call.
        counting = budget.model_copy(
            update={"policy": "warn_and_continue", "max_output_tokens": None}
        )
        # A store fault ends the event (it fails open at once): the ledger raises it rather
        # than serve from local state, which would let the event's next step wait for the
        # store again. Nothing is lost: what was not counted is read again from the transcript.
        closed = config.storage.model_copy(update={"fail_mode": "closed"})
        ledger_config = config.model_copy(update={"token_budget": counting, "storage": closed})
        self.ledger = TokenLedger(ledger_config, store=self.store, clock=clock)
        self._ttl = budget.session_ttl_seconds
        self._lock = threading.Lock()  # one event at a time: the detectors are sequential

    def handle(self, agent: str, payload: Any) -> HookAnswer:
        """The answer to one hook event.

        Args:
            agent: ``claude-code`` or ``codex``.
            payload: the event: its JSON text (bytes or str) or the decoded object.

        Returns:
            The answer (silence when everything may proceed). Never raises: an internal fault
            answers silence. Thread-safe (events are judged one at a time).
        """
        try:
            if isinstance(payload, (bytes, bytearray, str)):
                payload = json.loads(payload)
            event = parse_event(agent, payload)
            with self._lock:
                return self._judge(event)
        except Exception as exc:  # a guard fault must never block the agent
            return _failed_open(exc)

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    # -- judgement ---------------------------------------------------------------------------

    def _judge(self, event: HookEvent) -> HookAnswer:
        session = event.session
        if event.kind == "prompt":
            self.loops.news(session)
            return ALLOW
        if event.kind == "other":
            return ALLOW
        budget = self._spent(event)
        if event.kind == "stop":
            return self._turn_ended(session, budget)
        stop = budget is not None and budget.level == "exhausted" and self._hard_stop
        notes: list[str] = []
        if event.kind == "pre":
            verdict = self.loops.call(session, event.tool, event.tool_input)
            if stop and budget is not None:
                self._refused(session)
                return deny_answer(event, budget.text(for_model=True))
            if verdict.severity is Severity.BREAK:
                self._refused(session)
                return deny_answer(event, _PREFIX + verdict.message)
        else:
            verdict = self.loops.result(
                session, event.tool, event.tool_input, event.tool_response, event.failed
            )
        if verdict.severity >= Severity.WARNING:
            notes.append(_PREFIX + verdict.message)
        if budget is not None and (stop or self._first(session, "hint", budget)):
            notes.append(budget.text(for_model=True))
        return context_answer(event, "\n".join(notes)) if notes else ALLOW

    def _refused(self, session: str) -> None:
        """Count a refused tool call of this turn (told to the user when the turn ends)."""
        now = self._clock()
        count = self.store.get(_TURN, session, now)
        refused = int(count) + 1 if count and count.isdigit() else 1
        self.store.put(_TURN, session, str(refused), now, self._ttl)

    def _turn_ended(self, session: str, budget: _Budget | None) -> HookAnswer:
        """The user's notice at ``Stop``: tool calls refused this turn, a budget's state."""
        notes = []
        count = self.store.get(_TURN, session, self._clock())
        if count and count.isdigit() and int(count) > 0:
            self.store.delete(_TURN, session, self._clock())
            calls = "call" if count == "1" else "calls"
            notes.append(
                f"{_PREFIX}refused {count} tool {calls} this turn "
                "(repeated without progress, or past the token budget)."
            )
        if budget is not None and self._first(session, "notice", budget):
            notes.append(budget.text(for_model=False))
        return notice_answer("\n".join(notes)) if notes else ALLOW

    @property
    def _hard_stop(self) -> bool:
        return self._budget.policy == "hard_stop"

    def _first(self, session: str, what: str, budget: _Budget) -> bool:
        """Whether this is the first time ``what`` is said about this budget level."""
        key = f"{what}:{budget.level}:{budget.name}"
        return self.store.claim(f"hooks:said:{session}", key, "1", self._clock(), self._ttl) is None

    def _spent(self, event: HookEvent) -> _Budget | None:
        """Count what the transcript shows spent since the last hook; the budget past its
        warning line (the exhausted one first), or ``None``."""
        config = self._budget
        session = event.session
        if event.transcript is not None:
            now = self._clock()
            saved = self.store.get("hooks:cursor", session, now)
            cursor = Cursor.loads(saved, event.transcript)
            try:
                entries, after = read_usage(event.agent, cursor)
            except OSError:  # not written yet, or unreadable: the budget waits
                entries, after = [], cursor
            held: dict[str | None, Reservation] = {}  # one per model (it prices the usage)
            for entry in entries:
                reservation = held.get(entry.model)
                if reservation is None:
                    reservation = self.ledger.reserve(session, 0, model=entry.model)
                    held[entry.model] = reservation
                self.ledger.commit(reservation, entry.usage, event_id=f"{session}:{entry.event_id}")
            if after != cursor:
                self.store.put("hooks:cursor", session, after.dumps(), now, self._ttl)
        if not config.enabled:
            return None
        usage = self.ledger.usage(session)
        worst: _Budget | None = None
        for name, used, limit in (
            ("session", usage.session_tokens, config.per_session),
            ("hour", usage.hour_tokens, config.per_hour),
        ):
            if limit is None:
                continue
            if used >= limit:
                return _Budget("exhausted", name, used, limit)
            if worst is None and used >= config.warn_ratio * limit:
                worst = _Budget("warn", name, used, limit)
        return worst


def _failed_open(exc: BaseException) -> HookAnswer:
    """Let the event through, and log the fault (its type only: its text may quote the event)."""
    logger.warning("agentguard hook failed open (%s)", type(exc).__name__)
    return ALLOW


def default_store_path(env: Mapping[str, str] | None = None) -> str:
    """The SQLite file command hooks share by default: ``$XDG_STATE_HOME/agentguard/hooks.sqlite``
    (``~/.local/state/agentguard/hooks.sqlite``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "agentguard", "hooks.sqlite")


def open_guard(
    config: str | None = None, store: str | None = None, directory: str | None = None
) -> HookGuard:
    """The :class:`HookGuard` of a command hook or of its daemon.

    Args:
        config: a configuration file; ``None``: ``AGENTGUARD_CONFIG``, else the defaults (with
            the ``AGENTGUARD_*`` overrides either way).
        store: ``redis://`` / ``rediss://`` URL or a SQLite file; ``None``: the configuration's
            ``storage`` when it names a shared one, else :func:`default_store_path`.
        directory: what a relative ``storage.path`` of the configuration is relative to (the
            hook's working directory; default: this process's).

    Raises:
        ConfigError: the configuration is invalid.
        StoreUnavailable: the store cannot be opened.
    """
    cfg = GuardConfig.load(config)
    shared: Store
    if store and store.startswith(("redis://", "rediss://", "unix://")):
        shared = RedisStore(store, key_prefix=cfg.storage.key_prefix)
    elif store:
        shared = SQLiteStore(store, busy_timeout=cfg.storage.busy_timeout_seconds)
    elif cfg.storage.backend == "sqlite" and cfg.storage.path:
        path = os.path.join(directory or os.getcwd(), cfg.storage.path)
        shared = store_from_config(cfg.storage.model_copy(update={"path": path}))
    elif cfg.storage.backend != "memory":
        shared = store_from_config(cfg.storage)
    else:
        path = default_store_path()
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        shared = SQLiteStore(path, busy_timeout=cfg.storage.busy_timeout_seconds)
    return HookGuard(cfg, store=shared)


def judge_once(
    agent: str, payload: bytes, config: str | None = None, store: str | None = None
) -> HookAnswer:
    """The answer to one event of a command hook judging in its own process: a guard opened
    for it (see :func:`open_guard`) and closed after it.

    Fails open (logged as :meth:`HookGuard.handle` does) when the guard cannot be opened, and
    when the SQLite store is still write-locked by another process once its set-up has waited
    its busy timeout: the event's steps do not wait for the lock again.
    """
    try:
        guard = open_guard(config, store)
    except Exception as exc:  # a configuration or store that cannot be opened
        return _failed_open(exc)
    try:
        if isinstance(guard.store, SQLiteStore) and not guard.store.ready:
            return _failed_open(StoreUnavailable(f"SQLite store {guard.store.path!r} is locked"))
        return guard.handle(agent, payload)
    finally:
        guard.close()
