"""Reading recorded agent traces as a stream of :class:`Record` values, whatever their format.

A file is read as a stream of JSON values (:mod:`._stream`: JSONL lines, a JSON array's items,
or one document), and each value is read by the reader of its format, told apart value by value
(a file may mix them) or forced with ``fmt``. Memory grows with the sessions, not the file.
The scan reads :func:`runs`: a transcript's messages (or consecutive lines of one session's
chat messages) come as one :class:`Messages` run, not a record per message.

Formats (:data:`FORMATS`): ``openai`` chat transcripts and messages, ``litellm`` request logs,
``openhands`` event logs (:mod:`._chat`); ``atif`` trajectories, ``claude-code`` sessions,
``codex`` rollouts, ``swe-agent`` / mini-swe-agent trajectories, ``tau-bench`` results
(:mod:`._agents`); ``otlp`` OpenTelemetry GenAI spans in OTLP JSON (:mod:`._otel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, Any

from . import _agents, _chat, _otel
from ._base import InputError, Messages, Record, State, message, only_objects
from ._stream import Batch, items, open_counted

__all__ = [
    "FORMATS",
    "InputError",
    "Messages",
    "Record",
    "detect",
    "message",
    "only_objects",
    "open_counted",
    "records",
    "runs",
]

Reader = Callable[[Any, str, State], Iterator[Record]]

#: format name -> reader of one JSON value
FORMATS: dict[str, Reader] = {
    "openai": _chat.openai,
    "litellm": _chat.request_log,
    "openhands": _chat.openhands,
    "atif": _agents.atif,
    "claude-code": _agents.claude_code,
    "codex": _agents.codex,
    "swe-agent": _agents.swe_agent,
    "tau-bench": _agents.tau_bench,
    "otlp": _otel.otlp,
}
_CLAUDE_KEYS = ("sessionId", "uuid", "leafUuid", "messageId")
#: keys by which :func:`detect` tells a format from a plain chat message (``role``)
_NOT_A_MESSAGE = frozenset(
    ("resourceSpans", "action", "observation", "payload", "steps", "traj", "history",
     "trajectory_format", "request", "messages")
)  # fmt: skip


#: chat-message lines held in one run at most (``runs(group=True)``)
_RUN = 256


def detect(item: Any) -> str | None:
    """The format of one JSON value of a trace, or ``None`` when it is none of them."""
    if isinstance(item, list):
        return "openai"
    if not isinstance(item, dict):
        return None
    if "role" in item and _NOT_A_MESSAGE.isdisjoint(item):
        return "openai"  # a chat message (a file of them): no other rule below can match
    if "resourceSpans" in item:
        return "otlp"
    if "action" in item or "observation" in item:
        return "openhands"
    kind = item.get("type")
    if isinstance(kind, str) and isinstance(item.get("payload"), dict) and "timestamp" in item:
        return "codex"
    if isinstance(item.get("steps"), list) and (
        str(item.get("schema_version", "")).startswith("ATIF")
        or isinstance(item.get("agent"), dict)
    ):
        return "atif"
    if isinstance(item.get("traj"), list):
        return "tau-bench"
    if isinstance(item.get("history"), list) or "trajectory_format" in item:
        return "swe-agent"
    if _chat.is_request_log(item):
        return "litellm"
    if isinstance(item.get("messages"), list):
        return "openai"
    if isinstance(kind, str) and "role" not in item and any(k in item for k in _CLAUDE_KEYS):
        return "claude-code"
    if "role" in item:
        return "openai"
    return None


def records(stream: IO[str], path: str, fmt: str | None = None) -> Iterator[Record]:
    """Every message of every session in ``stream``, in file order.

    Args:
        stream: the trace, as text.
        path: its name, for errors.
        fmt: a name of :data:`FORMATS` to read every value as; detected value by value when
            ``None``.

    Raises:
        InputError: the file is not UTF-8, not JSON, or holds a value of no known format.
    """
    for item in runs(stream, path, fmt):
        if isinstance(item, Messages):
            yield from item.records()
        else:
            yield item


def runs(
    stream: IO[str], path: str, fmt: str | None = None, *, group: bool = False
) -> Iterator[Record | Messages]:
    """As :func:`records`, but a transcript's messages come as one :class:`Messages` run (read
    as a whole, without a record per message); with ``group``, so do consecutive lines of
    chat messages of one session (the run's ``where`` is its first line).

    Raises:
        InputError: as :func:`records`; and, with ``fmt``, a file whose values it reads no run
            out of (the wrong format forced: every reader skips what is not its own).
    """
    if fmt is None:
        return _runs(items(stream, path), path, None, group)
    return _forced(stream, path, fmt, group)


def _forced(stream: IO[str], path: str, fmt: str, group: bool) -> Iterator[Record | Messages]:
    """:func:`runs` with every value read as ``fmt``."""
    first: list[Any] = []  # the file's first value, for the error (whether it has one)

    def counted() -> Iterator[tuple[int, Any]]:
        for value in items(stream, path):
            if not first:
                first.append(value[1])
            yield value

    read = False
    for run in _runs(counted(), path, fmt, group):
        read = True
        yield run
    if first and not read:
        found = detect(first[0])
        looks = f"it looks like {found}" if found else "its format is not one scan reads"
        raise InputError(
            f"{path}: --format {fmt} reads nothing in it ({looks}); "
            "leave out --format to detect the format"
        )


def _runs(
    values: Iterator[tuple[int, Any]], path: str, fmt: str | None, group: bool
) -> Iterator[Record | Messages]:
    """:func:`runs` of the file's ``values`` (numbered by line)."""
    state = State()
    forced = FORMATS[fmt] if fmt is not None else None
    held: list[Any] = []  # with group: chat messages of one session not yet yielded
    held_session = held_where = ""
    try:
        for line_no, item in values:
            if (
                forced is None
                and item.__class__ is dict
                and "role" in item
                and _NOT_A_MESSAGE.isdisjoint(item)
            ):  # a chat message, as detect() finds first: read without a reader generator
                if not group:
                    yield _chat.message_record(item, f"{path}:{line_no}")
                    continue
                # (:func:`_chat.session_of`, inlined: it runs per line)
                session = item.get("session") or item.get("session_id") or "default"
                if session.__class__ is not str:
                    session = str(session)
                if session != held_session or not held or len(held) >= _RUN:  # a new run
                    if held:
                        yield Messages(held_session, held, held_where)
                        held = []
                    # a run's place is its first line's (made once per run)
                    held_session, held_where = session, f"{path}:{line_no}"
                held.append(item)
                continue
            where = f"{path}:{line_no}"
            if held:
                yield Messages(held_session, held, held_where)
                held = []
            if isinstance(item, Batch):  # the messages of a JSON array file: one transcript
                if forced is None or forced is _chat.openai:  # (another format skips them)
                    yield Messages("transcript", item, where)
                continue
            reader = forced or FORMATS.get(detect(item) or "")
            if reader is _chat.openai:
                run = _chat.transcript(item, where, state)
                if run is not None:
                    yield run
                    continue
                if item.__class__ is dict and "role" in item:
                    yield _chat.message_record(item, where)  # one message: no reader generator
                    continue
            if reader is None or not isinstance(item, (dict, list)):
                raise InputError(f"{where}: {_unknown(item)}")
            if isinstance(item, list) and reader is not _chat.openai:
                raise InputError(f"{where}: expected a JSON object for format {fmt}, got an array")
            yield from reader(item, where, state)
        if held:
            yield Messages(held_session, held, held_where)
        yield from _agents.flush(state)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _unknown(item: Any) -> str:
    if not isinstance(item, (dict, list)):
        return f"expected a JSON object or array, got {type(item).__name__}"
    return (
        "expected a trace of a known format: a transcript (array of messages or object with "
        "'messages'), a message (object with 'role'), a request log (with 'messages' and "
        "'response'), an OpenHands event, an ATIF trajectory, a Claude Code or Codex session "
        "line, a SWE-agent or tau-bench trajectory, or OTLP JSON spans (see --format)"
    )
