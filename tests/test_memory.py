"""MemoryPressureProbe: every platform path through injected readers, and sustained tracking."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard import GuardConfig
from agentguard.config import MemoryPressureConfig
from agentguard.events import MemoryPressureChanged
from agentguard.pressure import MemoryPressureProbe, PressureLevel, parse_psi
from agentguard.testing import FakeClock, capture_events

CGROUP_V2 = "0::/system.slice/agent.service\n"
CGROUP_HYBRID = "4:memory:/docker/abc\n1:cpu:/\n0::/\n"
CGROUP_V1 = "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n"
MOUNTINFO = (
    "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
    "30 22 0:26 / /run/cg2 rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"
)
MOUNTINFO_V1 = (
    "22 1 0:21 / /sys rw - sysfs sysfs rw\n"
    "31 22 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
)


def psi(some: float, full: float = 0.0) -> str:
    return (
        f"some avg10={some:.2f} avg60=1.00 avg300=0.50 total=12345\n"
        f"full avg10={full:.2f} avg60=0.00 avg300=0.00 total=100\n"
    )


def files(mapping: dict[str, str]) -> Callable[[str], str]:
    def read(path: str) -> str:
        if path not in mapping:
            raise FileNotFoundError(path)
        return mapping[path]

    return read


def linux(
    mapping: dict[str, str], clock: FakeClock | None = None, **cfg: Any
) -> MemoryPressureProbe:
    return MemoryPressureProbe(
        MemoryPressureConfig(**cfg),
        clock=clock or FakeClock(),
        read_file=files(mapping),
        psutil_module=False,
        platform="linux",
    )


def test_cgroup_v2_pressure_is_found_through_mountinfo() -> None:
    """The process's own cgroup file is read, at the mount point mountinfo names."""
    probe = linux(
        {
            "/proc/self/cgroup": CGROUP_V2,
            "/proc/self/mountinfo": MOUNTINFO,
            "/run/cg2/system.slice/agent.service/memory.pressure": psi(12.0),
            "/proc/pressure/memory": psi(0.0),
        }
    )
    reading = probe.reading()
    assert reading.source == "cgroup"
    assert reading.level == PressureLevel.WARNING
    assert reading.metrics["some_avg10"] == 12.0


def test_root_cgroup_on_hybrid_host() -> None:
    """A hybrid host with '0::/' resolves to the cgroup2 mount's own memory.pressure."""
    probe = linux(
        {
            "/proc/self/cgroup": CGROUP_HYBRID,
            "/proc/self/mountinfo": MOUNTINFO,
            "/run/cg2/memory.pressure": psi(40.0),
        }
    )
    assert probe.reading().source == "cgroup"
    assert probe.level() == PressureLevel.CRITICAL


def test_cgroup_v1_host_falls_back_to_system_psi() -> None:
    """Without cgroup v2 the system-wide PSI file is used."""
    probe = linux(
        {
            "/proc/self/cgroup": CGROUP_V1,
            "/proc/self/mountinfo": MOUNTINFO_V1,
            "/proc/pressure/memory": psi(1.0),
        }
    )
    reading = probe.reading()
    assert (reading.source, reading.level) == ("psi", PressureLevel.NORMAL)


def test_full_stall_is_critical_even_with_low_some() -> None:
    """Time when every task stalls on memory is critical on its own."""
    probe = linux({"/proc/pressure/memory": psi(6.0, full=7.0)})
    assert probe.level() == PressureLevel.CRITICAL


def test_thresholds_are_configurable() -> None:
    """Lower thresholds warn earlier."""
    probe = linux({"/proc/pressure/memory": psi(3.0)}, psi_some_warning=2.0)
    assert probe.level() == PressureLevel.WARNING


def test_no_source_is_unknown_not_an_error() -> None:
    """With nothing to read the level is unknown, and nothing raises."""
    probe = linux({})
    reading = probe.reading()
    assert (reading.level, reading.source) == (PressureLevel.UNKNOWN, "none")
    assert not probe.sustained()


@pytest.mark.parametrize(
    ("value", "level"),
    [
        (1, PressureLevel.NORMAL),
        (2, PressureLevel.WARNING),
        (4, PressureLevel.CRITICAL),
        (7, PressureLevel.UNKNOWN),
    ],
)
def test_macos_pressure_levels(value: int, level: PressureLevel) -> None:
    """kern.memorystatus_vm_pressure_level 1/2/4 maps to normal/warning/critical."""
    probe = MemoryPressureProbe(
        clock=FakeClock(),
        sysctl=lambda name: value if name == "kern.memorystatus_vm_pressure_level" else None,
        psutil_module=False,
        platform="darwin",
    )
    reading = probe.reading()
    assert reading.source == "macos"
    assert reading.level == level


def test_psutil_fallback() -> None:
    """Elsewhere psutil's share of RAM in use decides."""
    fake = SimpleNamespace(
        virtual_memory=lambda: SimpleNamespace(percent=95.0),
        swap_memory=lambda: SimpleNamespace(percent=40.0),
    )
    probe = MemoryPressureProbe(clock=FakeClock(), psutil_module=fake, platform="win32")  # type: ignore[arg-type]
    reading = probe.reading()
    assert (reading.source, reading.level) == ("psutil", PressureLevel.WARNING)
    assert reading.metrics["swap_percent"] == 40.0


def test_broken_psutil_is_unknown() -> None:
    """A psutil that raises gives unknown, not an exception."""

    def boom() -> Any:
        raise RuntimeError("no /proc")

    fake = SimpleNamespace(virtual_memory=boom, swap_memory=boom)
    probe = MemoryPressureProbe(clock=FakeClock(), psutil_module=fake, platform="win32")  # type: ignore[arg-type]
    assert probe.level() == PressureLevel.UNKNOWN


def test_sustained_only_after_continuous_pressure() -> None:
    """Pressure counts as sustained after sustained_seconds without a break."""
    clock = FakeClock(0)
    mapping = {"/proc/pressure/memory": psi(15.0)}
    probe = linux(mapping, clock=clock, sustained_seconds=60)
    probe.level()
    clock.advance(59)
    probe.level()
    assert probe.sustained_for() == 59
    assert not probe.sustained()
    clock.advance(1)
    probe.level()
    assert probe.sustained()


def test_flicker_resets_the_timer() -> None:
    """A normal reading in between starts the count again."""
    clock = FakeClock(0)
    mapping = {"/proc/pressure/memory": psi(15.0)}
    probe = linux(mapping, clock=clock, sustained_seconds=60)
    probe.level()
    clock.advance(50)
    mapping["/proc/pressure/memory"] = psi(0.0)
    probe.level()
    mapping["/proc/pressure/memory"] = psi(15.0)
    clock.advance(1)
    probe.level()
    clock.advance(30)
    assert probe.sustained_for() == 30
    assert not probe.sustained()


def test_warning_to_critical_keeps_the_timer() -> None:
    """Moving between warning and critical is still continuous pressure."""
    clock = FakeClock(0)
    mapping = {"/proc/pressure/memory": psi(15.0)}
    probe = linux(mapping, clock=clock)
    probe.level()
    clock.advance(40)
    mapping["/proc/pressure/memory"] = psi(50.0)
    assert probe.reading().sustained_for == 40


def test_level_changes_are_events() -> None:
    """Each change of level emits one MemoryPressureChanged; no change, no event."""
    mapping = {"/proc/pressure/memory": psi(0.0)}
    probe = linux(mapping)
    with capture_events() as events:
        probe.level()
        probe.level()
        mapping["/proc/pressure/memory"] = psi(35.0)
        probe.level()
    changes = events.of_type(MemoryPressureChanged)
    assert [(e.previous, e.pressure) for e in changes] == [
        ("unknown", "normal"),
        ("normal", "critical"),
    ]
    assert changes[-1].source == "psi"


def test_source_that_disappears_is_replaced() -> None:
    """When the cached source stops answering the probe looks for another."""
    mapping = {
        "/proc/self/cgroup": CGROUP_V2,
        "/proc/self/mountinfo": MOUNTINFO,
        "/run/cg2/system.slice/agent.service/memory.pressure": psi(1.0),
        "/proc/pressure/memory": psi(20.0),
    }
    probe = linux(mapping)
    assert probe.reading().source == "cgroup"
    del mapping["/run/cg2/system.slice/agent.service/memory.pressure"]
    reading = probe.reading()
    assert (reading.source, reading.level) == ("psi", PressureLevel.WARNING)


def test_disabled_probe_reads_nothing() -> None:
    """enabled: false never touches the system."""

    def forbidden(path: str) -> str:
        raise AssertionError(path)

    probe = MemoryPressureProbe(
        GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={}), read_file=forbidden
    )
    assert probe.reading().source == "disabled"


def test_config_rejects_inverted_thresholds() -> None:
    """warning above critical is a configuration error."""
    from agentguard import ConfigError

    with pytest.raises(ConfigError, match="psi_some_warning"):
        GuardConfig.from_dict(
            {"memory_pressure": {"psi_some_warning": 50, "psi_some_critical": 20}}, env={}
        )


def test_real_machine_never_raises() -> None:
    """On this machine the probe gives a level, whatever sources exist."""
    reading = MemoryPressureProbe().reading()
    assert isinstance(reading.level, PressureLevel)
    assert reading.source in {"cgroup", "psi", "macos", "psutil", "none"}


def test_levels_order_and_names() -> None:
    """UNKNOWN sorts lowest; names print in lowercase."""
    assert (
        PressureLevel.UNKNOWN
        < PressureLevel.NORMAL
        < PressureLevel.WARNING
        < PressureLevel.CRITICAL
    )
    assert str(PressureLevel.CRITICAL) == "critical"


@given(st.text())
def test_psi_parser_never_raises(text: str) -> None:
    """Any text parses to a (possibly empty) dict of percentages."""
    metrics = parse_psi(text)
    assert all(0.0 <= v <= 100.0 for v in metrics.values())


@given(st.text())
def test_garbage_psi_file_is_unknown_or_a_level(text: str) -> None:
    """A garbage PSI file never raises; without a 'some avg10' value the level is unknown."""
    probe = linux({"/proc/pressure/memory": text})
    level = probe.level()
    if "some_avg10" not in parse_psi(text):
        assert level == PressureLevel.UNKNOWN
