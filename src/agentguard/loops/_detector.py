"""The LoopDetector: content-aware loop detection for one agent run.

The model (see ``docs/loops.md``): a loop is repetition *without progress*, and progress is judged
by results, not by call counts. Each call is identified by a canonical fingerprint of its tool
name and arguments; each result by a fingerprint with volatile noise (ids, timestamps, durations)
removed. Per call identity the detector keeps a few counters (identical calls, the current run of
identical results, consecutive errors) for as long as the identity occurs in the last
``tool_window`` calls, so state is O(window) and every check is O(1) amortised.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rapidfuzz import fuzz

from agentguard import _clock
from agentguard.config import GuardConfig, LoopDetectionConfig
from agentguard.events import Emitter, Hook, LoopFlagged
from agentguard.types import Message, Severity

from ._identity import (
    ToolLoopPolicy,
    call_fingerprint,
    content_text,
    decoded,
    is_error_result,
    policies_from,
    result_fingerprint,
)
from ._text import ResponseWindow, degenerate_repeats

__all__ = ["DETECTORS", "LoopDetector", "Verdict"]

#: Every detector name, most specific first (ties in severity go to the earlier name).
DETECTORS: tuple[str, ...] = (
    "error_repeat",
    "unknown_tool_repeat",
    "ping_pong",
    "cycle",
    "poll_no_progress",
    "near_duplicate",
    "generic_repeat",
    "global_breaker",
    "response_repeat",
    "degenerate_text",
)
_PRIORITY = {name: i for i, name in enumerate(DETECTORS)}

_UNKNOWN_TOOL = re.compile(
    r"(unknown|invalid|unrecognized|undefined|unsupported|no such)\s+(tool|function)"
    r"|(tool|function)\s+\S+\s+(not found|does not exist|is not available|is not defined)",
    re.I,
)
_ERROR_MARK = "\x00error"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The detector's judgement of one call, result or text.

    Attributes:
        severity: ``OK < WARNING < CRITICAL < BREAK``; ``BREAK`` means do not run the call.
        detector: the detector that decided (see :data:`DETECTORS`), ``None`` when OK.
        count: the repetition count the severity was judged on.
        message: a hint fit to show the model (tool names and counts only, never arguments).
        tool: the tool concerned, ``None`` for text.
    """

    severity: Severity = Severity.OK
    detector: str | None = None
    count: int = 0
    message: str = ""
    tool: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return self.severity is Severity.OK


OK = Verdict()


class _Key:
    """Counters for one call identity while it occurs in the tool window."""

    __slots__ = (
        "calls", "changed", "errors", "in_window", "last_result", "level", "name", "pending",
        "progressed", "same",
    )  # fmt: skip

    def __init__(self, name: str) -> None:
        self.name = name
        self.in_window = 0  # occurrences among the last tool_window calls
        self.calls = 0  # identical calls in the current streak (refused calls included)
        self.pending = 0  # calls checked whose result is not recorded yet
        self.last_result: str | None = None
        self.same = 0  # current run of identical results
        self.changed = False  # the latest result differed from the one before
        self.progressed = False  # results changed at least once during the streak
        self.errors = 0  # consecutive failures
        self.level: Verdict = OK  # sticky: never drops until progress


class _Group:
    """Calls of one tool with different but similar arguments that returned one result."""

    __slots__ = ("args", "name", "text")

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        self.args: set[str] = set()


def _args_text(arguments: Any) -> str:
    args = decoded(arguments)
    if isinstance(args, Mapping):
        # "key value" pairs: tokens of values stay whole for the token-set comparison
        return " ".join(f"{k} {args[k]}" for k in sorted(args, key=str))
    return str(args)


def _ladder(count: int, warn: int, critical: int, brk: int) -> Severity:
    if count >= brk:
        return Severity.BREAK
    if count >= critical:
        return Severity.CRITICAL
    if count >= warn:
        return Severity.WARNING
    return Severity.OK


_HINTS = {
    "generic_repeat": "You have called `{tool}` with identical arguments {count} times.",
    "poll_no_progress": "You have called `{tool}` with identical arguments {count} times and the "
    "result has not changed.",
    "near_duplicate": "{count} calls of `{tool}` with only slightly different arguments all "
    "returned the same result; rewording or re-tuning the call does not help.",
    "ping_pong": "You are alternating between the same two tool calls ({count} rounds, ending "
    "with `{tool}`) and the results do not change.",
    "cycle": "You are repeating the same cycle of tool calls ({count} rounds, ending with "
    "`{tool}`) and the results do not change.",
    "error_repeat": "`{tool}` with these arguments has failed {count} times in a row.",
    "unknown_tool_repeat": "`{tool}` is not an available tool ({count} attempts).",
    "global_breaker": "{count} of your recent tool calls made no progress.",
    "response_repeat": "This response repeats one of your recent responses ({count} times).",
    "degenerate_text": "This output repeats the same text {count} times.",
}
_ADVICE = {
    Severity.WARNING: " Use the information you already have, or try a different approach.",
    Severity.CRITICAL: " Stop repeating it: change your approach now or give your final answer "
    "with what you know.",
    Severity.BREAK: " This is refused: the pattern will not run again. Change approach or finish.",
}


def _verdict(detector: str, severity: Severity, count: int, tool: str | None) -> Verdict:
    if severity is Severity.OK:
        return OK
    text = _HINTS[detector].format(tool=tool, count=count) + _ADVICE[severity]
    return Verdict(severity, detector, count, text, tool)


def _pick(candidates: Iterable[Verdict]) -> Verdict:
    best = OK
    for v in candidates:
        if v.severity > best.severity or (
            v.severity == best.severity
            and v.detector is not None
            and best.detector is not None
            and _PRIORITY[v.detector] < _PRIORITY[best.detector]
        ):
            best = v
    return best


def _section(config: GuardConfig | LoopDetectionConfig | None) -> LoopDetectionConfig:
    if config is None:
        return LoopDetectionConfig()
    if isinstance(config, GuardConfig):
        return config.loop_detection
    if isinstance(config, LoopDetectionConfig):
        return config
    raise TypeError(f"expected GuardConfig or LoopDetectionConfig, got {type(config).__name__}")


class LoopDetector:
    """Detects tool-call and text loops in one agent run (one instance per run or session).

    Call :meth:`check_tool_call` before running a tool, :meth:`record_tool_result` after it, and
    :meth:`check_text` on each assistant text output; or feed whole messages to
    :meth:`observe`. Not thread-safe: one run is sequential.

    Args:
        config: a :class:`~agentguard.GuardConfig`, its ``loop_detection`` section, or ``None``.
        tools: per-tool declarations: :class:`ToolLoopPolicy` objects and/or OpenAI-format tool
            schemas (when schemas are given, any other tool name is unknown).
        clock: time source (kept for event timing; detection itself is count based).
        hooks: event hooks; a :class:`~agentguard.events.LoopFlagged` is emitted above OK.
        session: the session id put on events.
    """

    def __init__(
        self,
        config: GuardConfig | LoopDetectionConfig | None = None,
        *,
        tools: Iterable[Any] | Mapping[str, Any] | None = None,
        clock: Callable[[], float] = _clock.monotonic,
        hooks: Iterable[Hook] | None = None,
        session: str | None = None,
        _process_hooks: bool = True,
    ) -> None:
        self.config = cfg = _section(config)
        self._policies, self._known = policies_from(tools)
        self._clock = clock
        self._emitter = Emitter(hooks, use_defaults=_process_hooks)
        self.session = session
        self._keys: dict[str, _Key] = {}
        self._window: deque[str] = deque()
        self._periods = range(2, cfg.cycle_max_period + 1)
        self._seq: deque[str] = deque(maxlen=cfg.cycle_max_period)
        self._runs = [0] * (cfg.cycle_max_period + 1)
        self._outcomes: deque[bool] = deque(maxlen=cfg.tool_window)
        self._stalled = 0
        self._unknown: OrderedDict[str, int] = OrderedDict()
        self._groups: OrderedDict[tuple[str, str], _Group] = OrderedDict()
        self._responses = ResponseWindow(cfg.window_size, cfg.similarity_threshold)
        self._response_level = OK
        self._pending_calls: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._fp_memo: dict[tuple[str, str], str] = {}
        self._fp_last: tuple[object, str, str] | None = None  # (arguments object, name, fp)
        # tools with a near-duplicate group big enough to flag the next variant (may be stale:
        # a stale name only costs the full check)
        self._suspects: set[str] = set()

    def declare(self, policy: ToolLoopPolicy) -> None:
        """Add or replace the loop policy of one tool (e.g. a tool registered later)."""
        self._policies[policy.name] = policy
        self._fp_memo.clear()  # identities computed under the old policy
        self._fp_last = None

    # -- tool calls ------------------------------------------------------------------------

    def check_tool_call(self, name: str, arguments: Any) -> Verdict:
        """Judge a call before it runs; ``BREAK`` means do not run it.

        Args:
            name: the tool name.
            arguments: a dict or a JSON string (identity ignores key order, whitespace, 1 vs 1.0).
        """
        if not self.config.enabled:
            return OK
        policy = self._policies.get(name)
        fp = self._call_fp(name, arguments, policy)
        key = self._enter(fp, name)
        key.calls += 1
        key.pending += 1
        cycle = self._advance_cycle(fp)
        if (  # fast path: a call new to the window, nothing suspect anywhere
            key.calls == 1
            and cycle is None
            and key.level is OK
            and name not in self._suspects
            and self._stalled < self.config.global_warn_at
            and (self._known is None or name in self._known)
            and name not in self._unknown
        ):
            return OK
        verdict = self._assess(key, policy, arguments, ahead=1, cycle=cycle)
        unknown = self._unknown_verdict(name, count_call=True)
        return self._emit(_pick((verdict, unknown)))

    def record_tool_result(
        self, name: str, arguments: Any, result: Any, error: bool = False
    ) -> Verdict:
        """Record what a call returned; returns the verdict for repeating it.

        Args:
            name: the tool name.
            arguments: the arguments the call ran with.
            result: the result (structured or text); volatile fields are ignored.
            error: the call failed (then the error text does not matter, only that it failed).
        """
        if not self.config.enabled:
            return OK
        policy = self._policies.get(name)
        fp = self._call_fp(name, arguments, policy)
        key = self._keys.get(fp)
        if key is None or key.pending == 0:  # no check_tool_call preceded: count the call here
            key = self._enter(fp, name)
            key.calls += 1
            self._advance_cycle(fp)
        else:
            key.pending -= 1
        unknown = OK
        if error:
            key.errors += 1
            rfp = _ERROR_MARK
            if isinstance(result, str) and _UNKNOWN_TOOL.search(result):
                self._unknown.setdefault(name, 1)
                unknown = self._unknown_verdict(name, count_call=False)
        else:
            key.errors = 0
            rfp = result_fingerprint(result, policy)
        if key.last_result is None or key.last_result != rfp:
            key.changed = key.last_result is not None
            key.progressed = key.progressed or key.changed
            key.same = 1
            if key.changed:
                key.level = OK  # progress: this identity's ladder starts again
        else:
            key.changed = False
            key.same += 1
        key.last_result = rfp
        stalled = key.same >= 2
        if len(self._outcomes) == self._outcomes.maxlen and self._outcomes[0]:
            self._stalled -= 1
        self._outcomes.append(stalled)
        self._stalled += stalled
        near = OK
        if not error and not stalled and key.same == 1:
            near = self._near_duplicate(name, fp, arguments, rfp, result)
        verdict = self._assess(key, policy, arguments, ahead=0, cycle=None)
        return self._emit(_pick((verdict, unknown, near)))

    # -- text ------------------------------------------------------------------------------

    def check_text(self, text: str | None, *, narration: bool = False) -> Verdict:
        """Judge an assistant text output (repeated responses, degenerate repetition).

        Args:
            text: the output.
            narration: the text accompanies tool calls ("Checking the build."); it is then only
                checked for degeneration, since repeating a short narration while the calls
                progress is normal (the calls themselves are judged by the tool detectors).
        """
        if not self.config.enabled or not text or not text.strip():
            return OK
        cfg = self.config
        if narration:
            return self._emit(self._degenerate(text))
        count = self._responses.add(text)
        sev = _ladder(
            count, cfg.duplicate_threshold, cfg.duplicate_threshold + 2, cfg.duplicate_threshold + 4
        )
        repeat = _verdict("response_repeat", sev, count, None)
        if repeat.ok:
            self._response_level = OK
        elif repeat.severity < self._response_level.severity:
            repeat = _verdict("response_repeat", self._response_level.severity, count, None)
        if not repeat.ok:
            self._response_level = repeat
        return self._emit(_pick((repeat, self._degenerate(text))))

    def _degenerate(self, text: str) -> Verdict:
        n = degenerate_repeats(text)
        m = self.config.degenerate_min_repeats
        return _verdict("degenerate_text", _ladder(n, m, 2 * m, 4 * m), n, None)

    # -- whole messages --------------------------------------------------------------------

    def observe(self, message: Message) -> list[Verdict]:
        """Judge one OpenAI-format message: assistant text and ``tool_calls``, ``tool`` results.

        Feeding a transcript message by message gives the same verdicts as the explicit calls.
        Returns one verdict per judged part (text first, then each tool call), OK ones included
        (an OK verdict about a tool carries its ``tool`` name).
        """
        role = message.get("role")
        out: list[Verdict] = []
        if role == "assistant":
            content = content_text(message.get("content"))
            calls = message.get("tool_calls") or ()
            if content:
                out.append(self.check_text(content, narration=bool(calls)))
            for call in calls:
                fn = call.get("function") or {}
                name = str(fn.get("name", ""))
                arguments = fn.get("arguments", "")
                verdict = self.check_tool_call(name, arguments)
                out.append(verdict if verdict.detector else Verdict(tool=name))
                call_id = call.get("id")
                if call_id is not None:
                    self._pending_calls[str(call_id)] = (name, arguments)
                    if len(self._pending_calls) > self.config.tool_window:
                        self._pending_calls.popitem(last=False)
        elif role == "tool":
            pending = self._pending_calls.pop(str(message.get("tool_call_id")), None)
            if pending is None:
                name = str(message.get("name", ""))
                pending = (name, None) if name else None
            if pending is not None:
                result = message.get("content")
                failed = is_error_result(result)
                verdict = self.record_tool_result(pending[0], pending[1], result, failed)
                out.append(verdict if verdict.detector else Verdict(tool=pending[0]))
        return out

    # -- internals -------------------------------------------------------------------------

    def _call_fp(self, name: str, arguments: Any, policy: ToolLoopPolicy | None) -> str:
        """The call fingerprint, memoised for JSON-text arguments (what the OpenAI API sends).

        The memo holds the last ``2 * tool_window`` texts, so the fingerprint computed by
        :meth:`check_tool_call` is reused by :meth:`record_tool_result` and by a looping call.
        """
        if not isinstance(arguments, str):
            # the same arguments object checked and then recorded (ToolGuard): one fingerprint
            last = self._fp_last
            if last is not None and last[0] is arguments and last[1] == name:
                return last[2]
            identity = call_fingerprint(name, arguments, policy)
            self._fp_last = (arguments, name, identity)
            return identity
        memo = self._fp_memo
        fp = memo.get((name, arguments))
        if fp is None:
            fp = memo[(name, arguments)] = call_fingerprint(name, arguments, policy)
            if len(memo) > 2 * self.config.tool_window:
                del memo[next(iter(memo))]
        return fp

    def _enter(self, fp: str, name: str) -> _Key:
        key = self._keys.get(fp)
        if key is None:
            key = self._keys[fp] = _Key(name)
        key.in_window += 1
        self._window.append(fp)
        if len(self._window) > self.config.tool_window:
            old = self._window.popleft()
            old_key = self._keys[old]
            old_key.in_window -= 1
            if old_key.in_window == 0:
                del self._keys[old]
        return key

    def _advance_cycle(self, fp: str) -> tuple[int, int] | None:
        """Update periodic runs with call ``fp``; return (period, full rounds) of the shortest."""
        seq, runs = self._seq, self._runs
        found: tuple[int, int] | None = None
        for p in self._periods:
            if len(seq) >= p and seq[-p] == fp:
                runs[p] += 1
                # the shortest period wins; a period needs two distinct calls (A-A is no cycle)
                if found is None and runs[p] >= p and len({*list(seq)[-(p - 1) :], fp}) >= 2:
                    found = (p, (runs[p] + p) // p)
            else:
                runs[p] = 0
        seq.append(fp)
        if found is None:
            return None
        for m in list(seq)[-found[0] :]:
            k = self._keys.get(m)
            if k is not None and k.changed:
                return None  # a member made progress: not a loop
        return found

    def _assess(
        self,
        key: _Key,
        policy: ToolLoopPolicy | None,
        arguments: Any,
        *,
        ahead: int,
        cycle: tuple[int, int] | None,
    ) -> Verdict:
        cfg = self.config
        name = key.name
        candidates: list[Verdict] = []
        if not (policy is not None and policy.polling):
            sev = _ladder(key.calls, cfg.warn_at, cfg.critical_at, cfg.break_at)
            if key.progressed:
                sev = min(sev, Severity.WARNING)  # results keep changing: progress, at most a hint
            candidates.append(_verdict("generic_repeat", sev, key.calls, name))
        stale = OK
        if key.last_result is not None and key.last_result != _ERROR_MARK:
            count = key.same + ahead
            sev = self._no_progress_ladder(count)
            stale = _verdict("poll_no_progress", sev, count, name)
            candidates.append(stale)
        if key.errors:
            count = key.errors + ahead
            sev = _ladder(count, cfg.error_warn_at, cfg.error_critical_at, cfg.error_break_at)
            candidates.append(_verdict("error_repeat", sev, count, name))
        if cycle is not None:
            period, rounds = cycle
            sev = _ladder(rounds, cfg.cycle_warn_at, cfg.cycle_critical_at, cfg.cycle_break_at)
            sev = max(sev, stale.severity) if rounds >= 2 else sev
            candidates.append(_verdict("ping_pong" if period == 2 else "cycle", sev, rounds, name))
        if ahead:
            candidates.append(self._near_duplicate_ahead(name, arguments))
        stalled = self._stalled
        sev = _ladder(stalled, cfg.global_warn_at, cfg.global_critical_at, cfg.global_break_at)
        candidates.append(_verdict("global_breaker", sev, self._stalled, name))
        verdict = _pick(candidates)
        if verdict.severity < key.level.severity:
            verdict = key.level  # sticky while the loop continues
        key.level = verdict
        return verdict

    def _unknown_verdict(self, name: str, *, count_call: bool) -> Verdict:
        cfg = self.config
        known = self._known is None or name in self._known
        if name not in self._unknown:
            if known:
                return OK
            self._unknown[name] = 0
        if count_call:
            self._unknown[name] += 1
            self._unknown.move_to_end(name)
            while len(self._unknown) > cfg.tool_window:
                self._unknown.popitem(last=False)
        count = self._unknown[name]
        sev = _ladder(
            count, cfg.unknown_tool_warn_at, cfg.unknown_tool_critical_at, cfg.unknown_tool_break_at
        )
        return _verdict("unknown_tool_repeat", sev, count, name)

    def _no_progress_ladder(self, count: int) -> Severity:
        cfg = self.config
        return _ladder(
            count, cfg.no_progress_warn_at, cfg.no_progress_critical_at, cfg.no_progress_break_at
        )

    def _near_duplicate(self, name: str, fp: str, arguments: Any, rfp: str, result: Any) -> Verdict:
        """After a result: is this call one more similar variant that returned the same thing?"""
        cfg = self.config
        size = len(result) if isinstance(result, str) else len(str(result))
        if size < cfg.near_duplicate_min_result_chars:
            return OK  # an acknowledgement ("ok") says nothing about whether the calls differed
        gkey = (name, rfp)
        group = self._groups.get(gkey)
        text = _args_text(arguments)
        if group is None:
            group = self._groups[gkey] = _Group(name, text)
            while len(self._groups) > cfg.tool_window:
                self._groups.popitem(last=False)
        elif fp not in group.args:
            score = fuzz.token_set_ratio(text, group.text) / 100.0
            if score < cfg.near_duplicate_threshold:
                return OK
        self._groups.move_to_end(gkey)
        group.args.add(fp)
        count = len(group.args)
        if count >= cfg.no_progress_warn_at - 1:
            self._suspects.add(name)
        return _verdict("near_duplicate", self._no_progress_ladder(count), count, name)

    def _near_duplicate_ahead(self, name: str, arguments: Any) -> Verdict:
        """Before a call: is it one more variant of a near-duplicate group already flagged?"""
        cfg = self.config
        threshold = cfg.no_progress_warn_at - 1
        text: str | None = None
        best = OK
        for group in self._groups.values():
            if group.name != name or len(group.args) < threshold:
                continue
            if text is None:
                text = _args_text(arguments)
            if fuzz.token_set_ratio(text, group.text) / 100.0 >= cfg.near_duplicate_threshold:
                count = len(group.args) + 1
                sev = self._no_progress_ladder(count)
                best = _pick((best, _verdict("near_duplicate", sev, count, name)))
        return best

    def _emit(self, verdict: Verdict) -> Verdict:
        if verdict.severity is not Severity.OK and verdict.detector is not None:
            self._emitter.emit(
                LoopFlagged(
                    session=self.session,
                    detector=verdict.detector,
                    severity=str(verdict.severity),
                    count=verdict.count,
                    tool=verdict.tool,
                    message=verdict.message,
                )
            )
        return verdict
