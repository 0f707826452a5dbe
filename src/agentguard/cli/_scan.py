"""``agentguard scan FILE``: find loops in recorded agent transcripts.

Input, read as a stream (memory does not grow with the file, only with the findings):

- JSONL, one transcript per line: a JSON array of messages, or an object with ``messages``
  (and optionally ``id`` / ``session`` / ``session_id`` naming it);
- JSONL, one message per line: objects with ``role``, grouped into transcripts by their
  ``session`` or ``session_id`` field (messages without one form the transcript ``default``);
- a JSON array file: an array of messages (one transcript) or of transcripts; the array is
  decoded item by item, so a large file is streamed too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from agentguard.config import GuardConfig
from agentguard.exceptions import ConfigError
from agentguard.loops import Finding, TranscriptScanner
from agentguard.types import Severity

_CHUNK = 1 << 16
_COLOURS = {
    Severity.WARNING: "yellow",
    Severity.CRITICAL: "bold red",
    Severity.BREAK: "bold white on red",
}


class InputError(Exception):
    """The input cannot be scanned; the message names the file and line."""


@dataclass
class _Transcript:
    id: str
    scanner: TranscriptScanner
    findings: list[Finding] = field(default_factory=list)

    def feed(self, message: Any, where: str) -> None:
        if not isinstance(message, Mapping):
            raise InputError(f"{where}: expected a message object, got {type(message).__name__}")
        self.findings.extend(self.scanner.feed(message))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "messages": self.scanner.messages_seen,
            "findings": [f.to_dict() for f in self.findings],
        }


def register(sub: Any) -> None:
    """Add the ``scan`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "scan",
        help="find loops in recorded transcripts (JSONL or a JSON array)",
        description="Run the loop detectors over OpenAI-format transcripts and report findings.",
    )
    parser.add_argument("file", help="a .jsonl file (a transcript or a message per line) or .json")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--fail-on",
        default="never",
        choices=["never", "warning", "critical", "break"],
        help="exit 1 when a finding reaches this severity (default: never)",
    )
    parser.add_argument("--config", help="a config file whose loop_detection section to use")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        config = GuardConfig.from_file(args.config) if args.config else GuardConfig.from_dict({})
    except ConfigError as exc:
        print(f"agentguard scan: {exc}", file=sys.stderr)
        return 2
    try:
        transcripts = scan_file(args.file, config)
    except InputError as exc:
        print(f"agentguard scan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_report(args.file, transcripts), indent=2))
    else:
        _print_tables(args.file, transcripts)
    if args.fail_on == "never":
        return 0
    bar = Severity.parse(args.fail_on)
    hit = any(f.severity >= bar for t in transcripts for f in t.findings)
    return 1 if hit else 0


def scan_file(path: str, config: GuardConfig) -> list[_Transcript]:
    """Scan every transcript in ``path``; raises :class:`InputError` on unusable input."""
    try:
        stream = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    transcripts: dict[str, _Transcript] = {}

    def transcript(name: str) -> _Transcript:
        t = transcripts.get(name)
        if t is None:
            t = transcripts[name] = _Transcript(name, TranscriptScanner(config))
        return t

    try:
        with stream:
            for line_no, item in _items(stream, path):
                where = f"{path}:{line_no}"
                if isinstance(item, _Batch):
                    t = transcript("transcript")
                    for message in item:
                        t.feed(message, where)
                elif isinstance(item, list):
                    t = transcript(_unique(transcripts, f"line {line_no}"))
                    for message in item:
                        t.feed(message, where)
                elif isinstance(item, Mapping) and isinstance(item.get("messages"), list):
                    name = item.get("id") or item.get("session") or item.get("session_id")
                    t = transcript(_unique(transcripts, str(name or f"line {line_no}")))
                    for message in item["messages"]:
                        t.feed(message, where)
                elif isinstance(item, Mapping) and "role" in item:
                    name = item.get("session") or item.get("session_id") or "default"
                    transcript(str(name)).feed(item, where)
                else:
                    raise InputError(
                        f"{where}: expected a transcript (array of messages or object with "
                        f"'messages') or a message (object with 'role'), "
                        f"got {type(item).__name__}"
                    )
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return list(transcripts.values())


def _unique(existing: Mapping[str, Any], name: str) -> str:
    if name not in existing:
        return name
    n = 2
    while f"{name} ({n})" in existing:
        n += 1
    return f"{name} ({n})"


def _items(stream: IO[str], path: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, JSON value)``: JSONL lines, or the items of a top-level array."""
    first = stream.readline()
    line_no = 1
    while first and not first.strip():
        first = stream.readline()
        line_no += 1
    if not first:
        return
    try:
        value = json.loads(first)
    except ValueError as exc:
        if first.lstrip().startswith("["):
            yield from _array_items(first, stream, path, line_no)
            return
        raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        yield from ((line_no, v) for v in value)  # a one-line array of transcripts
    elif isinstance(value, list) and value and all(_is_transcript(v) for v in value):
        yield from ((line_no, v) for v in value)
    else:
        yield line_no, value
    for line in stream:
        line_no += 1
        if not line.strip():
            continue
        try:
            yield line_no, json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None


def _is_transcript(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("messages"), list)


def _array_items(head: str, stream: IO[str], path: str, line_no: int) -> Iterator[tuple[int, Any]]:
    """Decode a JSON array spread over many lines item by item (bounded buffer)."""
    decoder = json.JSONDecoder()
    buf = head[head.index("[") + 1 :]
    eof = False
    as_messages: bool | None = None
    pending: list[Any] = []
    while True:
        pos = 0
        n = len(buf)
        while pos < n and buf[pos] in " \t\r\n,":
            if buf[pos] == "\n":
                line_no += 1
            pos += 1
        buf = buf[pos:]
        if buf.startswith("]"):
            break
        if not buf:
            if eof:
                raise InputError(f"{path}:{line_no}: unterminated JSON array")
            chunk = stream.read(_CHUNK)
            eof = not chunk
            buf += chunk
            continue
        try:
            item, end = decoder.raw_decode(buf)
        except ValueError as exc:
            if eof:
                raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None
            chunk = stream.read(_CHUNK)
            eof = not chunk
            buf += chunk
            continue
        if as_messages is None:
            as_messages = isinstance(item, Mapping) and "role" in item
        if as_messages:
            pending.append(item)  # one transcript: feed messages in bounded batches
            if len(pending) >= 256:
                yield line_no, _Batch(pending)
                pending = []
        else:
            yield line_no, item
        line_no += buf.count("\n", 0, end)
        buf = buf[end:]
    if pending or as_messages:
        yield line_no, _Batch(pending)


class _Batch(list[Any]):
    """Consecutive messages of the single transcript held by a JSON array file."""


def _report(path: str, transcripts: list[_Transcript]) -> dict[str, Any]:
    counts = {str(s): 0 for s in (Severity.WARNING, Severity.CRITICAL, Severity.BREAK)}
    for t in transcripts:
        for f in t.findings:
            counts[str(f.severity)] += 1
    return {
        "file": path,
        "transcripts": [t.to_dict() for t in transcripts],
        "summary": {
            "transcripts": len(transcripts),
            "messages": sum(t.scanner.messages_seen for t in transcripts),
            "findings": sum(counts.values()),
            **counts,
        },
    }


def _print_tables(path: str, transcripts: list[_Transcript]) -> None:
    console = Console(highlight=False)
    for t in transcripts:
        n = t.scanner.messages_seen
        if not t.findings:
            console.print(f"[green]✓[/] [bold]{t.id}[/]: {n} messages, no loops found")
            continue
        noun = "finding" if len(t.findings) == 1 else "findings"
        table = Table(
            title=f"[bold]{t.id}[/] — {n} messages, {len(t.findings)} {noun}",
            title_justify="left",
        )
        table.add_column("msg", justify="right", style="dim")
        table.add_column("severity")
        table.add_column("detector")
        table.add_column("tool")
        table.add_column("count", justify="right")
        for f in t.findings:
            table.add_row(
                f"#{f.index}",
                f"[{_COLOURS[f.severity]}]{str(f.severity).upper()}[/]",
                f.detector,
                f.tool or "(text)",
                str(f.count),
            )
        console.print(table)
    summary = _report(path, transcripts)["summary"]
    console.print(
        f"\nScanned {summary['transcripts']} transcript(s), {summary['messages']} messages in "
        f"{path}: {summary['findings']} finding(s) "
        f"({summary['warning']} warning, {summary['critical']} critical, {summary['break']} break)"
    )
    if summary["findings"]:
        console.print("[dim]The hint each finding would give the model is in the --json output.[/]")
