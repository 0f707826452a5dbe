"""ToolGuard overhead: a guarded tool call against the bare call, on the happy path.

The first guarded row is the path users get by default: a sync tool registered with a plain
``@tools.tool`` on a ``ToolGuard()`` with the default configuration, so it runs on a worker
thread under its criticality's timeout (15 s) and every call goes through the LoopDetector.
The other rows take parts away to show what each costs.
"""

from __future__ import annotations

import itertools
import time

import anyio

from _harness import Table, per_call, us, verdict
from agentguard import GuardConfig, ToolGuard

GOAL_US = 10.0


def _guard(**tools: object) -> ToolGuard:
    config = GuardConfig.from_dict({"tools": tools}, env={})
    return ToolGuard(config, hooks=())


def _search(query: int) -> str:
    return f"result {query}"


async def _asearch(query: int) -> str:
    return f"result {query}"


def _async_per_call(fn: object, n: int) -> float:
    """Seconds per awaited call, over ``n`` calls in one event loop."""

    async def batch() -> float:
        start = time.perf_counter()
        for i in range(n):
            await fn(i)  # type: ignore[operator]
        return (time.perf_counter() - start) / n

    return anyio.run(batch)


def run(quick: bool) -> list[Table]:
    repeat = 3 if quick else 7
    min_time = 0.02 if quick else 0.2
    counter = itertools.count()  # new arguments each call: no loop detector fires

    default = ToolGuard()  # the defaults, as a user gets them

    @default.tool
    def search(query: int) -> str:
        return f"result {query}"

    inline = _guard(sync_timeouts=False)
    inline.register(_search, name="search")
    no_loops = ToolGuard(
        GuardConfig.from_dict(
            {"tools": {"sync_timeouts": False}, "loop_detection": {"enabled": False}}, env={}
        ),
        hooks=(),
    )
    no_loops.register(_search, name="search")

    bare = us(per_call(lambda: _search(query=next(counter)), repeat=repeat, min_time=min_time))
    rows: list[list[object]] = [["bare call", bare, 0.0, ""]]
    for label, guard in (
        ("ToolGuard.call, plain @tools.tool (default: worker thread, 15 s timeout)", default),
        ("ToolGuard.call, sync tool inline (sync_timeouts: false)", inline),
        ("... loop detection off", no_loops),
    ):
        cost = us(
            per_call(
                lambda g=guard: g.call("search", {"query": next(counter)}),
                repeat=repeat,
                min_time=min_time,
            )
        )
        rows.append([label, cost, cost - bare, verdict(cost - bare, GOAL_US)])
    default.close()

    aguard = _guard()
    aguard.register(_asearch, name="search")
    n = 2_000 if quick else 20_000
    abare = us(_async_per_call(lambda i: _asearch(query=i), n))
    aguarded = us(_async_per_call(lambda i: aguard.acall("search", {"query": i}), n))
    rows.append(["bare await of an async tool", abare, 0.0, ""])
    rows.append(
        [
            "await ToolGuard.acall, async tool (anyio deadline)",
            aguarded,
            aguarded - abare,
            verdict(aguarded - abare, GOAL_US),
        ]
    )
    return [
        Table(
            "ToolGuard overhead on the happy path",
            ["call", "µs per call", "overhead µs", f"goal ≤ {GOAL_US:g} µs"],
            rows,
            description="A tool that returns at once, new arguments on every call; the guard "
            "checks loops, asks the tool's breaker, times the attempt, records the result "
            "and emits two events (no hooks registered beyond the default logger).",
            notes=[
                "A sync tool with a timeout runs on a worker thread (a sync callable cannot be "
                "interrupted, so only another thread can stop waiting for it); the hand-off to "
                "and back from that thread is most of the default path's cost. Set "
                "`sync_timeouts: false` or `timeout=None` for cheap tools, or make the tool "
                "async.",
            ],
        )
    ]
