"""The same judgment as the live guard: every loopbench episode, scanned as a recorded trace and
replayed through a real :class:`~agentguard.Guard` (a model transport answering with the
episode's own answers), gives the same loop findings at the same steps, and the guard climbs
the same rungs of its recovery ladder at the same steps.

A step is one model call. The guard judges an answer in the call that produced it and a tool
result in the next call, before the model is asked; the scan dates each finding the same way
(:attr:`Issue.step`). The replay ends where the recorded run stops being what the guard would
have seen: at an answer judged at BREAK (the guard asks the model again, and the recording has
no such answer) or when the guard stops the run. Results after an episode's last answer are
never judged live (no further call sees them), so they are left out. Tool-call checks are the
validator's and are compared in ``test_scan_audit.py``; here validation is off so that no
corrective re-ask changes the replay.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard
from agentguard.cli._audit import SessionAudit
from agentguard.config import GuardConfig
from agentguard.events import Event, LoopFlagged, LoopRecovery
from agentguard.exceptions import LoopDetected
from agentguard.testing import FakeClock
from agentguard.transport import ModelRequest, ModelResponse
from agentguard.types import Severity

EPISODES = Path(__file__).resolve().parents[1] / "benchmarks" / "loopbench" / "episodes.jsonl"
CONFIG = GuardConfig.from_dict({"tool_validation": {"enabled": False}}, env={})

Judged = dict[int, set[tuple[str, str | None, str]]]  # step -> {(detector, tool, severity)}


def episodes() -> list[dict[str, Any]]:
    """Every labelled loopbench episode."""
    with EPISODES.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class Recorded:
    """A model transport that answers with the recorded answers, exactly as recorded (their
    reasoning and sub-agent names included), one per call."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self._answers = iter(answers)

    def send(self, request: ModelRequest) -> ModelResponse:
        """The next recorded answer."""
        message = next(self._answers, None) or {"role": "assistant", "content": "(the end)"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return ModelResponse.from_body({"id": "r", "model": request.model, "choices": [choice]})

    async def asend(self, request: ModelRequest) -> ModelResponse:
        """As :meth:`send`."""
        return self.send(request)


Rungs = list[tuple[int, str]]


def replay(episode: dict[str, Any]) -> tuple[Judged, Rungs, int | None, int]:
    """The episode through a real guard: per step what it flagged, the rungs it took, the
    step of the first BREAK, and the last step replayed."""
    messages = episode["messages"]
    answers = [m for m in messages if m.get("role") == "assistant"]
    flagged: Judged = defaultdict(set)
    rungs: Rungs = []
    first_break: list[int] = []
    step = 0

    def hook(event: Event) -> None:
        if isinstance(event, LoopFlagged):
            flagged[step].add((event.detector, event.tool, event.severity))
            if event.severity == "break" and not first_break:
                first_break.append(step)
        elif isinstance(event, LoopRecovery):
            rungs.append((step, event.rung))

    clock = FakeClock()
    guard = Guard(Recorded(answers), CONFIG, clock=clock, sleep=clock.sleep, hooks=[hook])
    history: list[dict[str, Any]] = []
    params = {"tools": episode["tools"]} if episode.get("tools") else {}
    for message in messages:
        if message.get("role") != "assistant":
            history.append(message)
            continue
        step += 1
        request = ModelRequest(model="m", messages=list(history), params=params)
        try:
            response = guard.complete(request, session=episode["id"])
        except (LoopDetected, StopIteration):  # stopped, or re-asked past the recording
            break
        if first_break:
            break
        history.append(dict(response.message))  # what the agent would append: the answer
    return flagged, rungs, (first_break[0] if first_break else None), step


def scanned(episode: dict[str, Any]) -> tuple[Judged, int | None, SessionAudit]:
    """The scan's loop findings per step, the step of its first BREAK, and the audit."""
    audit = SessionAudit(episode["id"], CONFIG, bytearray())
    judged: Judged = defaultdict(set)
    first_break = None
    for message in episode["messages"]:
        before = len(audit.issues)
        audit.feed(message)
        for issue in audit.issues[before:]:
            if issue.category == "loop":
                judged[issue.step].add((issue.detector, issue.tool, str(issue.severity)))
                if issue.severity >= Severity.BREAK and first_break is None:
                    first_break = issue.step
    audit.finish()
    return judged, first_break, audit


@pytest.mark.parametrize(
    "episode",
    episodes(),
    ids=lambda e: e["id"],
)
def test_scan_and_live_guard_flag_the_same_loops_at_the_same_steps(
    episode: dict[str, Any],
) -> None:
    """Each scan finding is among what the guard flagged at that step; the steps with a verdict
    above OK are the same; the first BREAK is at the same step; the guard's recovery rungs are
    the ones the scan says it would take, at the same steps."""
    live, live_rungs, live_break, last = replay(episode)
    scan, scan_break, audit = scanned(episode)
    steps = sum(1 for m in episode["messages"] if m.get("role") == "assistant")
    if scan_break is not None and scan_break > steps:
        scan_break = None  # on a result after the last answer: no call judges it live
    if live_break is not None or (scan_break is not None and scan_break <= last):
        assert scan_break == live_break
    # at the last step replayed the live run ended (stopped, or re-asked past the recording):
    # what followed its request-time decision there is not comparable
    for step, findings in scan.items():
        if step < last:
            assert findings <= live.get(step, set()), (step, findings, live.get(step))
    timeline = audit.timeline or bytearray()
    severe_steps = set()
    n = 0
    for message, code in zip(episode["messages"], timeline, strict=True):
        n += message.get("role") == "assistant"
        if (code >> 2) & 0x3:
            severe_steps.add(n if message.get("role") == "assistant" else n + 1)
    live_steps = {s for s, flags in live.items() if flags}
    assert {s for s in severe_steps if s < last} == {s for s in live_steps if s < last}
    # the rungs: the same before the last step, and the same first one at it
    scan_rungs = audit.ladder.taken
    assert [r for r in scan_rungs if r[0] < last] == [r for r in live_rungs if r[0] < last]
    assert [r for r in scan_rungs if r[0] == last][:1] == [r for r in live_rungs if r[0] == last][
        :1
    ]
