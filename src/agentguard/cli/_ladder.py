"""What the live guard would have done about a loop, step by step: its recovery ladder replayed.

The guard judges a request's new messages (the tool results since the last answer) before it
asks the model: a loop there, at WARNING or above, climbs one rung of
``loop_detection.recovery.rungs`` (``hint``, ``summary``, ``prune``, ``force``, ``escalate``,
``stop``; a loop at BREAK starts at ``force`` at least), and a request without one resets the
ladder. It judges the answer too: at BREAK the answer is not delivered and the model is asked
again one rung higher (``stop`` when there is none); below BREAK the answer passes with a
warning in the report (``warn``). The rungs are climbed by the guard's own
:func:`agentguard._rungs.climb`; ``escalate`` is resolved by the escalation policy
(``stop`` when no stronger tier takes ``loop_detected``).
"""

from __future__ import annotations

from agentguard._rungs import TEXT_DETECTORS, climb
from agentguard.config import GuardConfig
from agentguard.escalation import EscalationPolicy
from agentguard.types import Severity

__all__ = ["Ladder"]


class Ladder:
    """The recovery ladder of one session, fed the verdict on each message in order.

    Args:
        config: its ``loop_detection.recovery``, ``escalation`` and ``tiers`` sections.
    """

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        #: every rung the guard would have taken: ``(step, rung)``
        self.taken: list[tuple[int, str]] = []
        #: what each rung does, escalation resolved: ``(step, action, detector)``
        self.acts: list[tuple[int, str, str | None]] = []
        self._rung = -1
        self._worst = Severity.OK  # the request being gathered: its worst verdict
        self._detector: str | None = None
        self._new = False  # the request has messages the guard had not seen
        self._model: str | None = None

    def message(self, severity: Severity, detector: str | None) -> None:
        """A message of the next request (a tool result, a user turn), judged at ``severity``."""
        self._new = True
        if severity > self._worst:
            self._worst, self._detector = severity, detector

    def request(self, step: int, model: str | None = None) -> str | None:
        """The guard receives the request of ``step``: the rung it takes (``None``: none)."""
        self._model = model or self._model
        worst, detector, new = self._worst, self._detector, self._new
        self._worst, self._detector, self._new = Severity.OK, None, False
        if worst < Severity.WARNING:
            if new:
                self._rung = -1  # out of the loop: a later one starts the ladder again
            return None
        return self._climb(step, worst, detector, reask=False)

    def answer(self, step: int, severity: Severity, detector: str | None) -> str:
        """The answer of ``step`` judged at ``severity`` (WARNING or above): what the guard does
        with it."""
        if severity < Severity.BREAK:
            return "warn"
        return self._climb(step, severity, detector, reask=True)

    def _climb(self, step: int, severity: Severity, detector: str | None, *, reask: bool) -> str:
        cfg = self.config.loop_detection.recovery
        before = self._rung
        self._rung = climb(before, severity, cfg, tool_loop=detector not in TEXT_DETECTORS)
        rung = "stop" if reask and self._rung <= before else cfg.rungs[self._rung]
        self.taken.append((step, rung))
        action: str = rung
        if rung == "escalate":
            policy = EscalationPolicy(self.config)
            decision = policy.on_failure(policy.tier_for(self._model or ""), "loop_detected")
            action = "stop" if decision.action == "stop" else "escalate"
        self.acts.append((step, action, detector))
        return action

