"""MemoryPressureProbe.level() against the bare cost of reading the PSI file."""

from __future__ import annotations

from pathlib import Path

from _harness import Table, per_call, us
from agentguard.pressure import MemoryPressureProbe


def run(quick: bool) -> list[Table]:
    repeat = 3 if quick else 7
    min_time = 0.02 if quick else 0.2
    probe = MemoryPressureProbe()
    source = probe.reading().source
    table = Table(
        "Memory pressure probe",
        ["operation", "µs per call", "ratio to bare read"],
        description=f"Source on this machine: `{source}`. The probe caches which source works.",
    )
    psi = Path("/proc/pressure/memory")
    level = us(per_call(probe.level, repeat=repeat, min_time=min_time))
    if psi.exists():
        bare = us(per_call(psi.read_text, repeat=repeat, min_time=min_time))
        table.rows.append(["read /proc/pressure/memory (bare)", bare, "1.00"])
        table.rows.append(["probe.level()", level, f"{level / bare:.2f}"])
    else:
        table.rows.append(["probe.level()", level, "n/a (no PSI here)"])
    return [table]
