"""``agentguard config check FILE`` and ``agentguard config show [FILE]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from agentguard._redact import redact_data
from agentguard.config import GuardConfig
from agentguard.exceptions import ConfigError


def register(sub: Any) -> None:
    """Add the ``config`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "config", help="check or show a configuration", description="Check or show a configuration."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="validate a config file; exit 1 with precise errors, warn on what will do nothing",
    )
    check.add_argument("file", help="a .yaml, .yml, .toml or .json file")
    check.add_argument(
        "--strict", action="store_true", help="exit 2 when there are warnings (for CI)"
    )
    check.set_defaults(handler=_check)
    show = actions.add_parser(
        "show", help="print the effective config (defaults and AGENTGUARD_* overrides applied)"
    )
    show.add_argument("file", nargs="?", help="a config file (optional)")
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    show.set_defaults(handler=_show)


def _check(args: argparse.Namespace) -> int:
    try:
        cfg = GuardConfig.from_file(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    notes = cfg.check()
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    print(f"{args.file}: ok" + (f" ({len(notes)} warning(s))" if notes else ""))
    return 2 if notes and args.strict else 0


def _show(args: argparse.Namespace) -> int:
    try:
        cfg = GuardConfig.from_file(args.file) if args.file else GuardConfig.from_dict({})
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    # what is printed is read by people and pasted into tickets: a URL's password or any
    # configured secret is shown as ***
    data = redact_data(cfg.to_dict())
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0
