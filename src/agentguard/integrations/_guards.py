"""What adapters share about their guards: a sync and an async guard sharing one budget, a fault
of the adapter reported and passed over (or raised, fail-closed), and a bounded record of
reports."""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentguard.config import GuardConfig
from agentguard.events import GuardInternalError
from agentguard.exceptions import GuardFailure
from agentguard.guard import AsyncGuard, Guard, GuardReport
from agentguard.types import Tier


def twin_guards(
    config: GuardConfig,
    transport: Callable[[Tier], Any],
    options: Mapping[str, Any],
    asleep: Callable[[float], Awaitable[None]] | None,
) -> tuple[Guard, AsyncGuard]:
    """A :class:`~agentguard.Guard` and an :class:`~agentguard.AsyncGuard` with one ledger (sync
    and async calls share the budgets) and one record of the runs of the tool calls they hand
    back (``run_of_call``): ``options`` are the sync guard's (its ``sleep`` too),
    ``asleep`` is the async guard's wait between retries."""
    guard = Guard(config=config, tier_transport=transport, **options)
    async_options = {k: v for k, v in options.items() if k != "sleep"}
    async_options.update(ledger=guard.pipeline.ledger, sleep=asleep)
    aguard = AsyncGuard(config=config, tier_transport=transport, **async_options)
    aguard.pipeline.call_runs = guard.pipeline.call_runs  # one agent: its tool calls' runs
    return guard, aguard


# How many reports an adapter keeps (one per model call): a long-lived one stays bounded.
KEPT = 1_000


class fail_open:  # lower case: used as a context manager, like contextlib.suppress
    """Inside the block, an ``Exception`` is a fault of the ``adapter`` (agentguard's own code;
    the event's component is ``<adapter, lower-cased>.<component>``): reported as a
    ``GuardInternalError`` event, then passed over (the caller goes on unguarded, as what the
    block set is left unset), or, with ``fail_mode: closed``, raised as a
    :class:`~agentguard.GuardFailure`."""

    def __init__(self, guard: Guard | AsyncGuard, adapter: str, component: str) -> None:
        self.guard, self.adapter, self.component = guard, adapter, component

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if not isinstance(exc, Exception):
            return False
        error, where = type(exc).__name__, f"{self.adapter.lower()}.{self.component}"
        message = f"agentguard's {self.adapter} adapter failed ({error}) in the {self.component}"
        self.guard.pipeline.emitter.emit(
            GuardInternalError(session=None, component=where, error_type=error, message=message)
        )
        if self.guard.config.fail_mode == "closed":
            raise GuardFailure(message, component=where, error_type=error) from exc
        return True


class KeepsReports:
    """An adapter's record of what its guard did, one report per model call (the latest
    :data:`KEPT`)."""

    def __init__(self) -> None:
        self._reports: collections.deque[GuardReport] = collections.deque(maxlen=KEPT)

    @property
    def reports(self) -> tuple[GuardReport, ...]:
        """What the guard did for each model call, oldest first (the latest 1,000; each answer
        also carries its own: ``agentguard.report_of(answer)``)."""
        return tuple(self._reports)

    @property
    def last_report(self) -> GuardReport | None:
        """What the guard did for the latest model call."""
        return self._reports[-1] if self._reports else None

    def _keep(self, report: GuardReport | None) -> None:
        if report is not None:
            self._reports.append(report)
