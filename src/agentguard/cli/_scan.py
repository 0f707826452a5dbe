"""``agentguard scan FILE``: audit recorded agent traces.

Finds loops (every loop detector), malformed, hallucinated and text-embedded tool calls
(checked against the tools found in the trace), and the tokens burnt in loops and retries, per
session and in total. Reads OpenAI-format transcripts, request logs (LiteLLM) and OpenHands
event logs as a stream (see :mod:`agentguard.cli._trace`): memory grows with the sessions and
findings, not with the file. Output: a table, ``--json``, ``--html report.html``; ``--fail-on``
gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from agentguard.config import GuardConfig
from agentguard.exceptions import ConfigError
from agentguard.types import Severity

from . import _html
from ._audit import SessionAudit
from ._trace import InputError, Record, open_counted, records

_COLOURS = {
    Severity.WARNING: "yellow",
    Severity.CRITICAL: "bold red",
    Severity.BREAK: "bold white on red",
}
_PROGRESS_EVERY = 2048
#: Sessions shown in the readable output; a large trace is summed up below them.
_MAX_SHOWN = 50


def register(sub: Any) -> None:
    """Add the ``scan`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "scan",
        help="audit recorded agent traces: loops, bad tool calls, tokens burnt",
        description=(
            "Audit recorded agent traces (OpenAI chat JSONL/JSON, LiteLLM request logs, "
            "OpenHands event logs): loops, malformed / hallucinated / text-embedded tool calls, "
            "and the tokens burnt in loops and retries, per session and in total."
        ),
    )
    parser.add_argument("file", help="a .jsonl or .json trace")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--html", metavar="REPORT", help="also write a self-contained HTML report to REPORT"
    )
    parser.add_argument(
        "--fail-on",
        default="never",
        choices=["never", "warning", "critical", "break"],
        help="exit 1 when a finding reaches this severity (default: never)",
    )
    parser.add_argument("--config", help="a config file whose loop_detection section to use")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        config = GuardConfig.from_file(args.config) if args.config else GuardConfig.from_dict({})
    except ConfigError as exc:
        print(f"agentguard scan: {exc}", file=sys.stderr)
        return 2
    err = Console(stderr=True)
    progress = not args.no_progress and err.is_terminal
    try:
        audits = scan_file(args.file, config, timeline=bool(args.html), progress=progress)
    except InputError as exc:
        print(f"agentguard scan: {exc}", file=sys.stderr)
        return 2
    if args.html:
        try:
            Path(args.html).write_text(_html.render(args.file, audits), encoding="utf-8")
        except OSError as exc:
            print(f"agentguard scan: cannot write {args.html}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.json:
        # indented for people; a large report compact, which the C encoder writes much faster
        indent = 2 if len(audits) <= _MAX_SHOWN else None
        print(json.dumps(_report(args.file, audits), indent=indent))
    else:
        _print_tables(args.file, audits)
        if args.html:
            Console(highlight=False).print(f"[dim]HTML report: {args.html}[/]")
    if args.fail_on == "never":
        return 0
    bar = Severity.parse(args.fail_on)
    return 1 if any(i.severity >= bar for a in audits for i in a.issues) else 0


def scan_file(
    path: str, config: GuardConfig, *, timeline: bool = False, progress: bool = False
) -> list[SessionAudit]:
    """Audit every session in ``path``; raises :class:`InputError` on unusable input."""
    stream, counter = open_counted(path)
    audits: dict[str, SessionAudit] = {}
    with stream:
        found = records(stream, path)
        for record in _with_progress(found, counter, path) if progress else found:
            audit = audits.get(record.session)
            if audit is None:
                audit = SessionAudit(record.session, config, bytearray() if timeline else None)
                audits[record.session] = audit
            if record.tools:
                audit.declare(record.tools)
            if record.message is None:
                audit.retry_tokens += record.retry_tokens
                audit.tokens += record.tokens or 0
                continue
            audit.feed(record.message, record.tokens, record.retry_tokens)
    for audit in audits.values():
        audit.finish()
    return list(audits.values())


def _with_progress(items: Iterator[Record], counter: Any, path: str) -> Iterator[Record]:
    size = os.path.getsize(path)
    columns = (
        TextColumn("scanning {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(os.path.basename(path), total=size)
        for n, item in enumerate(items):
            if n % _PROGRESS_EVERY == 0:
                bar.update(task, completed=counter.count)
            yield item
        bar.update(task, completed=size)


def _report(path: str, audits: list[SessionAudit]) -> dict[str, Any]:
    counts = {str(s): 0 for s in (Severity.WARNING, Severity.CRITICAL, Severity.BREAK)}
    for a in audits:
        for i in a.issues:
            counts[str(i.severity)] += 1
    return {
        "file": path,
        "transcripts": [a.to_dict() for a in audits],
        "summary": {
            "transcripts": len(audits),
            "messages": sum(a.messages for a in audits),
            "findings": sum(counts.values()),
            **counts,
            "tokens": sum(a.tokens for a in audits),
            "tokens_estimated": any(a.estimated for a in audits),
            "loop_tokens": sum(a.loop_tokens for a in audits),
            "retry_tokens": sum(a.retry_tokens for a in audits),
        },
    }


def _print_tables(path: str, audits: list[SessionAudit]) -> None:
    console = Console(highlight=False)
    shown = 0
    for a in audits:
        if shown == _MAX_SHOWN:
            rest = len(audits) - _MAX_SHOWN
            console.print(
                f"[dim]… and {rest:,} more session(s): every one is in the --json and --html "
                "output.[/]"
            )
            break
        shown += 1
        n = a.messages
        tokens = (
            f"{a.tokens:,} tokens{' (est.)' if a.estimated else ''}, {a.loop_tokens:,} burnt "
            f"in loops, {a.retry_tokens:,} in retries"
        )
        if not a.issues:
            clean = "no loops found, no bad tool calls"
            console.print(f"[green]✓[/] [bold]{a.id}[/]: {n} messages, {clean}; {tokens}")
            continue
        noun = "finding" if len(a.issues) == 1 else "findings"
        table = Table(
            title=f"[bold]{a.id}[/] — {n} messages, {len(a.issues)} {noun}; {tokens}",
            title_justify="left",
        )
        table.add_column("msg", justify="right", style="dim")
        table.add_column("severity")
        table.add_column("detector")
        table.add_column("tool")
        table.add_column("count", justify="right")
        for i in a.issues:
            table.add_row(
                f"#{i.index}",
                f"[{_COLOURS[i.severity]}]{str(i.severity).upper()}[/]",
                i.detector,
                i.tool or "(text)",
                str(i.count),
            )
        console.print(table)
    s = _report(path, audits)["summary"]
    console.print(
        f"\nScanned {s['transcripts']} session(s), {s['messages']} messages in {path}: "
        f"{s['findings']} finding(s) ({s['warning']} warning, {s['critical']} critical, "
        f"{s['break']} break); {s['tokens']:,} tokens{' (est.)' if s['tokens_estimated'] else ''}, "
        f"{s['loop_tokens']:,} burnt in loops, {s['retry_tokens']:,} in retries"
    )
    if s["findings"]:
        console.print("[dim]What each finding would tell the model is in the --json output.[/]")
