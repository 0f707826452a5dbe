"""The hook daemon: one process with the guard loaded, answering command hooks on a socket.

Started by the first command hook that finds none (``python -m agentguard.hooks._daemon``),
detached from the agent. It holds an exclusive lock beside its socket for its whole life, so two
hooks starting one at the same time leave one daemon; it answers one event at a time (each takes
milliseconds; the session state is in the store, shared with any in-process hook) and exits
after ``--idle`` seconds without an event.

Wire format (a private one between the hook and its daemon): the request is the agent name, a
newline and the event's JSON, then end of stream; the answer is the exit code, a newline and
what the hook prints.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
from collections.abc import Sequence

from ._guard import HookGuard, open_guard
from ._protocol import AGENTS

__all__ = ["main", "serve"]

#: Seconds without an event after which the daemon exits.
IDLE_SECONDS = 900.0
#: The longest event accepted (a tool result can be large; past this the event is let through).
MAX_EVENT = 64 << 20
_READ_TIMEOUT = 5.0


def _answer(guard: HookGuard, conn: socket.socket) -> None:
    conn.settimeout(_READ_TIMEOUT)
    chunks, size = [], 0
    while chunk := conn.recv(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_EVENT:
            conn.sendall(b"0\n")
            return
    agent, _, payload = b"".join(chunks).partition(b"\n")
    name = agent.decode("utf-8", "replace")
    if name not in AGENTS:
        conn.sendall(b"0\n")
        return
    try:
        answer = guard.handle(name, payload)
        reply = f"{answer.exit_code}\n".encode() + answer.stdout.encode()
    except Exception:  # an answer that cannot be written: this event proceeds
        reply = b"0\n"
    conn.sendall(reply)


def serve(guard: HookGuard, listener: socket.socket, idle: float = IDLE_SECONDS) -> None:
    """Answer events on ``listener`` until ``idle`` seconds pass without one."""
    listener.settimeout(idle)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            return
        with conn, contextlib.suppress(OSError):
            _answer(guard, conn)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon for one socket (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m agentguard.hooks._daemon")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--config")
    parser.add_argument("--store")
    parser.add_argument("--directory")
    parser.add_argument("--idle", type=float, default=IDLE_SECONDS)
    args = parser.parse_args(argv)
    lock = open(args.socket + ".lock", "a")  # noqa: SIM115 - held for the daemon's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another daemon serves (or is starting to serve) this socket
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")  # who serves this socket (to stop it: kill this pid)
    lock.flush()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.socket)  # a socket left by a daemon that died
    guard = open_guard(args.config, args.store, args.directory)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(args.socket)
    finally:
        os.umask(old)
    listener.listen(64)
    try:
        serve(guard, listener, args.idle)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(args.socket)
        guard.close()
        lock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
