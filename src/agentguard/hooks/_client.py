"""The command hook: ``agentguard hook claude-code`` / ``agentguard hook codex``.

A command hook is a new process for every tool call, so its start-up is the agent's latency.
Loading the guard (the configuration models, the detectors, the store) takes far longer than the
judgement itself, so the command hook is a thin client that imports only the standard library:
it hands the event to a hook daemon — a process started on first use, with the guard loaded,
answering on a Unix socket in a private directory and leaving after some idle minutes — and
prints its answer. When no daemon answers, the hook judges the event itself (the state lives in
the shared store either way, so both give the same answer) and starts one for the next events;
when a daemon takes the event but does not answer in time (its store is locked), the event
proceeds unjudged.

Whatever goes wrong, the hook exits 0 with no output: the agent goes on as if there were no
hook (fail open).
"""

from __future__ import annotations

import _socket  # the C module: ``socket`` (its enums, selectors) costs more start-up than the call
import os
import sys
import zlib

TYPE_CHECKING = False  # (not typing's: importing typing is a few ms of every hook's start-up)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO

__all__ = ["ask", "daemon_socket", "resolved", "run"]

#: Seconds to wait for the daemon's answer before letting the event through unjudged.
ANSWER_TIMEOUT = 5.0
_MAX_ANSWER = 1 << 20


def _state_dir(env: Mapping[str, str]) -> str | None:
    """The private directory of the hook sockets, or ``None`` when none can be trusted."""
    base = env.get("AGENTGUARD_HOOK_DIR")
    if not base:
        runtime = env.get("XDG_RUNTIME_DIR")
        tmp = env.get("TMPDIR") or "/tmp"
        base = (
            os.path.join(runtime, "agentguard")
            if runtime
            else os.path.join(tmp, f"agentguard-{os.getuid()}")
        )
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        info = os.stat(base)
    except OSError:
        return None
    # only a directory of our own that no one else can enter: another user must not be able to
    # answer for the guard (or read what the agent does)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return base


def daemon_socket(
    config: str | None, store: str | None, env: Mapping[str, str] | None = None
) -> str | None:
    """The socket of the daemon serving this configuration and store (``None``: no daemon).

    One daemon per configuration (file, its modification time, the ``AGENTGUARD_*``
    overrides), store and agentguard version: a changed configuration gets a new daemon, and
    the old one leaves when idle.
    """
    env = os.environ if env is None else env
    if env.get("AGENTGUARD_HOOK_DAEMON") == "0":
        return None
    if not hasattr(_socket, "AF_UNIX") or not hasattr(os, "getuid"):  # Windows: no daemon
        return None
    directory = _state_dir(env)
    if directory is None:
        return None
    config, store = resolved(config, store, env)
    stamp = ""
    if config:
        try:
            stamp = str(os.stat(config).st_mtime_ns)
        except OSError:
            stamp = "missing"
    from agentguard import __version__  # noqa: PLC0415 - the package alone, not the guard

    overrides = sorted((k, v) for k, v in env.items() if k.startswith("AGENTGUARD_"))
    # without a store, the configuration's may be a path relative to the working directory
    where = None if store else os.getcwd()
    key = repr((__version__, sys.executable, config, stamp, store, where, overrides)).encode()
    # a name, not a secret: two CRCs (64 bits) tell a handful of daemons apart (hashlib would
    # load OpenSSL, a few milliseconds of every hook's start-up)
    name = f"{zlib.crc32(key):08x}{zlib.crc32(key[::-1]):08x}"
    return os.path.join(directory, f"hook-{name}.sock")


def resolved(
    config: str | None, store: str | None, env: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The configuration file (``AGENTGUARD_CONFIG`` when not given) and the store, as absolute
    paths: the daemon serves hooks started in any directory."""
    config = config or env.get("AGENTGUARD_CONFIG") or None
    if config:
        config = os.path.abspath(config)
    if store and "://" not in store:
        store = os.path.abspath(store)
    return config, store


def ask(
    path: str, agent: str, payload: bytes, timeout: float | None = None
) -> tuple[int, bytes] | None:
    """The daemon's answer ``(exit code, stdout)`` to one event.

    ``None`` when no daemon answers (none listens, or it closed without an answer): the hook
    judges the event itself. A daemon that is there but does not answer within ``timeout``
    (default :data:`ANSWER_TIMEOUT`) is waiting for the store, which another process keeps
    locked (or is stuck): the answer is then silence, the event proceeds — judging it here
    would wait for the same store again.
    """
    try:
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError:
        return None
    chunks: list[bytes] = []
    try:
        conn.settimeout(ANSWER_TIMEOUT if timeout is None else timeout)
        conn.connect(path)
        conn.sendall(agent.encode() + b"\n" + payload)
        conn.shutdown(_socket.SHUT_WR)
        size = 0
        while chunk := conn.recv(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_ANSWER:
                return None
    except TimeoutError:  # a daemon is there, busy past the hook's wait: proceed (fail open)
        return 0, b""
    except OSError:
        return None
    finally:
        conn.close()
    head, sep, body = b"".join(chunks).partition(b"\n")
    if not sep or not head.isdigit():
        return None
    return int(head), body


def _spawn(path: str, config: str | None, store: str | None) -> None:
    """Start the daemon for ``path`` in the background (it exits at once if one is starting)."""
    import subprocess  # noqa: PLC0415 - only when no daemon answers

    command = [sys.executable, "-m", "agentguard.hooks._daemon", "--socket", path]
    if config:
        command += ["--config", config]
    if store:
        command += ["--store", store]
    else:  # a relative storage path in the configuration means one in this directory
        command += ["--directory", os.getcwd()]
    subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not the agent's child: it must not wait for it
        close_fds=True,
        cwd="/",  # holds no project directory open (paths are absolute)
    )


def _judge_here(
    agent: str, payload: bytes, config: str | None, store: str | None
) -> tuple[int, bytes]:
    from ._guard import judge_once  # noqa: PLC0415 - the slow path loads the guard

    answer = judge_once(agent, payload, config, store)
    return answer.exit_code, answer.stdout.encode()


def run(
    agent: str,
    *,
    config: str | None = None,
    store: str | None = None,
    daemon: bool = True,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
) -> int:
    """Answer one hook event read from stdin; returns the exit code (always 0 on a fault).

    Args:
        agent: ``claude-code`` or ``codex``.
        config: a configuration file (default: ``AGENTGUARD_CONFIG``, else the defaults).
        store: ``redis://...`` or a SQLite file (default: the configuration's ``storage``, else
            a SQLite file in the user's state directory).
        daemon: use (and start) the hook daemon.
    """
    source = stdin if stdin is not None else sys.stdin.buffer
    sink = stdout if stdout is not None else sys.stdout.buffer
    try:
        payload: bytes = source.read()
        config, store = resolved(config, store, os.environ)
        answer = None
        path = daemon_socket(config, store) if daemon else None
        if path is not None:
            answer = ask(path, agent, payload)
            if answer is None:
                _spawn(path, config, store)
        if answer is None:
            answer = _judge_here(agent, payload, config, store)
        code, out = answer
        if out:
            sink.write(out + b"\n")
            sink.flush()
        return code
    except Exception:  # fail open: the agent proceeds as if there were no hook
        return 0
