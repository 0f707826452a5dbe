"""Scale: many concurrent sessions in one process, and what ``import agentguard`` costs."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import agentguard as ag
from _harness import Table
from agentguard.testing import Reply, ScriptedModel
from agentguard.transport import ModelRequest

ROOT = Path(__file__).resolve().parents[1]


def _drive(count: int) -> tuple[ag.Guard, int, float]:
    """One guard serving ``count`` sessions, each a short agent run of three calls."""
    config = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    model = ScriptedModel([lambda r: Reply.text(f"answer {len(r.messages)}")], cycle=True)
    guard = ag.Guard(model, config)
    start = time.perf_counter()
    calls = 0
    for i in range(count):
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {i}"}]
        for _ in range(3):
            answer = guard.complete(ModelRequest(model="m", messages=messages), session=f"s{i}")
            messages = [*messages, dict(answer.message), {"role": "user", "content": "go on"}]
            calls += 1
    return guard, calls, time.perf_counter() - start


def _sessions(count: int) -> Table:
    _, calls, elapsed = _drive(count)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    guard, _, _ = _drive(count)  # kept alive while its sessions are measured
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del guard
    return Table(
        f"{count:,} concurrent sessions in one process",
        ["sessions", "calls", "calls / s", "memory per session"],
        [[count, calls, f"{calls / elapsed:,.0f}", f"{held / count / 1024:.1f} KiB"]],
        description=(
            "One Guard over the scripted transport; every session makes three calls and stays "
            "remembered (loop detector, seen messages, ledger entries). Memory is what "
            "tracemalloc still sees held after a second run, divided by the sessions; calls per "
            "second come from the first run (no tracing) and include the scripted model."
        ),
        notes=[
            "Sessions beyond `max_sessions` (10,000 by default) are forgotten least recently "
            "used first, so memory is bounded however many sessions a process sees."
        ],
    )


# VmHWM (peak RSS of this process image) rather than ru_maxrss, which a forked child inherits.
_PROBE = """
import json, resource, sys, time
start = time.perf_counter()
import {module}
elapsed = time.perf_counter() - start
try:
    status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
    rss = int(status)
except (OSError, IndexError, ValueError):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"seconds": elapsed, "rss_kib": rss, "modules": len(sys.modules)}}))
"""


def _import_cost(runs: int) -> Table:
    """``import agentguard`` in a fresh interpreter, next to importing its dependencies alone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def probe(module: str) -> dict[str, Any]:
        samples = []
        for _ in range(runs):
            out = subprocess.run(
                [sys.executable, "-c", _PROBE.format(module=module)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            samples.append(json.loads(out.stdout))
        samples.sort(key=lambda s: s["seconds"])
        return samples[len(samples) // 2]

    rows = []
    for label, module in (
        ("python alone", "sys"),
        ("pydantic + jsonschema + rapidfuzz + blake3", "pydantic, jsonschema, rapidfuzz, blake3"),
        ("agentguard", "agentguard"),
        ("openai", "openai"),
    ):
        sample = probe(module)
        rows.append(
            [
                label,
                f"{sample['seconds'] * 1000:.0f} ms",
                f"{sample['rss_kib'] / 1024:.1f} MiB",
                sample["modules"],
            ]
        )
    return Table(
        "import cost (fresh interpreter, median)",
        ["import", "time", "peak RSS", "modules loaded"],
        rows,
        description=(
            "Each import in a new interpreter; its core dependencies and the openai client for "
            "scale."
        ),
    )


def run(quick: bool) -> list[Table]:
    return [_sessions(500 if quick else 10_000), _import_cost(3 if quick else 9)]
