"""What every trace reader yields, and the small helpers they share."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "InputError",
    "Messages",
    "Record",
    "State",
    "call",
    "from_json",
    "message",
    "obj",
    "only_objects",
    "seq",
    "str_or_none",
    "text_of",
]


class InputError(Exception):
    """The input cannot be scanned; the message names the file and line."""


class Record(NamedTuple):
    """One message of one session, with what the trace says about it.

    Attributes:
        session: the session (agent run) it belongs to.
        message: the OpenAI-format message; ``None`` for a failed call that produced none.
        where: ``file:line``, for errors.
        tokens: tokens the trace reports for producing it (a model call's total), if any.
        tools: the tool definitions the trace declares for the session, if any.
        retry_tokens: tokens of an earlier attempt this one repeated (request logs).
        model: the model that produced it, when the trace says (for its price).
        prompt_tokens: the part of ``tokens`` that was prompt, when the trace says.
    """

    session: str
    message: Mapping[str, Any] | None
    where: str
    tokens: int | None = None
    tools: Sequence[Any] | None = None
    retry_tokens: int = 0
    model: str | None = None
    prompt_tokens: int | None = None


class Messages(NamedTuple):
    """A run of one session's messages that the trace says nothing more about (a transcript):
    read as a whole, not message by message.

    Attributes:
        session: the session they belong to.
        messages: the messages, as the trace holds them (each checked to be an object when it
            is read: :func:`message`).
        where: ``file:line``, for errors.
        tools: the tool definitions the trace declares for the session, if any.
        keep: whether an empty run still makes a session (an empty transcript object does, an
            empty array does not).
        whole: whether the run is the whole session (a transcript: the trace names no other
            session so, unless a line of another format reuses the name).
    """

    session: str
    messages: Sequence[Any]
    where: str
    tools: Sequence[Any] | None = None
    keep: bool = False
    whole: bool = False

    def records(self) -> Iterator[Record]:
        """The run as one :class:`Record` per message."""
        session, where, tools = self.session, self.where, self.tools
        if not self.messages and self.keep:
            yield Record(session, None, where, tools=tools)
        for m in self.messages:
            yield Record(session, message(m, where), where, tools=tools)


def message(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a message object, or an :class:`InputError`."""
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a message object, got {type(value).__name__}")
    return value


class State:
    """Per-file state of the readers: what each session has been fed so far."""

    def __init__(self) -> None:
        self.fed: dict[str, int] = {}  # request logs: history messages already fed
        self.last_tokens: dict[str, int] = {}  # request logs: the previous call's tokens
        self.response_id: dict[str, str] = {}  # OpenHands, Claude Code: response last fed
        self.names: dict[str, int] = {}  # transcripts: unique names
        self.session: dict[str, str] = {}  # JSONL formats: the file's current session
        self.model: dict[str, str] = {}  # the model a session runs on, when a line said
        self.held: dict[str, Record] = {}  # an assistant message still being assembled
        self.queued: dict[str, list[Record]] = {}  # results held behind it
        self.content: set[str] = set()  # OTLP: sessions whose chat spans carry messages
        self.failed: set[str] = set()  # OTLP: calls whose execute_tool span failed, unread

    def unique(self, name: str) -> str:
        """``name``, numbered when the file had it before (two runs of one task)."""
        n = self.names.get(name, 0) + 1
        self.names[name] = n
        return name if n == 1 else f"{name} ({n})"


def obj(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def seq(value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def from_json(value: Any) -> Any:
    """``value`` decoded when it is text (traces hold structures as JSON text: OTLP attributes,
    a logged response, SWE-agent's ``replay_config``), ``None`` for text that is no JSON;
    anything else as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def only_objects(values: Sequence[Any]) -> bool:
    """Whether ``values`` holds objects (plain dicts) alone, and one at least: one pass in C."""
    return {*map(type, values)} == _DICTS


_DICTS = frozenset({dict})


def str_or_none(value: Any) -> str | None:
    """``value`` as text; ``None`` for an empty or missing one."""
    return str(value) if value else None


def text_of(content: Any) -> str:
    """The text of a message content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("content"))
                out.append(text if isinstance(text, str) else text_of(text))
        return "\n".join(t for t in out if t)
    return "" if content is None else json.dumps(content, default=str)


def call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry; arguments not already text are JSON-encoded."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
    return {
        "id": str(call_id) if call_id is not None else None,
        "type": "function",
        "function": {"name": str(name or ""), "arguments": text},
    }
