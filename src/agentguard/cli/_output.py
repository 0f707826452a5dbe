"""``agentguard scan``'s readable tables and its JSON report."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from math import fsum
from typing import TYPE_CHECKING, Any

from agentguard.types import Severity

from ._audit import SessionAudit
from ._findings import SEVERITY_NAMES, ToolStats

if TYPE_CHECKING:  # rich is imported for the tables only: --json starts faster without it
    from rich.console import Console

__all__ = ["print_json", "print_tables", "report", "tool_totals"]

_COLOURS = {
    Severity.WARNING: "yellow",
    Severity.CRITICAL: "bold red",
    Severity.BREAK: "bold white on red",
}
#: Sessions shown in the readable output; a large trace is summed up below them.
_MAX_SHOWN = 50
_MAX_TOOLS = 20


def _console() -> Console:
    """A console whose closed pipe is the scan's to handle (rich would exit with 1 itself)."""
    from rich.console import Console  # noqa: PLC0415 - the tables only

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return _Console(highlight=False)


def tool_totals(audits: Sequence[SessionAudit]) -> dict[str, ToolStats]:
    """Per tool, its tallies summed over every session."""
    totals: dict[str, ToolStats] = {}
    for a in audits:
        for name, stats in a.tools.items():
            totals.setdefault(name, ToolStats()).add(stats)
    return totals


def report(path: str, audits: Sequence[SessionAudit]) -> dict[str, Any]:
    """The JSON report: every session, a summary, and the tools."""
    counts = {str(s): 0 for s in (Severity.WARNING, Severity.CRITICAL, Severity.BREAK)}
    for a in audits:
        for i in a.issues:
            counts[SEVERITY_NAMES[i.severity]] += 1
    tools = tool_totals(audits)
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
            "cost": round(fsum(a.cost for a in audits), 6),
            "loop_tokens": sum(a.loop_tokens for a in audits),
            "retry_tokens": sum(a.retry_tokens for a in audits),
            "burnt_tokens": sum(i.tokens for a in audits for i in a.issues),
            "burnt_cost": round(fsum(i.cost for a in audits for i in a.issues), 6),
            "sessions_acted_on": sum(1 for a in audits if a.issues),
        },
        "tools": {name: s.to_dict() for name, s in sorted(tools.items())},
    }


def print_json(path: str, audits: Sequence[SessionAudit]) -> None:
    """The report on stdout: indented for people; a large report compact and written session
    by session (the C encoder writes it much faster, and a reader that goes away stops it)."""
    data = report(path, audits)
    if len(audits) <= _MAX_SHOWN:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    write = sys.stdout.write
    sessions = data.pop("transcripts")
    write(json.dumps(data)[:-1] + ', "transcripts": [')
    for n, session in enumerate(sessions):
        write(("," if n else "") + json.dumps(session))
    write("]}\n")


def _money(cost: float) -> str:
    return f"${cost:,.4f}" if cost else ""


def print_tables(path: str, audits: Sequence[SessionAudit]) -> None:
    """A table per session with findings (the first :data:`_MAX_SHOWN`), then the tools and
    the totals."""
    console = _console()
    for shown, a in enumerate(audits):
        if shown == _MAX_SHOWN:
            rest = len(audits) - _MAX_SHOWN
            console.print(
                f"[dim]… and {rest:,} more session(s): every one is in the --json and --html "
                "output.[/]"
            )
            break
        _session(console, a)
    _tools(console, audits)
    s = report(path, audits)["summary"]
    est = " (est.)" if s["tokens_estimated"] else ""
    cost = f" ({_money(s['cost'])})" if s["cost"] else ""
    burnt = f" ({_money(s['burnt_cost'])})" if s["burnt_cost"] else ""
    console.print(
        f"\nScanned {s['transcripts']} session(s), {s['messages']} messages in {path}: "
        f"{s['findings']} finding(s) ({s['warning']} warning, {s['critical']} critical, "
        f"{s['break']} break); {s['tokens']:,} tokens{est}{cost}, {s['loop_tokens']:,} burnt "
        f"in loops, {s['retry_tokens']:,} in retries; burnt at the findings: "
        f"{s['burnt_tokens']:,} tokens{burnt}"
    )
    if s["findings"]:
        console.print("[dim]What each finding would tell the model is in the --json output.[/]")


def _session(console: Console, a: SessionAudit) -> None:
    from rich.table import Table  # noqa: PLC0415 - the tables only

    est = " (est.)" if a.estimated else ""
    cost = f" ({_money(a.cost)})" if a.cost else ""
    tokens = (
        f"{a.tokens:,} tokens{est}{cost}, {a.loop_tokens:,} burnt in loops, "
        f"{a.retry_tokens:,} in retries"
    )
    if not a.issues:
        clean = "no loops found, no bad tool calls"
        console.print(f"[green]✓[/] [bold]{a.id}[/]: {a.messages} messages, {clean}; {tokens}")
        return
    first = a.first_action()
    acted = f"; the guard would first act at step {first[0]} ({first[1]})" if first else ""
    if a.ladder.acts:
        acted += (
            "; its loop recovery: "
            + ", ".join(f"{action} at {step}" for step, action, _ in a.ladder.acts[:8])
            + (" …" if len(a.ladder.acts) > 8 else "")
        )
    noun = "finding" if len(a.issues) == 1 else "findings"
    table = Table(
        title=f"[bold]{a.id}[/] — {a.messages} messages, {a.steps} steps, {len(a.issues)} "
        f"{noun}; {tokens}{acted}",
        title_justify="left",
    )
    for name, justify in (("step (msg)", "right"), ("severity", "left"),
                          ("detector", "left"), ("tool", "left"), ("count", "right"),
                          ("guard would", "left"), ("tokens burnt", "right")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i in a.issues:
        table.add_row(
            f"{i.step} (#{i.index})",
            f"[{_COLOURS[i.severity]}]{str(i.severity).upper()}[/]",
            i.detector,
            i.tool or "(text)",
            str(i.count),
            i.action,
            f"{i.tokens:,} {_money(i.cost)}".strip() if i.tokens else "",
        )
    console.print(table)


def _tools(console: Console, audits: Sequence[SessionAudit]) -> None:
    from rich.table import Table  # noqa: PLC0415 - the tables only

    totals = tool_totals(audits)
    flagged = sorted(
        ((n, s) for n, s in totals.items() if s.findings or s.errors),
        key=lambda kv: (-kv[1].tokens, -kv[1].findings, kv[0]),
    )
    if not flagged:
        return
    table = Table(title="[bold]per tool[/] (tools with findings or failed results)",
                  title_justify="left")  # fmt: skip
    for name in ("tool", "calls", "failed results", "findings", "tokens burnt"):
        table.add_column(name, justify="left" if name == "tool" else "right")
    for name, s in flagged[:_MAX_TOOLS]:
        burnt = f"{s.tokens:,} {_money(s.cost)}".strip()
        table.add_row(name or "(no name)", f"{s.calls:,}", f"{s.errors:,}", f"{s.findings:,}",
                      burnt)  # fmt: skip
    console.print(table)
