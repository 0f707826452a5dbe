"""MemoryPressureProbe: is this host short of memory, and for how long?

A local model on a host that starts to swap keeps answering, only worse: the health check
passes while quality silently drops. The probe reads the operating system's own pressure signal,
turns it into a :class:`PressureLevel`, and tracks how long pressure has lasted, so the pipeline
can move complex requests up the escalation chain once pressure is *sustained*.

Sources, first that works wins (and is remembered):

1. Linux PSI of the process's own cgroup v2 (``memory.pressure``; the cgroup path comes from
   ``/proc/self/cgroup`` and the cgroup2 mount point from ``/proc/self/mountinfo``), so a
   container sees its own limit, not the host's;
2. Linux system-wide PSI (``/proc/pressure/memory``);
3. macOS ``kern.memorystatus_vm_pressure_level`` (1 normal, 2 warning, 4 critical);
4. psutil, when installed: share of RAM in use.

It never raises: with no source the level is ``unknown``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from agentguard._exports import publish

from . import _clock
from .config import GuardConfig, MemoryPressureConfig
from .events import Emitter, Hook, MemoryPressureChanged

__all__ = ["MemoryPressureProbe", "PressureLevel", "PressureReading", "parse_psi"]

ReadFile = Callable[[str], str]
Sysctl = Callable[[str], int | None]


class PressureLevel(enum.IntEnum):
    """How much memory pressure the host is under.

    ``UNKNOWN`` (no source) sorts lowest, so ``level >= WARNING`` is false without data.
    """

    UNKNOWN = -1
    NORMAL = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class PressureReading:
    """One probe of the host.

    Attributes:
        level: the pressure level.
        source: where it came from (``cgroup``, ``psi``, ``macos``, ``psutil`` or ``none``).
        metrics: the raw numbers read (e.g. ``some_avg10``, ``full_avg10``, ``percent``).
        sustained_for: seconds the level has continuously been at least ``WARNING``.
    """

    level: PressureLevel
    source: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    sustained_for: float = 0.0


def parse_psi(text: str) -> dict[str, float]:
    """Parse PSI text (``some avg10=1.00 avg60=...`` / ``full ...``) into ``some_avg10`` etc.

    Unparseable lines are ignored; the result may be empty.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind not in ("some", "full"):
            continue
        for pair in rest.split():
            key, _, value = pair.partition("=")
            if key.startswith("avg"):
                try:
                    number = float(value)
                except ValueError:
                    continue
                if 0.0 <= number <= 100.0:  # a percentage (also rules out NaN)
                    out[f"{kind}_{key}"] = number
    return out


def _read_file(path: str) -> str:
    return Path(path).read_text(encoding="ascii", errors="replace")


def _sysctl(name: str) -> int | None:
    """An integer sysctl on macOS/BSD: through libc, else the ``sysctl`` command."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        try:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            value = ctypes.c_int(0)
            size = ctypes.c_size_t(ctypes.sizeof(value))
            rc = libc.sysctlbyname(
                name.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)
            )
            if rc == 0:
                return int(value.value)
        except (OSError, AttributeError):
            pass
    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=2, check=True
        ).stdout
        return int(out.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _cgroup_pressure_path(read_file: ReadFile) -> str | None:
    """The ``memory.pressure`` file of this process's cgroup v2, or ``None``."""
    try:
        cgroup = read_file("/proc/self/cgroup")
        mountinfo = read_file("/proc/self/mountinfo")
    except OSError:
        return None
    rel = None
    for line in cgroup.splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip()
            break
    if rel is None:
        return None
    mount = None
    for line in mountinfo.splitlines():
        # "<id> <parent> <maj:min> <root> <mount point> <options> ... - <fstype> <source> ..."
        head, sep, tail = line.partition(" - ")
        if sep and tail.split(" ", 1)[0] == "cgroup2":
            fields = head.split()
            if len(fields) >= 5:
                mount = fields[4]
                break
    if mount is None:
        return None
    return f"{mount.rstrip('/')}/{rel.strip('/')}/memory.pressure".replace("//", "/")


class MemoryPressureProbe:
    """Reads the host's memory pressure and tracks how long it has lasted.

    Args:
        config: a :class:`GuardConfig` (its ``memory_pressure`` section), the section alone,
            or ``None`` for the defaults.
        clock: monotonic seconds (injected in tests).
        read_file: reads a file's text (injected in tests; raises ``OSError`` when missing).
        sysctl: reads an integer sysctl by name, ``None`` when absent (injected in tests).
        psutil_module: the ``psutil`` module, or ``None`` to import it when needed; pass
            ``False`` to never use it.
        platform: ``sys.platform`` (injected in tests).
        hooks: event hooks.
    """

    def __init__(
        self,
        config: GuardConfig | MemoryPressureConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        read_file: ReadFile | None = None,
        sysctl: Sysctl | None = None,
        psutil_module: ModuleType | bool | None = None,
        platform: str | None = None,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        if isinstance(config, MemoryPressureConfig):
            self._config = config
        else:
            self._config = (config or GuardConfig()).memory_pressure
        self._clock = clock or _clock.monotonic
        self._read_file = read_file or _read_file
        self._sysctl = sysctl or _sysctl
        self._psutil = psutil_module
        self._platform = platform or sys.platform
        self._emitter = Emitter(hooks)
        self._source: tuple[str, Callable[[], dict[str, float] | None]] | None = None
        self._level = PressureLevel.UNKNOWN
        self._since: float | None = None  # when the level first reached WARNING, continuously

    @property
    def config(self) -> MemoryPressureConfig:
        """The settings in force."""
        return self._config

    # -- sources ------------------------------------------------------------------------------

    def _sources(self) -> list[tuple[str, Callable[[], dict[str, float] | None]]]:
        sources: list[tuple[str, Callable[[], dict[str, float] | None]]] = []
        if self._platform.startswith("linux"):
            path = _cgroup_pressure_path(self._read_file)
            if path is not None:
                sources.append(("cgroup", lambda p=path: self._psi(p)))  # type: ignore[misc]
            sources.append(("psi", lambda: self._psi("/proc/pressure/memory")))
        if self._platform == "darwin":
            sources.append(("macos", self._macos))
        if self._psutil is not False:
            sources.append(("psutil", self._from_psutil))
        return sources

    def _psi(self, path: str) -> dict[str, float] | None:
        try:
            metrics = parse_psi(self._read_file(path))
        except OSError:
            return None
        return metrics if "some_avg10" in metrics else None

    def _macos(self) -> dict[str, float] | None:
        value = self._sysctl("kern.memorystatus_vm_pressure_level")
        return None if value is None else {"vm_pressure_level": float(value)}

    def _from_psutil(self) -> dict[str, float] | None:
        module = self._psutil
        if module is None or module is True:
            try:
                import psutil  # noqa: PLC0415 - optional, imported on first use
            except ImportError:
                return None
            module = psutil
        try:
            memory = module.virtual_memory()  # type: ignore[union-attr]
            metrics = {"percent": float(memory.percent)}
            swap = module.swap_memory()  # type: ignore[union-attr]
            metrics["swap_percent"] = float(swap.percent)
        except Exception:  # psutil raises platform-specific errors
            return None
        return metrics

    def _classify(self, source: str, m: Mapping[str, float]) -> PressureLevel:
        cfg = self._config
        if source in ("cgroup", "psi"):
            some, full = m.get("some_avg10", 0.0), m.get("full_avg10", 0.0)
            if some >= cfg.psi_some_critical or full >= cfg.psi_full_critical:
                return PressureLevel.CRITICAL
            return PressureLevel.WARNING if some >= cfg.psi_some_warning else PressureLevel.NORMAL
        if source == "macos":
            return {
                1: PressureLevel.NORMAL,
                2: PressureLevel.WARNING,
                4: PressureLevel.CRITICAL,
            }.get(int(m["vm_pressure_level"]), PressureLevel.UNKNOWN)
        percent = m.get("percent", 0.0)
        if percent >= cfg.percent_critical:
            return PressureLevel.CRITICAL
        return PressureLevel.WARNING if percent >= cfg.percent_warning else PressureLevel.NORMAL

    def _read(self) -> tuple[str, dict[str, float]] | None:
        if self._source is not None:
            name, read = self._source
            metrics = read()
            if metrics is not None:
                return name, metrics
            self._source = None  # the source went away: look again
        for name, read in self._sources():
            metrics = read()
            if metrics is not None:
                self._source = (name, read)
                return name, metrics
        return None

    # -- the API ------------------------------------------------------------------------------

    def reading(self) -> PressureReading:
        """Probe the host now and return the full reading (never raises)."""
        if not self._config.enabled:
            return PressureReading(PressureLevel.UNKNOWN, "disabled")
        try:
            found = self._read()
        except Exception:  # a probe must never break the agent
            found = None
        metrics: dict[str, float] = {}
        if found is None:
            source, level = "none", PressureLevel.UNKNOWN
        else:
            source, metrics = found
            level = self._classify(source, metrics)
        now = self._clock()
        if level >= PressureLevel.WARNING:
            if self._since is None:
                self._since = now
        else:
            self._since = None
        if level != self._level:
            previous, self._level = self._level, level
            self._emitter.emit(
                MemoryPressureChanged(pressure=str(level), previous=str(previous), source=source)
            )
        return PressureReading(level, source, metrics, self._sustained_for(now))

    def level(self) -> PressureLevel:
        """Probe the host now and return its pressure level."""
        return self.reading().level

    def _sustained_for(self, now: float) -> float:
        return 0.0 if self._since is None else max(0.0, now - self._since)

    def sustained_for(self) -> float:
        """Seconds the level has continuously been at least WARNING, as of the last probe."""
        return self._sustained_for(self._clock())

    def sustained(self) -> bool:
        """Whether pressure has lasted at least ``sustained_seconds`` (as of the last probe)."""
        return self._since is not None and self.sustained_for() >= self._config.sustained_seconds

    def __repr__(self) -> str:
        source = self._source[0] if self._source else "unprobed"
        return f"MemoryPressureProbe(level={self._level}, source={source})"


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
