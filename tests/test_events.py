"""Events and hooks: per-instance hooks, process hooks, logging, failure isolation."""

from __future__ import annotations

import logging
from dataclasses import FrozenInstanceError

import pytest

from agentguard.events import Emitter, Event, GuardInternalError, add_hook, remove_hook
from agentguard.testing import capture_events


def _event() -> GuardInternalError:
    return GuardInternalError(
        session="s1", component="loops", error_type="KeyError", message="boom"
    )


def test_events_are_frozen_data() -> None:
    """Events cannot be mutated and serialise to plain data with their kind."""
    event = _event()
    with pytest.raises(FrozenInstanceError):
        event.session = "other"  # type: ignore[misc]
    assert event.to_dict() == {
        "kind": "guard_internal_error",
        "session": "s1",
        "component": "loops",
        "error_type": "KeyError",
        "message": "boom",
    }


def test_instance_hooks_run_before_process_hooks() -> None:
    """An emitter calls its own hooks, then the process-wide ones."""
    order: list[str] = []

    def process_hook(event: Event) -> None:
        order.append("process")

    add_hook(process_hook)
    try:
        Emitter([lambda e: order.append("instance")]).emit(_event())
    finally:
        remove_hook(process_hook)
    assert order == ["instance", "process"]


def test_use_defaults_false_skips_process_hooks() -> None:
    """An emitter can opt out of the process-wide hooks."""
    seen: list[Event] = []
    with capture_events() as captured:
        Emitter([seen.append], use_defaults=False).emit(_event())
    assert len(seen) == 1
    assert captured == []


def test_failing_hook_is_logged_and_does_not_stop_others(caplog: pytest.LogCaptureFixture) -> None:
    """A hook that raises never breaks the caller, and later hooks still run."""
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("hook bug")

    with caplog.at_level(logging.WARNING, logger="agentguard"):
        Emitter([broken, seen.append], use_defaults=False).emit(_event())
    assert len(seen) == 1
    assert "hook" in caplog.text


def test_default_hook_logs_through_stdlib_logging(caplog: pytest.LogCaptureFixture) -> None:
    """The process default logs each event on the 'agentguard' logger at the event's level."""
    with caplog.at_level(logging.INFO, logger="agentguard"):
        Emitter().emit(_event())
    (record,) = [r for r in caplog.records if r.name == "agentguard"]
    assert record.levelno == logging.ERROR
    assert "guard_internal_error" in record.getMessage()
    assert record.agentguard_event == _event()  # type: ignore[attr-defined]


def test_capture_events_collects_and_filters() -> None:
    """capture_events() sees every emitted event and filters by type."""
    with capture_events() as events:
        Emitter().emit(_event())
    assert events.kinds() == ["guard_internal_error"]
    assert events.of_type(GuardInternalError) == [_event()]


def test_remove_hook_is_idempotent() -> None:
    """Removing a hook that is not registered is harmless."""

    def hook(event: Event) -> None:
        return None

    remove_hook(hook)


def test_every_event_kind_is_in_the_reference() -> None:
    """docs/events.md's reference table names every event kind and class the package emits."""
    import re
    from pathlib import Path

    import agentguard.events as events_module

    kinds = {
        cls.kind: f"agentguard.events.{cls.__name__}"
        for cls in vars(events_module).values()
        if isinstance(cls, type) and issubclass(cls, Event) and cls is not Event
    }
    page = (Path(__file__).resolve().parent.parent / "docs" / "events.md").read_text("utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| `([\w.]+)` \|", page, flags=re.MULTILINE))
    assert rows == kinds
