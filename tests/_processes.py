"""Servers under test as real processes on loopback: a free port, and a process started,
polled until its health endpoint answers, and stopped (used by the litellm proxy and
``agentguard serve`` tests); and a stand-in HTTP server on a thread of this process."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

import agentguard


def free_port() -> int:
    """A port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` answering HTTP on a loopback port (yielded), on a thread, until the block
    ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def process_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment for a server process: loopback never proxied, and the agentguard under
    test importable first (not whichever the process's environment installed)."""
    path = (str(Path(agentguard.__file__).parents[1]), os.environ.get("PYTHONPATH"))
    return {
        **os.environ,
        "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        **(extra or {}),
    }


@contextlib.contextmanager
def running(
    command: Sequence[str], *, env: Mapping[str, str], log: Path, health: str, name: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (output to ``log``) until the block ends, once ``health`` answers 200;
    then terminate it (kill it when it does not stop within 30 s)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_until_ready(process, health, log, name)
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_ready(process: subprocess.Popen[bytes], url: str, log: Path, name: str) -> None:
    """Poll ``url`` (at most ~3 minutes on a loaded machine); fail with the log."""
    with httpx.Client(timeout=2) as http:
        for _ in range(360):
            if process.poll() is not None:
                pytest.fail(f"{name} exited ({process.returncode}):\n{log.read_text()}")
            try:
                if http.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.5)  # the pause between polls; returns early if it dies
    pytest.fail(f"{name} not ready:\n{log.read_text()[-4000:]}")
