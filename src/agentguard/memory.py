"""The memory-pressure probe's former module name: :mod:`agentguard.pressure` is its home now.

Kept so that ``from agentguard.memory import MemoryPressureProbe`` (and the level and reading
types) goes on working; new code imports from ``agentguard`` or ``agentguard.pressure``.
"""

from __future__ import annotations

from agentguard.pressure import MemoryPressureProbe, PressureLevel, PressureReading

__all__ = ["MemoryPressureProbe", "PressureLevel", "PressureReading"]
