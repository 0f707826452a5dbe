"""bench_looprecovery's parts that need no model: the loop-prone tasks' fake tools, the
correctness checks, the agent loop's loop accounting through the real openai client, and the
recorded real run replayed offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import agentguard as ag
from agentguard.testing import Reply, ScriptedModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_looprecovery
from agenttasks.loops import BUILD_POLLS, LOOP_TASKS, TOOLS, LoopTask, Tools, text_call

openai = pytest.importorskip("openai")

RECORDED = Path(__file__).resolve().parents[1] / "benchmarks/agenttasks/looprecovery-smollm2.json"


def _task(name: str) -> LoopTask:
    return next(t for t in LOOP_TASKS if t.name == name)


def test_each_tool_gives_the_same_answer_however_it_is_asked() -> None:
    """Rewordings and repeats get one result (the ticket's timestamp aside); the build passes
    on the poll after BUILD_POLLS; a bad call is an error object, never an exception."""
    tools = Tools()
    a = tools.run("search_flights", {"origin": "Oslo", "destination": "Rome"})
    b = tools.run("search_flights", {"origin": "OSL", "destination": "Rome, Italy"})
    assert a == b == json.dumps({"flights": []})
    t1, t2 = (
        tools.run("get_ticket", {"ticket_id": 552}),
        tools.run("get_ticket", {"ticket_id": 552}),
    )
    assert t1 != t2
    assert bench_looprecovery.progress_key(t1) == bench_looprecovery.progress_key(t2)
    polls = [json.loads(tools.run("get_build", {"build_id": "8812"}))["state"] for _ in range(5)]
    assert polls == ["running"] * BUILD_POLLS + ["passed"] * (5 - BUILD_POLLS)
    assert "bad arguments" in tools.run("read_file", {"file": "config.yaml"})
    assert "no tool" in tools.run("make_coffee", {})
    assert tools.calls["search_flights"] == 2


def test_every_task_has_one_declared_tool() -> None:
    assert len(LOOP_TASKS) >= 10
    names = {t["function"]["name"] for t in TOOLS}
    for task in LOOP_TASKS:
        assert task.tool in names
        assert [t["function"]["name"] for t in task.tools] == [task.tool]


@pytest.mark.parametrize(
    ("name", "right", "wrong"),
    [
        (
            "flights_none",
            "I could not find any flights from Oslo to Rome.",
            "Take SK 4711, 89 EUR.",
        ),
        ("file_missing", "config.yaml does not exist.", "The port is 8080."),
        (
            "email_down",
            "I could not send it: the mail server is unavailable.",
            "The email was sent.",
        ),
        ("docs_empty", "The help pages have no results for that.", "Click 'Forgot password'."),
        ("customer_none", "No customer with that email was found.", "Her number is +1 555 0100."),
        ("weather_unknown", "Atlantis is an unknown city.", "It is 21 °C and sunny in Atlantis."),
        ("order_pending", "Your order 4417 is still pending.", "Yes, order 4417 has shipped."),
        ("ticket_open", "Ticket 552 is still open.", "Ticket 552 is closed."),
        ("rate_limited", "I hit a rate limit; try again later.", "1 USD is 0.92 EUR."),
        ("build_poll", "Build 8812 passed.", "Build 8812 is still running."),
    ],
)
def test_the_correctness_check_accepts_the_fact_and_rejects_a_made_up_one(
    name: str, right: str, wrong: str
) -> None:
    task = _task(name)
    done = Tools()
    for _ in range(task.needs_calls):
        done.run(task.tool, {})
    assert task.correct(right, done)
    assert not task.correct(wrong, done)
    assert not task.correct(None)
    assert not task.correct(f'{{"name": "{task.tool}", "arguments": {{"x": True}}}}')


def test_a_fact_the_run_never_got_back_is_a_guess() -> None:
    """'passed' before the build has passed in the run is not a correct answer."""
    task = _task("build_poll")
    tools = Tools()
    tools.run("get_build", {"build_id": "8812"})
    assert not task.correct("Build 8812 passed.", tools)
    assert task.correct("Build 8812 passed.")  # without the run's tools: the text alone


def test_the_text_call_parser_takes_only_the_asked_format() -> None:
    assert text_call('{"name": "read_file", "arguments": {"path": "a"}}') == (
        "read_file",
        {"path": "a"},
    )
    assert text_call('{"name": "read_file", "arguments": "{\\"path\\": \\"a\\"}"}') == (
        "read_file",
        {"path": "a"},
    )
    assert text_call('Sure: {"name": "read_file", "arguments": {}}') is None
    assert text_call('{"arguments": {}}') is None
    assert text_call("[1, 2]") is None


def test_the_agent_counts_a_loop_and_its_tokens() -> None:
    """Through the real openai client on loopback: three searches with one result (a loop
    episode), then the answer; loop tokens are the turns after the first no-progress call."""
    task = _task("flights_none")
    model = ScriptedModel(
        [
            Reply.call("search_flights", {"origin": "Oslo", "destination": "Rome"}),
            Reply.call("search_flights", {"origin": "Oslo", "destination": "Rome"}),
            # a call written as text is a call too, for this agent
            Reply.text(
                '{"name": "search_flights", "arguments": {"origin": "OSL", "destination": "ROM"}}'
            ),
            Reply.text("There are no flights from Oslo to Rome."),
        ]
    )
    with model.serve() as url, bench_looprecovery._client(openai, url) as client:
        run = bench_looprecovery.agent(client, "m", task, guarded=False)
    assert (run.finished, run.correct, run.error, run.capped) == (True, True, None, False)
    assert run.calls == ["search_flights"] * 3
    assert (run.no_progress, run.most_same, run.first_repeat, run.looped) == (2, 3, 2, True)
    assert len(run.turn_tokens) == 4
    assert all(run.turn_tokens)
    assert run.loop_tokens == sum(run.turn_tokens[2:])
    first = model.requests[0]
    assert first.messages[-1] == {"role": "user", "content": task.question}
    assert [t["function"]["name"] for t in first.tools] == ["search_flights"]
    assert first.params.get("tool_choice") == "auto"
    # the text call went back as the structured call it stands for, with its result
    third = model.requests[3].messages
    assert third[-2]["tool_calls"][0]["function"]["name"] == "search_flights"
    assert third[-1]["role"] == "tool"
    assert third[-1]["tool_call_id"] == third[-2]["tool_calls"][0]["id"]


def test_the_guarded_agent_reports_the_rungs_and_survives_the_stop() -> None:
    """A model that never stops calling: the guard climbs its ladder (each rung reported),
    and the run ends in LoopDetected, counted, with the tokens its report holds."""
    task = _task("docs_empty")
    model = ScriptedModel([Reply.call("search_docs", {"query": "reset password"})], cycle=True)
    config = bench_looprecovery._config("m", None)
    with model.serve() as url, ag.wrap(bench_looprecovery._client(openai, url), config) as client:
        run = bench_looprecovery.agent(client, "m", task, guarded=True)
    assert run.error == "LoopDetected"
    assert run.rungs[:4] == ["hint", "summary", "prune", "force"], run.rungs
    assert run.rungs[-1] in ("escalate", "stop"), run.rungs
    assert not run.correct
    assert run.tokens > 0


def test_the_tables_read_a_recorded_run() -> None:
    """The recorded real run (SmolLM2-135M-Instruct, function-calling format) makes the tables,
    and each recorded raw run's accounting is what replaying its answers gives."""
    data = bench_looprecovery.load(str(RECORDED))
    tables = bench_looprecovery.tables(data)
    assert tables[0].rows[0][0] == "raw"
    assert len(tables[1].rows) == len(LOOP_TASKS)
    for recorded in data["results"]["raw"]:
        if recorded.error is not None:
            continue  # the server's refusal (context full) is not in the answers
        task = _task(recorded.task)
        model = ScriptedModel([_reply(answer) for answer in recorded.answers])
        with model.serve() as url, bench_looprecovery._client(openai, url) as client:
            replay = bench_looprecovery.agent(client, "m", task, guarded=False)
        assert (replay.calls, replay.no_progress, replay.most_same, replay.correct) == (
            recorded.calls,
            recorded.no_progress,
            recorded.most_same,
            recorded.correct,
        ), task.name


def _reply(answer: dict[str, object]) -> Reply:
    calls = answer.get("tool_calls") or ()
    content = answer.get("content")
    if calls and isinstance(content, str) and text_call(content) is not None:
        calls = ()  # a text call the agent structured itself: replay the text
    return Reply(content or None, tuple(calls))  # type: ignore[arg-type]


def test_without_a_model_it_reports_one_row_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt-in: no llama.cpp or no model here, no endpoint named: one 'not run here' row, a
    placeholder (run.py then keeps the section measured where the model was)."""
    import bench_realmodel

    for name in ("AGENTTASKS_BASE_URL", "LOOPRECOVERY_SAVED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(bench_realmodel, "available", lambda: False)
    assert not bench_looprecovery.available()
    (table,) = bench_looprecovery.run(quick=True)
    assert table.placeholder
    assert "not run here" in str(table.rows[0][0])


@pytest.mark.parametrize("stack", list(bench_looprecovery.STACKS))
def test_every_stack_has_a_configuration(stack: str) -> None:
    """Each guarded stack's settings make a configuration (a changed signature once broke the
    small-model stack of the real run)."""
    settings = bench_looprecovery.STACKS[stack]
    config = bench_looprecovery._config("m", None, tool_validation=settings)
    for key, value in settings.items():
        assert getattr(config.tool_validation, key) == value
