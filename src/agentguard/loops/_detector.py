"""The LoopDetector: content-aware loop detection for one agent run.

The model (see ``docs/loops.md``): a loop is repetition *without progress*, and progress is judged
by results, not by call counts. Each call is identified by a canonical fingerprint of its tool
name and arguments; each result by a fingerprint with volatile noise (ids, timestamps, durations)
removed. Per call identity the detector keeps a few counters (identical calls, the current run of
identical results, consecutive errors) for as long as the identity occurs in the last
``tool_window`` calls, so state is O(window) and every check is O(1) amortised.

The detectors themselves are small units in ``_detectors.py``; the LoopDetector keeps the
bookkeeping they share, builds one event per call, result or text, and runs every registered
detector that consumes it.
"""

from __future__ import annotations

import functools
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentguard import _clock
from agentguard._fingerprint import safe_canonical_text
from agentguard.config import GuardConfig, LoopDetectionConfig
from agentguard.events import Emitter, Hook, LoopFlagged
from agentguard.types import Message

from ._detectors import (
    _SEV_OK,
    _WARNING,
    COUNTERS,
    DETECTORS,
    ERROR_MARK,
    OK,
    REGISTRY,
    CallState,
    Detector,
    TextEvent,
    ToolEvent,
    Verdict,
    worse,
)
from ._identity import (
    StandIns,
    ToolLoopPolicy,
    call_key,
    content_text,
    is_error_result,
    policies_from,
    result_key,
    text_call_key,
    text_result_key,
)
from ._text import normalise_text

__all__ = ["DETECTORS", "LoopDetector", "Verdict"]

#: Distinct results remembered per call identity: a result among them is not new (A-B-A-B).
_RECENT_RESULTS = 4
#: Longer result texts are not memoised (the memo would keep them alive).
_MEMO_CHARS = 65_536
#: Tool names whose OK verdict is kept for reuse.
_OK_NAMES = 256


@functools.cache
def _defaults() -> LoopDetectionConfig:
    """The default settings, made once: a config is immutable, and validating a new one costs
    more than scanning a short transcript (``scan_transcript`` without a config)."""
    return LoopDetectionConfig()


_Places = tuple[int, ...]
#: The stated preconditions of one event kind's sticky detectors (see :attr:`Detector.wakes_at`):
#: (place of the counter in :data:`COUNTERS`, the setting or the number it must reach).
_Wakes = tuple[tuple[int, str | int], ...]
#: Per counter of :data:`COUNTERS`, the least value at which a detector may wake.
_Floors = tuple[int, ...]
_KindPlan = tuple[_Places, _Places, _Places, _Wakes]  # sticky, loose, sticky stating nothing


@functools.lru_cache(maxsize=4)  # one registry in practice (a test may register another)
def _plan(
    registry: tuple[type[Detector], ...],
) -> tuple[_KindPlan, _KindPlan, _Places, dict[int, int]]:
    """Which detectors of ``registry`` (by place) each tool event kind runs (for calls, then for
    results: the sticky ones, the others, and the sticky ones that state no precondition, with
    the preconditions the others state), which want to know when a result was flagged (see
    :meth:`Detector.flagged`), and which judge text (place -> its rank among those):
    properties of the classes, worked out once."""
    call, result = (
        (
            tuple(i for i, d in enumerate(registry) if kind in d.consumes and kind in d.sticky),
            tuple(i for i, d in enumerate(registry) if kind in d.consumes and kind not in d.sticky),
            tuple(
                i
                for i, d in enumerate(registry)
                if kind in d.consumes and kind in d.sticky and not d.wakes_at
            ),
            tuple(
                (_counter(d, counter), at)
                for d in registry
                if kind in d.consumes and kind in d.sticky
                for counter, at in d.wakes_at
            ),
        )
        for kind in ("call", "result")
    )
    flag = tuple(i for i, d in enumerate(registry) if d.flagged is not Detector.flagged)
    text = [i for i, d in enumerate(registry) if "text" in d.consumes]
    return call, result, flag, {place: rank for rank, place in enumerate(text)}


def _counter(detector: type[Detector], name: str) -> int:
    """The place in :data:`COUNTERS` of the counter ``detector`` states a precondition on."""
    if name not in COUNTERS:
        raise ValueError(f"{detector.__name__}.wakes_at names {name!r}, not one of {COUNTERS}")
    return COUNTERS.index(name)


#: :func:`_floors` made, by the config's id and the preconditions (the config kept: its id
#: stays its own while it is here); a few configs in practice, emptied when full.
_FLOORS: dict[tuple[int, _Wakes], tuple[LoopDetectionConfig, _Floors]] = {}
_FLOORS_KEPT = 64


def _floors(wakes: _Wakes, cfg: LoopDetectionConfig) -> _Floors:
    """Per counter of :data:`COUNTERS`, the least value at which one of the detectors stating
    ``wakes`` may wake under ``cfg`` (a counter none names never wakes one)."""
    found = _FLOORS.get((id(cfg), wakes))
    if found is None:
        floors = [sys.maxsize] * len(COUNTERS)
        for counter, at in wakes:
            floors[counter] = min(floors[counter], at if isinstance(at, int) else getattr(cfg, at))
        if len(_FLOORS) >= _FLOORS_KEPT:
            _FLOORS.clear()
        found = _FLOORS[(id(cfg), wakes)] = (cfg, tuple(floors))
    return found[1]


#: What the LoopDetector runs for one tool event kind (see :func:`_judged`).
_Judged = tuple[tuple[Detector, ...], tuple[Detector, ...], tuple[Detector, ...], _Floors]


def _judged(plan: _KindPlan, detectors: tuple[Detector, ...], cfg: LoopDetectionConfig) -> _Judged:
    """One tool event kind's ``plan`` with the run's ``detectors``: the sticky ones, the others,
    the sticky ones asked while no stated precondition is reached (detectors, not their bound
    methods, which would be more objects for the garbage collector to walk), and the floors of
    the preconditions under ``cfg``."""
    sticky, loose, unstated, wakes = plan
    place = detectors.__getitem__
    return (
        tuple(map(place, sticky)),
        tuple(map(place, loose)),
        tuple(map(place, unstated)),
        _floors(wakes, cfg),
    )


def _section(config: GuardConfig | LoopDetectionConfig | None) -> LoopDetectionConfig:
    if config is None:
        return _defaults()
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

    # (slots: the instance keeps about thirty attributes, the most an instance dict shares its
    # keys for in CPython; past it every attribute lookup of the detector takes the slow path)
    __slots__ = (
        "__weakref__",
        "_call_ids",
        "_checked",
        "_clock",
        "_detectors",
        "_failed",
        "_fp_last",
        "_fp_memo",
        "_hooks",
        "_keys",
        "_known",
        "_no_runs",
        "_oks",
        "_on_call",
        "_on_flag",
        "_on_result",
        "_on_text",
        "_outcomes",
        "_pending_calls",
        "_periods",
        "_policies",
        "_process_hooks",
        "_result_ids",
        "_result_memo",
        "_runs",
        "_seq",
        "_stalled",
        "_tooled",
        "_window",
        "config",
        "session",
    )

    # made by ``_start_tools`` on the first tool event
    _on_call: _Judged  # (sticky, loose, sticky stating no precondition, floors: see _judged)
    _on_result: _Judged
    _checked: str  # the identity of the call checked last
    _on_flag: tuple[Detector, ...]
    _window: deque[str]
    _periods: range
    _seq: deque[str]
    _runs: list[int]
    _no_runs: tuple[int, ...]
    _outcomes: deque[bool]
    _stalled: int
    _pending_calls: dict[str, tuple[str, Any, str | None]]  # by call id, oldest first
    _call_ids: StandIns
    _result_ids: StandIns

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
        # an Emitter is made when a verdict is flagged: one object less per session to keep
        self._hooks = tuple(hooks or ())
        self._process_hooks = _process_hooks
        self.session = session
        # The detectors of text are built now; the tool detectors and their bookkeeping on the
        # first tool event (``_start_tools``): a run that never calls a tool — most one-turn
        # conversations, each a session of its own behind ``agentguard serve`` — then keeps a
        # handful of objects for the garbage collector to walk instead of a few dozen. Empty
        # dicts are not tracked by the collector at all, so those are made at once.
        self._on_text: tuple[Detector, ...] = tuple(
            d(cfg, self._known) for d in REGISTRY if "text" in d.consumes
        )
        #: every registered detector built so far, in priority order
        self._detectors: tuple[Detector, ...] = self._on_text
        self._tooled = False
        self._keys: dict[str, CallState] = {}
        self._fp_memo: dict[tuple[str, str], str] = {}
        self._result_memo: dict[tuple[str, str], str] = {}
        self._fp_last: tuple[object, str, str] | None = None  # (arguments object, name, fp)
        self._oks: dict[str, Verdict] = {}
        #: whether the latest tool result :meth:`observe` judged reports a failure, ``None``
        #: when it judged none (see :attr:`TranscriptScanner.last_failed`)
        self._failed: bool | None = None

    def _start_tools(self) -> None:
        """Build the tool detectors and the bookkeeping they share (once, on the first tool
        event); a detector that also judges text keeps its instance."""
        cfg, known, text = self.config, self._known, self._on_text
        call, result, flag, judges_text = _plan(REGISTRY)
        self._detectors = detectors = tuple(
            [
                text[judges_text[i]] if i in judges_text else d(cfg, known)
                for i, d in enumerate(REGISTRY)
            ]
        )
        self._on_call = _judged(call, detectors, cfg)
        self._on_result = _judged(result, detectors, cfg)
        self._on_flag = tuple(map(detectors.__getitem__, flag))
        self._window = deque()
        self._periods = range(2, cfg.cycle_max_period + 1)
        self._seq = deque(maxlen=cfg.cycle_max_period)
        self._runs = [0] * (cfg.cycle_max_period + 1)
        self._no_runs = tuple(self._runs)
        self._outcomes = deque(maxlen=cfg.tool_window)
        self._stalled = 0
        self._pending_calls = {}
        # identities of calls and of results, keyed only when needed
        self._call_ids = StandIns()
        self._result_ids = StandIns()
        self._tooled = True

    def declare(self, policy: ToolLoopPolicy) -> None:
        """Add or replace the loop policy of one tool (e.g. a tool registered later)."""
        if self._tooled:  # identities so far stay those under the old policy
            old = self._policies.get(policy.name)
            self._call_ids.declared(policy.name, old, self._call_fp)
            self._result_ids.declared(policy.name, old, self._result_fp)
        self._policies[policy.name] = policy
        if self._tooled:  # the calls awaiting their results are identified again
            self._pending_calls = {k: (v[0], v[1], None) for k, v in self._pending_calls.items()}
        self._fp_memo.clear()  # identities computed under the old policy
        self._result_memo.clear()
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
        if not self._tooled:
            self._start_tools()
        policy = self._policies.get(name)
        fp = self._call_ids.identity(name, arguments, policy, self._call_fp)
        state = self._enter(fp, name)
        state.calls += 1
        state.pending += 1
        cycle = self._advance_cycle(fp)
        self._checked = fp  # (observe hands it to the call's result)
        event = ToolEvent("call", name, arguments, fp, policy, state, self._stalled, cycle)
        return self._judge(event, self._on_call)

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
        return self._record(name, arguments, result, error, None)

    def _record(
        self, name: str, arguments: Any, result: Any, error: bool, fp: str | None
    ) -> Verdict:
        """:meth:`record_tool_result`, given the call's identity when its check made it."""
        if not self.config.enabled:
            return OK
        if not self._tooled:
            self._start_tools()
        policy = self._policies.get(name)
        if fp is None:
            fp = self._call_ids.identity(name, arguments, policy, self._call_fp)
        state = self._keys.get(fp)
        if state is None or state.pending == 0:  # no check_tool_call preceded: count the call here
            state = self._enter(fp, name)
            state.calls += 1
            self._advance_cycle(fp)
        else:
            state.pending -= 1
        if error:
            state.errors += 1
            rfp = ERROR_MARK
        else:
            state.errors = 0
            rfp = self._result_ids.identity(name, result, policy, self._result_fp)
        recent = state.recent
        state.novel = rfp not in recent
        if state.novel:
            state.recent = (*recent[1 - _RECENT_RESULTS :], rfp)
        if state.last_result is None or state.last_result != rfp:
            state.changed = state.last_result is not None
            state.progressed = state.progressed or state.changed
            state.same = 1
            if state.changed:
                state.level = OK  # progress: this identity's ladder starts again
        else:
            state.changed = False
            state.same += 1
        state.last_result = rfp
        stalled = state.same >= 2
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen and outcomes[0]:
            self._stalled -= 1
        outcomes.append(stalled)
        self._stalled += stalled
        event = ToolEvent(
            "result",
            name,
            arguments,
            fp,
            policy,
            state,
            self._stalled,
            None,
            result,
            rfp,
            error,
            self._result_id,
        )
        return self._judge(event, self._on_result)

    def _judge(self, event: ToolEvent, plan: _Judged) -> Verdict:
        """Run the detectors that consume ``event`` (``plan``: see ``_on_call``); sticky verdicts
        stay while the loop lasts.

        A detector quiet about the event is not asked: for a healthy call or result that is
        every detector, and no verdict is built at all (the fast path). While the event's
        counters are below every stated precondition's floor, the sticky detectors stating one
        are not even asked whether they are quiet (see :attr:`Detector.wakes_at`).
        """
        sticky, loose, unstated, floors = plan
        state = event.state
        ahead = event.ahead
        cycle = event.cycle
        if (  # (the counters, in the order of COUNTERS)
            state.errors + ahead < floors[0]
            and state.same + ahead < floors[1]
            and state.calls + ahead < floors[2]
            and event.stalled < floors[3]
            and (cycle is None or cycle[1] < floors[4])
        ):
            sticky = unstated
        verdict = OK
        for d in sticky:  # (a loop, not a list of the findings: most events find nothing)
            if not d.quiet(event):
                found = d.check(event)
                # (a tie goes to the earlier: the plan keeps the registry's order, which is
                # the detectors' priority, and a detector's verdicts carry its own name; OK
                # is worse than nothing)
                if found.severity > verdict.severity:
                    verdict = found
        if verdict.severity < state.level.severity:
            verdict = state.level  # sticky while the loop continues
        state.level = verdict
        for d in loose:
            extra = d.check(event)
            if extra is not OK:
                if extra.severity > verdict.severity:
                    verdict = extra
                elif extra.severity == verdict.severity:
                    verdict = worse(verdict, extra)
        if verdict is OK:
            return verdict
        if event.kind == "result" and verdict.severity >= _WARNING:
            for d in self._on_flag:
                d.flagged(verdict)
        if not self._hooks and not self._process_hooks:  # (a scan): no one to tell, no call
            return verdict
        return self._emit(verdict)

    # -- text ------------------------------------------------------------------------------

    def check_text(self, text: str | None, *, narration: bool = False) -> Verdict:
        """Judge an assistant text output (repeated responses, degenerate repetition).

        Args:
            text: the output.
            narration: the text accompanies tool calls ("Checking the build."); it is then only
                checked for degeneration, since repeating a short narration while the calls
                progress is normal (the calls themselves are judged by the tool detectors).
        """
        if not self.config.enabled or not text or text.isspace():  # (no stripped copy made)
            return OK
        # an answer's normalised text is compared by both text detectors: made here, once (a
        # narration's is mostly not needed: its degeneration count is remembered per text)
        event = TextEvent(text, True) if narration else TextEvent(text, False, normalise_text(text))
        verdict = OK
        for d in self._on_text:  # (a loop, not a list of the findings: most texts find nothing)
            if narration and not d.narration:
                continue
            found = d.check(event)
            # (a verdict not OK is worse than OK: the first one is taken; a tie goes to the
            # earlier detector, as the text detectors are in the registry's order)
            if found is not OK and (verdict is OK or found.severity > verdict.severity):
                verdict = found
        if verdict is OK or (not self._hooks and not self._process_hooks):  # (a scan: no call)
            return verdict
        return self._emit(verdict)

    # -- whole messages --------------------------------------------------------------------

    def observe(  # noqa: PLR0915 - one pass per message, kept flat: it runs per message
        self, message: Message
    ) -> list[Verdict]:
        """Judge one OpenAI-format message: assistant text and ``tool_calls``, ``tool`` results.

        An assistant's ``reasoning_content`` (or ``reasoning``) is judged as text too, before its
        content: a thought repeated inside one answer or turn after turn is a loop.

        Feeding a transcript message by message gives the same verdicts as the explicit calls.
        Returns one verdict per judged part (text first, then each tool call), OK ones included
        (an OK verdict about a tool carries its ``tool`` name).

        A malformed message never raises: what is not a message object is skipped, and so is
        each ``tool_calls`` entry that is not a call object (or ``tool_calls`` that is not a list).
        """
        untrusted: object = message  # typed a Message, but read from the wire
        # (a dict is tested by its class first: isinstance against an ABC is a Python call)
        if untrusted.__class__ is not dict and not isinstance(untrusted, Mapping):
            return []
        role = message.get("role")
        out: list[Verdict] = []
        if role == "assistant":
            content = message.get("content")
            if content.__class__ is not str:  # (text, or none beside calls: then no call)
                content = "" if content is None else content_text(content)
            calls = message.get("tool_calls") or ()
            if calls.__class__ is not list and not isinstance(calls, (list, tuple)):
                calls = ()
            # thinking that goes nowhere is judged like an answer: reasoning_content (llama.cpp,
            # vLLM, DeepSeek) or reasoning (OpenRouter, Ollama), before the content it led to
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            # (most answers have none: not converted then)
            if reasoning is not None and (thought := content_text(reasoning)):
                out.append(self.check_text(thought, narration=bool(calls)))
            if content:
                out.append(self.check_text(content, narration=bool(calls)))
            for call in calls:
                if call.__class__ is not dict and not isinstance(call, Mapping):
                    continue
                fn = call.get("function")
                if fn.__class__ is not dict and not isinstance(fn, Mapping):
                    fn = {}
                name = fn.get("name", "")
                if name.__class__ is not str:
                    name = _text_of(name)
                arguments = fn.get("arguments", "")
                verdict = self.check_tool_call(name, arguments)
                if verdict.detector is None:  # (the OK verdict about the tool: remembered)
                    verdict = self._oks.get(name) or self._ok_about(name)
                out.append(verdict)
                call_id = call.get("id")
                if call_id is not None and self._tooled:  # (not when detection is off)
                    if call_id.__class__ is not str:
                        call_id = _text_of(call_id)
                    self._pending_calls[call_id] = (name, arguments, self._checked)
                    if len(self._pending_calls) > self.config.tool_window:  # the oldest goes
                        del self._pending_calls[next(iter(self._pending_calls))]
        elif role == "user":
            for detector in self._detectors:
                detector.news()
        elif role == "tool":
            pending = None
            if self._tooled:
                call_id = message.get("tool_call_id")
                if call_id.__class__ is not str:
                    call_id = _text_of(call_id)
                pending = self._pending_calls.pop(call_id, None)
            if pending is None:
                name = _text_of(message.get("name", ""))
                pending = (name, None, None) if name else None
            if pending is None:
                self._failed = None
            else:
                result = message.get("content")
                failed = self._failed = is_error_result(result)
                verdict = self._record(pending[0], pending[1], result, failed, pending[2])
                if verdict.detector is None:
                    verdict = self._oks.get(pending[0]) or self._ok_about(pending[0])
                out.append(verdict)
        return out

    def _ok_about(self, name: str) -> Verdict:
        """The OK verdict about tool ``name``: one shared (frozen) object per recent tool name."""
        verdict = self._oks.get(name)
        if verdict is None:
            if len(self._oks) >= _OK_NAMES:  # invented names must not grow it without bound
                self._oks.clear()
            verdict = self._oks[name] = Verdict(tool=name)
        return verdict

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
            identity = call_key(name, arguments, policy)
            self._fp_last = (arguments, name, identity)
            return identity
        memo = self._fp_memo
        fp = memo.get((name, arguments))
        if fp is None:
            fp = memo[(name, arguments)] = text_call_key(name, arguments, policy)
            if len(memo) > 2 * self.config.tool_window:
                del memo[next(iter(memo))]
        return fp

    def _result_fp(self, name: str, result: Any, policy: ToolLoopPolicy | None) -> str:
        """The result fingerprint, memoised for text results of up to ``_MEMO_CHARS``.

        A loop brings the same result text back call after call: its identity (decode, noise
        removal, canonical text) is computed once while it stays among the last
        ``2 * tool_window`` results. A tool with its own ``fingerprint`` function is always
        asked.
        """
        if (
            result.__class__ is not str
            or len(result) > _MEMO_CHARS
            or (policy is not None and policy.fingerprint is not None)
        ):
            return result_key(result, policy)
        memo = self._result_memo
        key = (name, result)
        fp = memo.get(key)
        if fp is None:
            fp = memo[key] = text_result_key(result, policy)
            if len(memo) > 2 * self.config.tool_window:
                del memo[next(iter(memo))]
        return fp

    def _result_id(self, name: str, result: Any, policy: ToolLoopPolicy | None) -> str:
        """The identity of a result of tool ``name`` (see :class:`StandIns`)."""
        return self._result_ids.identity(name, result, policy, self._result_fp)

    def _enter(self, fp: str, name: str) -> CallState:
        key = self._keys.get(fp)
        if key is None:
            key = self._keys[fp] = CallState(name)
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
        if fp not in seq:  # the common case: no period continues, every run is broken
            runs[:] = self._no_runs
            seq.append(fp)
            return None
        found: tuple[int, int] | None = None
        # a period needs two distinct calls (A-A is no cycle): when every call remembered is
        # this one (a call repeated back to back, the common loop), none is looked for
        mixed = seq.count(fp) < len(seq)
        for p in self._periods:
            if len(seq) >= p and seq[-p] == fp:
                runs[p] += 1
                # the shortest period wins
                if (
                    found is None
                    and mixed
                    and runs[p] >= p
                    and len({*list(seq)[-(p - 1) :], fp}) >= 2
                ):
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

    def _emit(self, verdict: Verdict) -> Verdict:
        if verdict.severity is _SEV_OK or verdict.detector is None:
            return verdict
        if not self._hooks and not self._process_hooks:  # (a scan): no one to tell
            return verdict
        emitter = Emitter(self._hooks, use_defaults=self._process_hooks)
        if emitter.active:
            emitter.emit(
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


def _text_of(value: Any) -> str:
    """A name or an id as text, whatever the message held (a number, an object, a deep value)."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (int, float)):
        try:
            return str(value)
        except ValueError:  # an integer longer than str() converts
            pass
    return safe_canonical_text(value)
