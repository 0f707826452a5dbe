"""The hook protocols of the coding agents: their event payloads in, their answers out.

Claude Code and the Codex CLI call a hook with one JSON object per event (on a command hook's
stdin, or as an HTTP hook's POST body) and read its answer from the hook's stdout (or the HTTP
response body). Both speak the same wire format for the events agentguard handles:

- ``PreToolUse`` (``tool_name``, ``tool_input``, ``tool_use_id``): the answer can deny the call
  (``hookSpecificOutput.permissionDecision: "deny"`` with a ``permissionDecisionReason`` that
  the model reads) or add text to the model's context (``hookSpecificOutput.additionalContext``).
- ``PostToolUse`` (the same, plus ``tool_response``) and Claude Code's ``PostToolUseFailure``
  (``error`` instead of a response): the answer can add context.
- ``UserPromptSubmit``: news from the user (nothing is answered).
- ``Stop``: the turn ended; ``systemMessage`` shows the user a warning. agentguard never blocks
  a stop (that would make the agent go on working).

Silence (no output, exit code 0) lets everything proceed. Sources: the Claude Code hooks
reference (code.claude.com/docs/en/hooks) and the Codex hooks documentation
(developers.openai.com/codex/hooks) with the hook schemas and parsers in ``openai/codex``
(``codex-rs/hooks``); ``tests/data/hooks/SOURCES.md`` lists what each fixture follows.

This module is plain data handling (standard library only): the HTTP route and the command
hook's fast path use it without loading the guard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "AGENTS",
    "EVENT_KINDS",
    "HookAnswer",
    "HookEvent",
    "context_answer",
    "deny_answer",
    "notice_answer",
    "parse_event",
]

#: The coding agents whose hook protocol agentguard speaks.
AGENTS: tuple[str, ...] = ("claude-code", "codex")

Kind = Literal["pre", "post", "prompt", "stop", "other"]

#: ``hook_event_name`` -> what it means to the guard.
EVENT_KINDS: dict[str, Kind] = {
    "PreToolUse": "pre",
    "PostToolUse": "post",
    "PostToolUseFailure": "post",
    "UserPromptSubmit": "prompt",
    "Stop": "stop",
    "SubagentStop": "stop",
}


@dataclass(frozen=True, slots=True)
class HookEvent:
    """One hook event, in the terms the guard judges it by.

    Attributes:
        agent: ``claude-code`` or ``codex``.
        name: the ``hook_event_name`` as sent (``PreToolUse`` ...).
        kind: ``pre`` (a tool call about to run), ``post`` (its result), ``prompt`` (a user
            message), ``stop`` (the turn ended) or ``other`` (not judged).
        session: the agent's ``session_id``.
        tool: the tool name (tool events).
        tool_input: the tool's arguments (tool events).
        tool_response: what the tool returned, or the error text of a failed call.
        failed: the call failed (``PostToolUseFailure``).
        transcript: the session transcript file the event names, if any.
    """

    agent: str
    name: str
    kind: Kind
    session: str
    tool: str = ""
    tool_input: Any = None
    tool_response: Any = None
    failed: bool = False
    transcript: str | None = None


def parse_event(agent: str, data: Any) -> HookEvent:
    """The :class:`HookEvent` in one decoded hook payload.

    Raises:
        ValueError: ``agent`` is unknown, or the payload is not an event object with a
            ``session_id`` and a ``hook_event_name``.
    """
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r} (expected one of {', '.join(AGENTS)})")
    if not isinstance(data, Mapping):
        raise ValueError("a hook event is a JSON object")
    session, name = data.get("session_id"), data.get("hook_event_name")
    if not isinstance(session, str) or not session or not isinstance(name, str):
        raise ValueError("a hook event needs a session_id and a hook_event_name")
    transcript = data.get("transcript_path")
    transcript = transcript if isinstance(transcript, str) and transcript else None
    kind = EVENT_KINDS.get(name, "other")
    if kind not in ("pre", "post"):
        return HookEvent(agent, name, kind, session, transcript=transcript)
    tool = data.get("tool_name")
    if not isinstance(tool, str) or not tool:
        return HookEvent(agent, name, "other", session, transcript=transcript)
    failed = name == "PostToolUseFailure"
    response = data.get("error") if failed else data.get("tool_response")
    return HookEvent(
        agent,
        name,
        kind,
        session,
        tool=tool,
        tool_input=data.get("tool_input"),
        tool_response=response,
        failed=failed,
        transcript=transcript,
    )


@dataclass(frozen=True, slots=True)
class HookAnswer:
    """What a hook answers: the JSON object to print (``None``: print nothing) and the exit code.

    agentguard always exits 0 and says everything in JSON, the form both agents document for
    every decision; a command hook prints :attr:`stdout`, an HTTP hook returns :attr:`output`
    as the body.
    """

    output: dict[str, Any] | None = None
    exit_code: int = 0

    @property
    def stdout(self) -> str:
        """The text a command hook prints (empty when the answer is silence)."""
        if self.output is None:
            return ""
        import json  # noqa: PLC0415 - only an answer that says something pays for it

        text = json.dumps(self.output, ensure_ascii=False, separators=(",", ":"))
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate (from the event): written as its escape
            text = json.dumps(self.output, separators=(",", ":"))
        return text


#: The silent answer: proceed.
ALLOW = HookAnswer()


def deny_answer(event: HookEvent, reason: str) -> HookAnswer:
    """Refuse a tool call before it runs; ``reason`` is shown to the model."""
    return HookAnswer(
        {
            "hookSpecificOutput": {
                "hookEventName": event.name,
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }
        }
    )


def context_answer(event: HookEvent, text: str) -> HookAnswer:
    """Let the event proceed and add ``text`` to the model's context (the loop hint)."""
    return HookAnswer(
        {"hookSpecificOutput": {"hookEventName": event.name, "additionalContext": text}}
    )


def notice_answer(text: str) -> HookAnswer:
    """Let the event proceed and show ``text`` to the user (not to the model)."""
    return HookAnswer({"systemMessage": text})
