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

#: the severities compared per message, looked up once (an enum member's lookup is slow)
_OK, _WARNING, _BREAK = Severity.OK, Severity.WARNING, Severity.BREAK


class Ladder:
    """The recovery ladder of one session, fed the verdict on each message in order.

    Args:
        config: its ``loop_detection.recovery``, ``escalation`` and ``tiers`` sections.
    """

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        #: what each rung does, escalation resolved: ``(step, action, detector)``
        self.acts: list[tuple[int, str, str | None]] = []
        #: the places in :attr:`acts` of the ``escalate`` rungs that stopped instead (the rest
        #: of :attr:`taken` is :attr:`acts`: a loop climbs at every message it goes on, and
        #: one list of them is enough)
        self._stopped: list[int] = []
        #: whether the request being gathered has messages the guard had not seen
        self.new = False
        self._recovery = config.loop_detection.recovery
        self._rung = -1
        self._worst = _OK  # the request being gathered: its worst verdict
        self._detector: str | None = None
        #: the rungs; the rung :func:`climb` gives and the rung taken, by ``(rung before,
        #: severity, detector, a re-ask)`` (a loop climbs at every message it goes on); model
        #: -> what ``escalate`` does: shared by the ladders of one config
        _, self._rungs, self._climbs, self._escalation = _shared(config)

    @property
    def taken(self) -> list[tuple[int, str]]:
        """Every rung the guard would have taken: ``(step, rung)``."""
        taken = [(step, action) for step, action, _ in self.acts]
        for at in self._stopped:
            taken[at] = (taken[at][0], "escalate")
        return taken

    def message(self, severity: Severity, detector: str | None) -> None:
        """A message of the next request (a tool result, a user turn), judged at ``severity``."""
        self.new = True
        if severity > self._worst:
            self._worst, self._detector = severity, detector

    def request(self, step: int, model: str | None = None) -> str | None:
        """The guard receives the request of ``step`` (asking ``model``): the rung it takes
        (``None``: none)."""
        if not self.new:  # nothing new since the last request: nothing to judge
            return None
        worst, detector = self._worst, self._detector
        self._worst, self._detector, self.new = _OK, None, False
        if worst < _WARNING:
            self._rung = -1  # out of the loop: a later one starts the ladder again
            return None
        return self.rung(step, worst, detector, model)

    def answer(self, step: int, severity: Severity, detector: str | None,
               model: str | None = None) -> str:  # fmt: skip
        """The answer of ``step`` (by ``model``) judged at ``severity`` (WARNING or above):
        what the guard does with it."""
        if severity < _BREAK:
            return "warn"
        return self.rung(step, severity, detector, model, reask=True)

    def rung(self, step: int, severity: Severity, detector: str | None,
             model: str | None = None, *, reask: bool = False) -> str:  # fmt: skip
        """The rung the guard climbs to for the request of ``step`` judged at ``severity``
        (WARNING or above, by ``detector``; :meth:`request`), or with ``reask`` for its answer
        judged at BREAK, not delivered and asked again (``stop`` when no rung is higher;
        :meth:`answer`); ``escalate`` resolved for ``model``."""
        # (keyed by what it is given, not by what climb() reads of it: a loop climbs at every
        # message it goes on, and the few severities and detectors make few keys)
        key = (self._rung, severity, detector, reask)
        climbed = self._climbs.get(key)
        if climbed is None:
            before = key[0]
            tool_loop = detector not in TEXT_DETECTORS
            rung_at = climb(before, severity, self._recovery, tool_loop=tool_loop)
            taken: str = "stop" if reask and rung_at <= before else self._rungs[rung_at]
            climbed = self._climbs[key] = (rung_at, taken)
        self._rung, action = climbed
        if action == "escalate":
            action = self._escalation.get(model) or self._escalate(model)
            if action != "escalate":
                self._stopped.append(len(self.acts))
        self.acts.append((step, action, detector))
        return action

    def _escalate(self, model: str | None) -> str:
        """What the ``escalate`` rung does for ``model``: ``stop`` when no stronger tier takes
        ``loop_detected``."""
        policy = EscalationPolicy(self.config)
        decision = policy.on_failure(policy.tier_for(model or ""), "loop_detected")
        if len(self._escalation) >= 4096:  # bounded: a trace may name models without end
            self._escalation.clear()
        action = self._escalation[model] = "stop" if decision.action == "stop" else "escalate"
        return action


_Climbs = dict[tuple[int, Severity, str | None, bool], tuple[int, str]]

#: ``id(config)`` -> what the ladders under a config share: the config, its rungs, the
#: :func:`climb` memo and what the ``escalate`` rung does per model (a config is immutable, and
#: held here its id names it alone; a scan builds a ladder per session). Bounded: a process that
#: builds configs without end cannot grow it.
_SHARED: dict[int, tuple[GuardConfig, tuple[str, ...], _Climbs, dict[str | None, str]]] = {}


def _shared(
    config: GuardConfig,
) -> tuple[GuardConfig, tuple[str, ...], _Climbs, dict[str | None, str]]:
    held = _SHARED.get(id(config))
    if held is None or held[0] is not config:
        if len(_SHARED) >= 256:
            _SHARED.clear()
        rungs = tuple(config.loop_detection.recovery.rungs)
        held = _SHARED[id(config)] = (config, rungs, {}, {})
    return held
