"""The tool-call side of a session's audit, checked as the live guard checks calls.

With the tools the trace declares: the guard's own :class:`~agentguard.validation.ToolCallValidator`
(unknown names, broken JSON, missing required or unexpected arguments, wrong types, enum
violations, placeholders); what it repairs locally is reported as a repair. Without a tool list:
arguments that are not a JSON object, calls written as text, and names no tool answers to
(decided at the end of the trace). :class:`CallChecks` decides; :class:`SessionAudit` turns its
:class:`Problem` values into findings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from agentguard._fingerprint import decode_arguments
from agentguard.config import GuardConfig
from agentguard.loops import is_error_result
from agentguard.loops._identity import says_unknown_tool
from agentguard.types import Severity
from agentguard.validation import Extracted, ToolCallValidator

from ._findings import ToolStats

__all__ = ["OTHER_TOOLS", "CallChecks", "Problem"]

#: distinct tool names tallied per session (a hostile trace may name millions)
_MAX_NAMES = 4096
OTHER_TOOLS = "(other tools)"
_WARNING, _CRITICAL = Severity.WARNING, Severity.CRITICAL  # (looked up once: enum lookups are slow)


class Problem(NamedTuple):
    """A bad tool call: where (its message's index), how bad, and what the guard would do."""

    at: int
    severity: Severity
    kind: str
    tool: str
    text: str
    step: int
    action: str = "recovery"


class CallChecks:
    """The tool calls of one session: checks, per-tool tallies, which names ever worked.

    Args:
        config: its ``tool_validation`` section configures the validator, as the guard's.
    """

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.declared: frozenset[str] | None = None
        self.tools: dict[str, ToolStats] = {}
        #: names some call of which succeeded (by the guard's rule for failed results)
        self.working: set[str] = set()
        self.last_calls = -1  # index of the latest assistant message with tool calls
        self._validator: ToolCallValidator | None = None
        self._pending: dict[str, str] = {}  # tool_call_id -> tool name, oldest first
        self._answered: set[str] = set()  # names some result answered (an error included)
        self._refuted: set[str] = set()  # names a result said are no tool
        self._unconfirmed: dict[str, tuple[int, int]] = {}  # undeclared names: first index, step

    def declare(self, tools: Sequence[Any]) -> None:
        """The tools the trace declares for this session (chat, Responses or Anthropic form)."""
        names = set(self.declared or ())
        for tool in tools:
            if isinstance(tool, dict):
                fn = tool.get("function")
                name = (fn if isinstance(fn, dict) else tool).get("name")
                if isinstance(name, str):
                    names.add(name)
        if self.declared is None or names != self.declared:
            try:
                self._validator = ToolCallValidator(tools, self.config, hooks=(), lenient=True)
            except Exception:  # tools it cannot read at all: names are still checked
                self._validator = None
        self.declared = frozenset(names)

    def written(self, index: int, step: int, extracted: Extracted) -> list[Problem]:
        """The problem of an answer whose text holds tool calls (``extracted`` from it by
        :func:`~agentguard.validation.extract_calls`) instead of ``tool_calls``."""
        names = ", ".join(str(name) for name, _ in extracted.calls)
        action = "repair" if self.config.tool_validation.repair else "recovery"
        text = f"tool call written as text ({extracted.style}) instead of tool_calls: {names}"
        tool = str(extracted.calls[0][0])
        return [Problem(index, _WARNING, "text_tool_call", tool, text, step, action)]

    def check(
        self, index: int, step: int, message: Mapping[str, Any], calls: Any
    ) -> tuple[int, list[Problem]]:
        """Check an answer's tool calls (``calls``, its ``tool_calls``, not empty): the calls'
        size in characters, and the problems found (an answer without calls:
        :meth:`written`)."""
        self.last_calls = index
        listed = calls if calls.__class__ is list or isinstance(calls, list) else ()
        validator = self._validator
        found = [] if validator is None else _validated(validator, index, step, message, listed)
        size = 0
        tools = self.tools
        pending = self._pending
        for call in listed:
            if call.__class__ is not dict and not isinstance(call, dict):
                continue
            fn = call.get("function")
            if fn.__class__ is dict or isinstance(fn, dict):
                name = fn.get("name") or ""
                if name.__class__ is not str:  # (a name is text mostly: then no call)
                    name = str(name)
                arguments: Any = fn.get("arguments")
            else:
                name, arguments = "", None
            stats = tools.get(name)
            if stats is None:
                stats = self.stats(name)
            stats.calls += 1
            text_arguments = arguments.__class__ is str or isinstance(arguments, str)
            if text_arguments:
                size += len(arguments) + len(name)
            if validator is None:
                # without a validator: the call's arguments, and its name against the declared
                # names (or, with none declared, whether it ever works)
                if text_arguments:
                    decoded = _decoded.get(arguments)  # (a loop's arguments: met before)
                    if decoded is None:
                        try:
                            decoded = _arguments(arguments)
                        except ValueError:
                            text = f"arguments of {name} are not valid JSON"
                            found.append(Problem(index, _WARNING, "invalid_json", name, text, step))
                            decoded = {}
                    arguments = decoded
                if arguments.__class__ is not dict and not isinstance(arguments, dict):
                    text = f"arguments of {name} are not a JSON object"
                    found.append(Problem(index, _WARNING, "invalid_json", name, text, step))
                if self.declared is not None:
                    if name not in self.declared:
                        text = f"there is no tool named '{name}' in the trace's tools"
                        found.append(Problem(index, _CRITICAL, "unknown_tool", name, text, step))
                elif (
                    name not in self.working
                    and name not in self._unconfirmed
                    and len(self._unconfirmed) < _MAX_NAMES  # bounded: odd input cannot grow it
                ):
                    self._unconfirmed[name] = (index, step)
            call_id = call.get("id")
            if call_id is not None:
                pending[call_id if call_id.__class__ is str else str(call_id)] = name
                if len(pending) > 256:
                    del pending[next(iter(pending))]
        return size, found

    def result(self, message: Mapping[str, Any], content: Any, failed: bool | None = None) -> None:
        """A tool result (``content``, its content): the name it answers worked, or failed
        (and maybe is no tool). ``failed``: whether it reports a failure
        (:func:`~agentguard.loops.is_error_result`), when the caller knows already."""
        name = self._pending.pop(str(message.get("tool_call_id")), None) or message.get("name")
        if not (isinstance(name, str) and name):
            return
        if failed is None:
            failed = is_error_result(content)
        if not failed:
            if len(self.working) < _MAX_NAMES:
                self.working.add(name)
        else:
            if says_unknown_tool(content):
                self._refuted.add(name)
            self.stats(name).errors += 1
        if len(self._answered) < 4096:  # bounded: a name past the bound stays suspect
            self._answered.add(name)

    def stats(self, name: str) -> ToolStats:
        """The tally of ``name``; past :data:`_MAX_NAMES` names, one tally for the rest."""
        stats = self.tools.get(name)
        if stats is None:
            if len(self.tools) >= _MAX_NAMES:
                name = OTHER_TOOLS
                stats = self.tools.get(name)
            if stats is None:
                stats = self.tools[name] = ToolStats()
        return stats

    def finish(self) -> list[Problem]:
        """End of the trace: names that never worked are hallucinated tools. What checks
        further calls goes; the tallies stay (a scan keeps every session's until its report is
        written).

        A name whose calls came back with business errors ("seat taken", "no such file") ran:
        without a tool list, only a name no result answered, or one a result said is no tool,
        is suspect (a call of the trace's last turn may have no result: the trace ended).
        """
        found = []
        for name, (index, step) in self._unconfirmed.items():
            # a call in the trace's last turn has no result because the trace ends there
            unanswered = name not in self._answered and index != self.last_calls
            if name not in self.working and (name in self._refuted or unanswered):
                text = (
                    f"no call to '{name}' ever succeeded and the trace declares no tools: "
                    "probably a hallucinated tool name"
                )
                found.append(Problem(index, Severity.WARNING, "unknown_tool", name, text, step))
        del self._pending, self._answered, self._refuted, self._unconfirmed
        self._validator = None
        return found


#: repairs that mend a model's mistake (a coercion such as "5" -> 5 is no mistake worth a line)
_REPAIRED = {
    "json_repaired": "invalid_json",
    "split_calls": "invalid_json",
    "repeated_arguments": "invalid_json",
    "double_encoded": "invalid_json",
    "tool_name": "unknown_tool",
}


def _validated(
    validator: ToolCallValidator, index: int, step: int, message: Mapping[str, Any], calls: Any
) -> list[Problem]:
    """The problems the validator finds in an answer's ``calls`` (none when not a list)."""
    found: list[Problem] = []
    if not calls:
        return found
    report = validator.validate(message)
    for error in report.errors:
        severity = _CRITICAL if error.kind == "unknown_tool" else _WARNING
        text = str(error)
        found.append(Problem(index, severity, error.kind, error.tool_name, text, step))
    for repair in report.repairs:  # a model mistake the guard fixes at no token cost
        kind = _REPAIRED.get(repair.kind)
        if kind is not None:
            name = _name(calls, repair.tool_call_id)
            text = f"{repair} (the guard repairs this locally)"
            found.append(Problem(index, _WARNING, kind, name, text, step, "repair"))
    return found


def _name(calls: list[Any], call_id: str | None) -> str:
    """The name of the call with ``call_id`` as the model wrote it."""
    for call in calls:
        if isinstance(call, dict) and call.get("id") == call_id:
            fn = call.get("function")
            return str(fn.get("name") or "") if isinstance(fn, dict) else ""
    return ""


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
