"""Session resolution: explicit, header, context, fingerprint."""

from __future__ import annotations

import asyncio

import pytest

from agentguard.guard._session import current_session, resolve_session, session

CONVO = [
    {"role": "system", "content": "You are a build bot."},
    {"role": "user", "content": "Fix the failing test."},
]


def test_precedence_explicit_header_context_fingerprint() -> None:
    """The most specific source wins: explicit, then the header, then the context block."""
    headers = {"X-AgentGuard-Session": "from-header"}
    with session("from-context"):
        assert resolve_session(CONVO, explicit="given", headers=headers) == ("given", "explicit")
        assert resolve_session(CONVO, headers=headers) == ("from-header", "header")
        assert resolve_session(CONVO) == ("from-context", "context")
    assert resolve_session(CONVO, headers=headers) == ("from-header", "header")
    sid, source = resolve_session(CONVO)
    assert source == "fingerprint"
    assert sid.startswith("auto-")


def test_fingerprint_is_stable_as_the_conversation_grows() -> None:
    """Later turns of the same run map to the same session."""
    longer = [
        *CONVO,
        {"role": "assistant", "content": "on it"},
        {"role": "user", "content": "go on"},
    ]
    assert resolve_session(CONVO)[0] == resolve_session(longer)[0]


def test_different_tasks_get_different_sessions() -> None:
    """Another first user message is another session."""
    other = [CONVO[0], {"role": "user", "content": "Write the release notes."}]
    assert resolve_session(CONVO)[0] != resolve_session(other)[0]


def test_context_nests_and_restores() -> None:
    """Nested blocks override and restore the outer session."""
    assert current_session() is None
    with session("outer"):
        with session("inner"):
            assert current_session() == "inner"
        assert current_session() == "outer"
    assert current_session() is None


def test_empty_session_id_is_rejected() -> None:
    """An empty id is a caller bug."""
    with pytest.raises(ValueError, match="non-empty"), session(""):
        pass


def test_context_follows_asyncio_tasks() -> None:
    """Tasks created inside a session block see that session."""

    async def main() -> list[str | None]:
        async def probe() -> str | None:
            await asyncio.sleep(0)
            return current_session()

        with session("a"):
            task_a = asyncio.create_task(probe())
        with session("b"):
            task_b = asyncio.create_task(probe())
        return [await task_a, await task_b]

    assert asyncio.run(main()) == ["a", "b"]
