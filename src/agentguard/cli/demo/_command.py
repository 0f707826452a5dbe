"""``agentguard demo``: a realistic agent, every failure mode, the guard's answer to each.

Offline and with no API key: the real openai client, wrapped by :func:`agentguard.wrap`, talks
over an HTTP mock transport to :class:`~agentguard.testing.ScriptedModel`, which injects one
failure mode per scenario into a small file-summarising task. The timeline shows each step as
it happens (colour on a terminal, plain text when piped); a table sums it up at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterable
from math import fsum
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from agentguard import _clock
from agentguard.cli.demo import SCENARIOS, DemoEvent, RunResult, run_scenario
from agentguard.types import Choice, EscalationPrompt

#: Waits longer than this get a progress indicator.
PROGRESS_AFTER = 3.0
_STYLE = {"debug": "dim", "info": "", "ok": "green", "warn": "yellow", "error": "bold red"}
_SOURCE_STYLE = {
    "agent": "cyan",
    "model": "blue",
    "http": "dim",
    "tool": "magenta",
    "guard": "bold",
    "fault": "red",
    "user": "cyan",
}
_CHOICES = {
    "1": Choice.RETRY,
    "retry": Choice.RETRY,
    "r": Choice.RETRY,
    "2": Choice.USE_BACKUP,
    "backup": Choice.USE_BACKUP,
    "use_backup": Choice.USE_BACKUP,
    "b": Choice.USE_BACKUP,
    "3": Choice.CANCEL,
    "cancel": Choice.CANCEL,
    "c": Choice.CANCEL,
}


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="watch the guard handle every failure mode (offline, no API key)",
        description=(
            "Run a small agent through the real openai client wrapped by agentguard, against a "
            "scripted model that injects one failure mode per scenario."
        ),
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        metavar="NAME",
        help=f"run one failure mode: {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--json", action="store_true", help="print the event log as JSON lines")
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="escalation mode 'confirm': ask (retry / use backup / cancel) before changing tier; "
        "without --scenario runs dead_tier",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="real seconds per simulated second of waiting (default 1; 0: do not wait)",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="record OpenTelemetry spans and metrics (GenAI conventions): to the console, or "
        "over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set (needs opentelemetry-sdk)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        import openai  # noqa: F401, PLC0415 - the demo drives the real client
    except ImportError:
        print(
            "agentguard demo drives the real openai client: pip install 'agentguard[openai]'",
            file=sys.stderr,
        )
        return 2
    if args.speed < 0:
        print("agentguard demo: --speed must not be negative", file=sys.stderr)
        return 2
    names = [args.scenario] if args.scenario else (["dead_tier"] if args.confirm else SCENARIOS)
    if getattr(args, "otel", False):
        return _run_traced(args, names)
    return _run_all(args, names)


def _run_traced(args: argparse.Namespace, names: Iterable[str]) -> int:
    """The demo under OpenTelemetry: each scenario one trace, its root span the agent run."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401, PLC0415 - the application's SDK
    except ImportError:
        print(
            "agentguard demo --otel records through the OpenTelemetry SDK: "
            'pip install opentelemetry-sdk "agentguard[otel]"',
            file=sys.stderr,
        )
        return 2
    from agentguard.telemetry._console import demo_pipeline  # noqa: PLC0415

    with demo_pipeline(sys.stderr) as (tracer, where):
        print(f"agentguard demo: OpenTelemetry spans and metrics go to {where}", file=sys.stderr)
        return _run_all(args, names, tracer=tracer)


def _run_all(args: argparse.Namespace, names: Iterable[str], tracer: Any = None) -> int:
    out = Console(highlight=False, stderr=args.json)  # people's output; stderr under --json
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 120  # piped: lines are not folded to a terminal, give the table room
    view = _Timeline(out, json_lines=args.json, speed=args.speed)
    if not args.json:
        _header(out, confirm=args.confirm)
    results: list[RunResult] = []
    for name in names:
        scenario = SCENARIOS[name]
        if not args.json:
            out.rule(f"[bold]{name}[/]: {scenario.title}", align="left")
            out.print(Text(f"the guard should: {scenario.expect}", style="dim"))
        with contextlib.ExitStack() as stack:
            if tracer is not None:  # one trace per scenario: the agent run is its root span
                stack.enter_context(tracer.start_as_current_span(f"agent run {name}"))
            results.append(
                run_scenario(
                    scenario,
                    emit=view.event,
                    wait=view.wait,
                    ask=view.ask if args.confirm else None,
                    confirm=args.confirm,
                )
            )
    if args.json:
        totals = _totals(results)
        print(json.dumps({"kind": "summary", "results": [r.to_dict() for r in results], **totals}))
    else:
        _summary(out, results)
    return 1 if any(r.outcome == "failed" for r in results) else 0


def _header(out: Console, *, confirm: bool) -> None:
    import openai  # noqa: PLC0415 - checked by the caller

    mode = "confirm (no silent failover)" if confirm else "auto"
    out.print(
        Text.assemble(
            ("agentguard demo", "bold"),
            " — an agent summarising meeting notes with real file tools, through the real "
            f"openai client ({openai.__version__}) wrapped by agentguard, against a scripted "
            "model that injects faults. Offline; no API key. Escalation mode: ",
            (mode, "bold"),
            ".",
        )
    )


class _Timeline:
    """Renders demo events as they arrive; waits with a progress indicator; asks in confirm."""

    def __init__(self, out: Console, *, json_lines: bool, speed: float) -> None:
        self.out = out
        self.json_lines = json_lines
        self.speed = speed

    def event(self, event: DemoEvent) -> None:
        if self.json_lines:
            print(json.dumps(event.to_dict(), default=str), flush=True)
            return
        if event.level == "debug" or (event.kind == "http" and event.level == "info"):
            return  # routine steps, successful requests (the model line says it): --json only
        line = Text(f"{event.t:6.1f}s  ", style="dim")
        line.append(f"{event.source:<6} ", style=_SOURCE_STYLE.get(event.source, ""))
        line.append(event.text, style=_STYLE[event.level])
        self.out.print(line, soft_wrap=True)

    def wait(self, seconds: float, why: str) -> None:
        real = seconds * self.speed
        if seconds <= PROGRESS_AFTER:
            if real > 0:
                _clock.sleep(real)
            return
        label = f"waiting {seconds:.1f} s ({why})"
        if not self.out.is_terminal:
            self.out.print(Text(f"        … {label}", style="dim"))
            if real > 0:
                _clock.sleep(real)
            return
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeRemainingColumn(),
            console=self.out,
            transient=True,
        ) as progress:
            task = progress.add_task(label, total=seconds)
            step = 0.1
            done = 0.0
            while done < seconds:
                chunk = min(step, seconds - done)
                if real > 0:
                    _clock.sleep(chunk * self.speed)
                done += chunk
                progress.update(task, completed=done)

    def ask(self, prompt: EscalationPrompt, run: RunResult) -> Choice:
        text = (
            f"{prompt.render()}\n\nThis run so far: {run.tokens:,} tokens, {_money(run.cost)}, "
            f"{run.requests} model calls."
        )
        self.out.print(Panel(text, title="confirm before failover", expand=False))
        keys = {str(i): option for i, option in enumerate(prompt.options, 1)}
        for _ in range(3):
            try:
                answer = self.out.input(f"Choose [{'/'.join(keys)}]: ").strip().lower()
            except EOFError:
                self.out.print("(no answer: cancel)")
                return Choice.CANCEL
            if not sys.stdin.isatty():
                self.out.print(answer)  # echo a piped answer, as a terminal would
            choice = keys.get(answer) or _CHOICES.get(answer)
            if choice in prompt.options:
                return choice
            self.out.print(f"please answer {', '.join(keys)} (or retry / backup / cancel)")
        return Choice.CANCEL


def _totals(results: list[RunResult]) -> dict[str, Any]:
    return {
        "faults": sum(r.faults for r in results),
        "recovered": sum(r.outcome == "done" for r in results),
        "stopped": sum(r.outcome == "stopped" for r in results),
        "failed": sum(r.outcome == "failed" for r in results),
        "tokens": sum(r.tokens for r in results),
        "tokens_saved": sum(r.saved for r in results),
        "cost": round(fsum(r.cost for r in results), 6),
    }


_OUTCOME = {
    "done": ("recovered", "green"),
    "stopped": ("stopped", "yellow"),
    "failed": ("FAILED", "bold red"),
}


def _summary(out: Console, results: list[RunResult]) -> None:
    table = Table(title="What the guard did", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("scenario", no_wrap=True)
    table.add_column("faults", justify="right")
    table.add_column("outcome", no_wrap=True)
    table.add_column("how")
    table.add_column("calls", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("saved*", justify="right")
    table.add_column("cost", justify="right")
    for r in results:
        label, style = _OUTCOME[r.outcome]
        table.add_row(
            r.scenario.name,
            str(r.faults),
            Text(label, style=style),
            ", ".join(r.how) or "-",
            str(r.requests),
            f"{r.tokens:,}",
            f"{r.saved:,}",
            _money(r.cost),
        )
    totals = _totals(results)
    table.add_section()
    table.add_row(
        "total",
        str(totals["faults"]),
        f"{totals['recovered']} recovered",
        f"{totals['stopped']} stopped, {totals['failed']} failed",
        str(sum(r.requests for r in results)),
        f"{totals['tokens']:,}",
        f"{totals['tokens_saved']:,}",
        _money(totals["cost"]),
    )
    out.print()
    out.print(table)
    out.print(
        Text(
            "faults: injected by the scripted model or tool; calls: HTTP requests to the model. "
            "* saved (estimate): a re-ask for each answer repaired locally, plus the steps a "
            "stopped run would still have taken, at its mean tokens per step. Prices per million "
            "tokens: fast is local (free), standard $0.05 in / $0.08 out, premium $2.50 / $10.",
            style="dim",
        )
    )


def _money(value: float) -> str:
    return f"${value:,.4f}"
