"""What the guard remembers of a session's transcript, so each call judges only what is new.

A session's :class:`SessionState` holds its loop detector and a bounded memory of the messages
it has seen (by :func:`message_key`); :func:`new_messages` finds the messages of a request that
the session has not seen, and the prompt-token estimate of the whole history, in O(new
messages) for the usual append-only conversation.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentguard._fingerprint import fingerprint, fingerprint_bytes
from agentguard.budget import estimate_tokens
from agentguard.budget._estimate import REPLY_PRIMING
from agentguard.loops import LoopDetector
from agentguard.transport import ORIGINAL
from agentguard.types import Tier

__all__ = ["New", "SessionState", "message_key", "message_tokens", "new_messages"]


class SessionState:
    """What the guard remembers about one session: its loop detector and what it has seen."""

    __slots__ = ("detector", "forced_tier", "last", "marks", "memory")

    def __init__(self, detector: LoopDetector, memory: int) -> None:
        self.detector = detector
        #: message key -> (its index in the conversation, tokens of the conversation up to it),
        #: least recently seen first
        self.marks: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()
        self.memory = memory
        self.forced_tier: Tier | None = None
        #: the latest message remembered: (index, key, tokens up to it)
        self.last: tuple[int, str, int] | None = None

    def remember(self, key: str, index: int, tokens: int) -> None:
        self.last = (index, key, tokens)
        self.marks[key] = (index, tokens)
        self.marks.move_to_end(key)
        if len(self.marks) > self.memory:
            self.marks.popitem(last=False)

    def recall(self, key: str) -> tuple[int, int] | None:
        """The mark of a message seen before (kept fresh: it is in use), or ``None``."""
        mark = self.marks.get(key)
        if mark is not None:
            self.marks.move_to_end(key)
        return mark


#: A message not seen before: its index, key, the history's tokens up to it, the message.
New = tuple[int, str, int, Mapping[str, Any]]


def message_key(message: Mapping[str, Any]) -> str:
    """What identifies a message across calls: role, text, calls, call id — not the SDK's extra
    null fields (``refusal``, ``audio`` ...) an agent adds when it echoes an answer back, nor
    the spacing of re-serialised call arguments."""
    role, content = message.get("role"), message.get("content") or ""
    call_id, item = message.get("tool_call_id"), message.get(ORIGINAL)
    calls = message.get("tool_calls") or ()
    if (
        isinstance(role, str)
        and isinstance(content, str)
        and (call_id is None or isinstance(call_id, str))
        and item is None
    ):
        # The usual message, encoded without a JSON pass: every field length-prefixed, so no
        # two different messages share an encoding.
        parts = [role, content, call_id or ""]
        for call in calls:
            fn = call.get("function") or {}
            parts += [
                str(call.get("id")),
                str(fn.get("name")),
                fingerprint(fn.get("arguments") or ""),
            ]
        text = "".join(f"{len(part)}:{part}" for part in parts)
        return fingerprint_bytes(text.encode("utf-8", "surrogatepass"))
    described = [
        role,
        content,
        call_id,
        [
            (c.get("id"), fn.get("name"), fingerprint(fn.get("arguments") or ""))
            for c in calls
            for fn in (c.get("function") or {},)
        ],
        item,
    ]
    return "j" + fingerprint_bytes(
        json.dumps(described, default=str).encode("utf-8", "surrogatepass")
    )


def message_tokens(message: Mapping[str, Any]) -> int:
    return estimate_tokens([message]) - REPLY_PRIMING


def new_messages(
    state: SessionState, messages: Sequence[Mapping[str, Any]]
) -> tuple[list[New], int]:
    """The messages this session has not seen, and the token estimate of all of them.

    An append-only conversation (the usual case) carries the last message the session saw — the
    previous answer — at the index it had: everything after it is new, even a message repeating
    an older one word for word (a poll returning the same result is a loop signal, not something
    seen), and the tokens up to it are known. Both the loop check and the estimate then cost
    O(new messages). An edited or trimmed history falls back to walking back to the last message
    seen anywhere — at most as far as the session remembers: older messages are taken as seen,
    never judged twice — and to an estimate over the whole history.
    """
    start = len(messages)
    base: int | None = None
    keys: list[str] = []
    last = state.last
    if last is not None and last[0] < start and message_key(messages[last[0]]) == last[1]:
        start, base = last[0] + 1, last[2]
        keys = [message_key(m) for m in reversed(messages[start:])]
    else:
        floor = max(0, start - state.memory)
        while start > floor:
            key = message_key(messages[start - 1])
            mark = state.recall(key)
            if mark is not None:
                if mark[0] == start - 1:  # e.g. the same request again: its tokens are known
                    base = mark[1]
                break
            keys.append(key)
            start -= 1
    tokens = base if base is not None else sum(message_tokens(m) for m in messages[:start])
    new: list[New] = []
    for offset, key in enumerate(reversed(keys)):
        message = messages[start + offset]
        tokens += message_tokens(message)
        new.append((start + offset, key, tokens, message))
    return new, tokens
