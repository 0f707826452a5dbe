"""The process's lease renewer: the thread that keeps the holds of calls still in flight.

The ledger's own renewal rules (due after half a lease, up to ``max_call_seconds``, a hold gone
is forgotten) are tested in ``test_budget.py``; here, the thread that applies them to every
ledger on the wall clock.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import warnings
from typing import Any

import pytest

from agentguard.budget import TokenLedger
from agentguard.budget._renewer import RENEWER, LeaseRenewer
from agentguard.config import TokenBudgetConfig
from agentguard.exceptions import StoreError
from agentguard.storage import MemoryStore
from agentguard.testing import FakeClock


class _Watched(MemoryStore):
    """A memory store that says when a renewal reached it (or fails them)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.renewed = threading.Event()
        self.fail = fail

    def renew(self, spec: Any, reservation_id: str, expires_at: float, now: float) -> bool:
        if self.fail:
            raise StoreError("renew failed for sk-test-secret")
        held = super().renew(spec, reservation_id, expires_at, now)
        self.renewed.set()
        return held


def _ledger(store: MemoryStore, clock: Any, **budget: object) -> TokenLedger:
    config = TokenBudgetConfig.model_validate(
        {"max_output_tokens": None, "lease_seconds": 30, **budget}
    )
    return TokenLedger(config, store=store, clock=clock)


def test_the_thread_renews_the_due_leases_of_its_ledgers() -> None:
    """A round (here woken at once, time injected) renews what is due in every ledger."""
    clock = FakeClock()
    store = _Watched()
    ledger = _ledger(store, clock)
    assert ledger not in RENEWER  # an injected clock: renewed only when asked
    renewer = LeaseRenewer()
    renewer.add(ledger, 30)
    assert not renewer.idle
    ledger.reserve("s", 50)
    clock.advance(20)
    renewer._wake.set()
    assert store.renewed.wait(timeout=30)  # the thread's round reached the store
    clock.advance(20)  # 40 s: past the first lease
    assert ledger.usage("s").session_reserved == 50


def test_a_round_forgets_dropped_ledgers_and_survives_a_failing_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ledgers are held weakly; a store that fails is logged (type only, never its message)
    and the other ledgers are still renewed."""
    clock = FakeClock()
    renewer = LeaseRenewer()
    failing = _ledger(_Watched(fail=True), clock)
    working = _ledger(_Watched(), clock)
    dropped = _ledger(_Watched(), clock)
    for ledger in (failing, working, dropped):
        renewer.add(ledger, 30)
        ledger.reserve("s", 10)
    del ledger
    clock.advance(15)
    del dropped
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="agentguard.budget"):
        assert renewer.renew_all() == 1
    assert "StoreError" in caplog.text
    assert "sk-test-secret" not in caplog.text
    assert failing in renewer
    assert working in renewer


def test_a_ledger_on_the_wall_clock_is_renewed_by_the_process() -> None:
    """The default clock registers the ledger with the process's renewer, whose thread runs;
    ``max_call_seconds: 0`` (or a budget turned off) does not."""
    ledger = TokenLedger(TokenBudgetConfig(max_output_tokens=None))
    assert ledger in RENEWER
    assert not RENEWER.idle
    assert TokenLedger(TokenBudgetConfig(max_call_seconds=0)) not in RENEWER
    assert TokenLedger(TokenBudgetConfig(enabled=False)) not in RENEWER


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_forgets_the_parents_calls_and_renews_its_own() -> None:
    """After a fork the parent's calls in flight are the parent's: the child forgets them, and
    its own first reservation starts a renewer thread there."""
    ledger = TokenLedger(TokenBudgetConfig(max_output_tokens=None))
    ledger.reserve("s", 10)
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+: fork of a threaded process warns (the renewer's)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        verdict = b"ok"
        try:
            if not RENEWER.idle or ledger._flights:
                verdict = b"kept the parent's state"
            else:
                ledger.reserve("s", 10)
                if RENEWER.idle or len(ledger._flights or ()) != 1:
                    verdict = b"no renewer for the child's call"
                grandchild = os.fork()  # the child's own fork handlers take its own lock
                if grandchild == 0:
                    os._exit(0)
                os.waitpid(grandchild, 0)
        except BaseException as exc:  # pragma: no cover - reported to the parent
            verdict = repr(exc).encode()
        os.write(write, verdict)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        verdict = pipe.read()
    os.waitpid(pid, 0)
    assert verdict == b"ok"
    assert len(ledger._flights or ()) == 1  # the parent's call is still its own
