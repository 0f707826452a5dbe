"""One session of a recorded trace, audited: loops, bad tool calls, tokens and money burnt.

Loops come from every loop detector (:class:`~agentguard.loops.TranscriptScanner`), tool-call
problems from :class:`~._calls.CallChecks` (the guard's own validator against the tools the
trace declares; without a tool list, broken arguments, calls written as text and names no tool
answers to). Each finding is dated by the step where the live guard would have acted, with
what it would have done there (:mod:`._findings`).

Tokens: a model call's reported usage where the trace has it; otherwise estimated, as an agent
pays them, from the history each call re-sends (about four characters a token). Tokens *burnt*
are those of the model calls that were part of a loop, or that had to be redone (invalid calls,
re-sent requests); each finding carries its share, priced with the price table.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import fsum
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from agentguard.config import GuardConfig
from agentguard.loops import TranscriptScanner
from agentguard.types import Severity
from agentguard.validation import extract_calls

from ._calls import CallChecks, Problem
from ._findings import Issue, ToolStats, context_line, make_issue
from ._ladder import Ladder

if TYPE_CHECKING:  # the budget package (ledgers, stores) is imported only when prices are set
    from agentguard.budget import PriceTable

__all__ = ["Issue", "SessionAudit"]

_CHARS_PER_TOKEN = 4
_CONTEXT_FINDINGS = 200  # findings per session whose surrounding messages are kept (HTML)
#: Timeline codes: the message's role in the low bits, its severity above.
ROLE_OTHER, ROLE_TEXT, ROLE_CALL, ROLE_TOOL = 0, 1, 2, 3
ISSUE_BIT = 0x40
_BREAK = Severity.BREAK  # (looked up once: an enum member's lookup is slow)
#: the latest messages of an audit without a timeline: none (a deque of no length, shared)
_NOTHING_KEPT: deque[list[Any]] = deque(maxlen=0)
_index = itemgetter(0)  # an Issue's index
_SETTLED = Issue._fields.index("action")  # an Issue's fields from here are settled at the end


@dataclass
class SessionAudit:
    """The running audit of one session; feed it the session's messages in order.

    Args:
        id: the session's name.
        config: loop detection, tool validation and escalation settings (as the live guard's).
        timeline: keep one byte per message, and the messages around each finding, for the
            HTML report.
        prices: the price table for the money burnt (default: the config's ``token_budget``
            prices; none configured: every call costs nothing).
    """

    id: str
    config: GuardConfig
    timeline: bytearray | None = None
    prices: PriceTable | None = None
    issues: list[Issue] = field(default_factory=list)
    tokens: int = 0
    cost: float = 0.0
    loop_tokens: int = 0
    retry_tokens: int = 0
    estimated: bool = False
    steps: int = 0

    def __post_init__(self) -> None:
        self.scanner = TranscriptScanner(self.config)
        if self.prices is None and self.config.token_budget.prices:
            from agentguard.budget import PriceTable  # noqa: PLC0415 - only with prices

            self.prices = PriceTable(self.config.token_budget.prices)
        self.calls = CallChecks(self.config)
        self.ladder = Ladder(self.config)
        #: per finding of :attr:`issues`, in order, what settles it at the end
        self._settling: list[_Settling] = []
        self._awaiting: list[_Settling] = []  # the settling of loop findings of the next request
        self._history_chars = 0
        self._turn = (0, 0.0)  # the latest model call: tokens, cost
        self._turn_in_loop = False
        #: the settling of the loop finding the turns in a loop are charged to
        self._open: _Settling | None = None
        self._model: str | None = None
        self._index = 0  # the next message's index in the session
        #: the latest messages: ``[index, message, its context line once made]`` (a line is
        #: made once, however many findings around it show it); kept with a timeline only
        self._recent = deque(maxlen=3) if self.timeline is not None else _NOTHING_KEPT
        self._with_context = 0  # findings whose context is kept
        #: the contexts still collecting the messages that follow their finding, and how many
        self._following: list[tuple[list[tuple[int, str, str]], int]] = []

    @property
    def messages(self) -> int:
        """Messages fed so far."""
        return self._index

    @property
    def declared(self) -> frozenset[str] | None:
        """The tool names the trace declares, ``None`` when it declares none."""
        return self.calls.declared

    @property
    def tools(self) -> dict[str, ToolStats]:
        """Per tool: calls, failed results, findings, tokens and money burnt."""
        return self.calls.tools

    def declare(self, tools: Sequence[Any]) -> None:
        """The tools the trace declares for this session (chat, Responses or Anthropic form)."""
        self.calls.declare(tools)

    def feed(
        self,
        message: Mapping[str, Any],
        tokens: int | None = None,
        retry: int = 0,
        *,
        model: str | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """Audit the next message; ``tokens``: the model call's usage when the trace has it
        (``prompt_tokens`` of them prompt), ``model``: the model that answered."""
        if model:
            self._model = model
        if retry:
            self.retry_tokens += retry
        self._feed((message,), tokens, prompt_tokens)

    def feed_run(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Audit the next messages, of which the trace says nothing more (a transcript's): as
        :meth:`feed` of each, in one loop."""
        self._feed(messages, None, None)

    def _feed(  # noqa: PLR0915 - one pass per message, kept flat: a helper call is per message
        self,
        messages: Iterable[Mapping[str, Any]],
        usage: int | None,
        prompt_usage: int | None,
    ) -> None:
        """:meth:`feed` of each of ``messages`` (``usage``: the tokens of the one answer among
        them, when the trace says). The counters of the loop are kept in local variables and
        written back when it ends."""
        # per message, in the order the guard sees it: the request it completes (an answer),
        # the loop verdict, the calls, the accounting; kept flat (no helper calls on the
        # common path), it runs per message
        scanner = self.scanner
        scan = scanner.feed
        issues = self.issues
        ladder = self.ladder
        awaiting = self._awaiting  # (changed in place only)
        check = self.calls.check
        result = self.calls.result
        timeline = self.timeline
        prices = self.prices
        model = self._model
        index, steps, history = self._index, self.steps, self._history_chars
        total, spent, estimated = self.tokens, self.cost, self.estimated
        turn_tokens, turn_cost = self._turn
        turn_in_loop = self._turn_in_loop
        try:
            for message in messages:
                before = len(issues)
                content = message.get("content")
                size = len(content) + 8 if content.__class__ is str else 8
                found = scan(message)
                severity = scanner.last_severity
                role = message.get("role")
                if role == "assistant":
                    steps += 1
                    if awaiting:
                        self._request(steps)
                    elif ladder.new:  # no loop finding waits for the rung: the ladder alone
                        ladder.request(steps, model)
                    if found:
                        self._loops(found, steps, severity, answer=True)
                    elif severity >= _BREAK:  # a loop going on: the answer is asked again
                        ladder.rung(steps, severity, scanner.last_detector, model, reask=True)
                    calls = message.get("tool_calls")
                    # the answer's calls (or calls written in its text) checked, its model
                    # call counted
                    problems: Sequence[Problem] = ()
                    if calls:
                        code = ROLE_CALL
                        call_chars, problems = check(index, steps, message, calls)
                    else:
                        code, call_chars = ROLE_TEXT, 0
                        written = extract_calls(content) if content.__class__ is str else None
                        if written is not None:
                            problems = self.calls.written(index, steps, written)
                    tokens, prompt = usage, prompt_usage
                    if tokens is None:
                        tokens = (history + size + call_chars) // _CHARS_PER_TOKEN
                        prompt = history // _CHARS_PER_TOKEN
                        estimated = True
                    elif prompt is None:  # the answer's share estimated from its length
                        prompt = max(0, tokens - (size + call_chars) // _CHARS_PER_TOKEN)
                    cost = prices.cost(model, prompt, tokens - prompt) if prices else 0.0
                    total += tokens
                    spent += cost
                    turn_tokens, turn_cost, turn_in_loop = tokens, cost, False
                    if problems:
                        self._turn = (tokens, cost)
                        self._problems(problems)
                    size += call_chars
                else:
                    if severity:
                        ladder.message(severity, scanner.last_detector)
                        if found:
                            self._loops(found, steps + 1, severity, answer=False)
                    else:
                        ladder.new = True
                    if role == "tool":
                        code = ROLE_TOOL
                        # (whether it failed, as the loop detectors judged it: judged once)
                        result(message, content, scanner.last_failed)
                    else:
                        code = ROLE_OTHER
                        if usage:
                            total += usage
                if severity and not turn_in_loop:  # WARNING or worse: a loop's turn
                    # (the latest model call's turn is in a loop; in line: a loop's every
                    # message comes here)
                    turn_in_loop = True
                    self.loop_tokens += turn_tokens
                    burn = self._open
                    if burn is not None:
                        burn.tokens += turn_tokens
                        burn.cost += turn_cost
                history += size
                if timeline is not None:
                    flag = ISSUE_BIT if len(issues) > before else 0
                    timeline.append(code | (severity << 2) | flag)
                    self._remember(index, message)
                index += 1
        finally:
            self._index, self.steps, self._history_chars = index, steps, history
            self.tokens, self.cost, self.estimated = total, spent, estimated
            self._turn, self._turn_in_loop = (turn_tokens, turn_cost), turn_in_loop

    def _problems(self, problems: Sequence[Problem]) -> None:
        """The findings of an answer's bad calls; one the guard re-asks for burns the turn."""
        redone = False
        for p in problems:
            settling = self._add(_tool_call_issue(p))
            if p.action == "recovery":
                tokens, cost = self._turn
                if not redone:
                    redone = True
                    self.retry_tokens += tokens  # an invalid call: the turn is redone
                settling.tokens += tokens
                settling.cost += cost

    def _add(self, issue: Issue) -> _Settling:
        """Record ``issue``; what settles it at the end."""
        self.issues.append(issue)
        settling = _Settling(issue.action)
        self._settling.append(settling)
        if issue.category == "loop":  # the turns in a loop from here on are charged to it
            self._open = settling
        if self.timeline is not None and self._with_context < _CONTEXT_FINDINGS:
            self._with_context += 1
            context = settling.context = [_line(entry) for entry in self._recent]
            self._following.append((context, 3))  # its own message and the two after it
        return settling

    def _remember(self, index: int, message: Mapping[str, Any]) -> None:
        entry = [index, message, None]
        self._recent.append(entry)
        if self._following:
            line = _line(entry)
            for context, _ in self._following:
                context.append(line)
            self._following = [(c, n - 1) for c, n in self._following if n > 1]

    def _loops(self, found: list[Any], step: int, severity: Severity, *, answer: bool) -> None:
        """Loop findings of a message, with what the guard does about them: an answer's now,
        a request's once the request is complete (:meth:`_request`)."""
        action = ""
        if answer and severity:
            action = self.ladder.answer(step, severity, self.scanner.last_detector, self._model)
        for f in found:
            issue = make_issue((f.index, f.severity, "loop", f.detector, f.tool, f.count,
                                f.message, step, action, 0, 0.0, ()))  # fmt: skip
            settling = self._add(issue)
            if not action:
                self._awaiting.append(settling)

    def _request(self, step: int) -> None:
        """The request of ``step`` is complete: the rung the guard takes for it."""
        action = self.ladder.request(step, self._model)
        for settling in self._awaiting:
            settling.action = action or "warn"
        self._awaiting.clear()

    def finish(self) -> None:
        """End of the trace: names that never worked are hallucinated tools
        (:meth:`CallChecks.finish`); each finding gets its tokens, cost and context."""
        if self._awaiting:  # results after the last answer: the guard acts on the next request
            self._request(self.steps + 1)
        for p in self.calls.finish():
            self._add(_tool_call_issue(p))
        done = []
        tools, stats_of = self.calls.tools, self.calls.stats
        for issue, settling in zip(self.issues, self._settling, strict=True):
            tokens, cost, context = settling.tokens, settling.cost, settling.context
            # (its fields up to ``step`` as found; no call per finding: this runs per session)
            done.append(make_issue((*issue[:_SETTLED], settling.action, tokens, cost,
                                    () if context is None else tuple(context))))  # fmt: skip
            tool = issue.tool
            if tool is not None:
                stats = tools.get(tool) or stats_of(tool)
                stats.findings += 1
                stats.tokens += tokens
                stats.cost += cost
        done.sort(key=_index)  # (names never confirmed are dated by their first call)
        self.issues = done
        # nothing is fed after the end: the detectors' state goes, and what settled the
        # findings (a scan keeps every session's audit until its report is written)
        del self.scanner, self._settling, self._awaiting, self._following, self._open

    def first_action(self) -> tuple[int, str, str] | None:
        """Where the live guard would first have acted: ``(step, action, detector)`` — a rung
        of its loop recovery ladder, or a repair or re-ask of a tool call (a warning in its
        report is no act), ``None`` when it never would have."""
        acts = self.ladder.acts
        earliest = min(acts, key=_step) if acts else None  # the first of the earliest
        first = None if earliest is None else (earliest[0], earliest[1], earliest[2] or "loop")
        for i in self.issues:  # a tool call's finding only when strictly earlier
            if i.category == "tool_call" and (first is None or i.step < first[0]):
                first = (i.step, i.action, i.detector)
        return first

    # -- tool calls ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        first = self.first_action()
        return {
            "id": self.id,
            "messages": self.messages,
            "steps": self.steps,
            "tokens": self.tokens,
            "tokens_estimated": self.estimated,
            "cost": round(self.cost, 6),
            "loop_tokens": self.loop_tokens,
            "retry_tokens": self.retry_tokens,
            "burnt_cost": round(fsum(i.cost for i in self.issues), 6),
            "first_action": None
            if first is None
            else {"step": first[0], "action": first[1], "detector": first[2]},
            "recovery": [
                {"step": step, "action": action, "detector": detector}
                for step, action, detector in self.ladder.acts
            ],
            "tools": {name: s.to_dict() for name, s in sorted(self.tools.items())},
            "findings": [i.to_dict() for i in self.issues],
        }


class _Settling:
    """What settles a finding at the end of its trace: the tokens and money it burnt, what
    the guard does about it, and (with a timeline) the messages around it."""

    __slots__ = ("action", "context", "cost", "tokens")

    def __init__(self, action: str) -> None:
        self.tokens = 0
        self.cost = 0.0
        self.action = action
        self.context: list[tuple[int, str, str]] | None = None


def _tool_call_issue(p: Problem) -> Issue:
    return make_issue((p.at, p.severity, "tool_call", p.kind, p.tool, 1, p.text, p.step, p.action,
                       0, 0.0, ()))  # fmt: skip


def _step(act: tuple[int, str, str | None]) -> int:
    return act[0]


def _line(entry: list[Any]) -> tuple[int, str, str]:
    """The context line of a remembered message (``[index, message, line]``), made once."""
    line: tuple[int, str, str] | None = entry[2]
    if line is None:
        line = entry[2] = (entry[0], *context_line(entry[1]))
    return line
