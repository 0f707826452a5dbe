"""CircuitBreaker: transitions, ignored errors, probes; a hypothesis state machine."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from agentguard.events import BreakerStateChanged
from agentguard.resilience import BreakerState, CircuitBreaker, Classification, ErrorClass
from agentguard.storage import MemoryStore
from agentguard.testing import FakeClock, capture_events

CLIENT = Classification.of(ErrorClass.CLIENT_ERROR)
SERVER = Classification.of(ErrorClass.TRANSIENT)


def _breaker(clock: FakeClock, **kw: object) -> CircuitBreaker:
    options: dict[str, object] = {"failure_rate": 0.5, "min_calls": 4, "window": 60, "open_for": 30}
    options.update(kw)
    return CircuitBreaker("tier:fast", clock=clock, **options)  # type: ignore[arg-type]


def test_opens_on_failure_rate_after_min_calls() -> None:
    """Failures below min_calls never trip it; the rate does once enough calls are seen."""
    clock = FakeClock(0)
    breaker = _breaker(clock)
    for _ in range(3):
        breaker.record_failure(SERVER)
    assert breaker.state == BreakerState.CLOSED  # 3 < min_calls
    breaker.record_failure(SERVER)
    assert breaker.state == BreakerState.OPEN
    decision = breaker.allow()
    assert not decision.allowed
    assert decision.retry_at == 30


def test_healthy_mix_stays_closed() -> None:
    """A failure rate under the threshold keeps the breaker closed."""
    clock = FakeClock(0)
    breaker = _breaker(clock)
    for _ in range(10):
        breaker.record_success()
        breaker.record_success()
        breaker.record_failure(SERVER)
    assert breaker.state == BreakerState.CLOSED
    assert breaker.snapshot().failure_rate == pytest.approx(1 / 3)


def test_old_failures_leave_the_window() -> None:
    """Failures older than the window no longer count."""
    clock = FakeClock(0)
    breaker = _breaker(clock)
    for _ in range(3):
        breaker.record_failure(SERVER)
    clock.advance(61)
    breaker.record_failure(SERVER)
    assert breaker.state == BreakerState.CLOSED
    assert breaker.snapshot().calls == 1


def test_half_open_probe_closes_or_reopens() -> None:
    """After open_for one probe is let through: success closes, failure re-opens."""
    clock = FakeClock(0)
    breaker = _breaker(clock)
    for _ in range(4):
        breaker.record_failure(SERVER)
    clock.advance(30)
    assert breaker.state == BreakerState.HALF_OPEN
    probe = breaker.allow()
    assert probe.allowed
    assert probe.probe
    assert not breaker.allow().allowed  # only one probe at a time
    breaker.record_failure(SERVER)
    assert breaker.state == BreakerState.OPEN
    clock.advance(30)
    assert breaker.allow().allowed
    breaker.record_success()
    assert breaker.state == BreakerState.CLOSED


def test_an_ignored_end_frees_a_probes_slot() -> None:
    """A probe that ends with no outcome (its stream closed, the call cancelled) counts as
    neither success nor failure, and its slot is given out again: kept, the breaker would stay
    half-open with no probe ever let through."""
    clock = FakeClock(0)
    breaker = _breaker(clock)
    for _ in range(4):
        breaker.record_failure(SERVER)
    clock.advance(30)
    assert breaker.allow().probe
    assert not breaker.allow().allowed
    breaker.record_ignored()
    assert breaker.state == BreakerState.HALF_OPEN
    assert breaker.allow().probe
    breaker.record_success()
    assert breaker.state == BreakerState.CLOSED
    breaker.record_ignored()  # closed: nothing counted
    assert breaker.snapshot().calls == 0


def test_an_ignored_end_frees_a_probes_slot_in_a_store() -> None:
    """The async twin, on a breaker kept in a store."""
    clock = FakeClock(0)
    breaker = _breaker(clock, store=MemoryStore())

    async def go() -> None:
        for _ in range(4):
            await breaker.arecord_failure(SERVER)
        clock.advance(30)
        assert (await breaker.aallow()).probe
        assert not (await breaker.aallow()).allowed
        await breaker.arecord_ignored()
        assert (await breaker.aallow()).probe

    anyio.run(go)


def test_an_unreported_probe_lapses_with_a_lease_in_memory() -> None:
    """With ``probe_lease``, an in-memory breaker's probe that never reports stops counting."""
    clock = FakeClock(0)
    breaker = _breaker(clock, probe_lease=10)
    for _ in range(4):
        breaker.record_failure(SERVER)
    clock.advance(30)
    assert breaker.allow().probe
    clock.advance(9)
    assert not breaker.allow().allowed
    clock.advance(1)
    assert breaker.allow().probe


def test_client_errors_count_as_neither() -> None:
    """A bad request says nothing about the health of the endpoint."""
    clock = FakeClock(0)
    breaker = _breaker(clock)
    for _ in range(20):
        breaker.record_failure(CLIENT)
    assert breaker.state == BreakerState.CLOSED
    assert breaker.snapshot().calls == 0


def test_state_changes_are_events() -> None:
    """Every transition emits a breaker_state_changed event."""
    clock = FakeClock(0)
    breaker = _breaker(clock)
    with capture_events() as events:
        for _ in range(4):
            breaker.record_failure(SERVER)
        clock.advance(30)
        breaker.allow()
        breaker.record_success()
    changes = [(e.previous, e.state) for e in events.of_type(BreakerStateChanged)]
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_bad_arguments() -> None:
    """Impossible settings fail at construction."""
    with pytest.raises(ValueError, match="failure_rate"):
        CircuitBreaker(failure_rate=0)
    with pytest.raises(ValueError, match="min_calls"):
        CircuitBreaker(min_calls=0)


class BreakerMachine(RuleBasedStateMachine):
    """Random calls, outcomes and time: the breaker's invariants always hold."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0)
        self.breaker = CircuitBreaker(
            clock=self.clock,
            min_calls=3,
            failure_rate=0.5,
            window=10,
            open_for=5,
            half_open_probes=2,
        )
        self.probes = 0

    @rule()
    def allow(self) -> None:
        state = self.breaker.state
        decision = self.breaker.allow()
        if state == BreakerState.OPEN:
            assert not decision.allowed
            assert decision.retry_at is not None
            assert self.clock() < decision.retry_at
        if decision.probe:
            self.probes += 1
        elif self.breaker.state == BreakerState.HALF_OPEN:
            assert self.probes == 2  # a half-open breaker refuses only with every slot taken
        assert self.probes <= 2

    @rule(ok=st.booleans(), client=st.booleans())
    def outcome(self, ok: bool, client: bool) -> None:
        before = self.breaker.state
        if ok:
            self.breaker.record_success()
        elif client:
            self.breaker.record_failure(CLIENT)
            if before == BreakerState.CLOSED:
                assert self.breaker.state == BreakerState.CLOSED
        else:
            self.breaker.record_failure(SERVER)
            snap = self.breaker.snapshot()
            if before == BreakerState.CLOSED and snap.calls >= 3 and snap.failure_rate >= 0.5:
                # The rate is judged when a failure is recorded: one that crosses it trips.
                assert snap.state == BreakerState.OPEN
        if self.breaker.state != BreakerState.HALF_OPEN or before != BreakerState.HALF_OPEN:
            self.probes = 0
        else:
            self.probes = max(0, self.probes - 1)

    @rule()
    def ignored(self) -> None:
        """A call that ended with no outcome (abandoned, cancelled, rate limited)."""
        before = self.breaker.snapshot()
        self.breaker.record_ignored()
        after = self.breaker.snapshot()
        assert after.state == before.state  # neither a success nor a failure moves it
        assert (after.calls, after.failures) == (before.calls, before.failures)
        if after.state == BreakerState.HALF_OPEN:
            self.probes = max(0, self.probes - 1)  # its slot is free again
        else:
            self.probes = 0

    @rule(seconds=st.floats(min_value=0, max_value=20))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)
        if self.breaker.state != BreakerState.HALF_OPEN:
            self.probes = 0

    @invariant()
    def open_has_a_probe_time(self) -> None:
        snap = self.breaker.snapshot()
        assert (snap.state == BreakerState.OPEN) == (snap.retry_at is not None) or (
            snap.state == BreakerState.HALF_OPEN
        )


TestBreakerMachine = BreakerMachine.TestCase
