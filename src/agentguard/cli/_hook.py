"""``agentguard hook claude-code|codex``: the command hook of a coding agent.

Reads one hook event (JSON) on stdin and prints the answer in the agent's format (see
:mod:`agentguard.hooks`). Start-up is the agent's latency on every tool call, so this module and
the hook's fast path import only the standard library (see ``agentguard.hooks._client``).
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: the fast path imports neither typing nor argparse)
if TYPE_CHECKING:
    import argparse
    from typing import Any

_AGENTS = ("claude-code", "codex")  # agentguard.hooks.AGENTS, without importing the guard


def fast(args: list[str]) -> int | None:
    """The hook's plain form (``agentguard hook claude-code``, no option): run at once, as
    :func:`_run` would with the defaults; ``None`` for any other form (argparse's to read)."""
    if len(args) != 1 or args[0] not in _AGENTS:
        return None
    from agentguard.hooks._client import run  # noqa: PLC0415

    return run(args[0])


def register(sub: Any) -> None:
    """Add the ``hook`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "hook",
        help="command hook for Claude Code / Codex CLI: loop and budget guard per session",
        description=(
            "Answer one Claude Code or Codex CLI hook event (PreToolUse, PostToolUse, "
            "PostToolUseFailure, UserPromptSubmit, Stop) read as JSON on stdin, with the "
            "session's loop and token-budget state kept in a shared store. Prints nothing when "
            "the agent may proceed; always exits 0 (a guard fault lets the agent proceed)."
        ),
    )
    parser.add_argument("agent", choices=_AGENTS, help="the coding agent calling the hook")
    parser.add_argument(
        "--config", metavar="FILE", help="configuration file (default: $AGENTGUARD_CONFIG)"
    )
    parser.add_argument(
        "--store",
        metavar="PATH_OR_URL",
        help="shared state: a SQLite file or a redis:// URL (default: the configuration's "
        "storage, else ~/.local/state/agentguard/hooks.sqlite)",
    )
    parser.add_argument(
        "--no-daemon",
        action="store_true",
        help="judge in this process instead of the hook daemon (slower start-up)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from agentguard.hooks._client import run  # noqa: PLC0415 - imported for this command only

    return run(args.agent, config=args.config, store=args.store, daemon=not args.no_daemon)
