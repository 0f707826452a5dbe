"""The ``agentguard`` command line: ``demo``, ``scan`` and ``config``.

Each subcommand lives in its own module with ``register(subparsers)``; it uses only the public
API of the library.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agentguard import __version__

from . import _config, _demo, _scan

__all__ = ["main"]

_COMMANDS = (_demo, _scan, _config)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="agentguard",
        description="A reliability layer for LLM agents.",
    )
    parser.add_argument("--version", action="version", version=f"agentguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in _COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    code: int = args.handler(args)
    return code
