"""The ``agentguard`` command line: ``demo``, ``scan``, ``config``, ``serve`` and ``hook``.

Each subcommand lives in its own module with ``register(subparsers)``; it uses only the public
API of the library.

Ctrl-C ends any subcommand quietly with 130, whenever it comes: :func:`main` makes every
import of the command line (argparse included) under its handler, and this module imports
nothing but ``sys`` at its top level, as the console script imports it before calling
:func:`main`.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # (not typing's: typing is imported under main's handler, not before it)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["main"]

#: subcommand -> its module; only the one being run is imported (start-up time is throughput
#: for ``scan`` over many small files).
_COMMANDS = {
    "demo": ".demo._command",
    "scan": "._scan",
    "config": "._config",
    "serve": "._serve",
    "hook": "._hook",
}
#: the exit code of a command ended by Ctrl-C, as a shell reports a process ended by SIGINT
_INTERRUPTED = 130


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every subcommand (or just ``only``) registered."""
    import argparse  # noqa: PLC0415 - under main's Ctrl-C handler
    import importlib  # noqa: PLC0415

    from agentguard import __version__  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="agentguard",
        description="A reliability layer for LLM agents.",
    )
    parser.add_argument("--version", action="version", version=f"agentguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module, __name__).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (130 when Ctrl-C ended it)."""
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        # the command hook runs on every tool call of a coding agent: its plain form takes its
        # fast path at once, without argparse (about a third of the hook's own start-up)
        if args[:1] == ["hook"]:
            from ._hook import fast  # noqa: PLC0415 - imports no more than the hook needs

            code = fast(args[1:])
            if code is not None:
                return code
        # pydantic_core's Rust module imports datetime through the C API and panics (pyo3's
        # PanicException, not a KeyboardInterrupt) when Ctrl-C interrupts that import: imported
        # here first, where Ctrl-C interrupts it as any import
        import datetime  # noqa: F401, PLC0415

        return _main(args)
    except KeyboardInterrupt:
        return _INTERRUPTED


def _main(args_list: list[str]) -> int:
    first = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(first if first in _COMMANDS else None)
    args = parser.parse_args(args_list)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    code: int = args.handler(args)
    return code
