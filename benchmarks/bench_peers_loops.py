"""Loop detection against a peer: agentguard's LoopDetector and the OpenHands SDK's stuck detector.

Method. Each scenario is one agent run written once, neutrally (the assistant's words, its tool
call, the tool's result, per step), then fed to both detectors in their own native form:

- agentguard: OpenAI-format messages into :meth:`LoopDetector.observe` (what the guard does on
  every call), default configuration. A step is *flagged* at its first verdict of WARNING or
  above (a WARNING puts a hint in front of the model; BREAK stops the call) — both are shown.
- OpenHands: the SDK's own event objects (``MessageEvent``, ``ActionEvent`` carrying the
  assistant's words as its ``thought`` and an ``MCPToolAction`` with the arguments,
  ``ObservationEvent`` / ``AgentErrorEvent``) appended to a real ``ConversationState``, then
  ``StuckDetector.is_stuck()`` — which the SDK's run loop calls once per agent step — with its
  default thresholds. A step is flagged when ``is_stuck()`` first returns True after it; the SDK
  then stops the run (it has no softer level).

Scenarios where the run must go on (a healthy run, a poll that makes progress) count a flag as a
false alarm. The cost table times one step's detection at a given history length: agentguard's
``observe()`` of the step's two messages, against one ``is_stuck()`` on a state holding that
many events (building the SDK's events and appending them is the framework's cost, not the
detector's, and is left out; so is agentguard's message construction).

The OpenHands SDK needs Python >= 3.12 and is not in the ``bench`` session: ``nox -s
bench_peers`` installs it. Without it the tables say so.
"""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from _harness import Table, side_by_side, us
from _peers import missing, optional
from agentguard.loops import LoopDetector
from agentguard.types import Severity

# -- the shared scenarios ------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One assistant turn: its words, and optionally one tool call with its result."""

    text: str
    call: tuple[str, dict[str, Any]] | None = None
    result: str = ""
    error: bool = False  # the tool failed: ``result`` is the error text


@dataclass(frozen=True)
class Scenario:
    """One run; ``loop`` says whether a detector should flag it."""

    name: str
    loop: bool
    steps: tuple[Step, ...]


_THOUGHTS = (
    "Let me check the build status.",
    "Checking the build again.",
    "I'll look at the build once more.",
    "Let me see whether the build has changed.",
    "One more look at the build.",
    "Re-checking the build result.",
    "Let me query the build status again.",
    "Checking build 8812 again.",
    "Let me verify the build state.",
    "I'll fetch the build status one more time.",
    "Looking at the build again.",
    "Let me re-read the build result.",
)
_QUERIES = (
    "why did the build fail",
    "why did the build fail?",
    "Why did the build fail",
    "why did the build fail today",
    "why did this build fail",
    "why did the last build fail",
    "why did the build fail again",
    "why did my build fail",
    "why did the build fail now",
    "why does the build fail",
    "why did the build fail at all",
    "why did the CI build fail",
)
_FAILED_BUILD = json.dumps({"id": 8812, "status": "failed", "failed_test": "test_login"})
_SEARCH_HITS = "3 hits: docs/ci.md (line 40), docs/build.md (line 12), CHANGELOG.md (line 7)"
_STEPS = 12


def scenarios() -> list[Scenario]:
    """The shared scenario set (12 steps each, but for the one-response runaway)."""
    n = _STEPS
    build = ("get_build", {"id": 8812})
    return [
        Scenario(
            "healthy run (distinct files)",
            False,
            tuple(
                Step(f"Reading module {i}.", ("read_file", {"path": f"src/m{i}.py"}), f"code {i}")
                for i in range(n)
            ),
        ),
        Scenario(
            "polling with progress",
            False,
            tuple(
                Step(
                    "Checking the build.",
                    build,
                    json.dumps({"id": 8812, "status": "running", "progress": 8 * i}),
                )
                for i in range(n)
            ),
        ),
        Scenario(
            "identical loop, same wording",
            True,
            tuple(Step("Checking the build.", build, _FAILED_BUILD) for _ in range(n)),
        ),
        Scenario(
            "identical loop, varied wording",
            True,
            tuple(Step(_THOUGHTS[i], build, _FAILED_BUILD) for i in range(n)),
        ),
        Scenario(
            "stalled poll (only a timestamp changes)",
            True,
            tuple(
                Step(
                    "Checking the build.",
                    build,
                    json.dumps(
                        {
                            "id": 8812,
                            "status": "running",
                            "progress": 40,
                            "checked_at": f"2026-05-01T10:{i:02d}:00Z",
                            "request_id": f"req-{9000 + i}",
                        }
                    ),
                )
                for i in range(n)
            ),
        ),
        Scenario(
            "same call, same error",
            True,
            tuple(
                Step("Opening the config.", ("read_file", {"path": "conf.yml"}), err, error=True)
                for err in ["Error: permission denied: conf.yml"] * n
            ),
        ),
        Scenario(
            "ping-pong between two calls",
            True,
            tuple(
                Step(
                    "Comparing the two files.",
                    ("read_file", {"path": "a.py" if i % 2 == 0 else "b.py"}),
                    "code A" if i % 2 == 0 else "code B",
                )
                for i in range(n)
            ),
        ),
        Scenario(
            "paraphrased arguments, same result",
            True,
            tuple(
                Step("Searching the docs.", ("search", {"query": q}), _SEARCH_HITS)
                for q in _QUERIES[:n]
            ),
        ),
        Scenario(
            "paraphrased arguments, same short result",
            True,
            tuple(
                Step("Searching the docs.", ("search", {"query": q}), "no match")
                for q in _QUERIES[:n]
            ),
        ),
        Scenario(
            "text loop (same message, no tool calls)",
            True,
            tuple(Step("I will now check why the build failed.") for _ in range(n)),
        ),
        Scenario(
            "text loop inside one response",
            True,
            (Step("Let me check the file again. " * 60),),
        ),
        Scenario(
            "distinct messages, no tool calls",
            False,
            tuple(
                Step(f"Part {i + 1} of the summary: module m{i}.py has {10 + i} functions.")
                for i in range(6)
            ),
        ),
    ]


# -- the two detectors ---------------------------------------------------------------------------


def _messages(step: Step, i: int) -> list[dict[str, Any]]:
    """One step as OpenAI-format messages (assistant, then its tool result)."""
    if step.call is None:
        return [{"role": "assistant", "content": step.text}]
    name, args = step.call
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    return [
        {"role": "assistant", "content": step.text, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": step.result},
    ]


def agentguard_flags(scenario: Scenario) -> tuple[int | None, int | None, str]:
    """(first step flagged ≥ WARNING, first step at BREAK, the detector that decided)."""
    detector = LoopDetector(hooks=(), _process_hooks=False)
    warned = broke = None
    name = ""
    for i, step in enumerate(scenario.steps, 1):
        for message in _messages(step, i):
            for verdict in detector.observe(message):
                if verdict.severity >= Severity.WARNING and warned is None:
                    warned, name = i, verdict.detector or ""
                if verdict.severity >= Severity.BREAK and broke is None:
                    broke = i
    return warned, broke, name


class OpenHands:
    """The OpenHands SDK's stuck detector over a real ``ConversationState``."""

    def __init__(self) -> None:
        from openhands.sdk import LLM, Agent
        from openhands.sdk.conversation.state import ConversationState
        from openhands.sdk.conversation.stuck_detector import StuckDetector
        from openhands.sdk.event import (
            ActionEvent,
            AgentErrorEvent,
            MessageEvent,
            ObservationEvent,
        )
        from openhands.sdk.llm import Message, MessageToolCall, TextContent
        from openhands.sdk.mcp.definition import MCPToolAction, MCPToolObservation
        from openhands.sdk.workspace import LocalWorkspace

        logging.getLogger("openhands").setLevel(logging.ERROR)  # "loop detected" warnings
        self._tmp = TemporaryDirectory(prefix="agentguard-peers-")
        self.state = ConversationState.create(
            id=uuid.uuid4(),
            agent=Agent(llm=LLM(model="openai/bench", api_key="sk-bench", usage_id="b"), tools=[]),
            workspace=LocalWorkspace(working_dir=str(Path(self._tmp.name))),
        )
        self.detector = StuckDetector(self.state)
        self._t = (
            ActionEvent,
            AgentErrorEvent,
            MessageEvent,
            ObservationEvent,
            Message,
            MessageToolCall,
            TextContent,
            MCPToolAction,
            MCPToolObservation,
        )
        self.say("user", "Find out why build 8812 failed.")

    def close(self) -> None:
        self._tmp.cleanup()

    def say(self, source: str, text: str) -> None:
        """A user or agent message."""
        _, _, message_event, _, message, _, content, _, _ = self._t
        role = "user" if source == "user" else "assistant"
        self.state.append_event(
            message_event(
                source=source, llm_message=message(role=role, content=[content(text=text)])
            )
        )

    def events(self, step: Step, i: int) -> list[Any]:
        """One step as the SDK's own events (an action and its observation, or a message)."""
        action_event, error_event, _, obs_event, _, tool_call, content, action, obs = self._t
        assert step.call is not None
        name, args = step.call
        call_id = f"call_{i}"
        act = action_event(
            thought=[content(text=step.text)],
            action=action(data=args),
            tool_name=name,
            tool_call_id=call_id,
            tool_call=tool_call(
                id=call_id, name=name, arguments=json.dumps(args), origin="completion"
            ),
            llm_response_id=f"resp_{i}",
        )
        if step.error:
            return [act, error_event(error=step.result, tool_name=name, tool_call_id=call_id)]
        observation = obs(content=[content(text=step.result)], tool_name=name)
        return [
            act,
            obs_event(
                observation=observation, action_id=act.id, tool_name=name, tool_call_id=call_id
            ),
        ]

    def feed(self, step: Step, i: int) -> None:
        if step.call is None:
            self.say("agent", step.text)
            return
        for event in self.events(step, i):
            self.state.append_event(event)


def openhands_flags(scenario: Scenario) -> int | None:
    """The first step after which ``is_stuck()`` is True."""
    peer = OpenHands()
    try:
        for i, step in enumerate(scenario.steps, 1):
            peer.feed(step, i)
            if peer.detector.is_stuck():
                return i
        return None
    finally:
        peer.close()


# -- tables --------------------------------------------------------------------------------------


def _outcome(scenario: Scenario, step: int | None) -> str:
    if scenario.loop:
        return f"caught @ step {step}" if step else "**missed**"
    return f"**false alarm** @ step {step}" if step else "ok (not flagged)"


def _catches() -> Table:
    rows: list[list[object]] = []
    score = {"agentguard": 0, "openhands": 0}
    for scenario in scenarios():
        warned, broke, detector = agentguard_flags(scenario)
        peer = openhands_flags(scenario)
        ours = _outcome(scenario, warned)
        if warned and scenario.loop:
            ours += f" ({detector}; BREAK @ {broke})" if broke else f" ({detector}; no BREAK)"
        elif warned:  # a false alarm: say whether it only hinted or blocked a call
            ours += f" ({detector}; " + (f"BREAK @ {broke})" if broke else "a hint, never blocks)")
        score["agentguard"] += bool(warned) == scenario.loop
        score["openhands"] += bool(peer) == scenario.loop
        rows.append([scenario.name, len(scenario.steps), ours, _outcome(scenario, peer)])
    n = len(rows)
    rows.append(
        [
            "**right calls**",
            "",
            f"**{score['agentguard']}/{n}**",
            f"**{score['openhands']}/{n}**",
        ]
    )
    return Table(
        "Loop detection vs the OpenHands SDK's stuck detector: what each catches",
        ["scenario", "steps", "agentguard LoopDetector", "OpenHands StuckDetector"],
        rows,
        description=(
            "The same runs fed to both detectors in their own native form (see the module "
            "docstring of `benchmarks/bench_peers_loops.py`), default settings on both. A step "
            "is one assistant turn (its words, one tool call, the result). agentguard: the first "
            "step with a WARNING or above (a hint to the model), and where it reaches BREAK "
            "(the call is not run); OpenHands: the first step after which `is_stuck()` is True "
            "(the run stops)."
        ),
        notes=[
            "OpenHands compares whole events for equality: an action equals another only if its "
            "`thought` (the assistant's words), tool and arguments are all the same, and an "
            "observation only if its text is. A loop whose wording varies, whose result carries "
            "a timestamp, or whose arguments are paraphrased never matches; agentguard "
            "identifies calls by canonical arguments, results with volatile fields stripped, "
            "and groups near-duplicate arguments with the same result.",
            "Where OpenHands is ahead: it *stops* an identical loop sooner (after 4 identical "
            "action/observation pairs, 4 identical errors, 6 alternating steps). "
            "agentguard hints earlier (a WARNING puts a note in front of the model) but lets "
            "the run go on until its BREAK (7 identical calls; 5 errors; 10 ping-pong steps), "
            "since a legitimate retry or poll looks the same for its first calls. Both are "
            "configurable (`loop_detection.*`, `StuckDetectionThresholds`).",
            "Where agentguard is wrong: a poll that makes progress for 10 calls gets a hint "
            "(`generic_repeat` counts identical calls; progress caps it at a WARNING, so it "
            "never blocks). Declaring the tool as a poll (`ToolLoopPolicy(polling=True)`) "
            "silences it; OpenHands sees the changing result and says nothing. A paraphrased "
            "search that keeps returning a short result ('no match') is missed by design: "
            "results under `near_duplicate_min_result_chars` (48) say nothing about whether "
            "two calls differed.",
            "OpenHands' monologue check counts consecutive agent messages whatever they say, "
            "so three different messages in a row count as stuck (the last scenario). In an "
            "OpenHands conversation an agent message without a tool call normally ends the "
            "turn, so that pattern rarely reaches its detector; it matters for chat-style "
            "agents.",
        ],
    )


def _cost_at(size: int, repeat: int, min_time: float) -> tuple[float, float]:
    """(agentguard, OpenHands) µs of one step's detection after ``size`` events."""
    history = [
        Step(f"Reading module {i}.", ("read_file", {"path": f"src/m{i}.py"}), f"code {i}")
        for i in range(size // 2)
    ]
    ours = LoopDetector(hooks=(), _process_hooks=False)
    for i, step in enumerate(history):
        for message in _messages(step, i):
            ours.observe(message)
    peer = OpenHands()
    for i, step in enumerate(history):
        peer.feed(step, i)
    steps = itertools.cycle(  # new calls; each recurs long after it left the window
        [
            _messages(
                Step(f"Reading file {k}.", ("read_file", {"path": f"lib/f{k}.py"}), f"text {k}"),
                size + k,
            )
            for k in range(4096)
        ]
    )

    def agentguard_step() -> None:
        for message in next(steps):
            ours.observe(message)

    check: Callable[[], object] = peer.detector.is_stuck
    try:
        theirs, mine = side_by_side(check, agentguard_step, repeat=repeat, min_time=min_time)
    finally:
        peer.close()
    return us(mine), us(theirs)


def _cost(quick: bool) -> Table:
    repeat = 3 if quick else 7
    min_time = 0.02 if quick else 0.2
    rows: list[list[object]] = []
    for size in (100, 1_000) if quick else (100, 1_000, 10_000):
        mine, theirs = _cost_at(size, repeat, min_time)
        rows.append([f"{size:,} events", mine, theirs, f"{theirs / mine:.1f}×"])
    return Table(
        "Loop detection vs the OpenHands SDK: cost per step as the history grows",
        ["history", "agentguard µs / step", "OpenHands µs / step", "OpenHands ÷ agentguard"],
        rows,
        description=(
            "CPU time in alternating rounds, same process. agentguard: `observe()` of one "
            "step's assistant message and tool result (every detector runs). OpenHands: one "
            "`is_stuck()` on a `ConversationState` (in-memory event log) holding that many "
            "events of a healthy run — what its run loop calls once per step."
        ),
        notes=[
            "Both stay flat as the history grows: agentguard keeps O(window) state; OpenHands "
            "reads only the last 20 events of the active branch.",
        ],
    )


def run(quick: bool) -> list[Table]:
    """The peer comparison's tables (a one-row note when openhands-sdk is not installed)."""
    if optional("openhands.sdk.conversation.stuck_detector") is None:
        return [
            missing(
                "Loop detection vs the OpenHands SDK's stuck detector",
                "openhands-sdk",
                ["comparison", "result"],
            )
        ]
    return [_catches(), _cost(quick)]
