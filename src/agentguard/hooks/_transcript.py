"""Token use read from a coding agent's session transcript, incrementally.

Both agents append one JSON object per line to the transcript file a hook event names:

- Claude Code writes each assistant message with the API's ``message.usage``
  (``input_tokens``, ``cache_creation_input_tokens``, ``cache_read_input_tokens``,
  ``output_tokens``), once per content block, all under one ``message.id``;
- the Codex CLI writes ``event_msg`` lines of type ``token_count`` whose
  ``info.total_token_usage`` is the session's running total.

A reader keeps a cursor (file, byte offset of the first line not read, the running total seen,
what the latest messages counted) in the store, so each hook reads only what was appended since
the last one: a session's transcript is read once in all, however many hooks run. Each usage
found gets an event id that is the same whoever reads it (the message id, or the line's offset),
so the ledger counts it once even when two hook processes read the same lines.

A Claude Code message's lines are written one by one, the later ones with the larger
``output_tokens``, and a hook may read between them. So a message counts its first line's usage
under its id, and each later line only what it adds to the largest usage of the lines before
it, under an id naming that usage (``msg_01@15733/8``): every reader finds the same ids and
amounts, whichever lines it read before (the cursor carries what the message counted so far),
and the message counts its largest usage once in all.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agentguard.types import Usage

__all__ = ["Cursor", "UsageEntry", "read_usage"]

_CHUNK = 1 << 20
#: Bytes one hook reads at most (a long session's first hook reads the rest later).
_READ_BUDGET = 256 << 20
#: Longer lines are passed over unread (a tool result or a written file, never a usage line).
_MAX_LINE = 64 << 20
#: Messages whose counts a cursor keeps. A message's lines are consecutive, so one is enough to
#: continue a message past a read's end; the rest in case concurrent messages interleave.
_COUNTED = 8


@dataclass(frozen=True, slots=True)
class UsageEntry:
    """Tokens of one model call found in a transcript (or what a later line of its message adds).

    Attributes:
        event_id: the same for every reader (idempotency key for the ledger).
        usage: prompt (cached and uncached input) and completion tokens.
        model: the model named beside it, if any.
        message: the message it counts for, when later lines may carry a larger usage of it
            (a Claude Code message, one line per content block).
    """

    event_id: str
    usage: Usage
    model: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far a transcript has been read.

    Attributes:
        path: the transcript file.
        offset: byte offset of the first line not read yet.
        total: the last running total seen (Codex), to turn totals into per-call usage.
        counted: the latest messages read (at most :data:`_COUNTED`, the most recent last),
            each with the largest prompt and completion tokens counted for it: a message
            continued after ``offset`` counts only what its later lines add.
    """

    path: str
    offset: int = 0
    total: int = 0
    counted: tuple[tuple[str, int, int], ...] = ()

    def dumps(self) -> str:
        """The cursor as a store record."""
        return json.dumps([self.path, self.offset, self.total, self.counted])

    @classmethod
    def loads(cls, text: str | None, path: str) -> Cursor:
        """The cursor in a store record, or a new one when it is missing, damaged or for another
        file."""
        try:
            # a record written before ``counted`` existed has three items
            saved, offset, total, *rest = json.loads(text) if text else (None, 0, 0)
        except (ValueError, TypeError):
            return cls(path)
        counted = rest[0] if rest else []
        if (
            saved != path
            or len(rest) > 1
            or not isinstance(offset, int)
            or not isinstance(total, int)
            or not isinstance(counted, list)
            or not all(_counted(item) for item in counted)
        ):
            return cls(path)  # read again from the start: the same ids and amounts, counted once
        counted = [tuple(item) for item in counted[-_COUNTED:]]
        return cls(path, max(offset, 0), max(total, 0), tuple(counted))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _counted(item: Any) -> bool:
    """Whether ``item`` is a valid ``[message, prompt, completion]`` of a stored cursor."""
    return (
        isinstance(item, list)
        and len(item) == 3
        and isinstance(item[0], str)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in item[1:])
    )


def _lines(
    path: str, offset: int, budget: int = _READ_BUDGET
) -> Iterator[tuple[int, int, bytes | None]]:
    """``(offset, next offset, line)`` for each complete line from ``offset``; a partial last
    line waits for the next hook.

    Reads at most ``budget`` bytes (the rest waits too); of a line longer than
    :data:`_MAX_LINE` nothing is kept (``None``: only the offset moves; what follows it fails
    to parse and is skipped as well); anything but a regular file reads as empty (a transcript
    path could name a device that never ends).
    """
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return
        if info.st_size < offset:
            offset = 0  # the file was replaced: read it again
        f.seek(offset)
        pending = b""
        start = offset
        while budget > 0 and (chunk := f.read(min(_CHUNK, budget))):
            budget -= len(chunk)
            pending += chunk
            begin = 0
            while (end := pending.find(b"\n", begin)) >= 0:
                yield start + begin, start + end + 1, pending[begin:end]
                begin = end + 1
            start += begin
            pending = pending[begin:]
            if len(pending) > _MAX_LINE:  # no usage line is this long: pass over it
                start += len(pending)
                pending = b""
                yield start, start, None


def _claude(line: bytes, at: int, total: int) -> tuple[UsageEntry | None, int]:
    if b'"usage"' not in line:  # tool results, user turns: not decoded at all
        return None, total
    data = json.loads(line)
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("usage"), dict):
        return None, total
    usage = message["usage"]
    prompt = (
        _int(usage.get("input_tokens"))
        + _int(usage.get("cache_creation_input_tokens"))
        + _int(usage.get("cache_read_input_tokens"))
    )
    model = message.get("model") if isinstance(message.get("model"), str) else None
    found = Usage(prompt, _int(usage.get("output_tokens")))
    if isinstance(message.get("id"), str):
        return UsageEntry(message["id"], found, model, message["id"]), total
    return UsageEntry(f"line-{at}", found, model), total


def _codex(line: bytes, at: int, total: int) -> tuple[UsageEntry | None, int]:
    if b'"token_count"' not in line:
        return None, total
    data = json.loads(line)
    payload = data.get("payload") if isinstance(data, dict) else None
    info = payload.get("info") if isinstance(payload, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("total_token_usage"), dict):
        return None, total
    totals = info["total_token_usage"]
    now_total = _int(totals.get("total_tokens")) or (
        _int(totals.get("input_tokens")) + _int(totals.get("output_tokens"))
    )
    if now_total <= total:  # a repeated report (rate limits only): no new call
        return None, total
    last = info.get("last_token_usage")
    delta = now_total - total
    completion = min(_int(last.get("output_tokens")), delta) if isinstance(last, dict) else 0
    return UsageEntry(f"line-{at}", Usage(delta - completion, completion)), now_total


_READERS: dict[str, Callable[[bytes, int, int], tuple[UsageEntry | None, int]]] = {
    "claude-code": _claude,
    "codex": _codex,
}


def read_usage(agent: str, cursor: Cursor) -> tuple[list[UsageEntry], Cursor]:
    """The usage appended to ``cursor.path`` since ``cursor``, and the cursor after it.

    Lines that are not valid JSON are skipped. A Claude Code message (one line per content
    block) counts its largest count of each kind: its first line's usage under its id, then
    what each later line adds, under an id naming the usage counted before it (see the module
    documentation).

    Raises:
        OSError: the file cannot be read.
    """
    reader = _READERS[agent]
    found: list[UsageEntry] = []
    counted = {message: (prompt, completion) for message, prompt, completion in cursor.counted}
    total, offset = cursor.total, cursor.offset
    for at, offset, line in _lines(cursor.path, cursor.offset):  # noqa: B007 - offset: the cursor
        if line is None:
            continue
        try:
            entry, total = reader(line, at, total)
        except (ValueError, RecursionError):
            continue
        if entry is None:
            continue
        message = entry.message
        if message is None:
            found.append(entry)
            continue
        prompt, completion = entry.usage.prompt_tokens, entry.usage.completion_tokens
        before = counted.pop(message, None)
        if before is None:
            counted[message] = (prompt, completion)
            found.append(entry)
            continue
        now = counted[message] = (max(before[0], prompt), max(before[1], completion))
        if now != before:
            usage = Usage(now[0] - before[0], now[1] - before[1])
            event_id = f"{message}@{before[0]}/{before[1]}"
            found.append(UsageEntry(event_id, usage, entry.model, message))
    kept = tuple((m, p, c) for m, (p, c) in list(counted.items())[-_COUNTED:])
    return found, Cursor(cursor.path, offset, total, kept)
