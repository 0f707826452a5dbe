"""Shared fixtures."""

from __future__ import annotations

import pytest

from agentguard.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock; advance it by hand."""
    return FakeClock()


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio."""
    return "asyncio"
