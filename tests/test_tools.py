"""ToolGuard: timeouts, classification, retries, budgets, breakers, idempotency, fallbacks, hand-off.

Time, sleep and jitter are injected (FakeClock, seeded Random); nothing here really waits except
the two tests that prove a real timeout fires (10 ms each).
"""

from __future__ import annotations

import concurrent.futures
import email.utils
import os
import random
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from _stores import RedisServer, run_tool_workers
from agentguard import GuardConfig
from agentguard.events import (
    BreakerStateChanged,
    HandOffRequested,
    RetryBudgetExhausted,
    ToolCallFailed,
    ToolCallRefused,
    ToolCallReplayed,
    ToolCallRetried,
    ToolCallStarted,
    ToolCallSucceeded,
    ToolDeadLettered,
    ToolFallbackUsed,
)
from agentguard.exceptions import ModelError, StoreError
from agentguard.resilience import Classification, ErrorClass, RetryPolicy
from agentguard.storage import MemoryStore, RedisStore, Store
from agentguard.testing import CapturedEvents, FakeClock, capture_events
from agentguard.tools import Default, HandOff, ToolGuard, ToolOutcome
from agentguard.tools._run import DaemonPool, _Job


def _error(status: int, **headers: str) -> ModelError:
    return ModelError(f"HTTP {status}", status_code=status, headers=headers)


class Script:
    """A tool that raises or returns the next scripted item on each call."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, BaseException):
            raise step
        return step


def _guard(clock: FakeClock, config: dict[str, Any] | None = None, **kw: Any) -> ToolGuard:
    options: dict[str, Any] = {
        "clock": clock,
        "sleep": clock.sleep,
        "asleep": clock.asleep,
        "rng": random.Random(7),
        "hooks": (),
    }
    options.update(kw)
    cfg = GuardConfig.from_dict({"tools": {"sync_timeouts": False, **(config or {})}}, env={})
    return ToolGuard(cfg, **options)


@pytest.fixture
def events() -> Iterator[CapturedEvents]:
    """Every event emitted during the test."""
    with capture_events() as captured:
        yield captured


# -- registration and the happy path --------------------------------------------------------


def test_decorated_tool_returns_its_value_and_emits_start_and_success(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """A guarded call of a healthy tool returns its value, once, with two events."""
    tools = _guard(clock)

    @tools.tool(criticality="blocking")
    def search(query: str) -> str:
        return f"found {query}"

    outcome = tools.call("search", {"query": "x"})
    assert (outcome.ok, outcome.value, outcome.attempts, outcome.error) == (
        True,
        "found x",
        1,
        None,
    )
    assert search(query="y") == "found y"  # the decorator returns the function itself
    assert [type(e) for e in events] == [ToolCallStarted, ToolCallSucceeded]
    assert outcome.to_message("call_1") == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "found x",
    }


def test_json_arguments_are_decoded_and_bad_ones_are_a_client_error(clock: FakeClock) -> None:
    """Arguments may be a JSON object text; anything else is reported, not raised."""
    tools = _guard(clock)
    tools.register(lambda n: n * 2, name="double")
    assert tools.call("double", '{"n": 21}').value == 42
    bad = tools.call("double", "[1, 2]")
    assert bad.error is not None
    assert bad.error.kind == "client_error"


def test_unknown_tool_names_the_closest_tools(clock: FakeClock, events: CapturedEvents) -> None:
    """A hallucinated name is refused with the closest registered names."""
    tools = _guard(clock)
    tools.register(lambda: 1, name="search_web")
    tools.register(lambda: 1, name="read_file")
    outcome = tools.call("search_webs", {})
    assert outcome.error is not None
    assert outcome.error.kind == "unknown_tool"
    assert "search_web" in outcome.error.message
    assert events.of_type(ToolCallRefused)[0].reason == "unknown_tool"


# -- classification and retries ---------------------------------------------------------------


def test_transient_errors_are_retried_with_seeded_full_jitter(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """503s are retried; each wait is the full-jitter draw of the same seeded RNG."""
    tools = _guard(clock)
    tool = Script(_error(503), _error(502), "ok")
    tools.register(tool, name="fetch")
    outcome = tools.call("fetch", {})
    assert (outcome.ok, outcome.attempts) == (True, 3)
    expected = RetryPolicy(rng=random.Random(7))
    assert clock.sleeps == [expected.backoff(0), expected.backoff(1)]
    assert 0 <= clock.sleeps[0] <= 0.5
    assert 0 <= clock.sleeps[1] <= 1.0
    assert [e.attempt for e in events.of_type(ToolCallRetried)] == [1, 2]
    assert outcome.elapsed == pytest.approx(sum(clock.sleeps))


def test_retry_after_is_honoured_up_to_the_cap(clock: FakeClock) -> None:
    """A 429's Retry-After is the wait; one beyond max_retry_after fails at once, with the delay."""
    tools = _guard(clock, {"retry": {"max_retry_after_seconds": 10}})
    tools.register(Script(_error(429, **{"retry-after": "4"}), "ok"), name="api")
    assert tools.call("api", {}).ok
    assert clock.sleeps == [4.0]
    tools.register(Script(_error(429, **{"retry-after": "60"}), "ok"), name="slow")
    outcome = tools.call("slow", {})
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.retry_after, outcome.attempts) == (
        "rate_limited",
        60.0,
        1,
    )
    assert "wait 60s" in outcome.error.message
    assert clock.sleeps == [4.0]


def test_an_http_date_retry_after_is_a_wait_until_then(clock: FakeClock) -> None:
    """``Retry-After`` as an HTTP date (nginx, Cloudflare, gateways send it) is read on the
    guard's clock: the wait is until that date, not a quick backoff."""
    tools = _guard(clock)
    soon = email.utils.formatdate(clock() + 5, usegmt=True)
    tools.register(Script(_error(429, **{"retry-after": soon}), "ok"), name="api")
    assert tools.call("api", {}).ok
    assert clock.sleeps == [5.0]


def test_client_errors_are_never_retried(clock: FakeClock) -> None:
    """A 400 goes straight back to the model, saying retrying will not help."""
    tools = _guard(clock)
    tool = Script(_error(400))
    tools.register(tool, name="api")
    outcome = tools.call("api", {"q": 1})
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.retryable, len(tool.calls)) == (
        "client_error",
        False,
        1,
    )
    assert "fix the arguments" in outcome.error.message
    assert clock.sleeps == []


@pytest.mark.parametrize("lib", ["httpx", "httpx2"])
def test_http_library_errors_are_understood(clock: FakeClock, lib: str) -> None:
    """httpx and httpx2 timeouts and status errors are classified without any set-up."""
    http = pytest.importorskip(lib)
    request = http.Request("GET", "http://tool.invalid/")
    response = http.Response(429, headers={"Retry-After": "2"}, request=request)
    tools = _guard(clock)
    tools.register(
        Script(
            http.ReadTimeout("slow", request=request),
            http.HTTPStatusError("429", request=request, response=response),
            "ok",
        ),
        name="web",
    )
    assert tools.call("web", {}).ok
    assert clock.sleeps[1] == 2.0


def test_pluggable_classifiers_go_first(clock: FakeClock) -> None:
    """A tool's own classifier decides before the built-in rules."""
    tools = _guard(clock)

    def quota(exc: BaseException) -> Classification | None:
        if "quota" in str(exc):
            return Classification.of(ErrorClass.CLIENT_ERROR, reason="quota exhausted")
        return None

    tools.register(Script(ConnectionError("quota")), name="api", classifiers=[quota])
    outcome = tools.call("api", {})
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.attempts) == ("client_error", 1)


def test_side_effecting_tools_are_retried_only_when_safe(clock: FakeClock) -> None:
    """A side-effecting tool without a key or idempotency is not retried on a 503, only on 429."""
    tools = _guard(clock)
    tool = Script(_error(503), _error(429, **{"retry-after": "1"}), "sent")

    def send(to: str) -> Any:  # takes no idempotency key: a retry could send twice
        return tool(to=to)

    tools.register(send, side_effecting=True)
    assert tools.call("send", {"to": "a"}).error is not None
    assert len(tool.calls) == 1
    assert tools.call("send", {"to": "a"}).ok  # the 429 refused before any work: retried
    assert len(tool.calls) == 3


def test_a_result_that_no_longer_matches_its_schema_is_a_schema_error(
    clock: FakeClock,
) -> None:
    """Schema drift is caught (not passed on), not retried, and counts against the breaker."""
    schema = {"type": "object", "required": ["price"], "properties": {"price": {"type": "number"}}}
    tools = _guard(clock)
    tool = Script({"cost": 3})
    tools.register(tool, name="quote", result_schema=schema)
    outcome = tools.call("quote", {})
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.value, len(tool.calls)) == ("schema", None, 1)
    assert "price" in outcome.error.message
    assert tools.breaker("quote").snapshot().failures == 1
    tools.register(Script({"price": 2}), name="good", result_schema=schema)
    assert tools.call("good", {}).value == {"price": 2}


# -- the retry budget per turn ------------------------------------------------------------------


def test_retry_budget_is_shared_by_the_turn_and_exhaustion_hands_off(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """Two retries per turn across tools; then failures go back at once, and a person is told."""
    handed: list[HandOff] = []
    tools = _guard(
        clock,
        {"retry_budget_per_turn": 2, "retry": {"max_attempts": 10}, "breaker": {"min_calls": 99}},
        on_hand_off=handed.append,
    )
    tools.register(Script(_error(503)), name="a")
    tools.register(Script(_error(503)), name="b", fallbacks=[Default("cached")])
    with tools.turn(reasoning="I need a and b") as turn:
        first = tools.call("a", {})
        second = tools.call("b", {})
    assert (first.attempts, second.attempts) == (3, 1)
    assert first.error is not None
    assert second.error is not None
    assert first.error.budget_exhausted
    assert second.error.budget_exhausted
    assert "retry budget of this turn is spent" in first.error.message
    assert not second.ok  # the guard stopped intervening: no fallback either
    assert len(events.of_type(RetryBudgetExhausted)) == 1
    assert [h.reason for h in handed] == ["retry_budget_exhausted"]
    assert handed[0].reasoning == "I need a and b"
    assert handed[0].turn == turn.id
    with tools.turn():
        assert tools.call("a", {}).attempts == 3  # a new turn, a new budget


def test_new_turn_resets_the_default_turn(clock: FakeClock) -> None:
    """Without ``with``, new_turn() starts a fresh budget and trace."""
    tools = _guard(clock, {"retry_budget_per_turn": 1})
    tools.register(Script(_error(503)), name="a")
    tools.call("a", {})
    assert tools.current_turn.budget.exhausted
    turn = tools.new_turn(reasoning="again")
    assert tools.current_turn is turn
    assert (turn.budget.remaining, turn.trace) == (1, [])


# -- circuit breakers ---------------------------------------------------------------------------


def test_breaker_opens_answers_at_once_then_probes(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """After enough failures the tool is not called; the error says when it will be probed."""
    tools = _guard(
        clock,
        {"breaker": {"min_calls": 3, "open_seconds": 30}, "retry": {"max_attempts": 1}},
    )
    tool = Script(_error(500), _error(500), _error(500), "back")
    tools.register(tool, name="api")
    for _ in range(3):
        tools.call("api", {"n": _})
    refused = tools.call("api", {"n": 9})
    assert len(tool.calls) == 3
    assert refused.error is not None
    assert (refused.error.kind, refused.error.breaker, refused.error.retry_at) == (
        "breaker_open",
        "open",
        clock() + 30,
    )
    assert refused.error.retry_after == 30
    assert "in 30s" in refused.error.message
    clock.advance(30)
    assert tools.call("api", {"n": 10}).value == "back"
    changes = [(e.previous, e.state) for e in events.of_type(BreakerStateChanged)]
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_client_errors_do_not_trip_the_breaker(clock: FakeClock) -> None:
    """Ignored errors count as neither success nor failure."""
    tools = _guard(clock, {"breaker": {"min_calls": 2}})
    tools.register(Script(_error(404)), name="api")
    for _ in range(5):
        tools.call("api", {"n": _})
    snap = tools.breaker("api").snapshot()
    assert (snap.state.value, snap.calls) == ("closed", 0)


def test_open_breaker_of_a_blocking_tool_hands_off_and_falls_back(clock: FakeClock) -> None:
    """A blocking tool's open breaker: the fallback answers, and a person is told."""
    handed: list[HandOff] = []
    tools = _guard(
        clock,
        {"breaker": {"min_calls": 1}, "retry": {"max_attempts": 1}},
        on_hand_off=handed.append,
    )
    tools.register(lambda **_: "cached", name="cache")  # fallbacks get the same arguments
    tools.register(Script(_error(500)), name="db", criticality="blocking", fallbacks=["cache"])
    tools.call("db", {"n": 1})  # fails; the fallback answers; the breaker opens
    outcome = tools.call("db", {"n": 2})
    assert (outcome.ok, outcome.value, outcome.fallback) == (True, "cached", "cache")
    tools.register(Script(_error(500)), name="auth", criticality="blocking")
    tools.call("auth", {})
    refused = tools.call("auth", {"again": True})
    assert refused.error is not None
    assert refused.error.kind == "breaker_open"
    assert [h.reason for h in handed] == ["breaker_open"]
    assert handed[0].error is not None
    assert handed[0].error.kind == "breaker_open"


# -- fallbacks ------------------------------------------------------------------------------------


def test_fallback_chain_tries_tools_then_a_default(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """Each fallback in order; a Default value ends the chain."""
    tools = _guard(clock, {"retry": {"max_attempts": 1}})
    tools.register(Script(TimeoutError("slow")), name="primary", fallbacks=["mirror", Default([])])
    tools.register(Script(ConnectionError("down")), name="mirror")
    outcome = tools.call("primary", {"q": "x"})
    assert (outcome.ok, outcome.value, outcome.fallback, outcome.attempts) == (
        True,
        [],
        "default",
        2,
    )
    assert [(e.fallback, e.error) for e in events.of_type(ToolFallbackUsed)] == [
        ("default", "timeout")
    ]


def test_failure_without_fallback_lists_the_alternatives(clock: FakeClock) -> None:
    """When the whole chain fails the error names the alternatives; a client error skips it."""
    tools = _guard(clock, {"retry": {"max_attempts": 1}})
    mirror = Script(ConnectionError("down"))
    tools.register(mirror, name="mirror")
    tools.register(Script(ConnectionError("down")), name="primary", fallbacks=["mirror"])
    outcome = tools.call("primary", {})
    assert outcome.error is not None
    assert outcome.error.alternatives == ("mirror",)
    assert "Alternatives: mirror." in outcome.error.message
    tools.register(Script(_error(422)), name="strict", fallbacks=["mirror"])
    calls = len(mirror.calls)
    assert not tools.call("strict", {}).ok
    assert len(mirror.calls) == calls


# -- idempotency ----------------------------------------------------------------------------------


def test_replay_returns_the_stored_outcome_without_running_again(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """The same side-effecting call again (same key) replays the first outcome."""
    tools = _guard(clock)
    tool = Script("charged 1")
    tools.register(tool, name="charge", side_effecting=True)
    first = tools.call("charge", {"amount": 5})
    again = tools.call("charge", {"amount": 5})
    assert (again.ok, again.value, again.replayed, len(tool.calls)) == (True, "charged 1", True, 1)
    assert not first.replayed
    assert len(events.of_type(ToolCallReplayed)) == 1
    assert tools.call("charge", {"amount": 6}).replayed is False  # other arguments, other key


def test_same_key_with_other_arguments_is_an_error(clock: FakeClock) -> None:
    """An explicit key reused for different arguments is refused."""
    tools = _guard(clock)
    tools.register(Script("ok"), name="charge", side_effecting=True)
    tools.call("charge", {"amount": 5}, idempotency_key="order-1")
    outcome = tools.call("charge", {"amount": 9}, idempotency_key="order-1")
    assert outcome.error is not None
    assert outcome.error.kind == "idempotency_conflict"


def test_a_side_effecting_tool_with_an_unencodable_result_is_kept_and_replayed(
    clock: FakeClock,
) -> None:
    """A result JSON cannot hold (cyclic, a number too long) never raises after the tool ran:
    the outcome comes back, and its replay is the result's text (issue 15)."""
    cyclic: dict[str, Any] = {"id": 7}
    cyclic["self"] = cyclic
    for result in (cyclic, 10**5_000):
        tools = _guard(clock)
        tool = Script(result)
        tools.register(tool, name="charge", side_effecting=True)
        first = tools.call("charge", {"amount": 5})
        again = tools.call("charge", {"amount": 5})
        assert first.ok
        assert first.value is result
        assert again.replayed
        assert again.value == first.content
        assert len(tool.calls) == 1


def test_a_key_in_the_arguments_is_the_key_of_the_operation(clock: FakeClock) -> None:
    """An ``idempotency_key`` the arguments carry is honoured: the tool gets it, the same key
    with the same arguments replays, with other arguments it is a conflict (issue 15)."""
    tools = _guard(clock)
    received: list[str] = []

    def pay(amount: int, idempotency_key: str = "") -> str:
        received.append(idempotency_key)
        return f"paid {amount}"

    tools.register(pay, side_effecting=True)
    assert tools.call("pay", {"amount": 5, "idempotency_key": "k-1"}).ok
    assert tools.call("pay", {"amount": 5, "idempotency_key": "k-1"}).replayed
    conflict = tools.call("pay", {"amount": 6, "idempotency_key": "k-1"})
    assert conflict.error is not None
    assert conflict.error.kind == "idempotency_conflict"
    # the keyword wins over a key in the arguments
    assert tools.call("pay", {"amount": 7, "idempotency_key": "k-2"}, idempotency_key="kw").ok
    assert received == ["k-1", "kw"]


def test_keys_expire_and_failures_free_them(clock: FakeClock) -> None:
    """A failed call does not block its key; a stored outcome is forgotten after the TTL."""
    tools = _guard(clock, {"idempotency_ttl_seconds": 100, "retry": {"max_attempts": 1}})
    tool = Script(_error(500), "done", "done again")
    tools.register(tool, name="send", side_effecting=True)
    assert not tools.call("send", {"to": "a"}).ok
    assert tools.call("send", {"to": "a"}).value == "done"
    clock.advance(99)
    assert tools.call("send", {"to": "a"}).replayed
    clock.advance(1)
    assert tools.call("send", {"to": "a"}).value == "done again"


def test_one_key_is_passed_on_every_retry(clock: FakeClock) -> None:
    """A tool that takes ``idempotency_key`` gets the same key on each attempt, and is retried."""
    tools = _guard(clock)
    tool = Script(_error(503), "paid")

    def pay(amount: int, idempotency_key: str) -> Any:
        return tool(amount=amount, idempotency_key=idempotency_key)

    tools.register(pay, side_effecting=True)
    assert tools.call("pay", {"amount": 3}, idempotency_key="k-1").value == "paid"
    assert [c["idempotency_key"] for c in tool.calls] == ["k-1", "k-1"]


def test_concurrent_duplicate_is_refused_while_the_first_runs(clock: FakeClock) -> None:
    """Two threads, one key: the second is refused as in flight; the first completes."""
    tools = _guard(clock)
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def transfer(amount: int) -> str:
        runs.append(amount)
        started.set()
        release.wait(5)
        return "moved"

    tools.register(transfer, side_effecting=True)
    results: list[ToolOutcome] = []
    first = threading.Thread(target=lambda: results.append(tools.call("transfer", {"amount": 1})))
    first.start()
    assert started.wait(5)
    duplicate = tools.call("transfer", {"amount": 1})
    release.set()
    first.join(5)
    assert duplicate.error is not None
    assert (duplicate.error.kind, duplicate.error.retryable) == ("duplicate_in_flight", True)
    assert results[0].value == "moved"
    assert runs == [1]


# -- dead letters ----------------------------------------------------------------------------------


def test_final_failures_are_dead_lettered_and_replayable(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """A call that finally failed is recorded with its errors; a manual replay clears it."""
    tools = _guard(clock, {"retry": {"max_attempts": 2}})
    tool = Script(_error(503), _error(504), "ok at last")
    tools.register(tool, name="sync_crm", side_effecting=True, idempotent=True)
    assert not tools.call("sync_crm", {"id": 7}).ok
    (letter,) = tools.dead_letters()
    assert (letter.tool, letter.arguments, letter.attempts) == ("sync_crm", {"id": 7}, 2)
    assert [e["error_class"] for e in letter.errors] == ["transient", "timeout"]
    assert letter.idempotency_key is not None
    assert events.of_type(ToolDeadLettered)[0].letter == letter.id
    assert tools.replay(letter.id).value == "ok at last"
    assert tools.dead_letters() == []


def test_client_errors_are_not_dead_lettered(clock: FakeClock) -> None:
    """The model's own mistakes are for the model to fix, not for a dead-letter queue."""
    tools = _guard(clock)
    tools.register(Script(_error(400)), name="api")
    tools.call("api", {})
    assert tools.dead_letters() == []


# -- hand-off and high-risk tools ----------------------------------------------------------------


def test_high_risk_tools_need_approval(clock: FakeClock, events: CapturedEvents) -> None:
    """A person sees the turn's trace and reasoning and approves or refuses each call."""
    answers = [False, True]
    seen: list[HandOff] = []

    def approve(hand_off: HandOff) -> bool:
        seen.append(hand_off)
        return answers.pop(0)

    tools = _guard(clock, on_hand_off=approve)
    tools.register(lambda path: "listed", name="ls")
    tool = Script("deleted")
    tools.register(tool, name="rm", high_risk=True)
    with tools.turn(reasoning="clean up"):
        tools.call("ls", {"path": "/tmp"})
        refused = tools.call("rm", {"path": "/tmp/x"})
        tools.note_reasoning("the user insisted")
        done = tools.call("rm", {"path": "/tmp/x"})
    assert refused.error is not None
    assert refused.error.kind == "not_approved"
    assert (done.value, len(tool.calls)) == ("deleted", 1)
    assert [(e.tool, e.ok) for e in seen[0].trace] == [("ls", True)]
    assert seen[0].arguments == {"path": "/tmp/x"}
    assert (seen[0].reason, seen[0].reasoning, seen[1].reasoning) == (
        "high_risk",
        "clean up",
        "the user insisted",
    )
    assert [(e.tool, e.error) for e in seen[1].trace][-1] == ("rm", "not_approved")
    assert len(events.of_type(HandOffRequested)) == 2


def test_high_risk_without_an_approver_is_refused(clock: FakeClock) -> None:
    """No callback, no approval: the tool does not run."""
    tools = _guard(clock)
    tool = Script("x")
    tools.register(tool, name="wire_money", high_risk=True)
    outcome = tools.call("wire_money", {})
    assert outcome.error is not None
    assert "no approver" in outcome.error.message
    assert tool.calls == []


# -- loops -----------------------------------------------------------------------------------------


def test_loop_break_means_the_tool_is_not_run(clock: FakeClock) -> None:
    """Identical calls with identical results: warnings first, then BREAK and no call."""
    config = {
        "loop_detection": {
            "no_progress_warn_at": 2,
            "no_progress_critical_at": 3,
            "no_progress_break_at": 3,
        }
    }
    tools = ToolGuard(
        GuardConfig.from_dict({**config, "tools": {"sync_timeouts": False}}, env={}),
        clock=clock,
        hooks=(),
    )
    tool = Script(*[{"status": "pending", "trace": i} for i in range(5)])
    tools.register(tool, name="status", volatile_fields=["trace"])  # a new trace is no progress
    outcomes = [tools.call("status", {"job": 1}) for _ in range(4)]
    assert [o.ok for o in outcomes] == [True, True, False, False]
    assert outcomes[1].hint  # a warning travels with the value
    assert "[agentguard]" in outcomes[1].content
    last = outcomes[-1]
    assert last.error is not None
    assert last.error.kind == "loop_detected"
    assert "has not changed" in last.error.message
    assert len(tool.calls) == 2


def test_changing_results_are_progress(clock: FakeClock) -> None:
    """A poll whose result really changes is never flagged."""
    tools = _guard(clock)
    counter = iter(range(100))
    tools.register(lambda job: {"done": next(counter)}, name="poll")
    outcomes = [tools.call("poll", {"job": 1}) for _ in range(8)]
    assert [(o.ok, o.hint) for o in outcomes] == [(True, "")] * 8


def test_loop_state_is_per_run(clock: FakeClock) -> None:
    """Runs making the same call once or twice each are no loop; one run repeating it is."""
    tools = _guard(clock)
    tool = Script("Sunny in Paris")
    tools.register(tool, name="get_weather")
    separate = [
        tools.call("get_weather", {"city": "Paris"}, run=f"run-{i % 8}")
        for i in range(12)  # 12 calls in 8 runs: four of them twice, interleaved
    ]
    assert [(o.ok, o.hint) for o in separate] == [(True, "")] * 12
    repeating = [tools.call("get_weather", {"city": "Paris"}, run="stuck") for _ in range(12)]
    assert [o.error.kind for o in repeating if o.error] == ["loop_detected"] * 6
    alone = [tools.call("get_weather", {"city": "Paris"}) for _ in range(12)]  # no run: as one
    assert [o.error.kind for o in alone if o.error] == ["loop_detected"] * 6
    assert len(tool.calls) == 12 + 6 + 6


def test_declared_volatile_fields_apply_to_every_run(clock: FakeClock) -> None:
    """A tool registered after a run began, and a run begun after it, both ignore its fields."""
    config = {"no_progress_warn_at": 2, "no_progress_critical_at": 3, "no_progress_break_at": 3}
    cfg = GuardConfig.from_dict(
        {"loop_detection": config, "tools": {"sync_timeouts": False}}, env={}
    )
    tools = ToolGuard(cfg, clock=clock, hooks=())
    tools.register(Script("x"), name="other")
    tools.call("other", {}, run="early")  # a run made before the declaration
    counter = iter(range(100))
    tools.register(lambda job: {"status": "pending", "trace": next(counter)}, name="status2")
    tools.register(
        lambda job: {"status": "pending", "trace": next(counter)},
        name="status",
        volatile_fields=["trace"],  # a new trace is no progress
    )
    for run in ("early", "late"):
        outcomes = [tools.call("status", {"job": 1}, run=run) for _ in range(4)]
        assert [o.ok for o in outcomes] == [True, True, False, False], run
    changing = [tools.call("status2", {"job": 1}, run="late") for _ in range(4)]
    assert [o.ok for o in changing] == [True] * 4  # undeclared: its trace is progress


def test_runs_kept_are_bounded(clock: FakeClock) -> None:
    """Past ``max_runs`` the least recently used run is forgotten: it starts afresh."""
    cfg = GuardConfig.from_dict(
        {
            "loop_detection": {"no_progress_break_at": 3, "no_progress_critical_at": 3},
            "tools": {"sync_timeouts": False},
        },
        env={},
    )
    tools = ToolGuard(cfg, clock=clock, hooks=(), max_runs=2)
    tools.register(Script("same"), name="poll")
    for run in ("a", "a", "b"):
        assert tools.call("poll", {}, run=run).ok
    assert tools.call("poll", {}, run="a").error is not None  # a's third: a loop
    tools.call("poll", {}, run="c")  # a third run: "b", the least recently used, is forgotten
    assert tools.call("poll", {}, run="a").error is not None  # "a" is kept
    assert [tools.call("poll", {}, run="b").ok for _ in range(2)] == [True, True]  # afresh
    assert len(tools._runs) == 2


# -- timeouts --------------------------------------------------------------------------------------


class _RecordingExecutor(concurrent.futures.Executor):
    """An executor whose futures time out at once, recording the timeout they were given."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return _Late(self)


class _Late:
    def __init__(self, owner: _RecordingExecutor) -> None:
        self.owner = owner

    def result(self, timeout: float | None = None) -> Any:
        self.owner.timeouts.append(timeout)
        raise concurrent.futures.TimeoutError

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        return True


def test_timeouts_follow_criticality(clock: FakeClock) -> None:
    """Blocking 30 s, enhancing 15 s, optional 5 s by default; configurable and per tool."""
    executor = _RecordingExecutor()
    config = {"sync_timeouts": True, "retry": {"max_attempts": 1}, "timeouts": {"optional": 2}}
    tools = _guard(clock, config, executor=executor)
    for level in ("blocking", "enhancing", "optional"):
        tools.register(lambda: None, name=level, criticality=level)
    tools.register(lambda: None, name="custom", timeout=0.5)
    outcomes = [tools.call(n, {}) for n in ("blocking", "enhancing", "optional", "custom")]
    assert executor.timeouts == [30.0, 15.0, 2.0, 0.5]
    error = outcomes[2].error
    assert error is not None
    assert (error.kind, error.retryable) == ("timeout", True)
    assert "no answer within 2s" in error.message


def test_a_hung_sync_tool_is_abandoned_at_its_timeout(clock: FakeClock) -> None:
    """Real thread, real (10 ms) timeout: the caller gets a timeout; the thread is left behind."""
    release = threading.Event()
    tools = _guard(clock, {"sync_timeouts": True, "retry": {"max_attempts": 1}})
    tools.register(lambda: release.wait(5), name="hang", timeout=0.01)
    try:
        outcome = tools.call("hang", {})
    finally:
        release.set()
        tools.close()
    assert outcome.error is not None
    assert outcome.error.kind == "timeout"


@pytest.mark.anyio
async def test_a_hung_async_tool_is_cancelled_at_its_timeout(clock: FakeClock) -> None:
    """Real (10 ms) anyio deadline: the async tool is cancelled and reported as a timeout."""
    tools = _guard(clock, {"retry": {"max_attempts": 1}})
    cancelled: list[bool] = []

    async def hang() -> None:
        try:
            await anyio.Event().wait()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    tools.register(hang, timeout=0.01)
    outcome = await tools.acall("hang", {})
    assert outcome.error is not None
    assert outcome.error.kind == "timeout"
    assert cancelled == [True]


# -- async -----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_acall_awaits_async_tools_and_retries_with_the_async_sleep(
    clock: FakeClock,
) -> None:
    """acall runs async tools (and sync ones on a thread) with the same guarding."""
    tools = _guard(clock, {"sync_timeouts": True})
    attempts: list[int] = []

    async def lookup(key: str) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("reset")
        return key.upper()

    tools.register(lookup)
    tools.register(lambda: "sync", name="plain")
    assert (await tools.acall("lookup", {"key": "a"})).value == "A"
    assert len(clock.sleeps) == 1
    assert (await tools.acall("plain", {})).value == "sync"


@pytest.mark.anyio
async def test_async_hand_off_and_store_backed_breaker(clock: FakeClock) -> None:
    """An async callback approves; a store-backed breaker works through the async driver."""

    async def approve(hand_off: HandOff) -> bool:
        return hand_off.tool == "deploy"

    store = MemoryStore()
    tools = _guard(clock, {"breaker": {"min_calls": 1}}, store=store, on_hand_off=approve)
    tools.register(lambda: "deployed", name="deploy", high_risk=True)
    assert (await tools.acall("deploy", {})).value == "deployed"
    tools.register(Script(_error(401)), name="auth")
    await tools.acall("auth", {})
    assert (await tools.breaker("auth").asnapshot()).calls == 0


def test_sync_call_of_an_async_tool_runs_it(clock: FakeClock) -> None:
    """call() runs an async tool in its own event loop when none is running."""
    tools = _guard(clock)

    async def answer() -> int:
        return 42

    tools.register(answer)
    assert tools.call("answer", {}).value == 42


# -- shared breakers -------------------------------------------------------------------------------


def test_two_guards_on_one_store_share_breakers(clock: FakeClock) -> None:
    """With a store given, breakers live there: one guard's failures open the other's breaker."""
    store: Store = MemoryStore()
    config = {"breaker": {"min_calls": 2}, "retry": {"max_attempts": 1}}
    one, two = _guard(clock, config, store=store), _guard(clock, config, store=store)
    one.register(Script(_error(500)), name="api")
    two.register(Script("fine"), name="api")
    one.call("api", {"a": 1})
    one.call("api", {"a": 2})
    outcome = two.call("api", {"a": 3})
    assert outcome.error is not None
    assert outcome.error.kind == "breaker_open"


def test_disabled_guard_runs_tools_once_unguarded(clock: FakeClock) -> None:
    """tools.enabled false: one attempt, the error still structured."""
    tools = _guard(clock, {"enabled": False})
    tool = Script(_error(503))
    tools.register(tool, name="api")
    outcome = tools.call("api", {})
    assert (outcome.ok, len(tool.calls)) == (False, 1)
    assert outcome.error is not None
    assert outcome.error.kind == "transient"


def test_failed_call_emits_a_failure_event_with_its_numbers(
    clock: FakeClock, events: CapturedEvents
) -> None:
    """The final failure is an event with the error kind and attempts, never the arguments."""
    tools = _guard(clock, {"retry": {"max_attempts": 2}})
    tools.register(Script(_error(503)), name="api")
    tools.call("api", {"secret": "sk-abcdefghijklmnop"})
    (failed,) = events.of_type(ToolCallFailed)
    assert (failed.error, failed.attempts, failed.retryable) == ("transient", 2, True)
    assert all("sk-abc" not in str(e.to_dict()) for e in events)


@pytest.mark.redis
def test_a_breaker_is_shared_by_two_processes_through_redis(redis_server: RedisServer) -> None:
    """Two worker processes, 3 failures each: only together do they reach min_calls (6) and trip
    the breaker, which then refuses every further call, in both and in this third process."""
    prefix = f"fleet{uuid.uuid4().hex[:8]}"
    reports = run_tool_workers(redis_server.url, prefix, workers=2, calls=3)
    assert sum(r["ran"] for r in reports) == 6  # every failing call ran exactly once
    tools = ToolGuard(
        GuardConfig.from_dict({"tools": {"breaker": {"min_calls": 6}}}, env={}),
        store=RedisStore(redis_server.url, key_prefix=prefix),
        hooks=(),
    )
    ran: list[int] = []

    def inventory(n: int) -> None:
        ran.append(n)

    tools.register(inventory)
    outcome = tools.call("inventory", {"n": 99})
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.breaker) == ("breaker_open", "open")
    assert ran == []
    snapshot = tools.breaker("inventory").snapshot()
    assert (snapshot.state.value, snapshot.failures) == ("open", 6)


def test_a_hung_sync_tool_does_not_hold_up_interpreter_exit(tmp_path: Path) -> None:
    """A timed-out sync tool is abandoned on a daemon thread: the process still exits."""
    script = tmp_path / "hang.py"
    script.write_text(
        "import threading, agentguard as ag\n"
        "cfg = ag.GuardConfig.from_dict({'tools': {'timeouts': {'optional': 0.05}}}, env={})\n"
        "tools = ag.ToolGuard(cfg)\n"
        "@tools.tool(criticality='optional')\n"
        "def stuck() -> str:\n"
        "    threading.Event().wait()\n"
        "    return 'never'\n"
        "print(tools.call('stuck', {}).error.kind)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timeout"


def test_daemon_pool_runs_reuses_and_shuts_down() -> None:
    """The pool returns results and errors, reuses idle workers, and refuses work once closed."""
    pool = DaemonPool("test")
    assert pool.submit(lambda x: x * 2, 21).result() == 42
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result()
    names = {pool.submit(lambda: threading.current_thread().name).result() for _ in range(5)}
    assert len(names) == 1
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_daemon_pool_call_hands_back_results_errors_and_timeouts() -> None:
    """call(): the result or the tool's own error; at the deadline late() is raised, the hung
    job is abandoned, and the next call gets another worker."""
    pool = DaemonPool("test")
    assert pool.call(lambda: 42, 5.0, RuntimeError) == 42
    with pytest.raises(TimeoutError, match="its own"):
        pool.call(lambda: (_ for _ in ()).throw(TimeoutError("its own")), 5.0, RuntimeError)
    release = threading.Event()
    try:
        with pytest.raises(RuntimeError, match="late"):
            pool.call(lambda: release.wait(5), 0.01, lambda: RuntimeError("late"))
        assert pool.call(lambda: "still served", 5.0, RuntimeError) == "still served"
    finally:
        release.set()
        pool.shutdown()


def test_an_abandoned_job_never_starts_and_cancels_its_future() -> None:
    """What shutdown(cancel_futures=True) and a timeout do to queued work: it never runs."""
    ran: list[bool] = []
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    job = _Job(lambda: ran.append(True), future)
    job.abandon()
    assert future.cancelled()
    pool = DaemonPool("test")
    pool._queue.put(job)  # a worker picks it up, skips it, and releases its waiter
    pool._workers = 1
    threading.Thread(target=pool._work, daemon=True).start()
    assert job.done.acquire(timeout=5)
    assert ran == []
    pool.shutdown()


@pytest.mark.anyio
async def test_sync_call_of_an_async_tool_inside_a_running_loop_is_refused_clearly() -> None:
    """Inside an event loop, call() of an async tool raises and names acall(), not a tool error."""
    tools = ToolGuard()

    @tools.tool
    async def fetch() -> str:
        return "x"

    with pytest.raises(RuntimeError, match="acall"):
        tools.call("fetch", {})
    assert (await tools.acall("fetch", {})).value == "x"


class _DeadStore(MemoryStore):
    """A store whose every breaker and record operation fails as an unreachable server would."""

    def _down(self, *args: Any, **kwargs: Any) -> Any:
        from agentguard.exceptions import StoreUnavailable

        raise StoreUnavailable("store is down")

    breaker_allow = breaker_record = breaker_view = _down
    claim = put = get = items = delete = _down


def test_an_unreachable_store_fails_open_and_says_so() -> None:
    """With the store down, tools still run (fail open) and a store_fallback event tells why."""
    tools = ToolGuard(store=_DeadStore())

    @tools.tool(side_effecting=True, idempotent=True)
    def send(text: str) -> str:
        return f"sent {text}"

    with capture_events() as events:
        outcome = tools.call("send", {"text": "hi"})
    assert outcome.ok
    assert outcome.value == "sent hi"
    assert any(e.kind == "store_fallback" for e in events)


def test_an_unreachable_store_raises_when_fail_closed() -> None:
    """fail_mode closed: the store's failure is raised, the tool does not run unguarded."""
    ran: list[str] = []
    tools = ToolGuard(GuardConfig.from_dict({"fail_mode": "closed"}, env={}), store=_DeadStore())

    @tools.tool(side_effecting=True, idempotent=True)
    def send(text: str) -> str:
        ran.append(text)
        return "sent"

    with pytest.raises(StoreError):
        tools.call("send", {"text": "hi"})
    assert ran == []
