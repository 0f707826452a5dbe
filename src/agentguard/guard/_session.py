"""Which session (agent run) a model call belongs to.

The most specific source wins: an explicit id (an argument), then the
``x-agentguard-session`` header of the request, then the innermost :func:`session` block, and
otherwise a stable fingerprint of the conversation's opening messages (its system messages and
first user message), so that a guard works with no set-up at all: every call of one agent run
starts with the same messages. :func:`resolve_session` is the one place that decides; ``Guard``,
``AsyncGuard`` and every adapter go through it.
"""

from __future__ import annotations

import collections
import contextvars
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from agentguard._fingerprint import fingerprint
from agentguard.transport import SCOPE, SESSION_HEADER, ModelRequest, split_session_header
from agentguard.types import Message

__all__ = [
    "SESSION_HEADER",
    "CallRuns",
    "SessionSource",
    "current_session",
    "opening_key",
    "resolve_session",
    "scope_of",
    "session",
]

SessionSource = Literal["explicit", "header", "context", "fingerprint"]

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentguard_session", default=None
)


@contextmanager
def session(session_id: str) -> Iterator[str]:
    """Attribute every guarded call inside the block to ``session_id``.

    Works across threads started inside the block only if they copy the context; works across
    ``await`` points and asyncio tasks (each task inherits the context it was created in).

    Raises:
        ValueError: ``session_id`` is empty.
    """
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("a session id must be a non-empty string")
    token = _current.set(session_id)
    try:
        yield session_id
    finally:
        _current.reset(token)


def current_session() -> str | None:
    """The session id set by the innermost :func:`session` block, or ``None``."""
    return _current.get()


def resolve_session(
    messages: Sequence[Message],
    *,
    explicit: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[str, SessionSource]:
    """The session id of a call, and where it came from.

    Args:
        messages: the request's messages (their opening makes the fingerprint).
        explicit: the id given as an argument (``session=``), if any.
        headers: the request's headers; :data:`SESSION_HEADER` names a session.

    Returns:
        The id, and its source: ``explicit`` > ``header`` > ``context`` (an :func:`session`
        block) > ``fingerprint``.
    """
    if explicit:
        return explicit, "explicit"
    if headers:
        header, _ = split_session_header(headers)
        if header:
            return header, "header"
    ctx = _current.get()
    if ctx:
        return ctx, "context"
    return "auto-" + opening_key(messages)[:16], "fingerprint"


def opening_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """A fingerprint of a conversation's opening: its system messages and first user message."""
    opening: list[Any] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            opening.append([role, message.get("content")])
        elif role == "user":
            opening.append(["user", message.get("content")])
            break
    return fingerprint(opening)


def scope_of(request: ModelRequest) -> str:
    """Who a request comes from, as far as the request says: the scope an adapter set (a proxy
    sets the caller's key) and the body's ``user`` / ``safety_identifier``. Conversations found
    without a named session are only ever matched within one scope."""
    parts = [request.extensions.get(SCOPE), request.params.get("user")]
    parts.append(request.params.get("safety_identifier"))
    if not any(isinstance(p, str) and p for p in parts):
        return ""
    return fingerprint([p if isinstance(p, str) else "" for p in parts])[:16]


class CallRuns:
    """The session (agent run) of each tool call the guard handed back, by the call's id: the
    run a framework's tool call belongs to, for a ToolGuard keeping loop state per run.

    An id is not unique (a deterministic local model says ``call_0`` in every run): the latest
    answer that gave it wins, the one whose run is about to execute it. The least recently
    given ids are forgotten past ``max_calls``.
    """

    def __init__(self, max_calls: int = 16_384) -> None:
        self._runs: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._max = max_calls
        self._lock = threading.Lock()  # a sync and an async guard may share one

    def answered(self, message: Mapping[str, Any], session: str) -> None:
        """``message`` (an answer in chat form) was handed back in ``session``."""
        for call in message.get("tool_calls") or ():
            call_id = call.get("id") if isinstance(call, Mapping) else None
            if not isinstance(call_id, str) or not call_id:
                continue
            with self._lock:
                self._runs[call_id] = session
                self._runs.move_to_end(call_id)
                if len(self._runs) > self._max:
                    self._runs.popitem(last=False)

    def get(self, call_id: str) -> str | None:
        """The session of the latest answer that gave ``call_id`` (``None``: none remembered)."""
        with self._lock:
            return self._runs.get(call_id)
