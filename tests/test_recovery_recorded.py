"""The loop recovery ladder on recorded real small-model runs that used to stall.

SmolLM2-135M, in three recorded loop-recovery runs (``tests/data/smollm2_same_result_loops.json``,
source in ``tests/data/SOURCES.md``), keeps calling its one tool with changing, garbled arguments
and gets the same result every time (a mail server that is down, a customer search that finds
nobody, a rate limit). The guard hinted once; every call after the hint asked "another question"
by the arguments, so no detector saw the loop go on and the ladder never climbed. A flagged run
now continues whatever the arguments while the tool's result stays the same.

The model's recorded answers are replayed by a scripted upstream behind the real openai client,
with the benchmark's agent loop (eight turns at most, the recorded tool results).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import agentguard as ag
from _openai_upstream import wrapped_client
from agentguard.loops import LoopDetector
from agentguard.testing import Reply, ScriptedModel
from agentguard.transport import ModelRequest, report_of
from agentguard.types import Severity

pytest.importorskip("openai")

RECORDED = json.loads(
    (Path(__file__).resolve().parent / "data" / "smollm2_same_result_loops.json").read_text(
        encoding="utf-8"
    )
)
RUNS = {run["task"]: run for run in RECORDED["runs"]}
CONFIG = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
#: The result (0-based) each run was first flagged at: where the recorded run got its hint.
FIRST_FLAG = {"email_down": 5, "customer_none": 5, "rate_limited": 3}
#: The rungs the eight turns take now (the recording took ``hint`` alone).
RUNGS = {
    "email_down": ["hint", "summary"],
    "customer_none": ["hint", "summary"],
    "rate_limited": ["hint", "summary", "prune", "force"],
}


def _transcript(run: dict[str, Any]) -> list[dict[str, Any]]:
    messages = [
        {"role": "system", "content": RECORDED["system"]},
        {"role": "user", "content": run["question"]},
    ]
    results = iter(run["results"])
    for answer in run["answers"]:
        messages.append(answer)
        for call in answer.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": next(results)})
    return messages


@pytest.mark.parametrize("task", sorted(RUNS))
def test_after_the_first_flag_every_same_result_is_flagged_and_climbs(task: str) -> None:
    run = RUNS[task]
    assert run["recorded_rungs"] == ["hint"]  # the stall this file is about
    assert len(set(run["results"])) == 1  # one answer, whatever the arguments
    det = LoopDetector(tools=run["tools"])
    severities = []
    for message in _transcript(run):
        verdicts = det.observe(message)
        if message["role"] == "tool":
            severities.append(max(v.severity for v in verdicts))
    first = FIRST_FLAG[task]
    assert all(s is Severity.OK for s in severities[:first])  # exploring, by the arguments
    after = severities[first:]
    assert all(s >= Severity.WARNING for s in after)
    assert after == sorted(after)  # sticky: never down while the loop goes on
    assert after[-1] > Severity.WARNING


def _replay(run: dict[str, Any]) -> tuple[list[list[str]], ScriptedModel]:
    """The benchmark's agent on the recorded answers: each request's rungs, and the upstream."""
    answers = iter(run["answers"])

    def step(request: ModelRequest) -> Reply:
        answer = next(answers)
        return Reply(content=answer["content"] or None, tool_calls=tuple(answer["tool_calls"]))

    model = ScriptedModel([step], cycle=True)
    client = wrapped_client(model, CONFIG)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": RECORDED["system"]},
        {"role": "user", "content": run["question"]},
    ]
    results = iter(run["results"])
    rungs = []
    for _ in range(len(run["answers"])):
        before = copy.deepcopy(messages)
        answer = client.chat.completions.create(
            model="smollm2", messages=messages, tools=run["tools"], tool_choice="auto"
        )
        assert messages == before  # the caller's history is never touched
        rungs.append(list(report_of(answer).recovery))
        message = answer.choices[0].message.model_dump(exclude_none=True)
        messages.append({"role": "assistant", "content": "", "tool_calls": message["tool_calls"]})
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": next(results)})
    return rungs, model


@pytest.mark.parametrize("task", sorted(RUNS))
def test_the_ladder_climbs_on_the_recorded_runs(task: str) -> None:
    run = RUNS[task]
    rungs, model = _replay(run)
    first = FIRST_FLAG[task] + 1  # the request carrying the first flagged result
    assert rungs[:first] == [[]] * first  # unchanged up to the recorded hint
    assert [r for step in rungs for r in step] == RUNGS[task]
    assert all(len(step) == 1 for step in rungs[first:])  # one rung per request, no pause
    sent = model.requests
    assert sent[first].messages[-1]["content"].startswith("[agentguard] ")
    summary = sent[first + 1].messages[-1]["content"]
    assert "What you tried and what came back:" in summary
    forced = [r for r in sent if r.params.get("tool_choice") == "none"]
    assert len(forced) == RUNGS[task].count("force")


@pytest.mark.parametrize("user_turn", [True, False], ids=["user message", "none"])
def test_a_user_message_ends_a_flagged_loop_in_a_live_session(user_turn: bool) -> None:
    """The live guard hears the user too: after the hint, a recorded call with other arguments
    brings the same failure back — the flagged loop going on, unless the user said something
    new in between (then it is judged anew, as ``scan`` judges it)."""
    run = RUNS["rate_limited"]
    failure = run["results"][0]
    model = ScriptedModel([Reply.text("ok")], cycle=True)
    client = wrapped_client(model, CONFIG)

    def exchange(answer: dict[str, Any]) -> list[dict[str, Any]]:
        call = answer["tool_calls"][0]
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": failure},
        ]

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": RECORDED["system"]},
        {"role": "user", "content": run["question"]},
    ]
    rungs = []
    for turn in range(4):
        if turn == 3 and user_turn:
            messages.append({"role": "user", "content": "It should work now, try again."})
        # three identical calls (the hint), then one with other arguments
        messages += exchange(run["answers"][0 if turn < 3 else 4])
        answer = client.chat.completions.create(
            model="smollm2", messages=messages, tools=run["tools"]
        )
        rungs.append(list(report_of(answer).recovery))
        messages.append({"role": "assistant", "content": "ok"})
    assert rungs == [[], [], ["hint"], [] if user_turn else ["summary"]]
