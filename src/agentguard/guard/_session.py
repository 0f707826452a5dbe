"""Which session (agent run) a model call belongs to.

In order: an explicit id (an argument), the innermost :func:`session` context, the
``x-agentguard-session`` request header, and otherwise a stable fingerprint of the
conversation's opening messages (its system messages and first user message), so that a guard
works with no set-up at all: every call of one agent run starts with the same messages.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from agentguard._fingerprint import fingerprint
from agentguard.types import Message

__all__ = ["SESSION_HEADER", "SessionSource", "current_session", "resolve_session", "session"]

#: The request header that names a session.
SESSION_HEADER = "x-agentguard-session"

SessionSource = Literal["explicit", "context", "header", "fingerprint"]

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
    headers: Mapping[str, Any] | None = None,
) -> tuple[str, SessionSource]:
    """The session id of a call, and where it came from."""
    if explicit:
        return explicit, "explicit"
    ctx = _current.get()
    if ctx:
        return ctx, "context"
    if headers:
        for key, value in headers.items():
            if key.lower() == SESSION_HEADER and isinstance(value, str) and value:
                return value, "header"
    return "auto-" + fingerprint(_opening(messages))[:16], "fingerprint"


def _opening(messages: Sequence[Message]) -> list[Any]:
    """The system messages before the first user message, and that user message."""
    opening: list[Any] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            opening.append([role, message.get("content")])
        elif role == "user":
            opening.append(["user", message.get("content")])
            break
    return opening
