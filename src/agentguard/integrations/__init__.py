"""Adapters: thin translations between agentguard's core and one SDK or framework each.

Each adapter imports its SDK lazily and names the extra to install when it is missing.
"""

from __future__ import annotations

__all__: list[str] = []
