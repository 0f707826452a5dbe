"""loopbench: loop judgment on labelled agent runs, agentguard side by side with every peer.

Data. ``benchmarks/loopbench/episodes.jsonl``: one labelled episode per line (OpenAI chat
messages, the class, ``loop`` or ``healthy``, the step by which a loop must be flagged, source,
licence, the reason); real recorded runs (tau-bench, SWE-agent) plus minimal synthetic cases for
the classes no real trace covers. ``RUBRIC.md`` says how they are labelled, ``SOURCES.md`` where
they come from; ``build.py`` regenerates the file.

Method. Every episode is replayed message by message; a *step* is one assistant message (its
tool results belong to it), counted from 1. Each detector's first firing step is recorded:

- agentguard: :meth:`LoopDetector.observe` per message, default configuration, the episode's
  tool schemas declared when it has them. WARNING (a hint to the model) and BREAK (the call is
  refused) are reported apart.
- agentguard scan: the audit ``agentguard scan`` runs on a recorded trace (the same loop
  detectors, plus its tool-call checks: unknown or text-embedded calls, broken arguments), fed
  the episode with its declared tools; its first finding of WARNING or above. It blocks nothing.
- naive counter: the third call of one tool with the same canonical arguments (warn = block).
- OpenHands SDK: its ``StuckDetector`` over the SDK's own events
  (``loopbench/peers/openhands_driver.py``); it only stops the run.
- Gemini CLI and Qwen Code: their ``LoopDetectionService`` (deterministic checks only; the
  LLM-based check is never called) driven by ``loopbench/peers/node_harness.mjs``; a loop stops
  the turn.
- OpenClaw: its tool-loop detection (``detectToolCallLoop`` / ``recordToolCall`` /
  ``recordToolCallOutcome``, enabled, default thresholds) in the same Node harness; "warning"
  and "critical" (a blocked call) are reported apart.

A loop episode counts as caught when the detector fires at any step, and on time when it fires
by the rubric's step. On a healthy episode any firing is a false warning (or block). The check
cost is agentguard's ``observe()`` CPU time per tool event (one call or one result) over every
episode's tool messages, the detector's construction subtracted.

Opt-in: ``nox -s loopbench`` sets ``LOOPBENCH_RUN=1`` and installs the peers (Node and a
Python 3.12 interpreter when the machine has them); ``nox -s bench`` keeps the existing section.
Peers whose runtime is missing are marked "not run here".
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from unittest import mock

from _harness import Table, side_by_side, us
from _peers import optional
from agentguard import GuardConfig
from agentguard.loops import LoopDetector
from agentguard.loops import _detector as detector_module
from agentguard.loops._identity import forget_texts
from agentguard.types import Severity

LOOPBENCH = Path(__file__).resolve().parent / "loopbench"
EPISODES = LOOPBENCH / "episodes.jsonl"
RESULTS = LOOPBENCH / "results.jsonl"

Episode = dict[str, Any]
#: per detector: (first warning step, first blocking step); None = never fired
Flags = tuple[int | None, int | None]

DETECTORS = [
    ("agentguard", "agentguard LoopDetector"),
    ("scan", "agentguard scan (audit of a recorded trace)"),
    ("naive", "naive counter (3 identical calls)"),
    ("openhands", "OpenHands SDK StuckDetector"),
    ("gemini", "Gemini CLI LoopDetectionService"),
    ("qwen", "Qwen Code LoopDetectionService"),
    ("openclaw", "OpenClaw tool-loop detection"),
]


def available() -> bool:
    """Opt-in (``nox -s loopbench``): ``nox -s bench`` keeps the report's existing section."""
    return os.environ.get("LOOPBENCH_RUN") == "1"


def episodes() -> list[Episode]:
    """Every labelled episode of ``episodes.jsonl``."""
    with EPISODES.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# -- detectors ------------------------------------------------------------------------------------


def _replay(messages: Iterable[dict[str, Any]], judge: Callable[[dict[str, Any]], int]) -> Flags:
    """Feed messages to ``judge`` (0 = nothing, 1 = warning, 2 = block); first steps of each."""
    warned = blocked = None
    step = 0
    for message in messages:
        if message.get("role") == "assistant":
            step += 1
        level = judge(message)
        if level >= 1 and warned is None:
            warned = step
        if level >= 2 and blocked is None:
            blocked = step
            break
    return warned, blocked


def agentguard_flags(episode: Episode) -> tuple[Flags, str]:
    """agentguard's (warning step, BREAK step), and the detector behind the first warning."""
    detector = LoopDetector(tools=episode.get("tools") or None, hooks=(), _process_hooks=False)
    first: list[str] = []

    def judge(message: dict[str, Any]) -> int:
        worst = Severity.OK
        for verdict in detector.observe(message):
            if verdict.severity >= Severity.WARNING and not first:
                first.append(verdict.detector or "")
            worst = max(worst, verdict.severity)
        return 2 if worst >= Severity.BREAK else 1 if worst >= Severity.WARNING else 0

    return _replay(episode["messages"], judge), (first[0] if first else "")


def scan_flags(episode: Episode) -> tuple[Flags, str]:
    """``agentguard scan``'s audit of the episode as a recorded trace: the first finding of
    WARNING or above (loops, and its tool-call checks: unknown or text-embedded calls, broken
    arguments), and the detector behind it. An audit blocks nothing."""
    from agentguard.cli._audit import SessionAudit  # the audit behind `agentguard scan`

    audit = SessionAudit(episode["id"], GuardConfig.from_dict({}, env={}))
    if episode.get("tools"):
        audit.declare(episode["tools"])
    steps = []
    step = 0
    for message in episode["messages"]:
        step += message.get("role") == "assistant"
        steps.append(step)
        audit.feed(message)
    audit.finish()
    found = [i for i in audit.issues if i.severity >= Severity.WARNING]
    if not found:
        return (None, None), ""
    first = min(found, key=lambda i: i.index)
    return (steps[first.index], None), first.detector


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


def naive_flags(episode: Episode, threshold: int = 3) -> Flags:
    """The third call of one tool with the same arguments, anywhere in the run."""
    seen: dict[tuple[str, str], int] = defaultdict(int)

    def judge(message: dict[str, Any]) -> int:
        for call in message.get("tool_calls") or ():
            key = (call["function"]["name"], _canonical(call["function"]["arguments"]))
            seen[key] += 1
            if seen[key] >= threshold:
                return 2
        return 0

    return _replay(episode["messages"], judge)


def _lines(out: str) -> list[dict[str, Any]]:
    rows = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def openhands_flags() -> dict[str, Flags] | str:
    """The OpenHands SDK's flags per episode id, or why it was not run."""
    if optional("openhands.sdk.conversation.stuck_detector") is not None:  # Python >= 3.12
        sys.path.insert(0, str(LOOPBENCH / "peers"))
        try:
            import openhands_driver
        finally:
            sys.path.pop(0)
        return {
            e["id"]: (step, step)
            for e in episodes()
            for step in [openhands_driver.first_stuck(e["messages"])]
        }
    python = os.environ.get("LOOPBENCH_OPENHANDS_PYTHON")
    if not python or not Path(python).exists():
        return "not run here (needs openhands-sdk on Python >= 3.12)"
    done = subprocess.run(
        [python, str(LOOPBENCH / "peers" / "openhands_driver.py"), str(EPISODES)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")},
    )
    if done.returncode:
        return f"not run here (the driver failed: {done.stderr.strip()[-200:]})"
    return {r["id"]: (r["openhands"], r["openhands"]) for r in _lines(done.stdout)}


def node_flags() -> dict[str, dict[str, Flags | str]] | str:
    """Gemini CLI's, Qwen Code's and OpenClaw's flags per episode id, or why none ran."""
    node = shutil.which("node")
    peers = LOOPBENCH / "peers"
    if node is None:
        return "not run here (needs Node.js)"
    if not (peers / "node_modules").is_dir():
        return "not run here (peers not installed: `nox -s loopbench`)"
    done = subprocess.run(
        [node, str(peers / "node_harness.mjs"), str(EPISODES)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return f"not run here (the Node harness failed: {done.stderr.strip()[-200:]})"
    out: dict[str, dict[str, Flags | str]] = {}
    for row in _lines(done.stdout):
        flags: dict[str, Flags | str] = {}
        for name in ("gemini", "qwen"):
            value = row.get(name)
            flags[name] = "unavailable" if value == "unavailable" else (value, value)
        warn, block = row.get("openclaw_warn"), row.get("openclaw_block")
        flags["openclaw"] = "unavailable" if warn == "unavailable" else (warn, block)
        out[row["id"]] = flags
    return out


def all_flags(
    eps: list[Episode],
) -> tuple[dict[str, dict[str, Flags]], dict[str, str], dict[str, str]]:
    """Per detector, per episode id: its flags; the detectors not run and why; per episode id,
    the agentguard detector behind its first warning."""
    flags: dict[str, dict[str, Flags]] = {name: {} for name, _ in DETECTORS}
    skipped: dict[str, str] = {}
    deciders: dict[str, str] = {}
    for e in eps:
        ours, deciders[e["id"]] = agentguard_flags(e)
        flags["agentguard"][e["id"]] = ours
        flags["scan"][e["id"]], deciders["scan:" + e["id"]] = scan_flags(e)
        flags["naive"][e["id"]] = naive_flags(e)
    oh = openhands_flags()
    if isinstance(oh, str):
        skipped["openhands"] = oh
    else:
        flags["openhands"] = oh
    nodes = node_flags()
    for name in ("gemini", "qwen", "openclaw"):
        if isinstance(nodes, str):
            skipped[name] = nodes
            continue
        values = {i: f[name] for i, f in nodes.items()}
        if any(isinstance(v, str) for v in values.values()):
            skipped[name] = "not run here (package not installed)"
            continue
        flags[name] = {i: v for i, v in values.items() if not isinstance(v, str)}
    return flags, skipped, deciders


# -- tables ---------------------------------------------------------------------------------------


def _median(values: list[int]) -> str:
    return f"{statistics.median(values):g}" if values else "–"


def _positive_cell(eps: list[Episode], fired: list[int | None]) -> str:
    """recall · on-time share · median firing step."""
    n = len(eps)
    caught = [s for s in fired if s is not None]
    on_time = sum(1 for e, s in zip(eps, fired, strict=True) if s is not None and s <= e["flag_by"])
    return f"{len(caught) / n:.2f} · {on_time / n:.2f} · {_median(caught)}"


def _groups(eps: list[Episode], label: str) -> dict[str, list[Episode]]:
    groups: dict[str, list[Episode]] = defaultdict(list)
    for e in eps:
        if e["label"] == label:
            groups[e["class"]].append(e)
    return dict(sorted(groups.items()))


def _columns() -> list[tuple[str, str, int]]:
    """(detector, column title, index into Flags) of each column: warn and block apart where a
    detector has both levels."""
    return [
        ("agentguard", "agentguard WARNING", 0),
        ("agentguard", "agentguard BREAK", 1),
        ("scan", "agentguard scan", 0),
        ("naive", "naive ×3", 1),
        ("openhands", "OpenHands", 1),
        ("gemini", "Gemini CLI", 1),
        ("qwen", "Qwen Code", 1),
        ("openclaw", "OpenClaw warning", 0),
        ("openclaw", "OpenClaw critical", 1),
    ]


def _recall_table(
    eps: list[Episode], flags: dict[str, dict[str, Flags]], skipped: dict[str, str]
) -> Table:
    cols = _columns()
    rows: list[list[object]] = []
    groups = _groups(eps, "loop")
    everything = [e for g in groups.values() for e in g]
    for cls, group in [*groups.items(), ("**all loops**", everything)]:
        row: list[object] = [cls, len(group), _median([e["flag_by"] for e in group])]
        for det, _, level in cols:
            if det in skipped:
                row.append("not run here")
                continue
            row.append(_positive_cell(group, [flags[det][e["id"]][level] for e in group]))
        rows.append(row)
    return Table(
        "loopbench: loops caught, per class (recall · on time · median step)",
        ["class", "episodes", "rubric step", *(title for _, title, _ in cols)],
        rows,
        description=(
            "Each cell: the share of the class's loop episodes the detector fired on at all · "
            "the share it fired on by the rubric's step (`RUBRIC.md`) · the median step it "
            "fired at. A step is one assistant message. agentguard and OpenClaw have two "
            "levels (a hint, then a refusal); the others only stop the run. Method and "
            "sources: `benchmarks/bench_loopbench.py`, `benchmarks/loopbench/`."
        ),
        notes=[f"{name}: {why}" for name, why in sorted(skipped.items())],
    )


def _healthy_table(
    eps: list[Episode], flags: dict[str, dict[str, Flags]], skipped: dict[str, str]
) -> Table:
    cols = _columns()
    rows: list[list[object]] = []
    groups = _groups(eps, "healthy")
    everything = [e for g in groups.values() for e in g]
    for cls, group in [*groups.items(), ("**all healthy**", everything)]:
        row: list[object] = [cls, len(group)]
        for det, _, level in cols:
            if det in skipped:
                row.append("not run here")
                continue
            n = sum(1 for e in group if flags[det][e["id"]][level] is not None)
            row.append(f"{n} ({100 * n / len(group):.1f} %)" if n else "0")
        rows.append(row)
    return Table(
        "loopbench: false warnings and false blocks on must-not-flag episodes",
        ["class", "episodes", *(title for _, title, _ in cols)],
        rows,
        description=(
            "Healthy episodes (real runs that solved their task or failed it without looping, "
            "and synthetic must-not-flag shapes): how many each detector fired on. For "
            "agentguard a WARNING injects a hint into the model's prompt; a BREAK refuses a "
            "call. The peers without a warning level stop the run."
        ),
    )


_THIRD_CALL = {
    "identical_call",
    "repeated_error",
    "same_result_reworded_query",
    "same_result_noise_argument",
    "unknown_tool_repeated",
    "subagent_loop",
}


def _cost(eps: list[Episode], quick: bool, *, detectors: bool = True) -> tuple[float, int]:
    """agentguard's µs of ``observe()`` per tool event over every episode, and the event count;
    without ``detectors``, of a LoopDetector whose registry is empty: what reading the messages,
    the shared bookkeeping and the identities cost before any detector judges (a reference)."""
    if not detectors:
        with mock.patch.object(detector_module, "REGISTRY", ()):
            return _cost(eps, quick)
    tool_messages = [
        (
            e.get("tools") or None,
            [m for m in e["messages"] if m.get("tool_calls") or m["role"] == "tool"],
        )
        for e in eps
    ]
    events = sum(len(m.get("tool_calls") or ()) or 1 for _, ms in tool_messages for m in ms)

    # Each replay starts with the process-wide identity memos empty: a replay meets the texts
    # the one before met, and would otherwise measure memo hits only. (Texts met again within
    # a replay, in one episode or across episodes, are hits as in a long-running process.)
    def construct_only() -> None:
        forget_texts()
        for tools, _ in tool_messages:
            LoopDetector(tools=tools, hooks=(), _process_hooks=False)

    def replay() -> None:
        forget_texts()
        for tools, messages in tool_messages:
            detector = LoopDetector(tools=tools, hooks=(), _process_hooks=False)
            for message in messages:
                detector.observe(message)

    base, full = side_by_side(
        construct_only, replay, repeat=3 if quick else 5, min_time=0.05 if quick else 0.3
    )
    return us(full - base) / events, events


def _goals(
    eps: list[Episode],
    flags: dict[str, dict[str, Flags]],
    costs: dict[str, tuple[float, int]],
    references: dict[str, tuple[float, int]],
) -> Table:
    ours = flags["agentguard"]
    loops = [e for e in eps if e["label"] == "loop"]
    healthy = [e for e in eps if e["label"] == "healthy"]
    recall = sum(ours[e["id"]][0] is not None for e in loops) / len(loops)
    blocks = sum(ours[e["id"]][1] is not None for e in healthy)
    warns = sum(ours[e["id"]][0] is not None for e in healthy)
    third = [e for e in loops if e["class"] in _THIRD_CALL]
    third_ok = sum(ours[e["id"]][0] is not None and ours[e["id"]][0] <= e["flag_by"] for e in third)
    cycles = [e for e in loops if e["class"].startswith("cycle_")]
    cycles_ok = sum(
        ours[e["id"]][0] is not None and ours[e["id"]][0] <= e["flag_by"] for e in cycles
    )

    def met(ok: bool) -> str:
        return "met" if ok else "**missed**"

    rows: list[list[object]] = [
        [
            "recall (WARNING or above) on loop episodes",
            "≥ 0.95",
            f"{recall:.3f}",
            met(recall >= 0.95),
        ],
        ["blocks on healthy episodes", "0", f"{blocks} of {len(healthy)}", met(blocks == 0)],
        [
            "warnings on healthy episodes",
            "≤ 0.5 %",
            f"{warns} of {len(healthy)} ({100 * warns / len(healthy):.1f} %)",
            met(warns <= 0.005 * len(healthy)),
        ],
        [
            "warned by the third identical no-progress call",
            "all",
            f"{third_ok} of {len(third)}",
            met(third_ok == len(third)),
        ],
        [
            "cycle of length 2–5 flagged by its second repetition",
            "all",
            f"{cycles_ok} of {len(cycles)}",
            met(cycles_ok == len(cycles)),
        ],
        *(
            [
                f"check cost per tool event, {what}",
                "≤ 5 µs",
                f"{cost:.1f} µs ({events:,} events)",
                met(cost <= 5),
            ]
            for what, (cost, events) in costs.items()
        ),
        *(
            [
                f"reference: the same without any detector, {what}",
                "-",
                f"{cost:.1f} µs",
                "-",
            ]
            for what, (cost, _) in references.items()
        ),
    ]
    return Table(
        "loopbench: agentguard against the goals of issue 16",
        ["goal", "target", "agentguard now", "status"],
        rows,
        notes=[
            "The reference rows replay the same messages through a LoopDetector whose detector "
            "registry is empty: reading the messages, the shared bookkeeping (call states, "
            "window, cycles) and the identities of calls and results, before any detector "
            "judges. Its share of the cost: "
            + ", ".join(
                f"{references[what][0] / cost:.0%} ({what})" for what, (cost, _) in costs.items()
            )
            + "; above the goal by itself: "
            + (", ".join(what for what, (ref, _) in references.items() if ref > 5) or "none")
            + "."
        ],
        description=(
            f"{len(eps)} episodes ({len(loops)} loops, {len(healthy)} healthy). "
            "'Third identical no-progress call' covers the classes whose rubric step is that "
            "call (identical calls, repeated errors, reworded queries, noise arguments, unknown "
            "tools, sub-agents); a cycle's rubric step is the end of its third pass. The cost "
            "is CPU time of `observe()` on every tool call and result, alternating rounds with "
            "the detectors' construction alone, which is subtracted; the real runs' tool "
            "results are large (tau-bench's JSON records, SWE-agent's file views), and every "
            "result is fingerprinted. Identities (and whether a result reports a failure) are "
            "remembered per text in bounded process-wide memos; each replay starts with them "
            "empty, so a text is met again only within the replay, in its own episode or in "
            "another (as a process guarding many sessions of one agent meets the same files, "
            "records and polls again). Where the cost goal stands (all episodes, measured by "
            "stubbing each part out in turn, 2026-11-25, a 2-core machine under a load of 2 to "
            "3): the identities of results that must be keyed (decoded, stripped of volatile "
            "fields and ids in one pass, canonical text built) about 2.3 µs per tool event, of "
            "calls about 0.8 µs, the degeneration check of the narration beside tool calls about "
            "1.4 µs, the failure check of a result about 0.5 µs, a run's first tool event "
            "(building its tool detectors) about 0.4 µs, the detectors' own checks about 2.7 µs; "
            "the rest, about 2.6 µs, is reading the message and the shared bookkeeping (call "
            "states, window, cycles). Four cost passes (2026-11-25), every verdict of "
            "every `observe()` unchanged (compared message by message with the code before, on "
            "every episode, the recorded traces of `tests/data` and seeded random streams, at "
            "the default and at tight thresholds). The first: the stripping JSON decoder "
            "remembers which keys are volatile and keeps strings shorter than any noise without "
            "a call; a result opening more than 64 containers whose brackets outside strings "
            "nest no deeper is stripped while decoded instead of walked twice; the periodicity "
            "scan no longer masks the shifted text; a verdict is made once per detector, "
            "severity, count and tool and shared (all episodes 19.5 to 18.5 µs per tool event). "
            "The second: the process-wide memos (before, a detector remembered only its last "
            "few texts); the degeneration check's run regex, O(length × 80), starts where the "
            "earliest periodic stretch does instead of at the start; which detectors each event "
            "kind runs is worked out once, not per episode (18.6 to 12.6 µs). The third: a "
            "tool's first result text, and its first arguments text, stand in for their "
            "identity, keyed only when the tool meets another text (results are only compared "
            "with results of the same tool; most tools of a run are called once, or return one "
            "answer); a result's call identity is the one its call's check made; the "
            "periodicity scan tests periods of five and more only when an aligned block of "
            "16 characters recurs within 80 of itself (real narration 1.8 to 1.2 µs per event); "
            "a long ASCII text result tries the noise pattern only where four hex digits start; "
            "plain dicts instead of ordered ones in the detectors; narration skips the detector "
            "that does not judge it. Together: all episodes 12.0 to 10.4 µs per tool event "
            "(-14 %), real runs 16.6 to 13.4 (-19 %), synthetic 7.6 to 7.5 (21 interleaved "
            "rounds in one process against the code before, CPU time, medians, load 2 to 3; "
            "the table's numbers are one later run). Measured and dropped: decoding "
            "a JSON result without the object hook when no key is volatile and no string can "
            "hold noise (slower overall: the results that pass the check are the small ones, "
            "and tau-bench's `date` fields put a volatile key and a date in almost every large "
            "one); skipping the event for a call every detector is quiet about (at most about "
            "1 µs per event, and it would restate each detector's quiet rule in the "
            "LoopDetector); the process-wide memos alone, without a detector's own memo of its "
            "last texts (no faster); replacing a tool's stand-in by its key wherever it is kept "
            "once the tool returns another text (the rewrites cost more than the stand-in "
            "saved on synthetic episodes); reusing one event object per detector instead of "
            "building one per tool event (about 0.15 µs per event, for an event shared and "
            "mutated under the detectors). "
            "The fourth (every verdict compared the same way, and `agentguard scan`'s reports "
            "byte for byte on `bench_scan.py`'s inputs and the traces of `tests/data`): a long "
            "ASCII text tries the noise pattern only where its hex image has the shape a "
            "timestamp, a UUID or a long hex id starts with, not at every four hex digits (file "
            "views and listings full of line numbers, years and sizes had more than 16 such "
            "places and fell back to the regex's scan of the whole text); the degeneration "
            "count of a narration is remembered per text process-wide, as identities are (a "
            "loop says its narration again turn after turn; answers, mostly new, are not "
            "remembered); an error result is searched for the unknown-tool phrases only when "
            "its lower-cased text names a tool or a function (the pattern cost about 4.8 µs per "
            "error text); the degeneration check's run regex is tried only from the earliest to "
            "the latest periodic stretch instead of to the end of the text (a narration holding "
            "a hex constant 396 to 43 µs). Together: all episodes 10.4 to 9.6 µs per tool event "
            "(-7 %), real runs 13.9 to 12.6 (-9 %), synthetic 7.3 to 6.8 (-7 %) (two runs of 21 "
            "interleaved rounds in one process against the code before, CPU time, medians, load "
            "2.5 to 2.7; the scripts live outside the repository; the table's cost rows are one "
            "later run); `agentguard scan`'s library "
            "rates on `bench_scan.py`'s four shapes unchanged within ±1.5 % (9 interleaved "
            "rounds, a process per round: its transcripts hold no narration, no error result "
            "and no long text). Measured and dropped: the stripping decoder's object hook "
            "telling an object's volatile keys by set operations in C instead of a lookup per "
            "key (slower: 17.6 to 19.0 µs per keyed JSON result of the real runs); remembering "
            "the degeneration count of every text, answers included (about 0.2 µs more per new "
            "text, which the scan, all answers, paid for nothing); one instance of each "
            "detector that keeps no state of a run, shared by every session (no measurable "
            "gain); testing the failure flag before the unknown-tool detector's helper and "
            "reading a tool's OK verdict without a call (no measurable gain). What is left is "
            "spread thin: per tool event about 3 µs of detectors' checks (a result's three "
            "detectors that are always asked, same result, near duplicate and unknown tool, "
            "about 1.4 µs of it), the identities of the real runs' large results (about 18 µs "
            "per keyed result: decoding with the stripping hook, canonical text, digest) and "
            "the analysis of multi-sentence narration (about 17 µs per text on the real runs, "
            "about 7 of them the periodicity scan). "
            "Synthetic episodes are short and their texts met "
            "again, so their cost is the detectors' checks and the bookkeeping, which no "
            "identity shortcut reaches. The goal stays missed by a factor of about two."
        ),
    )


def _sources(eps: list[Episode]) -> Table:
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for e in eps:
        src = e["source"]
        key = (
            src.get("repo", ""),
            src["kind"] + (" (" + src["path"].split("/")[0] + ")" if src["kind"] == "real" else ""),
        )
        rows[key][0 if e["label"] == "loop" else 1] += 1
    return Table(
        "loopbench: episodes per source",
        ["source", "kind", "loops", "healthy"],
        [[repo, kind, n[0], n[1]] for (repo, kind), n in sorted(rows.items())],
        description=(
            "Licences and commits per episode in `episodes.jsonl`; see `loopbench/SOURCES.md`."
        ),
    )


def _deciders(eps: list[Episode], deciders: dict[str, str]) -> Table:
    per: dict[tuple[str, str], tuple[Counter[str], Counter[str]]] = defaultdict(
        lambda: (Counter(), Counter())
    )
    for e in eps:
        for k, key in enumerate((e["id"], "scan:" + e["id"])):
            if deciders[key]:
                per[(e["label"], e["class"])][k][deciders[key]] += 1

    def cell(found: Counter[str]) -> str:
        return ", ".join(f"`{d}` ×{n}" for d, n in found.most_common()) or "–"

    return Table(
        "loopbench: which agentguard detector fired first",
        ["label", "class", "LoopDetector: first WARNING from", "scan: first finding from"],
        [
            [label, cls, cell(ours), cell(scan)]
            for (label, cls), (ours, scan) in sorted(per.items())
        ],
        description=(
            "Per class, the detector behind agentguard's first WARNING (the verdict's "
            "`detector`), and behind `agentguard scan`'s first finding of WARNING or above; on "
            "healthy classes these are the false warnings to fix. Per-episode steps of every "
            "detector: `benchmarks/loopbench/results.jsonl`."
        ),
    )


def _write_results(
    eps: list[Episode], flags: dict[str, dict[str, Flags]], deciders: dict[str, str]
) -> None:
    """Per episode, every detector's (warning, block) steps: the input for detector work."""
    with RESULTS.open("w", encoding="utf-8") as f:
        for e in eps:
            row: dict[str, Any] = {
                "id": e["id"],
                "class": e["class"],
                "label": e["label"],
                "flag_by": e["flag_by"],
            }
            for name, per in flags.items():
                if e["id"] in per:
                    row[name] = list(per[e["id"]])
            row["agentguard_detector"] = deciders[e["id"]]
            row["scan_detector"] = deciders["scan:" + e["id"]]
            f.write(json.dumps(row) + "\n")


def run(quick: bool) -> list[Table]:
    """The loopbench tables (every episode even with ``quick``: only the timing is shortened);
    one placeholder row unless opted in (``nox -s bench`` and CI's smoke run skip it)."""
    if not available():
        row = ["opt-in: run `nox -s loopbench` (sets LOOPBENCH_RUN=1)", "-"]
        return [Table("loopbench", ["loopbench", "result"], [row], placeholder=True)]
    eps = episodes()
    start = time.perf_counter()
    flags, skipped, deciders = all_flags(eps)
    print(f"  loopbench: {len(eps)} episodes replayed in {time.perf_counter() - start:.1f} s")
    real = [e for e in eps if e["source"]["kind"] == "real"]
    synthetic = [e for e in eps if e["source"]["kind"] != "real"]
    parts = {
        "all episodes": eps,
        "real runs (large results)": real,
        "synthetic (short results)": synthetic,
    }
    costs = {what: _cost(part, quick) for what, part in parts.items()}
    references = {what: _cost(part, quick, detectors=False) for what, part in parts.items()}
    if not quick:
        _write_results(eps, flags, deciders)
    return [
        _goals(eps, flags, costs, references),
        _recall_table(eps, flags, skipped),
        _healthy_table(eps, flags, skipped),
        _deciders(eps, deciders),
        _sources(eps),
    ]
