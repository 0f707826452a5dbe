"""The loop detectors, one small unit each, and the registry the LoopDetector runs.

A detector is a class with a ``name``, the events it ``consumes`` (a tool call about to run, a
tool result, an assistant text), a ``hint`` (what the model is told), and a ``check(event)``
returning a :class:`Verdict`. Detectors that judge tool calls also say when they are ``quiet``:
certain to find nothing for a call, and to change nothing by looking. The LoopDetector's fast path
runs only when every call detector is quiet, so a new detector is never skipped by it (the default
``quiet`` is "never"). A detector may also state a precondition of ``quiet`` as data
(``wakes_at``: the counters of the event that must reach a setting first), which the LoopDetector
tests for every detector stating one at once instead of asking each.

Adding a detector is one class here and one line in :data:`REGISTRY` (its place there is its
priority: ties in severity go to the earlier detector).

The LoopDetector keeps the bookkeeping the tool detectors share — per call identity, the counters
in :class:`CallState`; across calls, the run of periodic calls and the stalled outcomes — and
hands each detector a :class:`ToolEvent` (or a :class:`TextEvent`) built from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from rapidfuzz import fuzz

from agentguard._fingerprint import safe_canonical_text
from agentguard.config import LoopDetectionConfig
from agentguard.types import Severity

from ._identity import ToolLoopPolicy, decoded, says_unknown_tool
from ._text import ResponseWindow, degenerate_repeats, degeneration, normalise_text, repeats_below

__all__ = ["DETECTORS", "REGISTRY", "CallState", "Detector", "TextEvent", "ToolEvent", "Verdict"]

Kind = Literal["call", "result", "text"]

#: The result fingerprint of a failed call (no fingerprint starts with a NUL).
ERROR_MARK = "\x00error"

# (looked up once: an enum member's lookup is a slow class attribute lookup, and these run per
# event)
_SEV_OK, _WARNING, _CRITICAL, _BREAK = (
    Severity.OK, Severity.WARNING, Severity.CRITICAL, Severity.BREAK
)  # fmt: skip


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
        return self.severity is _SEV_OK


OK = Verdict()

_ADVICE = {
    _WARNING: " Use the information you already have, or try a different approach.",
    _CRITICAL: " Stop repeating it: change your approach now or give your final answer "
    "with what you know.",
    _BREAK: " This is refused: the pattern will not run again. Change approach or finish.",
}


#: Verdicts made, by (detector, severity, count, tool): shared by every detector instance.
_VERDICTS: dict[tuple[type[Detector], Severity, int, str | None], Verdict] = {}
_VERDICTS_KEPT = 512


def ladder(count: int, warn: int, critical: int, brk: int) -> Severity:
    """The severity ``count`` reaches on a warn / critical / break ladder."""
    if count >= brk:
        return _BREAK
    if count >= critical:
        return _CRITICAL
    if count >= warn:
        return _WARNING
    return _SEV_OK


class CallState:
    """Counters for one call identity while it occurs in the tool window."""

    __slots__ = (
        "calls", "changed", "errors", "in_window", "last_result", "level", "name", "novel",
        "pending", "progressed", "recent", "same",
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
        self.recent: tuple[str, ...] = ()  # the last few distinct results, newest last
        self.novel = False  # the latest result differs from every recent one: progress
        self.level: Verdict = OK  # sticky: never drops until progress


class ToolEvent:
    """One tool call about to run (``kind == "call"``) or one recorded result (``"result"``).

    Attributes:
        kind: ``call`` or ``result``.
        name: the tool.
        arguments: the arguments as given (a dict or JSON text).
        fp: the call's identity.
        policy: the tool's loop policy, if declared.
        state: the counters of this call identity (already updated with this event).
        ahead: 1 for a call (it counts as one more attempt), 0 for a result.
        cycle: ``(period, full rounds)`` of the shortest periodic run this call completes.
        stalled: tool outcomes without progress in the window (results so far).
        result: the result (results only).
        rfp: the result's fingerprint, :data:`ERROR_MARK` for a failure (results only).
        error: the call failed (results only).
    """

    __slots__ = (
        "_identify", "_text", "ahead", "arguments", "cycle", "error", "fp", "kind", "name",
        "policy", "result", "rfp", "stalled", "state",
    )  # fmt: skip

    def __init__(  # noqa: PLR0917 - built twice per tool call: positional is cheapest
        self,
        kind: Kind,
        name: str,
        arguments: Any,
        fp: str,
        policy: ToolLoopPolicy | None,
        state: CallState,
        stalled: int,
        cycle: tuple[int, int] | None = None,
        result: Any = None,
        rfp: str = "",
        error: bool = False,
        identify: Callable[[str, Any, ToolLoopPolicy | None], str] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.arguments = arguments
        self.fp = fp
        self.policy = policy
        self.state = state
        self.stalled = stalled
        self.ahead = 1 if kind == "call" else 0
        self.cycle = cycle
        self.result = result
        self.rfp = rfp
        self.error = error
        self._identify = identify
        self._text: str | None = None

    @property
    def key(self) -> str:
        """The result's identity, a failure's as well (``rfp`` only says that it failed)."""
        if not self.error or self._identify is None:
            return self.rfp
        return self._identify(self.name, self.result, self.policy)

    @property
    def arguments_text(self) -> str:
        """The arguments as ``key value`` words, for fuzzy comparison (decoded once, on demand)."""
        if self._text is None:
            self._text = arguments_text(self.arguments)
        return self._text


class TextEvent:
    """One assistant text output (a plain slotted object: one is made per judged text).

    Attributes:
        text: the output (not blank).
        narration: the text accompanies tool calls (only degeneration is judged then).
        normalised: :func:`normalise_text` of the text when the maker made it already (an
            answer's, compared by both text detectors); made on demand otherwise.
    """

    kind: ClassVar[Kind] = "text"
    __slots__ = ("_normalised", "narration", "text")

    def __init__(self, text: str, narration: bool = False, normalised: str | None = None) -> None:
        self.text = text
        self.narration = narration
        self._normalised = normalised

    @property
    def normalised(self) -> str:
        """The text lower-cased, its whitespace collapsed (:func:`normalise_text`): made once,
        on demand, for every detector that compares it."""
        if self._normalised is None:
            self._normalised = normalise_text(self.text)
        return self._normalised


def arguments_text(arguments: Any) -> str:
    """Arguments as ``key value`` words: tokens of values stay whole for a token-set comparison."""
    args = decoded(arguments)
    if isinstance(args, Mapping):
        return " ".join(f"{k} {args[k]}" for k in sorted(args, key=str))
    return str(args)


class Detector:
    """One loop detector. Subclasses set the class attributes and implement :meth:`check`.

    Args:
        config: the loop-detection settings.
        known: the tool names declared with schemas, ``None`` when any name may be a tool.
    """

    #: The name verdicts carry (see :data:`DETECTORS`).
    name: ClassVar[str]
    #: The events judged: ``call`` (before a tool runs), ``result`` (after), ``text``.
    consumes: ClassVar[frozenset[Kind]]
    #: What the model is told; formatted with ``tool`` and ``count``.
    hint: ClassVar[str]
    #: The tool events whose verdicts stick to the call identity until it makes progress.
    sticky: ClassVar[frozenset[Kind]] = frozenset({"call", "result"})
    #: A text detector judges narration (text beside tool calls) too; one that does not is not
    #: asked about it (its :meth:`check` must then find nothing in narration).
    narration: ClassVar[bool] = True
    #: A precondition of :meth:`quiet` stated as data: the counters of a tool event (see
    #: :data:`COUNTERS`) with the setting (or the number) each must reach before the detector
    #: may find anything; while none is reached, :meth:`quiet` would say so. The LoopDetector
    #: tests the stated preconditions of a sticky detectors' event at once, in a few
    #: comparisons, and asks each detector only when one is reached. Empty: nothing stated,
    #: :meth:`quiet` is always asked.
    wakes_at: ClassVar[tuple[tuple[str, str | int], ...]] = ()

    __slots__ = ("config",)

    def __init__(self, config: LoopDetectionConfig, known: frozenset[str] | None) -> None:
        self.config = config

    def check(self, event: Any) -> Verdict:
        """Judge one event of a kind in :attr:`consumes`."""
        raise NotImplementedError

    def quiet(self, event: ToolEvent) -> bool:
        """True when :meth:`check` would surely return OK for this tool event and change nothing.

        Lets the LoopDetector skip building verdicts for the common healthy call and result; the
        default, ``False``, keeps a detector that does not say always checked.
        """
        return False

    def news(self) -> None:
        """A new user message arrived (new information: progress for detectors that care)."""

    def flagged(self, verdict: Verdict) -> None:
        """The run's verdict on a tool result was ``verdict`` (WARNING or above), whichever
        detector gave it: the model has been told that this tool's calls make no progress."""

    def verdict(self, severity: Severity, count: int, tool: str | None) -> Verdict:
        """The verdict at ``severity``, with this detector's hint (``OK`` when nothing)."""
        if severity is _SEV_OK:
            return OK
        if tool is not None and tool.__class__ is not str:  # (typed str; not a key for sure)
            return self._made(severity, count, tool)
        # A loop gets the same verdict call after call, and a scan of many runs the same few:
        # verdicts are frozen, so one object serves every session (the hint is formatted once)
        key = (self.__class__, severity, count, tool)
        verdict = _VERDICTS.get(key)
        if verdict is None:
            if len(_VERDICTS) >= _VERDICTS_KEPT:  # invented tool names must not grow it
                _VERDICTS.clear()
            verdict = _VERDICTS[key] = self._made(severity, count, tool)
        return verdict

    def _made(self, severity: Severity, count: int, tool: str | None) -> Verdict:
        text = self.hint.format(tool=tool, count=count) + _ADVICE[severity]
        return Verdict(severity, self.name, count, text, tool)


def _no_progress(event: ToolEvent, cfg: LoopDetectionConfig) -> tuple[Severity, int] | None:
    """Attempts for an unchanged (non-error) answer, and their severity; ``None`` before one."""
    last = event.state.last_result
    if last is None or last == ERROR_MARK:
        return None
    count = event.state.same + event.ahead
    # (no_progress_ladder's ladder, called directly: a loop's every event comes here)
    brk = cfg.no_progress_break_at
    return ladder(count, cfg.no_progress_warn_at, cfg.no_progress_critical_at, brk), count


def no_progress_ladder(count: int, cfg: LoopDetectionConfig) -> Severity:
    """The ``no_progress_*`` ladder, shared by the detectors judging unchanged answers."""
    return ladder(
        count, cfg.no_progress_warn_at, cfg.no_progress_critical_at, cfg.no_progress_break_at
    )


# -- tool calls ----------------------------------------------------------------------------------


class ErrorRepeat(Detector):
    """The same call failing again and again (the error text may vary)."""

    name = "error_repeat"
    consumes = frozenset({"call", "result"})
    hint = "`{tool}` with these arguments has failed {count} times in a row."
    wakes_at = (("errors", "error_warn_at"),)
    __slots__ = ()

    def quiet(self, event: ToolEvent) -> bool:
        errors = event.state.errors
        return errors == 0 or errors + event.ahead < self.config.error_warn_at

    def check(self, event: ToolEvent) -> Verdict:
        if not event.state.errors:
            return OK
        cfg = self.config
        count = event.state.errors + event.ahead
        sev = ladder(count, cfg.error_warn_at, cfg.error_critical_at, cfg.error_break_at)
        if sev is _WARNING and event.ahead:
            # A retry after a transient failure is normal (two failures, then success, is
            # healthy): the hint waits for the failure itself. Only a refusal or a critical
            # verdict is worth giving before the call runs.
            return OK
        return self.verdict(sev, count, event.name)


class UnknownToolRepeat(Detector):
    """Calls to a name that is not a tool: not declared, or an error result said so."""

    name = "unknown_tool_repeat"
    consumes = frozenset({"call", "result"})
    hint = "`{tool}` is not an available tool ({count} attempts)."
    sticky = frozenset()  # about a tool name, not one call identity
    __slots__ = ("_known", "names")

    def __init__(self, config: LoopDetectionConfig, known: frozenset[str] | None) -> None:
        super().__init__(config, known)
        self._known = known
        self.names: dict[str, int] = {}  # unknown name -> calls, oldest first

    def quiet(self, event: ToolEvent) -> bool:
        if event.kind == "result":
            return not self._says_unknown(event)
        known = self._known
        return (known is None or event.name in known) and event.name not in self.names

    @staticmethod
    def _says_unknown(event: ToolEvent) -> bool:
        result = event.result
        return event.error and isinstance(result, str) and says_unknown_tool(result)

    def check(self, event: ToolEvent) -> Verdict:
        name = event.name
        if event.kind == "result":
            # an error result that says so teaches that the name is no tool (a result that is
            # no failure, the common one, says nothing: no call)
            if not event.error or not self._says_unknown(event):
                return OK
            self.names.setdefault(name, 1)
            return self._judge(name)
        if name not in self.names:
            if self._known is None or name in self._known:
                return OK
            self.names[name] = 0
        self.names[name] = self.names.pop(name) + 1  # (now the newest)
        while len(self.names) > self.config.tool_window:
            del self.names[next(iter(self.names))]
        return self._judge(name)

    def _judge(self, name: str) -> Verdict:
        cfg = self.config
        count = self.names[name]
        sev = ladder(
            count, cfg.unknown_tool_warn_at, cfg.unknown_tool_critical_at, cfg.unknown_tool_break_at
        )
        return self.verdict(sev, count, name)


class _Periodic(Detector):
    """A periodic run of calls (A-B-A-B…, A-B-C-A-B-C…) whose results do not change."""

    consumes = frozenset({"call"})
    wakes_at = (("rounds", 1),)  # any periodic run
    __slots__ = ()

    def _mine(self, period: int) -> bool:
        raise NotImplementedError

    def quiet(self, event: ToolEvent) -> bool:
        return event.cycle is None or not self._mine(event.cycle[0])

    def check(self, event: ToolEvent) -> Verdict:
        if event.cycle is None or not self._mine(event.cycle[0]):
            return OK
        cfg = self.config
        rounds = event.cycle[1]
        sev = ladder(rounds, cfg.cycle_warn_at, cfg.cycle_critical_at, cfg.cycle_break_at)
        if rounds >= 2:  # a loop of stale members is as bad as its stalest member
            stale = _no_progress(event, cfg)
            if stale is not None:
                sev = max(sev, stale[0])
        return self.verdict(sev, rounds, event.name)


class PingPong(_Periodic):
    """Two calls alternating (A-B-A-B…) with unchanged results."""

    name = "ping_pong"
    hint = (
        "You are alternating between the same two tool calls ({count} rounds, ending with "
        "`{tool}`) and the results do not change."
    )
    __slots__ = ()

    def _mine(self, period: int) -> bool:
        return period == 2


class Cycle(_Periodic):
    """A longer cycle of calls (A-B-C…-A-B-C…) with unchanged results."""

    name = "cycle"
    hint = (
        "You are repeating the same cycle of tool calls ({count} rounds, ending with `{tool}`) "
        "and the results do not change."
    )
    __slots__ = ()

    def _mine(self, period: int) -> bool:
        return period > 2


class PollNoProgress(Detector):
    """The same call whose result has not changed."""

    name = "poll_no_progress"
    consumes = frozenset({"call", "result"})
    hint = (
        "You have called `{tool}` with identical arguments {count} times and the result has not "
        "changed."
    )
    wakes_at = (("same", "no_progress_warn_at"),)
    __slots__ = ()

    def quiet(self, event: ToolEvent) -> bool:
        state = event.state
        last = state.last_result
        # ladders are ordered (the config checks), so below warn_at means OK
        return (
            last is None
            or last == ERROR_MARK
            or state.same + event.ahead < self.config.no_progress_warn_at
        )

    def check(self, event: ToolEvent) -> Verdict:
        stale = _no_progress(event, self.config)
        if stale is None:
            return OK
        return self.verdict(stale[0], stale[1], event.name)


class _Group:
    """Calls of one tool with different but similar arguments that returned one result."""

    __slots__ = ("arguments", "fps", "name", "text")

    def __init__(self, name: str, event: ToolEvent) -> None:
        self.name = name
        # The words are made when first compared (most groups never are). A mapping is copied,
        # so a caller reusing its dict does not change what this call said.
        args = event.arguments
        self.arguments: Any = None
        self.text: str | None = None
        if args.__class__ is str:  # (JSON text, what the API sends: no Mapping check first)
            self.arguments = args
        elif isinstance(args, Mapping):
            self.arguments = dict(args)
        elif isinstance(args, (str, bytes)):
            self.arguments = args
        else:
            self.text = event.arguments_text
        self.fps: set[str] = {event.fp}

    def words(self) -> str:
        if self.text is None:
            self.text = arguments_text(self.arguments)
            self.arguments = None
        return self.text


class NearDuplicate(Detector):
    """One tool, different but similar arguments, the same informative result."""

    name = "near_duplicate"
    consumes = frozenset({"call", "result"})
    hint = (
        "{count} calls of `{tool}` with only slightly different arguments all returned the same "
        "result; rewording or re-tuning the call does not help."
    )
    # after a result the verdict is about the group of variants, not this call identity
    sticky = frozenset({"call"})
    __slots__ = ("groups", "suspects")

    def __init__(self, config: LoopDetectionConfig, known: frozenset[str] | None) -> None:
        super().__init__(config, known)
        self.groups: dict[tuple[str, str], _Group] = {}  # oldest first
        # tools with a group big enough to flag the next variant (may be stale: a stale name
        # only costs the full check)
        self.suspects: set[str] = set()

    def quiet(self, event: ToolEvent) -> bool:
        if event.kind == "call":
            return event.name not in self.suspects
        return not self._informative(event)

    def check(self, event: ToolEvent) -> Verdict:
        if event.kind == "call":
            return self._ahead(event)
        # after a result (in line: every result comes here): is this call one more similar
        # variant that returned the same thing?
        if not self._informative(event):
            return OK
        cfg = self.config
        name = event.name
        gkey = (name, event.rfp)
        groups = self.groups
        group = groups.get(gkey)
        if group is None:  # a new answer: a group of one, newest in the window
            groups[gkey] = _Group(name, event)
            if len(groups) > cfg.tool_window:
                del groups[next(iter(groups))]
            if cfg.no_progress_warn_at <= 2:  # (as below, for a count of one)
                self.suspects.add(name)
            return OK  # one call is no near-duplicate (the ladder starts at two)
        if event.fp not in group.fps:
            score = fuzz.token_set_ratio(event.arguments_text, group.words()) / 100.0
            if score < cfg.near_duplicate_threshold:
                return OK
        groups[gkey] = groups.pop(gkey)  # (now the newest)
        group.fps.add(event.fp)
        count = len(group.fps)
        if count >= cfg.no_progress_warn_at - 1:
            self.suspects.add(name)
        return self.verdict(no_progress_ladder(count, cfg), count, name)

    def _informative(self, event: ToolEvent) -> bool:
        """A new answer long enough to say whether the calls differed (not a failure, not the
        same answer again: those are the other detectors' case; not an acknowledgement such as
        "ok", which says nothing about the calls)."""
        if event.error or event.state.same != 1:
            return False
        result = event.result
        size = len(result) if isinstance(result, str) else _printed_size(result)
        return size >= self.config.near_duplicate_min_result_chars

    def _ahead(self, event: ToolEvent) -> Verdict:
        """Before a call: is it one more variant of a near-duplicate group already flagged?"""
        cfg = self.config
        threshold = cfg.no_progress_warn_at - 1
        best = OK
        for group in self.groups.values():
            if group.name != event.name or len(group.fps) < threshold:
                continue
            score = fuzz.token_set_ratio(event.arguments_text, group.words()) / 100.0
            if score >= cfg.near_duplicate_threshold:
                count = len(group.fps) + 1
                best = pick((best, self.verdict(no_progress_ladder(count, cfg), count, event.name)))
        return best


#: Argument fields that change between calls without changing the question (compared case- and
#: separator-insensitively, as the volatile result fields are).
NOISE_ARGUMENTS: frozenset[str] = frozenset(
    {
        "requestid", "nonce", "timestamp", "ts", "time", "timeout", "timeoutms", "timeoutseconds",
        "pagesize", "perpage", "limit", "seed", "traceid", "idempotencykey", "cachebuster",
        "retry", "attempt", "attempts",
    }
)  # fmt: skip
_WORD = re.compile(r"[^\W_]+")
#: Words glued into one identifier: a file name, a path, an address, a snake_case name.
_GLUED = re.compile(r"\w*(?:_|[./\\:@=]\w)\w*")
_GLUE = frozenset("._/\\:@=")
_QUERY_CHARS = 200  # longer texts are content, not queries to reword


def _noise_field(name: Any) -> bool:
    return str(name).replace("_", "").replace("-", "").lower() in NOISE_ARGUMENTS


def _rewording(a: Any, b: Any) -> bool:
    """Two short free texts (queries) asking one thing in other words: they share a word, and
    every word that differs is a plain word. A changed name is another question: a number, a
    date, an id, a word written with a capital (a city, a person, a code such as ``OSL``) or
    glued into an identifier (``main.py``, ``get_seed``). A path or a name (no space) is an
    identifier, never a rewording; so is a long text (a file's content is not a query)."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    if not (" " in a.strip() and " " in b.strip()) or max(len(a), len(b)) > _QUERY_CHARS:
        return False
    written_a, written_b = set(_WORD.findall(a)), set(_WORD.findall(b))
    wa, wb = set(map(str.lower, written_a)), set(map(str.lower, written_b))
    if len(wa) < 2 or len(wb) < 2 or not wa & wb:
        return False
    return _plain(wa - wb, written_a, a) and _plain(wb - wa, written_b, b)


def _plain(words: set[str], written: set[str], text: str) -> bool:
    """Are ``words`` (lower-cased, from ``text``, whose words as written are ``written``) all
    plain: letters only, in lower case somewhere in the text, in no identifier?"""
    if not words:
        return True
    if not (words <= written and all(w.isalpha() for w in words)):
        return False
    if _GLUE.isdisjoint(text):
        return True
    return words.isdisjoint(_WORD.findall(" ".join(_GLUED.findall(text.lower()))))


def same_question(first: Any, later: Any) -> bool:
    """Do two calls' arguments ask the same thing (equal, reworded, or differing by noise only)?

    ``first`` is decoded already (a run keeps its first call's arguments decoded).
    """
    a, b = first, decoded(later)
    if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
        return a == b or _rewording(a, b)
    return all(
        a.get(k) == b.get(k) or _noise_field(k) or _rewording(a.get(k), b.get(k))
        for k in a.keys() | b.keys()
    )


class _Run:
    """The current run of one tool's results that were all the same."""

    __slots__ = ("_arguments", "_raw", "count", "epoch", "flagged", "fps", "key")

    def __init__(self, key: str, epoch: int, event: ToolEvent) -> None:
        self.key = key
        self.count = 1
        self.epoch = epoch
        self.flagged = False  # a verdict about this tool came with one of the run's results
        self.fps = {event.fp}  # call identities in the run: a repeat of one needs no comparing
        arguments = event.arguments
        # JSON text (what the API sends) is decoded only when a later call is compared with it:
        # most runs end at their first result
        self._raw = arguments.__class__ is str
        if not self._raw:
            arguments = decoded(arguments)
            if isinstance(arguments, Mapping):  # a caller reusing its dict changes nothing here
                arguments = dict(arguments)
        self._arguments: Any = arguments

    @property
    def arguments(self) -> Any:
        """The first call's arguments, decoded."""
        if self._raw:
            self._arguments = decoded(self._arguments)
            self._raw = False
        return self._arguments


class SameResult(Detector):
    """One tool returning the same result call after call, whatever the arguments.

    No progress is a property of the results: rewordings of one query that all find nothing,
    or a call whose only changing argument is noise (a nonce, a timeout, a page size), are as
    stuck as the identical call. A run is broken by a different result of that tool, or by news
    from any tool in between (a result not seen recently: a patch between two reads, a search
    that found something), or by a call asking another question (another route, another date:
    exploring, not repeating), so pagination, refinement and change-then-look stay quiet —
    until the run is flagged (by any detector: the model was told its calls of this tool make
    no progress). From then on a call that brings the run's result back continues the run,
    whatever it asked: exploring that finds the very answer the loop was warned about is the
    loop going on, and each such call climbs one step of the ladder from the flag's severity.
    """

    name = "same_result"
    consumes = frozenset({"result"})
    hint = (
        "The last {count} calls of `{tool}` all returned the same result, whatever the arguments; "
        "calling it again differently will not help."
    )
    sticky = frozenset()  # about a tool's run of results, not one call identity
    __slots__ = ("epoch", "runs", "seen")

    def __init__(self, config: LoopDetectionConfig, known: frozenset[str] | None) -> None:
        super().__init__(config, known)
        self.runs: dict[str, _Run] = {}  # tool -> its current run, oldest tool first
        self.seen: dict[tuple[str, str], None] = {}  # recent (tool, result), oldest first
        self.epoch = 0  # bumped on every result that is news

    def check(self, event: ToolEvent) -> Verdict:
        name = event.name
        # a failure's text matters here: different business errors are different answers (a
        # text one's identity remembered, as a result's is: a failing call repeats its error)
        key = event.key if event.error else event.rfp
        cfg = self.config
        window = cfg.tool_window
        seen, runs, epoch = self.seen, self.runs, self.epoch
        heard = (name, key)
        news = heard not in seen
        run = runs.get(name)
        if (
            run is not None
            and run.key == key
            and run.epoch == epoch
            and (
                run.flagged or event.fp in run.fps or same_question(run.arguments, event.arguments)
            )
        ):
            run.count += 1
            if len(run.fps) < window:
                run.fps.add(event.fp)
        else:
            run = runs[name] = _Run(key, epoch, event)
            if len(runs) > window:
                del runs[next(iter(runs))]
        if news:
            # (its own news does not break the run it starts)
            self.epoch = run.epoch = epoch + 1
            seen[heard] = None
            if len(seen) > window:
                del seen[next(iter(seen))]
        count = run.count
        if count < cfg.no_progress_warn_at:
            return OK
        return self.verdict(no_progress_ladder(count, cfg), count, name)

    def news(self) -> None:
        self.epoch += 1  # a user message with new information: every run starts again

    def flagged(self, verdict: Verdict) -> None:
        # Called after check() for the same result: the tool's run is the one that result
        # belongs to. It takes the flag's severity on its own ladder (counts of other
        # detectors measure other things: rounds, failures, stalled outcomes).
        run = self.runs.get(verdict.tool) if verdict.tool is not None else None
        if run is None or run.epoch != self.epoch:
            return
        run.flagged = True
        cfg = self.config
        severity = verdict.severity  # (no dict built per flag: a long loop is flagged per result)
        if severity == _WARNING:
            floor = cfg.no_progress_warn_at
        elif severity == _CRITICAL:
            floor = cfg.no_progress_critical_at
        else:
            floor = cfg.no_progress_break_at
        run.count = max(run.count, floor)


class GenericRepeat(Detector):
    """The same call again and again without a new result (capped at a hint once results have
    changed; silent while each result is new, as a poll that advances)."""

    name = "generic_repeat"
    consumes = frozenset({"call", "result"})
    hint = "You have called `{tool}` with identical arguments {count} times."
    wakes_at = (("calls", "warn_at"),)
    __slots__ = ()

    def quiet(self, event: ToolEvent) -> bool:
        policy = event.policy
        polling = policy is not None and policy.polling
        return polling or event.state.calls < self.config.warn_at

    def check(self, event: ToolEvent) -> Verdict:
        policy = event.policy
        if policy is not None and policy.polling:
            return OK  # a polling tool is judged by its results only
        cfg = self.config
        state = event.state
        if state.novel:
            return OK  # the latest result is new (a poll that advances): progress, no hint
        sev = ladder(state.calls, cfg.warn_at, cfg.critical_at, cfg.break_at)
        if state.progressed and sev > _WARNING:
            sev = _WARNING  # results keep changing: progress, at most a hint
        return self.verdict(sev, state.calls, event.name)


class GlobalBreaker(Detector):
    """Many no-progress outcomes across all calls."""

    name = "global_breaker"
    consumes = frozenset({"call", "result"})
    hint = "{count} of your recent tool calls made no progress."
    wakes_at = (("stalled", "global_warn_at"),)
    __slots__ = ("_last",)

    def __init__(self, config: LoopDetectionConfig, known: frozenset[str] | None) -> None:
        super().__init__(config, known)
        self._last = OK  # the latest verdict: a long loop keeps its count event after event

    def quiet(self, event: ToolEvent) -> bool:
        return event.stalled < self.config.global_warn_at

    def check(self, event: ToolEvent) -> Verdict:
        stalled = event.stalled
        last = self._last
        if last.count == stalled and last.tool == event.name:
            return last  # the same count about the same tool: the same (frozen) verdict
        cfg = self.config
        sev = ladder(stalled, cfg.global_warn_at, cfg.global_critical_at, cfg.global_break_at)
        last = self._last = self.verdict(sev, stalled, event.name)
        return last


# -- text ----------------------------------------------------------------------------------------


class ResponseRepeat(Detector):
    """An assistant response equal or near-equal to recent ones (not narration of tool calls)."""

    name = "response_repeat"
    consumes = frozenset({"text"})
    hint = "This response repeats one of your recent responses ({count} times)."
    narration = False
    __slots__ = ("_level", "_window")

    def __init__(self, config: LoopDetectionConfig, known: frozenset[str] | None) -> None:
        super().__init__(config, known)
        self._window = ResponseWindow(config.window_size, config.similarity_threshold)
        self._level = OK  # sticky while the responses keep repeating

    def check(self, event: TextEvent) -> Verdict:
        if event.narration:
            return OK  # a short narration repeated while the calls progress is normal
        n = self.config.duplicate_threshold
        count = self._window.add(event.text, event.normalised)
        if count < n:  # the usual case: no repeat (and the ladder starts at n)
            self._level = OK
            return OK
        if count == self._level.count:  # a loop going on at a full window: the same verdict
            return self._level
        # (``verdict`` gives the OK object itself for an OK severity: compared by identity)
        repeat = self.verdict(ladder(count, n, n + 2, n + 4), count, None)
        if repeat is OK:
            self._level = OK
        elif repeat.severity < self._level.severity:
            repeat = self.verdict(self._level.severity, count, None)
        if repeat is not OK:
            self._level = repeat
        return repeat


class DegenerateText(Detector):
    """A line, sentence or chunk repeating inside one output."""

    name = "degenerate_text"
    consumes = frozenset({"text"})
    hint = "This output repeats the same text {count} times."
    __slots__ = ()

    def check(self, event: TextEvent) -> Verdict:
        m = self.config.degenerate_min_repeats
        if event.narration:  # its count is remembered (a loop says its narration again)
            n = degeneration(event.text, m, remember=True)
        elif repeats_below(event.text, m, event.normalised):
            # an answer (mostly new: not remembered), told by the gate with the normalised
            # text the response detector compared (:func:`degeneration`, one call less)
            return OK
        else:
            n = degenerate_repeats(event.text)
        if n < 0:
            return OK  # a sentence or two: no unit can come back m times
        return self.verdict(ladder(n, m, 2 * m, 4 * m), n, None)


#: Every detector, most specific first: ties in severity go to the earlier one.
REGISTRY: tuple[type[Detector], ...] = (
    ErrorRepeat,
    UnknownToolRepeat,
    PingPong,
    Cycle,
    PollNoProgress,
    NearDuplicate,
    SameResult,
    GenericRepeat,
    GlobalBreaker,
    ResponseRepeat,
    DegenerateText,
)

#: The counters of a tool event a detector's :attr:`~Detector.wakes_at` may name: of the call
#: identity, its failures in a row (``errors``), results unchanged in a row (``same``) and calls
#: (``calls``), each counting the call about to run; the stalled outcomes of the window
#: (``stalled``); the full rounds of the periodic run the call completes (``rounds``, 0 for none).
COUNTERS: tuple[str, ...] = ("errors", "same", "calls", "stalled", "rounds")

#: Every detector name, most specific first (ties in severity go to the earlier name).
DETECTORS: tuple[str, ...] = tuple(d.name for d in REGISTRY)
_PRIORITY = {name: i for i, name in enumerate(DETECTORS)}


def pick(candidates: Iterable[Verdict]) -> Verdict:
    """The worst verdict; ties go to the more specific detector (the earlier in the registry)."""
    best = OK
    for v in candidates:
        best = worse(best, v)
    return best


def worse(best: Verdict, v: Verdict) -> Verdict:
    """One step of :func:`pick`: ``v`` if it is worse than ``best`` so far (or as bad, from a
    more specific detector), else ``best``; ``pick((a, b)) == worse(worse(OK, a), b)``.

    The detectors call it for the rare second finding of an event (no tuple, no loop)."""
    if v.severity > best.severity or (
        v.severity == best.severity
        and v.detector is not None
        and best.detector is not None
        and _PRIORITY[v.detector] < _PRIORITY[best.detector]
    ):
        return v
    return best


def _printed_size(value: Any) -> int:
    """How long ``value`` prints, for any value (``str`` fails on huge ints and deep values)."""
    try:
        return len(str(value))
    except (ValueError, RecursionError):
        return len(safe_canonical_text(value))
