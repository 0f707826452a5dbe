"""bench_agenttasks's parts that need no model: the fake tools, the tasks, the stronger tier
that stands in for a real one, and the agent loop through the real openai client."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentguard.testing import Reply, ScriptedModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import agenttasks
import bench_agenttasks

openai = pytest.importorskip("openai")


def test_the_fake_tools_answer_deterministically() -> None:
    """Known inputs get their fixed answers; anything else an error object, never an exception."""
    assert json.loads(agenttasks.run_tool("get_weather", {"city": "paris "}))["temperature_c"] == 18
    assert json.loads(agenttasks.run_tool("get_weather", {"city": "Atlantis"})) == {
        "error": "not found"
    }
    assert "bad arguments" in agenttasks.run_tool("get_weather", {"town": "Paris"})
    assert "no tool" in agenttasks.run_tool("make_coffee", {})
    usd = {"amount": "100", "from_currency": "usd", "to_currency": "EUR"}
    assert json.loads(agenttasks.run_tool("convert_currency", usd)) == {"result": 92.0}


def test_each_task_is_answered_by_its_calls_and_judged_by_its_facts() -> None:
    """Every task's calls return the facts its correct answer states."""
    assert len(agenttasks.TASKS) >= 10
    assert len(agenttasks.SINGLE_TURN) >= 20
    for task in agenttasks.TASKS:
        results = " ".join(agenttasks.run_tool(name, args) for name, args in task.calls)
        assert all(fact.lower() in results.lower() for fact in task.facts), task.name
        assert task.correct(task.answer)
        assert not task.correct("I do not know.")
        assert not task.correct(None)


def test_the_stronger_tier_makes_each_call_then_answers() -> None:
    """The oracle asks for each call the task needs, in order, then gives the answer."""
    task = agenttasks.TASKS[-1]  # two calls
    messages: list[dict[str, object]] = [{"role": "user", "content": task.question}]
    for name, _args in task.calls:
        step = agenttasks.oracle(messages)
        (call,) = step["tool_calls"]
        assert call["function"]["name"] == name
        messages.append(step)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
    assert agenttasks.oracle(messages)["content"] == task.answer
    assert "cannot" in agenttasks.oracle([{"role": "user", "content": "hi"}])["content"]


def test_the_agent_loop_runs_tools_and_counts_repeats() -> None:
    """Through the real openai client on loopback: a native call, a repeat, then the answer."""
    task = agenttasks.TASKS[0]
    call = Reply.call("get_weather", {"city": "Paris"})
    model = ScriptedModel([call, call, Reply.text(task.answer)])
    with model.serve() as url, bench_agenttasks._client(openai, url) as client:
        out = bench_agenttasks.agent(client, "m", task, guarded=False)
    assert (out.finished, out.correct, out.repeats, out.turns) == (True, True, 1, 3)
    assert out.tokens > 0
    # every request carried the instructions, the examples and the task
    first = model.requests[0].messages
    assert first[0]["content"] == agenttasks.SYSTEM
    assert first[-1] == {"role": "user", "content": task.question}


def test_the_guarded_agent_gets_the_text_call_and_the_strong_tier() -> None:
    """Guarded, two tiers: a text call is run as a call; a half-written answer the small tier
    cannot mend goes to the scripted strong tier, which finishes the task."""
    task = agenttasks.TASKS[0]
    small = ScriptedModel(
        [Reply.text('{"name": "get_weather", "arguments": {"city": "Paris"}}')]
        + [Reply.text("functions.get_weather:")] * 4
    )
    with small.serve() as url, bench_agenttasks._strong_tier() as strong:
        config = bench_agenttasks._config("m", strong)
        import agentguard as ag

        with ag.wrap(bench_agenttasks._client(openai, url), config) as client:
            out = bench_agenttasks.agent(client, "m", task, guarded=True)
    assert out.correct, out
    assert "strong" in out.tiers
    assert out.error is None


def test_the_tables_say_the_stronger_tier_is_scripted() -> None:
    """The report names the scripted tier and counts per stack."""
    outcome = bench_agenttasks.Outcome("weather_paris", finished=True, correct=True, tokens=10)
    data = {
        "results": {stack: [outcome] for stack, *_ in bench_agenttasks.STACKS},
        "single": {"raw": (0, 20), "guarded": (15, 20)},
        "placement": dict.fromkeys(bench_agenttasks.PLACEMENTS, (1, 1)),
        "model": "m",
    }
    main, per_task, single, placement = bench_agenttasks.tables(data)
    assert "scripted" in main.description
    assert "small-model profile" in main.description
    assert main.rows[0][2] == "**1/1**"
    assert "75%" in single.rows[1][2]
    assert per_task.rows[0][0] == "`weather_paris`"
    assert [row[0] for row in placement.rows] == list(bench_agenttasks.PLACEMENTS)


def test_the_single_turn_table_has_a_row_per_server_mode_and_stack() -> None:
    """The function-calling mode's rows follow the chat template's, each stack once."""
    outcome = bench_agenttasks.Outcome("weather_paris")
    counts = {"raw": (0, 20), "guarded": (5, 20), "guarded, profile": (9, 20)}
    data = {
        "results": {stack: [outcome] for stack, *_ in bench_agenttasks.STACKS},
        "single": {"model's chat template": counts, "function-calling mode": counts},
        "placement": {},
        "model": "m",
    }
    single = bench_agenttasks.tables(data)[2]
    assert [row[:2] for row in single.rows] == [
        [mode, stack] for mode in data["single"] for stack in counts
    ]
    assert "45%" in single.rows[-1][2]


def test_saved_measurements_give_the_same_tables(tmp_path: Path) -> None:
    """--save then --load (or AGENTTASKS_SAVED for run.py): the tables come back the same."""
    outcome = bench_agenttasks.Outcome("weather_paris", finished=True, tiers={"small"})
    data = {
        "results": {stack: [outcome] for stack, *_ in bench_agenttasks.STACKS},
        "single": {"raw": (0, 20), "guarded": (15, 20)},
        "placement": dict.fromkeys(bench_agenttasks.PLACEMENTS, (1, 0)),
        "model": "m",
    }
    path = tmp_path / "saved.json"
    bench_agenttasks._save(data, str(path))
    again = bench_agenttasks.tables(bench_agenttasks._load(str(path)))
    assert [t.rows for t in again] == [t.rows for t in bench_agenttasks.tables(data)]
