"""``agentguard scan FILE``: audit recorded agent traces.

Finds loops (every loop detector), tool calls the live guard would have repaired or refused
(checked against the tools the trace declares, with the guard's own validator), and the tokens
and money burnt in loops and retries: per finding, per session, per tool and in total, with the
step where the live guard would first have acted and what it would have done. Reads the
formats of :mod:`agentguard.cli._formats` as a stream: memory grows with the sessions and
findings, not with the file. Output: a table, ``--json``, ``--html report.html``; ``--fail-on``
gates CI. Ctrl-C and a closed pipe (``| head``) end it quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentguard.config import GuardConfig
from agentguard.exceptions import ConfigError
from agentguard.types import Severity

from . import _output
from ._audit import SessionAudit
from ._formats import FORMATS, InputError, Messages, Record, only_objects, open_counted, runs
from ._formats import message as checked

if TYPE_CHECKING:  # imported when needed (prices, a terminal): start-up time is throughput
    from agentguard.budget import PriceTable

_PROGRESS_EVERY = 2048
#: the exit code of a scan whose reader went away, as a shell reports a process ended by SIGPIPE
_PIPE_CLOSED = 141


def register(sub: Any) -> None:
    """Add the ``scan`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "scan",
        help="audit recorded agent traces: loops, bad tool calls, tokens and money burnt",
        description=(
            "Audit recorded agent traces (OpenAI chat, LiteLLM request logs, OpenHands events, "
            "ATIF, Claude Code and Codex sessions, SWE-agent and tau-bench trajectories, "
            "OpenTelemetry GenAI spans as OTLP JSON): loops, tool calls the live guard would "
            "repair or refuse, the tokens and money burnt, and where the guard would have acted."
        ),
    )
    parser.add_argument("file", help="a trace: .jsonl, .json, .traj")
    parser.add_argument(
        "--format",
        choices=sorted(FORMATS),
        help="read every item as this format (default: detected item by item)",
    )
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
    parser.add_argument(
        "--config",
        help="a config file: its loop_detection, tool_validation, escalation and tiers "
        "sections judge as the live guard would, its token_budget.prices price the tokens",
    )
    parser.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=IN,OUT",
        help="price per million input and output tokens of a model (or prefix, or '*'); "
        "repeatable, added to the config's prices",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        return _scan(args)
    except BrokenPipeError:  # (Ctrl-C is the command line's: agentguard.cli.main)
        # the reader went away (`| head`): nothing more can be written, not even at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _PIPE_CLOSED


def _scan(args: argparse.Namespace) -> int:
    try:
        config = GuardConfig.from_file(args.config) if args.config else GuardConfig.from_dict({})
        prices = _prices(config, args.price)
    except (ConfigError, ValueError) as exc:
        print(f"agentguard scan: {exc}", file=sys.stderr)
        return 2
    progress = not args.no_progress and _terminal()
    # the reports are written under the scan's collector setting too: they build an object
    # per finding over the heap of audits, which would make the collector walk it again
    with _collecting_rarely():
        return _scan_and_report(args, config, prices, progress=progress)


def _scan_and_report(
    args: argparse.Namespace, config: GuardConfig, prices: PriceTable | None, *, progress: bool
) -> int:
    try:
        audits = scan_file(
            args.file,
            config,
            timeline=bool(args.html),
            progress=progress,
            fmt=args.format,
            prices=prices,
        )
    except InputError as exc:
        print(f"agentguard scan: {exc}", file=sys.stderr)
        return 2
    if args.html:
        from . import _html  # noqa: PLC0415 - only for --html

        try:
            Path(args.html).write_text(_html.render(args.file, audits), encoding="utf-8")
        except OSError as exc:
            print(f"agentguard scan: cannot write {args.html}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.json:
        _output.print_json(args.file, audits)
    else:
        _output.print_tables(args.file, audits)
        if args.html:
            from rich.console import Console  # noqa: PLC0415 - the tables only

            Console(highlight=False).print(f"[dim]HTML report: {args.html}[/]")
    sys.stdout.flush()  # a closed pipe is reported here, inside the handler
    if args.fail_on == "never":
        return 0
    bar = Severity.parse(args.fail_on)
    return 1 if any(i.severity >= bar for a in audits for i in a.issues) else 0


_gc_lock = threading.Lock()
_gc_scans = 0  # scans under way in this process (threads): the first sets the collector aside
_gc_threshold: tuple[int, ...] = ()  # the thresholds it found, restored by the last
_gc_froze = False  # whether the first froze what was there (and the last unfreezes it)


@contextlib.contextmanager
def _collecting_rarely() -> Iterator[None]:
    """The cyclic garbage collector, while a scan runs, set aside what was there before and
    run rarely: it would otherwise walk the growing heap of audits (and whatever the process
    holds) again and again, a tenth of the scan's time. What the scan frees is freed by
    reference counting; cycles wait a little longer. Restored when the last scan under way
    ends (the scan may run inside a larger process, in several threads).

    ``gc.unfreeze`` releases every frozen object, so the scan freezes only in a process that
    froze nothing itself (a server that called ``gc.freeze()`` after its start-up keeps its
    frozen objects frozen); there it raises the thresholds alone."""
    global _gc_scans, _gc_threshold, _gc_froze  # noqa: PLW0603 - one count per process, locked
    with _gc_lock:
        _gc_scans += 1
        if _gc_scans == 1:
            _gc_threshold = gc.get_threshold()
            _gc_froze = gc.get_freeze_count() == 0
            if _gc_froze:
                gc.freeze()
            gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        with _gc_lock:
            _gc_scans -= 1
            if _gc_scans == 0:
                gc.set_threshold(*_gc_threshold)
                if _gc_froze:
                    gc.unfreeze()


def _prices(config: GuardConfig, extra: list[str]) -> PriceTable | None:
    """The config's prices with ``MODEL=IN,OUT`` additions (``None`` when there are none);
    ValueError names a bad one."""
    table: dict[str, Any] = dict(config.token_budget.prices)
    for spec in extra:
        model, _, pair = spec.partition("=")
        try:
            given, out = (float(v) for v in pair.split(","))
        except ValueError:
            message = f"--price {spec!r}: expected MODEL=IN,OUT (per million tokens)"
            raise ValueError(message) from None
        table[model.strip()] = (given, out)
    if not table:
        return None
    from agentguard.budget import PriceTable  # noqa: PLC0415 - only with prices

    return PriceTable(table)


class _Reopened(Exception):
    """A run named a session the scan had already finished (a transcript's name reused by a
    later line of another format)."""


@_collecting_rarely()
def scan_file(
    path: str,
    config: GuardConfig,
    *,
    timeline: bool = False,
    progress: bool = False,
    fmt: str | None = None,
    prices: PriceTable | None = None,
) -> list[SessionAudit]:
    """Audit every session in ``path``; raises :class:`InputError` on unusable input.

    A transcript is a whole session: its audit is finished as soon as it is read, and the loop
    detectors' state for it let go (memory held for every session until the end slows the
    scan of a large file by a tenth); so is a session's of lines of chat messages once the
    lines move on to another session. Should a later line name a finished session, the file
    is read again with every audit kept open to the end, as the report must not depend on
    when an audit was finished. The cyclic garbage collector runs rarely meanwhile
    (:func:`_collecting_rarely`)."""
    try:
        return _scan_file(path, config, timeline=timeline, progress=progress, fmt=fmt,
                          prices=prices, early=True)  # fmt: skip
    except _Reopened:
        return _scan_file(path, config, timeline=timeline, progress=progress, fmt=fmt,
                          prices=prices, early=False)  # fmt: skip


def _scan_file(
    path: str,
    config: GuardConfig,
    *,
    timeline: bool,
    progress: bool,
    fmt: str | None,
    prices: PriceTable | None,
    early: bool,
) -> list[SessionAudit]:
    """:func:`scan_file`; with ``early``, a transcript's audit is finished once it is read
    (in a regular file, which can be read again: :class:`_Reopened`)."""
    stream, counter = open_counted(path)
    audits: dict[str, SessionAudit] = {}
    finished: set[str] = set()
    session: str | None = None
    audit: SessionAudit | None = None
    lines = False  # whether the session being fed was fed by lines of chat messages alone
    with stream:
        early = early and stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
        found = runs(stream, path, fmt, group=True)
        for run in _with_progress(found, counter, path) if progress else found:
            name = run[0]
            if name != session or audit is None:  # runs of one session's messages are common
                if lines and early and audit is not None:
                    # lines of chat messages moved on to another session: as a transcript's,
                    # its audit is finished (a later line naming it reads the file again)
                    audit.finish()
                    finished.add(session)  # type: ignore[arg-type]
                if name in finished:
                    raise _Reopened
                session = name
                audit = audits.get(name)
                lines = audit is None
                if audit is None:
                    timeline_bytes = bytearray() if timeline else None
                    audit = audits[name] = SessionAudit(name, config, timeline_bytes, prices)
            if isinstance(run, Messages):  # a transcript: its messages fed in one loop
                _, messages, where, tools, _, whole = run
                if tools:
                    audit.declare(tools)  # once: declaring the same tools again changes nothing
                if not only_objects(messages):  # (dicts, as a rule)
                    for message in messages:
                        checked(message, where)  # an InputError when it is no message
                audit.feed_run(messages)
                if whole and early:
                    audit.finish()
                    finished.add(name)
                    audit = None
                continue
            lines = False
            _, message, _, tokens, tools, retry, model, prompt_tokens = run
            if tools:
                audit.declare(tools)
            if message is None:
                audit.retry_tokens += retry
                audit.tokens += tokens or 0
                continue
            audit.feed(message, tokens, retry, model=model, prompt_tokens=prompt_tokens)
    for name, audit in audits.items():
        if name not in finished:
            audit.finish()
    return list(audits.values())


def _terminal() -> bool:
    """Whether stderr is a terminal (rich's rule: ``FORCE_TERMINAL`` and the like included)."""
    from rich.console import Console  # noqa: PLC0415 - not needed with --no-progress

    return Console(stderr=True).is_terminal


def _with_progress(
    items: Iterator[Record | Messages], counter: Any, path: str
) -> Iterator[Record | Messages]:
    from rich.console import Console  # noqa: PLC0415 - a progress bar only on a terminal
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    size = os.path.getsize(path)
    columns = (
        TextColumn("scanning {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(os.path.basename(path), total=size)
        due = 0  # messages until the next update
        for item in items:
            if due <= 0:
                bar.update(task, completed=counter.count)
                due = _PROGRESS_EVERY
            due -= len(item.messages) if isinstance(item, Messages) else 1
            yield item
        bar.update(task, completed=size)
