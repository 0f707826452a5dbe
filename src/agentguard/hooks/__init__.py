"""Hooks for coding agents: loop and budget guards for Claude Code and the Codex CLI.

Both agents call a hook before and after every tool use. :class:`HookGuard` answers those events
with the session's state — the loop detector's view of every call and result so far, the tokens
the session's transcript shows spent — kept in a store shared by the hook processes:

- ``agentguard hook claude-code`` / ``agentguard hook codex``: the command hooks (the event on
  stdin, the answer on stdout);
- ``POST /hooks/claude-code`` / ``POST /hooks/codex`` on ``agentguard serve``: the same answers
  for HTTP hooks.

See ``docs/integrations/coding-agents.md`` for the settings of each agent.

Importing this package loads nothing heavy: the command hook's fast path (a thin client of the
hook daemon) needs only the standard library; :class:`HookGuard` is loaded on first use.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # (not typing's: the command hook's fast path does without typing)
if TYPE_CHECKING:
    from typing import Any

    from ._guard import HookGuard as HookGuard
    from ._guard import open_guard as open_guard
    from ._protocol import AGENTS as AGENTS
    from ._protocol import HookAnswer as HookAnswer
    from ._protocol import HookEvent as HookEvent
    from ._protocol import parse_event as parse_event

__all__ = ["AGENTS", "HookAnswer", "HookEvent", "HookGuard", "open_guard", "parse_event"]

_WHERE = {
    "AGENTS": "._protocol",
    "HookAnswer": "._protocol",
    "HookEvent": "._protocol",
    "parse_event": "._protocol",
    "HookGuard": "._guard",
    "open_guard": "._guard",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
