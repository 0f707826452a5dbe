"""``agentguard scan`` throughput: the library audit and the command, by file shape.

Goals (issue 18): >= 100,000 messages/s for the library scan and >= 50,000 messages/s for the
command as a process, on one core, whatever the file's shape. Rates are messages per second of
CPU time (the process's own, and the child's for the command), which is what one core gives:
wall time on a machine shared with other work measures the neighbours too; each row is the
best of a few rounds, taken in turn with the other rows' (the neighbours only ever add time).
The baseline is ``json.loads`` of the same JSONL lines, the floor any scanner of the file
pays; the loop detectors alone (``scan_transcript``, no file, no tool checks, no accounting)
are the floor of the audit.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import Table, verdict
from agentguard.cli import _output
from agentguard.cli._scan import scan_file
from agentguard.config import GuardConfig
from agentguard.loops import scan_transcript
from agentguard.loops._identity import forget_texts

_SRC = Path(__file__).resolve().parent.parent / "src"
_LIBRARY_GOAL, _COMMAND_GOAL = 100_000, 50_000
_ROUNDS = 5  # each row: the best of this many rounds


def transcript(run: int) -> list[dict[str, Any]]:
    """40 messages: healthy reads, a poll of a finished build, a final answer."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"Investigate failing run {run}."}]
    for i in range(12):
        name, args = (
            ("read_file", {"path": f"src/m{i}.py"}) if i < 6 else ("get_build", {"id": run})
        )
        call_id = f"c{run}-{i}"
        fn = {"name": name, "arguments": json.dumps(args)}
        msgs.append(
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "function": fn}]}
        )
        content = f"source of m{i}" if i < 6 else json.dumps({"status": "failed", "request_id": i})
        msgs.append({"role": "tool", "tool_call_id": call_id, "content": content})
    msgs += [{"role": "assistant", "content": f"Run {run} fails in test {k}."} for k in range(15)]
    return msgs


def _cpu(fn: Callable[[], object], rounds: int = _ROUNDS) -> float:
    """The least CPU time of ``rounds`` runs of ``fn``, each with the process-wide identity
    memos empty (a round would otherwise find every text the round before met)."""
    best = float("inf")
    for _ in range(rounds):
        forget_texts()
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def _command(args: list[str], rounds: int = _ROUNDS) -> float:
    """``agentguard scan ARGS`` as a process: the least CPU seconds of the child in ``rounds``."""
    env = {**os.environ, "PYTHONPATH": str(_SRC)}
    best = float("inf")
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(
            [sys.executable, "-m", "agentguard", "scan", *args, "--no-progress"],
            check=True, env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best = min(best, cpu)
    return best


def _print_json(path: str, audits: list[Any]) -> None:
    """``--json``'s writing of the report, into a buffer."""
    real, sys.stdout = sys.stdout, io.StringIO()
    try:
        _output.print_json(path, audits)
    finally:
        sys.stdout = real


def _shapes(tmp: Path, transcripts: list[list[dict[str, Any]]]) -> list[tuple[str, Path]]:
    """The same messages written in each file shape the scan reads."""
    out = []
    path = tmp / "transcripts.jsonl"
    with path.open("w") as fh:
        for r, t in enumerate(transcripts):
            fh.write(json.dumps({"id": f"run-{r}", "messages": t}) + "\n")
    out.append(("JSONL, a transcript per line", path))
    path = tmp / "messages.jsonl"
    with path.open("w") as fh:
        for r, t in enumerate(transcripts):
            for m in t:
                fh.write(json.dumps({**m, "session": f"run-{r}"}) + "\n")
    out.append(("JSONL, a message per line", path))
    path = tmp / "array.json"
    with path.open("w") as fh:  # one transcript spread over many lines, as json.dump(indent)
        fh.write("[\n" + ",\n".join(json.dumps(m) for t in transcripts for m in t) + "\n]\n")
    out.append(("JSON array over many lines (one transcript)", path))
    path = tmp / "oneline.json"
    path.write_text(json.dumps([{"id": f"run-{r}", "messages": t}
                                for r, t in enumerate(transcripts)]))  # fmt: skip
    out.append(("JSON array on one line (transcripts)", path))
    return out


def _huge_item(tmp: Path, size: int) -> Path:
    """A JSON array whose one item holds a ``size``-character message (linear, not quadratic)."""
    path = tmp / "huge.json"
    messages = [{"role": "user", "content": "x" * size}, {"role": "assistant", "content": "ok"}]
    path.write_text("[\n" + ",\n".join(json.dumps(m, indent=1) for m in messages) + "\n]\n")
    return path


def run(quick: bool) -> list[Table]:
    """The scan throughput table."""
    runs = 50 if quick else 2_500
    transcripts = [transcript(r) for r in range(runs)]
    n = sum(len(t) for t in transcripts)
    config = GuardConfig.from_dict({}, env={})
    table = Table(
        title="agentguard scan throughput, by file shape",
        columns=[
            "what",
            "messages",
            "CPU seconds",
            "messages/s (one core)",
            "× json.loads alone",
            "goal",
        ],
        description=(
            f"{runs:,} generated transcripts of 40 messages (healthy reads, a stalled poll, final "
            "answers), written in each shape the scan reads. The library rows run "
            "`agentguard.cli._scan.scan_file` in this process (reading, every loop detector, "
            "tool-call checks, token accounting per session); the command rows run `agentguard "
            "scan FILE --json` as a process, start-up included, and count the child's CPU "
            "time. Each library round starts with the loop detectors' process-wide memos of "
            "identities empty (the transcripts share tool results and arguments, as runs of one "
            "agent do). The last rows show the file-shape bound: an array with one huge item "
            "is decoded in linear time."
        ),
    )
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shapes = _shapes(tmp, transcripts)
        lines = shapes[0][1].read_text().splitlines()
        base_cpu = _cpu(lambda: [json.loads(line) for line in lines])
        base = n / base_cpu
        table.rows.append(["json.loads of the JSONL (baseline)", n, base_cpu, base, 1.0, "-"])
        # Every row but the baseline in one round-robin, each row its best round: on a machine
        # whose speed comes and goes (one has run the same command 45 % slower for tens of
        # seconds, then at full speed again), a row measured in rounds of its own can fall
        # wholly in a slow stretch; interleaved, every row meets the same stretches, and the
        # rows compare with each other as well as with the goal. (The note's account of the
        # scan's cost outside the detectors is the difference of their row and the first
        # shape's, measured so in alternate rounds.)
        one = tmp / "one.jsonl"
        one.write_text(json.dumps({"role": "user", "content": "hello"}) + "\n")
        html = [str(shapes[0][1]), "--json", "--html", str(tmp / "report.html")]
        jobs: list[tuple[str, Callable[[], float]]] = [
            ("detectors", lambda: _cpu(lambda: [scan_transcript(t) for t in transcripts], 1)),
            *(
                (f"library scan: {label}",
                 lambda p=path: _cpu(lambda: scan_file(str(p), config), 1))
                for label, path in shapes
            ),
            *(
                (f"`agentguard scan --json` (process): {label}",
                 lambda p=path: _command([str(p), "--json"], 1))
                for label, path in shapes[:2]
            ),
            ("`agentguard scan --json --html` (process): JSONL, a transcript per line",
             lambda: _command(html, 1)),
            ("start-up", lambda: _command([str(one), "--json"], 1)),
        ]  # fmt: skip
        best = dict.fromkeys((label for label, _ in jobs), float("inf"))
        for _ in range(_ROUNDS):
            for label, job in jobs:
                best[label] = min(best[label], job())
        cpu = best.pop("detectors")
        table.rows.append(["loop detectors alone (scan_transcript, no file)", n, cpu, n / cpu,
                           n / cpu / base, "-"])  # fmt: skip
        start_up = best.pop("start-up")
        for label, cpu in best.items():
            rate = n / cpu
            goal = _LIBRARY_GOAL if label.startswith("library") else _COMMAND_GOAL
            table.rows.append([label, n, cpu, rate, rate / base,
                               verdict(rate, goal, lower_is_better=False)])  # fmt: skip
        table.rows.append(["`agentguard scan --json` (process): start-up, a one-message file", 1,
                           start_up, "-", "-", "-"])  # fmt: skip
        audits = scan_file(str(shapes[0][1]), config)
        writing = _cpu(lambda: _print_json(str(shapes[0][1]), audits))
        table.rows.append(["writing the `--json` report (library, after the scan)", n, writing,
                           n / writing, n / writing / base, "-"])  # fmt: skip
        detectors, library = table.rows[1][3], table.rows[2][3]
        rest = 1e6 / library - 1e6 / detectors
        bound = (
            "bound it below the library's goal"
            if detectors < _LIBRARY_GOAL
            else "leave room for the library's goal"
        )
        table.notes.append(
            f"Machine load when measured: {load_before:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end (1-minute averages) on {os.cpu_count()} "
            "logical CPUs. CPU time per message varies with the machine's state (other "
            "processes on its CPUs, its clock): read the rows against each other, and against "
            "the goal with that in mind."
        )
        table.notes.append(
            f"The loop detectors alone run at {detectors:,.0f} messages/s "
            f"({1e6 / detectors:.1f} µs a message): they are {library / detectors:.0%} of the "
            f"library scan's cost per message and {bound}; the rest, about {rest:.1f} µs a "
            "message, is reading, the tool-call checks, the recovery ladder and the "
            "accounting. The command adds its start-up "
            f"({start_up:.2f} s of CPU: the interpreter, the configuration models the loop "
            "detectors are built on, and the detectors; the guard package, jsonschema and "
            "the HTML and table writers are not imported by a `--json` scan) and writing the "
            f"report ({writing:.2f} s for these {runs:,} sessions)."
        )
        table.notes.append(
            "Where the rest goes (2026-11-25, issue 18's third pass on the scan; CPU time, "
            "medians of rounds outside this table): reading is about 0.55 µs a message for a "
            "transcript per JSONL line (json's C scanner decodes the line in one call) and "
            "about 1.0 µs for message lines or a JSON array's items (a Python step per item, "
            "decoded in the reading loop; an array's separators skipped by one regex call). The "
            "audit's own work (tool-call checks, recovery ladder, token accounting, findings) "
            "is about 1.7 µs a message with the detectors' verdicts replayed, and about 3 µs "
            "beside the real detectors: the same code runs slower after theirs. A transcript's "
            "audit is finished as soon as it is read and its detectors' state let go (about "
            "19 KB a session down to 7 KB; held for every session until the end it cost about "
            "1 µs a message); so is a session of message lines once the lines move on to "
            "another session (a session whose lines come back has the file read again, every "
            "audit kept open). The JSON array over many lines is one session of 100,000 "
            "messages, the 2,500 runs joined: loops go on across them, its loop detectors cost "
            "about 6.6 µs a message against 5.8 for the same messages as 2,500 sessions, and "
            "its recovery ladder climbs 82,000 times, most of its gap to the other rows. "
            "A loop's findings compared without a tuple each, the global breaker's latest "
            "verdict reused and the ladder's memo keyed by what it is given took that file's "
            "scan from 1.197 to 1.131 s of CPU (-5.5 %; 7 interleaved rounds against the code "
            "before, medians, on a machine then about 7 % slower than for the table). "
            "A fourth pass took 5–9 % more off by shape: the loop detectors' severities looked "
            "up once per module (an enum member's lookup costs about 60 ns, and a loop's every "
            "event climbed a ladder of them), the degeneration check's periodicity gate given "
            "its zero streaks made once per process (a short output's gate 3.5 to 2.0 µs), the "
            "scanner's state per message kept in locals, a loop's turn charged in the audit's "
            "own loop; 7 interleaved rounds against the code before (CPU time, medians, load "
            "2.5–4.7): a transcript per line 1.087 to 0.999 s, message lines 1.126 to 1.065, "
            "the JSON array over many lines 1.178 to 1.067, an array of transcripts on one "
            "line 1.100 to 1.045. "
            "A fifth pass (reports byte for byte the same) took a little more: the recovery "
            "ladder keeps one list of its rungs, not two (the long array climbs it 82,000 "
            "times), a call repeated back to back looks for no cycle period (a set was built "
            "per period and call), a response repeating at the last one's count keeps its "
            "verdict, a session's pending calls sit in a plain dict; instructions counted "
            "(callgrind, the shapes at 10,000 messages) 1.3 % fewer for a transcript per line "
            "and an array on one line, 1.4 % for message lines, 2.4 % for the long array; 9 "
            "interleaved rounds against the code before (CPU time, medians, load 3.5–4.8): a "
            "transcript per line 1.140 to 1.116 s, message lines 1.150 to 1.167 (the pairs' "
            "median −1.7 %: noise), the long array 1.227 to 1.158 (−5.6 %), an array of "
            "transcripts on one line 1.197 to 1.102. What is left is spread thin: in the long "
            "array a quarter of the instructions are the two text detectors (the response "
            "window's normalising and rapidfuzz call, about 20,000 instructions an answer, and "
            "the degeneration gate about as many), a tool event in a loop about 30,000 in the "
            "detectors' checks, and a session's set-up about 15 µs. "
            "A seventh pass (reports byte for byte the same; every `observe()` verdict compared "
            "with the code before on loopbench's episodes and 3,000 seeded random streams) took "
            "Python steps out of each message, which inside the scan cost more than twice what "
            "they cost alone: an answer normalised once by `check_text`, the scanner's verdict "
            "in slots, a tie between one event's detectors settled without `worse()`, no call "
            "for the common case of a message's text, call list, names, OK verdict, a result "
            "that is no failure and the near-duplicate check of a result, one comparison for a "
            "JSONL value's end and a JSON array's next character, a run's messages told to be "
            "objects in one pass in C; instructions (callgrind, the shapes at 10,000 messages) "
            "2.4–2.9 % fewer, 3.7 % for the long array; 30 interleaved rounds against the code "
            "before (CPU time, medians, load 4.3–4.9): a transcript per line 0.932 to 0.900 s, "
            "message lines 0.986 to 0.959, the long array 1.003 to 0.958, an array of "
            "transcripts on one line 0.972 to 0.943 (−2.7 to −4.5 %). "
            "An eighth pass (reports byte for byte the same; every `observe()` verdict compared "
            "with the code before on loopbench's episodes) decodes a JSON array of messages "
            "laid out a message to a line a buffer's whole lines at a time (one call of json's "
            "C scanner, not one per item; reading that file 0.98 to 0.63 µs a message) and "
            "tells a text of up to 32 characters with fewer than 7 repeated bytes has no "
            "periodic stretch without the shifted-XOR scan; 11 interleaved rounds against the "
            "code before (a process per round, CPU time, medians, load 3–4): the long array "
            "1.007 to 0.944 s (−6.2 %), message lines 0.994 to 0.974 (−2.0 %), a transcript per "
            "line −2.2 %, an array on one line −0.7 %. Message lines are read no faster: each "
            "line must be decoded on its own to be one value. "
            "`--html` adds the timeline and "
            "the messages around each finding to the scan (about 0.25 s here) and the page "
            "(about 0.2 s: a timeline's marks are formatted once per session length, escaped "
            "texts and context rows remembered)."
        )
        for mb in (4, 16) if not quick else (1, 2):
            path = _huge_item(tmp, mb * 1_000_000)
            cpu = _cpu(lambda p=path: scan_file(str(p), config))
            table.rows.append([f"library scan: a JSON array with one {mb} MB item", 2, cpu,
                               f"{mb / cpu:,.0f} MB/s", "-", "linear"])  # fmt: skip
    return [table]
