"""One session of a recorded trace, audited: loops, bad tool calls, tokens burnt.

Loops come from every loop detector (:class:`~agentguard.loops.TranscriptScanner`). Tool calls
are checked against the tools the trace declares, or, when it declares none, against the tools
seen working in it: arguments that are not a JSON object, calls written as text instead of
``tool_calls`` (:func:`~agentguard.validation.extract_calls`), and names no tool answers to.

Tokens: a model call's reported usage where the trace has it; otherwise estimated, as an agent
pays them, from the history each call re-sends (about four characters a token). Tokens *burnt*
are those of the model calls that were part of a loop, or that had to be redone (invalid calls,
re-sent requests).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentguard._fingerprint import decode_arguments
from agentguard.config import GuardConfig
from agentguard.loops import TranscriptScanner, is_error_result
from agentguard.loops._identity import says_unknown_tool
from agentguard.types import Severity
from agentguard.validation import extract_calls

__all__ = ["Issue", "SessionAudit"]

_CHARS_PER_TOKEN = 4
#: Timeline codes: the message's role in the low bits, its severity above.
ROLE_OTHER, ROLE_TEXT, ROLE_CALL, ROLE_TOOL = 0, 1, 2, 3
ISSUE_BIT = 0x40


@dataclass(frozen=True, slots=True)
class Issue:
    """A finding in a session: a loop or a bad tool call.

    Attributes:
        index: the message (0-based, within the session) where it was found.
        severity: how bad.
        category: ``loop`` or ``tool_call``.
        detector: the loop detector, or the tool-call error (``invalid_json``,
            ``unknown_tool``, ``text_tool_call``).
        tool: the tool concerned, ``None`` for text.
        count: the repetition count behind a loop's severity (1 for tool calls).
        message: what is wrong, in words.
    """

    index: int
    severity: Severity
    category: str
    detector: str
    tool: str | None
    count: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "index": self.index,
            "severity": str(self.severity),
            "category": self.category,
            "detector": self.detector,
            "count": self.count,
            "tool": self.tool,
            "message": self.message,
        }


@dataclass
class SessionAudit:
    """The running audit of one session; feed it the session's messages in order.

    Args:
        id: the session's name.
        config: loop-detection settings.
        timeline: keep one byte per message for the HTML timeline.
    """

    id: str
    config: GuardConfig
    timeline: bytearray | None = None
    issues: list[Issue] = field(default_factory=list)
    tokens: int = 0
    loop_tokens: int = 0
    retry_tokens: int = 0
    estimated: bool = False
    declared: frozenset[str] | None = None

    def __post_init__(self) -> None:
        self.scanner = TranscriptScanner(self.config)
        self._history_chars = 0
        self._turn_tokens = 0
        self._turn_in_loop = False
        self._pending: OrderedDict[str, str] = OrderedDict()  # tool_call_id -> tool name
        self._working: set[str] = set()
        self._answered: set[str] = set()  # names some result answered (an error included)
        self._refuted: set[str] = set()  # names a result said are no tool
        self._last_calls = -1  # index of the latest assistant message with tool calls
        self._unconfirmed: dict[str, int] = {}  # undeclared names: first message index

    @property
    def messages(self) -> int:
        """Messages fed so far."""
        return self.scanner.messages_seen

    def declare(self, tools: Sequence[Any]) -> None:
        """The tools the trace declares for this session (OpenAI ``tools`` format)."""
        names = set(self.declared or ())
        for tool in tools:
            if isinstance(tool, dict):
                fn = tool.get("function")
                name = (fn if isinstance(fn, dict) else tool).get("name")
                if isinstance(name, str):
                    names.add(name)
        self.declared = frozenset(names)

    def feed(self, message: Mapping[str, Any], tokens: int | None = None, retry: int = 0) -> None:
        """Audit the next message; ``tokens``: the model call's usage when the trace has it."""
        scanner = self.scanner
        issues = self.issues
        index = scanner.messages_seen
        before = len(issues)
        for f in scanner.feed(message):
            issues.append(
                Issue(f.index, f.severity, "loop", f.detector, f.tool, f.count, f.message)
            )
        severity = scanner.last_severity
        role = message.get("role")
        content = message.get("content")
        size = len(content) + 8 if content.__class__ is str else 8
        code = ROLE_OTHER
        if retry:
            self.retry_tokens += retry
        if role == "assistant":
            if tokens is None:
                tokens = (self._history_chars + size) // _CHARS_PER_TOKEN
                self.estimated = True
            self.tokens += tokens
            self._turn_tokens = tokens
            self._turn_in_loop = False
            calls = message.get("tool_calls")
            code = ROLE_CALL if calls else ROLE_TEXT
            checked = len(issues)
            if calls:
                self._last_calls = index
            size += self._check_calls(index, calls, content)
            if len(issues) > checked:
                self.retry_tokens += tokens  # an invalid call: the turn must be redone
        elif role == "tool":
            code = ROLE_TOOL
            self._result(message)
        elif tokens:
            self.tokens += tokens
        if severity and not self._turn_in_loop:  # WARNING or worse: this turn is in a loop
            self._turn_in_loop = True
            self.loop_tokens += self._turn_tokens
        self._history_chars += size
        if self.timeline is not None:
            flag = ISSUE_BIT if len(issues) > before else 0
            self.timeline.append(code | (severity << 2) | flag)

    def finish(self) -> None:
        """End of the trace: names that never worked are hallucinated tools.

        A name whose calls came back with business errors ("seat taken", "no such file") ran:
        without a tool list, only a name no result answered, or one a result said is no tool,
        is suspect (a call of the trace's last turn may have no result: the trace ended).
        """
        for name, index in self._unconfirmed.items():
            # a call in the trace's last turn has no result because the trace ends there
            unanswered = name not in self._answered and index != self._last_calls
            if name not in self._working and (name in self._refuted or unanswered):
                self.issues.append(
                    Issue(
                        index,
                        Severity.WARNING,
                        "tool_call",
                        "unknown_tool",
                        name,
                        1,
                        f"no call to '{name}' ever succeeded and the trace declares no tools: "
                        "probably a hallucinated tool name",
                    )
                )
        self._unconfirmed.clear()
        self.issues.sort(key=lambda i: i.index)

    # -- tool calls ------------------------------------------------------------------------

    def _check_calls(self, index: int, calls: Any, content: Any) -> int:
        """Check an answer's tool calls (or its text for calls); returns their size in chars."""
        size = 0
        if not calls:
            if content.__class__ is str:  # extract_calls returns at once on text without calls
                extracted = extract_calls(content)
                if extracted is not None:
                    names = ", ".join(str(name) for name, _ in extracted.calls)
                    self._issue(
                        index,
                        Severity.WARNING,
                        "text_tool_call",
                        str(extracted.calls[0][0]),
                        f"tool call written as text ({extracted.style}) instead of tool_calls: "
                        f"{names}",
                    )
            return 0
        for call in calls:
            if not isinstance(call, dict):
                continue
            fn = call.get("function")
            name = str(fn.get("name") or "") if isinstance(fn, dict) else ""
            arguments = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(arguments, str):
                size += len(arguments) + len(name)
                try:
                    arguments = _arguments(arguments)
                except ValueError:
                    self._issue(
                        index,
                        Severity.WARNING,
                        "invalid_json",
                        name,
                        f"arguments of {name} are not valid JSON",
                    )
                    arguments = {}
            if not isinstance(arguments, dict):
                self._issue(
                    index,
                    Severity.WARNING,
                    "invalid_json",
                    name,
                    f"arguments of {name} are not a JSON object",
                )
            if self.declared is not None:
                if name not in self.declared:
                    self._issue(
                        index,
                        Severity.CRITICAL,
                        "unknown_tool",
                        name,
                        f"there is no tool named '{name}' in the trace's tools",
                    )
            elif name not in self._working:
                self._unconfirmed.setdefault(name, index)
            call_id = call.get("id")
            if call_id is not None:
                self._pending[str(call_id)] = name
                if len(self._pending) > 256:
                    self._pending.popitem(last=False)
        return size

    def _result(self, message: Mapping[str, Any]) -> None:
        name = self._pending.pop(str(message.get("tool_call_id")), None) or message.get("name")
        if not (isinstance(name, str) and name):
            return
        content = message.get("content")
        if not is_error_result(content):
            self._working.add(name)
        elif says_unknown_tool(content):
            self._refuted.add(name)
        if len(self._answered) < 4096:  # bounded: a name past the bound stays suspect
            self._answered.add(name)

    def _issue(self, index: int, severity: Severity, kind: str, tool: str, text: str) -> None:
        self.issues.append(Issue(index, severity, "tool_call", kind, tool, 1, text))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "id": self.id,
            "messages": self.messages,
            "tokens": self.tokens,
            "tokens_estimated": self.estimated,
            "loop_tokens": self.loop_tokens,
            "retry_tokens": self.retry_tokens,
            "findings": [i.to_dict() for i in self.issues],
        }


_decoded: dict[str, Any] = {}


def _arguments(text: str) -> Any:
    """``text`` decoded as the guard decodes arguments; raises ValueError. Loops repeat their
    arguments, so recent texts are remembered (a bounded cache, cleared when full)."""
    value = _decoded.get(text)
    if value is None:
        value = decode_arguments(text)
        if len(_decoded) >= 4096:
            _decoded.clear()
        _decoded[text] = value
    return value
