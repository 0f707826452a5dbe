"""Conversations as a tree of turns: which run a request continues, and what counts as a step.

Without a named session the guard follows each conversation by the answers it returned: a request
that carries a run's latest answer continues that run; an identical re-send (a retry, a
regeneration, another sample) or a history edited back to an earlier turn is a fork, judged from
its own transcript; two conversations that share only their opening are two runs. Loop evidence is
what the transcript shows was executed, plus the current answer once.
"""

from __future__ import annotations

import collections
import random
from importlib import import_module
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentguard as ag
from agentguard.guard import Guard
from agentguard.testing import FakeClock, Reply, ScriptedModel
from agentguard.transport import SCOPE, ModelRequest, caller_scope

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")

SYSTEM = {"role": "system", "content": "You are a weather assistant. Use the tools."}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
# Every conversation gets the same answers, call ids included (as a deterministic local model
# gives them): nothing but the guard's bookkeeping can tell the conversations apart.
CALL = Reply.call("get_weather", {"city": "Paris"}, id="call_0")
RESULT = {"role": "tool", "tool_call_id": "call_0", "content": '{"temp_c": 18}'}
ANSWER = Reply.text("It is 18 °C in Paris.")


def _config(**sections: Any) -> ag.GuardConfig:
    return ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}, **sections}, env={})


def _client(model: ScriptedModel, config: ag.GuardConfig) -> Any:
    clock = FakeClock()
    raw = openai.OpenAI(
        api_key="sk-test-transcript",
        base_url="http://scripted.invalid/v1",
        http_client=http.Client(transport=model.mock_transport(http)),
    )
    return ag.wrap(raw, config, clock=clock, sleep=clock.sleep, rng=random.Random(0))


def _ask(client: Any, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **kw)


def _echo(response: Any) -> dict[str, Any]:
    """The assistant message as an agent appends it to its history."""
    return response.choices[0].message.model_dump(exclude_none=True)


def test_conversations_with_identical_openings_share_no_loop_state_or_budget() -> None:
    """Thirty users asking the same first question through one wrapped client: no loop verdict,
    thirty sessions, each with its own budget (a budget for two calls refuses nobody)."""
    users = 30
    model = ScriptedModel([CALL] * users + [ANSWER] * users)
    config = _config(
        token_budget={"per_session": 700, "policy": "hard_stop", "max_output_tokens": 64}
    )
    client = _client(model, config)
    histories: list[list[dict[str, Any]]] = []
    sessions = set()
    for _ in range(users):  # every first request before any second one
        response = _ask(client, [SYSTEM, QUESTION])
        report = ag.report_of(response)
        assert report is not None
        assert not report.warnings
        sessions.add(report.session)
        histories.append([SYSTEM, QUESTION, _echo(response), RESULT])
    assert len(sessions) == users
    continued = set()
    for history in histories:
        response = _ask(client, history)
        assert response.choices[0].message.content == "It is 18 °C in Paris."
        report = ag.report_of(response)
        assert report is not None
        assert not report.warnings
        assert report.session_tokens is not None
        assert report.session_tokens < 700
        continued.add(report.session)
    assert continued == sessions  # each second request continued one first request's run


def test_a_real_executed_loop_is_still_stopped() -> None:
    """One conversation that keeps executing the same call with the same result is refused."""
    model = ScriptedModel([CALL], cycle=True)
    client = _client(model, _config())
    messages: list[dict[str, Any]] = [SYSTEM, QUESTION]

    def run_agent() -> None:
        for _ in range(40):
            response = _ask(client, messages)
            messages.extend([_echo(response), RESULT])

    with pytest.raises(ag.LoopDetected) as caught:
        run_agent()
    assert caught.value.detector in {"generic_repeat", "poll_no_progress"}


def test_resending_the_same_history_is_not_a_loop_step() -> None:
    """Retries, regenerations and samples of one history add nothing to the loop evidence."""
    model = ScriptedModel([CALL], cycle=True)
    client = _client(model, _config())
    history = [SYSTEM, QUESTION, CALL.message(), RESULT]
    for _ in range(12):
        report = ag.report_of(_ask(client, history))
        assert report is not None
        assert not report.warnings
    with ag.session("named"):  # a named session forks the same way, and keeps its name
        for _ in range(12):
            report = ag.report_of(_ask(client, history))
            assert report is not None
            assert (report.session, report.warnings) == ("named", ())


def test_the_same_request_in_flight_twice_is_two_runs() -> None:
    """A request sent again while the first is still being answered (concurrent clients, or
    a retry after a client-side timeout) is a fork, not a continuation with nothing new."""
    model = ScriptedModel([Reply.text("It is sunny in Paris today, 18 °C.")], cycle=True)
    guard = Guard(model, _config())
    request = ModelRequest(model="m", messages=[SYSTEM, QUESTION])
    first = guard.stream(request)
    next(iter(first))  # the first request is prepared and streaming, its answer not yet done
    second = ag.report_of(guard.complete(request))
    list(first)
    assert second is not None
    assert first.report is not None
    assert second.session != first.report.session


def test_going_on_after_the_guards_own_answer_continues_the_run() -> None:
    """A request that ends with the answer the guard returned (two answers in a row: sub-agents
    reporting back in turn, a "go on") continues the run: nothing is judged twice, and the
    second answer is the run's next step. A second such request before its answer is a fork."""
    reports = (
        "The build passes on Linux.",
        "Docs: two broken links, fixed in the index page.",
        "Benchmarks ran; no regression over last week's numbers.",
        "All four checks are done.",
        "Done: the release can go out.",
    )
    model = ScriptedModel([Reply.text(text) for text in reports])
    guard = Guard(model, _config())
    messages: list[dict[str, Any]] = [SYSTEM, QUESTION]
    sessions = set()
    for _ in range(3):
        response = guard.complete(ModelRequest(model="m", messages=list(messages)))
        report = ag.report_of(response)
        assert report is not None
        sessions.add(report.session)
        messages.append(dict(response.message))
    assert len(sessions) == 1
    (run,) = guard.pipeline._runs
    assert run.last is not None
    assert run.last[0] == len(messages) - 1  # the latest answer, judged once
    ask = ModelRequest(model="m", messages=list(messages))
    first = guard.stream(ask)
    next(iter(first))  # in flight: the run was continued from its answer
    second = ag.report_of(guard.complete(ask))
    list(first)
    assert second is not None
    assert first.report is not None
    assert first.report.session in sessions
    assert second.session != first.report.session


def test_callers_are_told_apart_by_user_and_scope() -> None:
    """The same conversation from two `user`s, or two scopes an adapter set, is two runs."""
    model = ScriptedModel([CALL], cycle=True)
    guard = Guard(model, _config())
    sessions = set()
    for user in ("alice", "bob"):
        request = ModelRequest(model="m", messages=[QUESTION], params={"user": user})
        report = ag.report_of(guard.complete(request))
        assert report is not None
        sessions.add(report.session)
    for key in ("sk-one", "sk-two"):
        request = ModelRequest(
            model="m", messages=[QUESTION], extensions={SCOPE: caller_scope(key)}
        )
        report = ag.report_of(guard.complete(request))
        assert report is not None
        sessions.add(report.session)
    assert len(sessions) == 4
    assert all(s.startswith("auto-") for s in sessions)


def test_a_continuation_is_judged_incrementally_even_when_trimmed() -> None:
    """A request that carries the run's latest answer continues it with only its new messages,
    also when the agent dropped older turns from its history."""
    model = ScriptedModel([Reply.call("get_weather", {"city": f"c{i}"}) for i in range(4)])
    guard = Guard(model, _config())
    messages: list[dict[str, Any]] = [SYSTEM, QUESTION]
    sessions = set()
    for i in range(4):
        response = guard.complete(ModelRequest(model="m", messages=list(messages)))
        report = ag.report_of(response)
        assert report is not None
        sessions.add(report.session)
        call_id = response.message["tool_calls"][0]["id"]
        messages += [
            dict(response.message),
            {"role": "tool", "tool_call_id": call_id, "content": f"r{i}"},
        ]
        if i == 1:
            messages = [SYSTEM, QUESTION, *messages[-2:]]  # the agent trims its history
    assert len(sessions) == 1
    (run,) = guard.pipeline._runs
    assert run.last is not None
    assert run.last[0] == len(messages) - 2  # the latest answer, where the request has it


@pytest.mark.parametrize("edit", ["sliding-window", "system-prompt-with-the-time"])
def test_a_conversation_whose_opening_changes_keeps_its_run(edit: str) -> None:
    """An agent that keeps a window of its last turns drops the opening too (the first user
    message), and one whose system prompt carries the time changes it every turn: the request
    still carries the run's latest answer, and continues that run (one session, one budget)
    instead of starting a new one each turn."""
    model = ScriptedModel([Reply.text(f"Answer {i}: step {i} is done.") for i in range(8)])
    guard = Guard(model, _config())
    history: list[dict[str, Any]] = []
    sessions = []
    for turn in range(8):
        history.append({"role": "user", "content": f"Question {turn}: what comes next?"})
        system = SYSTEM
        window = history
        if edit == "sliding-window":
            window = history[-3:]
        else:
            system = {"role": "system", "content": f"You help. The time is 10:0{turn}."}
        response = guard.complete(ModelRequest(model="m", messages=[system, *window]))
        report = ag.report_of(response)
        assert report is not None
        sessions.append(report.session)
        history.append(dict(response.message))
    assert len(set(sessions)) == 1, sessions
    assert len(guard.pipeline._runs) == 1


def test_two_runs_ending_on_the_same_answer_are_not_joined_without_their_opening() -> None:
    """Two conversations of one caller whose latest answers are the same text: a request that
    carries that answer under a third opening continues neither (which one it follows, the
    transcript does not say), and each conversation still continues its own run."""
    model = ScriptedModel([Reply.text("Done.")], cycle=True)
    guard = Guard(model, _config())
    runs = {}
    for topic in ("alpha", "beta"):
        first = [SYSTEM, {"role": "user", "content": f"Do {topic}."}]
        response = guard.complete(ModelRequest(model="m", messages=first))
        runs[topic] = (first, dict(response.message), ag.report_of(response))
    after = {"role": "user", "content": "And now?"}
    stranger = [{"role": "system", "content": "Another prompt."}, runs["alpha"][1], after]
    report = ag.report_of(guard.complete(ModelRequest(model="m", messages=stranger)))
    assert report is not None
    assert report.session not in {r[2].session for r in runs.values()}
    for first, answer, before in runs.values():
        again = ag.report_of(
            guard.complete(ModelRequest(model="m", messages=[*first, answer, after]))
        )
        assert again is not None
        assert again.session == before.session


def test_forgotten_runs_free_their_memory() -> None:
    """Past ``max_sessions`` the least recently used runs are forgotten, with their indexes."""
    model = ScriptedModel([CALL], cycle=True)
    guard = Guard(model, _config())
    guard.pipeline._runs._max_runs = 3
    for i in range(10):
        guard.complete(ModelRequest(model="m", messages=[{"role": "user", "content": f"q{i}"}]))
    runs = guard.pipeline._runs
    assert len(runs) == 3
    alive = {id(run) for run in runs}
    assert {id(run) for run in runs._seen.values()} <= alive
    assert {id(run) for waiting in runs._tips.values() for run in waiting} <= alive


@settings(max_examples=60, deadline=None)
@given(
    users=st.integers(min_value=1, max_value=6),
    turns=st.integers(min_value=1, max_value=4),
    order=st.randoms(use_true_random=False),
)
def test_interleaved_identical_conversations_each_keep_their_run(
    users: int, turns: int, order: random.Random
) -> None:
    """However identical conversations interleave, no run ever takes two conversations' turns:
    as many runs as conversations, each continued once per turn. (Which of two identical
    transcripts continues which run cannot be told and does not matter.)"""
    model = ScriptedModel([CALL], cycle=True)
    guard = Guard(model, _config())
    histories = [[SYSTEM, QUESTION] for _ in range(users)]
    used: collections.Counter[str] = collections.Counter()
    steps = [u for u in range(users) for _ in range(turns)]
    order.shuffle(steps)
    for user in steps:
        response = guard.complete(ModelRequest(model="m", messages=list(histories[user])))
        report = ag.report_of(response)
        assert report is not None
        assert not report.warnings or turns >= 3  # only a conversation's own repeats count
        used[report.session] += 1
        histories[user] += [dict(response.message), RESULT]
    assert len(used) == users
    assert set(used.values()) == {turns}
