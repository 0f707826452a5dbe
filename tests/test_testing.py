"""The shipped test kit: FakeClock."""

from __future__ import annotations

import pytest

from agentguard.testing import FakeClock


def test_fake_clock_moves_only_when_told() -> None:
    """The clock returns the same time until advanced."""
    clock = FakeClock(100.0)
    assert clock() == clock.time() == 100.0
    assert clock.advance(2.5) == 102.5
    assert clock() == 102.5


def test_fake_clock_refuses_to_go_backwards() -> None:
    """Negative advances are a bug in the test."""
    with pytest.raises(ValueError, match="backwards"):
        FakeClock().advance(-1)


def test_sleep_advances_and_records() -> None:
    """sleep() never waits: it advances the clock and records the delay."""
    clock = FakeClock(0.0)
    clock.sleep(1.5)
    clock.sleep(0.5)
    assert clock() == 2.0
    assert clock.sleeps == [1.5, 0.5]


@pytest.mark.anyio
async def test_asleep_advances_and_records() -> None:
    """The async sleep behaves like the sync one."""
    clock = FakeClock(0.0)
    await clock.asleep(3)
    assert clock() == 3.0
    assert clock.sleeps == [3]
