"""TokenLedger reserve + commit per store, and memory per idle session."""

from __future__ import annotations

import itertools
import tempfile
import tracemalloc
from pathlib import Path

from _harness import Table, per_call, us, verdict
from agentguard.budget import TokenLedger
from agentguard.config import TokenBudgetConfig
from agentguard.storage import MemoryStore, SQLiteStore


def _redis_store() -> tuple[object, object] | None:
    try:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from _stores import running_redis
        from agentguard.storage import RedisStore
    except ImportError:
        return None
    context = running_redis()
    server = context.__enter__()
    return RedisStore(server.url, key_prefix="bench"), context


def run(quick: bool) -> list[Table]:
    repeat = 3 if quick else 7
    min_time = 0.02 if quick else 0.2
    config = TokenBudgetConfig(max_output_tokens=None, per_session=None, per_hour=None)
    ids = itertools.count()
    rows: list[list[object]] = []
    stores: list[tuple[str, object]] = [("memory", MemoryStore())]
    tmp = tempfile.TemporaryDirectory()
    stores.append(("sqlite (WAL, one file)", SQLiteStore(Path(tmp.name) / "b.db")))
    redis = _redis_store()
    if redis is not None:
        stores.append(("redis (unix socket, Lua)", redis[0]))
    memory_cost = 0.0
    for name, store in stores:
        ledger = TokenLedger(config, store=store)  # type: ignore[arg-type]

        def cycle(ledger: TokenLedger = ledger) -> None:
            ledger.commit(ledger.reserve("s", 100), 80, event_id=f"e{next(ids)}")

        cost = us(per_call(cycle, repeat=repeat, min_time=min_time))
        if name == "memory":
            memory_cost = cost
        rows.append(
            [
                name,
                cost,
                f"{cost / memory_cost:.1f}",
                f"≤ 5 µs: {verdict(cost, 5)}" if name == "memory" else "-",
            ]
        )
        store.close()  # type: ignore[attr-defined]
    if redis is not None:
        redis[1].__exit__(None, None, None)  # type: ignore[attr-defined]
    tmp.cleanup()
    sessions = 1_000 if quick else 10_000
    ledger = TokenLedger(config, store=MemoryStore())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(sessions):
        ledger.commit(ledger.reserve(f"session-{i}", 10), 10, event_id=f"x{i}")
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_session = (after - before) / sessions
    return [
        Table(
            "Token ledger: reserve + commit",
            ["store", "µs per reserve+commit", "ratio to memory", "goal"],
            rows,
            description="One reservation and its commit (idempotent event id), same run.",
        ),
        Table(
            "Token ledger: memory per idle session (MemoryStore)",
            ["sessions", "bytes per session (incl. its event id)"],
            [[sessions, per_session]],
        ),
    ]
