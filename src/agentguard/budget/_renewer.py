"""The leases of calls still in flight, renewed by one daemon thread per process.

A reservation's lease (``lease_seconds``) frees the tokens of a caller that crashed before
settling. A call that merely runs long — a slow reasoning answer, a long stream — must not lose
its hold that way: other calls would take the room, and its own usage, counted when it settles,
would pass a ``hard_stop`` limit. Each :class:`~agentguard.budget.TokenLedger` keeps its
unsettled reservations; this thread renews the due ones of every ledger on the wall clock, up
to ``max_call_seconds`` after the reservation (past that, a hold nobody settled is treated as a
crashed caller's and lapses with its lease). A process that dies takes the thread with it, so
its holds still return when their leases end.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._ledger import TokenLedger

__all__ = ["RENEWER", "LeaseRenewer"]

logger = logging.getLogger("agentguard.budget")

# The thread looks at its ledgers this often at most (seconds), whatever their leases.
_LONGEST_WAIT = 60.0
_SHORTEST_WAIT = 0.05


class LeaseRenewer:
    """Renews the due leases of the ledgers it was given, on a daemon thread of its own.

    The thread starts with the first ledger and wakes every quarter of the shortest lease among
    them (a lease is renewed once half of it has run, so well before it ends). Ledgers are held
    weakly: one that is dropped stops being renewed. A renewal that fails (the store is
    unreachable) is logged and tried again on the next round; it never reaches a caller.
    """

    def __init__(self) -> None:
        self._ledgers: weakref.WeakSet[TokenLedger] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        # Held for a whole round, and by a fork (see below): a child is never forked while the
        # thread is inside a store (its lock would stay taken in the child).
        self._round = threading.Lock()
        self._wait = _LONGEST_WAIT
        self._thread: threading.Thread | None = None
        #: No thread runs (before the first ledger, and in a forked child until it reserves).
        self.idle = True

    def add(self, ledger: TokenLedger, lease_seconds: float) -> None:
        """Renew ``ledger``'s calls in flight from now on."""
        with self._lock:
            self._ledgers.add(ledger)
            self._wait = max(_SHORTEST_WAIT, min(self._wait, lease_seconds / 4))
        self.start()

    def start(self) -> None:
        """Start the thread unless it runs (a ledger calls this when ``idle``, after a fork)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="agentguard-leases", daemon=True
                )
                self._thread.start()
            self.idle = False

    def renew_all(self) -> int:
        """One round: renew the due leases of every ledger; how many were renewed."""
        renewed = 0
        with self._round:
            for ledger in list(self._ledgers):
                try:
                    renewed += ledger.renew_due()
                except Exception as exc:  # never let one ledger's store stop the others
                    logger.warning("agentguard: renewing leases failed (%s)", type(exc).__name__)
        return renewed

    def __contains__(self, ledger: object) -> bool:
        return ledger in self._ledgers

    def _run(self) -> None:
        while True:
            self._wake.wait(self._wait)  # set: a round at once (tests)
            self._wake.clear()
            self.renew_all()

    def _before_fork(self) -> None:
        self._round.acquire()  # the current lock: a forked child makes its own

    def _after_fork_in_parent(self) -> None:
        self._round.release()

    def _after_fork(self) -> None:
        # The thread does not survive a fork. The child's copies of the parent's calls in
        # flight are the parent's to settle and renew: forgotten here. Its next reservation
        # starts a thread of its own.
        self._lock = threading.Lock()
        self._round = threading.Lock()
        self._wake = threading.Event()  # the parent's thread may have been waiting on it
        self._thread = None
        self.idle = True
        for ledger in list(self._ledgers):
            ledger._forget_flights()


#: The process's renewer.
RENEWER = LeaseRenewer()

if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(
        before=RENEWER._before_fork,
        after_in_parent=RENEWER._after_fork_in_parent,
        after_in_child=RENEWER._after_fork,
    )
