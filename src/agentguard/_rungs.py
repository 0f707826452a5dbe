"""The loop recovery ladder's rule: which rung a loop gets (the guard's, and the scan's replay).

It lives apart from :mod:`agentguard.guard._recovery` (which re-exports it) so that
``agentguard scan`` replays the ladder without importing the guard package: a command's
start-up time is throughput when it scans many small files.
"""

from __future__ import annotations

from agentguard.config import LoopRecoveryConfig
from agentguard.config._models import RecoveryRung
from agentguard.loops._detectors import REGISTRY
from agentguard.types import Severity

__all__ = ["TEXT_DETECTORS", "climb"]

#: The rungs a loop at BREAK starts at, at least (the first of them in the configured ladder).
_AT_BREAK: tuple[RecoveryRung, ...] = ("force", "escalate", "stop")

#: The detectors of loops in the model's text rather than in its tool calls.
TEXT_DETECTORS = frozenset(d.name for d in REGISTRY if d.consumes == {"text"})


def climb(
    current: int, severity: Severity, config: LoopRecoveryConfig, *, tool_loop: bool = True
) -> int:
    """The rung (an index into ``config.rungs``) a request at ``severity`` gets, when the run's
    last one was ``current`` (-1: none yet): the next one, and at BREAK a forcing one at least.

    A loop in the text (``tool_loop`` false) skips ``force``: the model already answers in text,
    turning its tools off changes nothing.
    """
    rungs = config.rungs
    usable = [i for i, rung in enumerate(rungs) if tool_loop or rung != "force"]
    step = next((i for i in usable if i > current), usable[-1])
    if severity >= Severity.BREAK:
        floor = next((i for i in usable if rungs[i] in _AT_BREAK), step)
        step = max(step, floor)
    return step
