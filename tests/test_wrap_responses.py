"""agentguard.wrap(): ``responses.create`` through the real openai client, over an HTTP mock."""

from __future__ import annotations

import dataclasses
import inspect
import json
from importlib import import_module
from typing import Any

import pytest

import agentguard as ag
from _openai_upstream import Upstream, reasoning_answer, response_events, wrapped_client
from agentguard.integrations.openai._responses import (
    ITEM,
    messages_to_items,
    request_from_responses,
    response_from_responses,
    responses_body,
    responses_output,
)
from agentguard.testing import Fault, Reply, ScriptedModel, capture_events

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
CONFIG = ag.GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}},
        "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 1},
        "memory_pressure": {"enabled": False},
        "token_budget": {"max_output_tokens": 512},
    },
    env={},
)
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {"type": "web_search_preview"},
]


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _client(model: ScriptedModel, *, asynchronous: bool = False) -> Any:
    return wrapped_client(model, CONFIG, asynchronous=asynchronous)


def test_responses_create_returns_a_response_with_a_report() -> None:
    """A clean Responses call comes back as the SDK's Response, with a report and usage."""
    model = ScriptedModel([Reply.call("read_file", {"path": "a.txt"})])
    response = _client(model).responses.create(model="fast", input="read a.txt", tools=TOOLS)
    assert type(response).__name__ == "Response"
    call = response.output[0]
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "read_file",
        {"path": "a.txt"},
    )
    report = ag.report_of(response)
    assert report is not None
    assert report.tier == "fast"
    assert report.usage.total_tokens > 0
    sent = model.requests[0]
    assert sent.model == "small"
    assert sent.max_output_tokens == 512  # the cap, sent as the Responses API names it
    assert "max_tokens" not in sent.params


def test_responses_text_embedded_call_is_repaired_into_a_function_call_item() -> None:
    """A tool call written as text becomes a function_call output item."""
    model = ScriptedModel([Reply.embedded("read_file", {"path": "b.txt"}, style="hermes")])
    response = _client(model).responses.create(model="fast", input="read b.txt", tools=TOOLS)
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read_file", {"path": "b.txt"})]
    assert ag.report_of(response).repairs


def test_responses_hallucinated_tool_is_corrected_with_function_call_output_items() -> None:
    """An unknown tool gets a re-ask whose input carries the call and its error as items."""
    model = ScriptedModel(
        [Reply.call("wipe_disk", {"force": True}), Reply.call("read_file", {"path": "c.txt"})]
    )
    response = _client(model).responses.create(
        model="fast",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "read c.txt"}]}],
        tools=TOOLS,
    )
    assert response.output[0].name == "read_file"
    assert ag.report_of(response).corrections == 1
    retry_input = model.requests[1].messages
    kinds = [m[ITEM].get("type", "message") if ITEM in m else m["role"] for m in retry_input]
    assert kinds[0] == "message"  # the user's own item, unchanged
    body = messages_to_items(retry_input)
    assert [i.get("type") for i in body[1:]] == ["function_call", "function_call_output"]
    assert "wipe_disk" in body[2]["output"]


@pytest.mark.anyio
async def test_async_responses_escalate_past_a_dead_tier() -> None:
    """A dead first tier moves an async Responses call to the next tier, reported."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 4, "big": [Reply.text("done")]})
    with capture_events() as events:
        response = await _client(model, asynchronous=True).responses.create(
            model="fast", input="hi"
        )
    assert response.output_text == "done"
    report = ag.report_of(response)
    assert (report.tier, report.escalated_from) == ("premium", "fast")
    assert any(e.kind == "escalated" for e in events)


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_responses_streaming_is_guarded(asynchronous: bool) -> None:
    """``stream=True`` on Responses: broken arguments are repaired; the caller gets the
    function-call events of the repaired call and a ``response.completed`` carrying it."""
    upstream = Upstream(http, [Reply.call("read_file", '{"path": "a.txt",', id="c1")])
    client = ag.wrap(upstream.client(openai, asynchronous=asynchronous), CONFIG)
    stream = await _maybe(
        client.responses.create(model="fast", input="read a.txt", tools=TOOLS, stream=True)
    )
    events = [event async for event in stream] if asynchronous else list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.name, json.loads(i.arguments)) for i in done] == [("read_file", {"path": "a.txt"})]
    assert [i.name for i in events[-1].response.output] == ["read_file"]
    assert sorted(e.sequence_number for e in events) == [e.sequence_number for e in events]
    report = ag.report_of(stream)
    assert report is not None
    assert report.repairs


def test_responses_streaming_re_ask_serves_the_corrected_attempt() -> None:
    """A hallucinated tool gets a corrective re-ask; the stream carries the second attempt's
    events only, and one ``response.completed``."""
    upstream = Upstream(
        http,
        [Reply.call("wipe_disk", {"force": True}), Reply.call("read_file", {"path": "c.txt"})],
    )
    client = ag.wrap(upstream.client(openai, asynchronous=False), CONFIG)
    stream = client.responses.create(model="fast", input="read c.txt", tools=TOOLS, stream=True)
    events = list(stream)
    assert [e.type for e in events].count("response.completed") == 1
    assert [i.name for i in events[-1].response.output] == ["read_file"]
    assert ag.report_of(stream).corrections == 1


def test_items_round_trip_unchanged() -> None:
    """Input items the guard did not change go back exactly as they came (reasoning too)."""
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
    ]
    request = request_from_responses({"model": "m", "input": items, "tools": TOOLS})
    assert messages_to_items(request.messages) == items
    assert [t["function"]["name"] for t in request.tools] == ["read_file"]
    assert [m["role"] for m in request.messages][2:4] == ["assistant", "tool"]


def test_output_rewrite_keeps_other_items_and_carries_the_repaired_calls() -> None:
    """Rewriting the output keeps reasoning items and replaces text and calls."""
    body = {
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "<tool_call>...</tool_call>", "annotations": []}
                ],
            },
        ],
        "status": "completed",
    }
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c9", "function": {"name": "f", "arguments": "{}"}}],
    }
    out = responses_output(body, message)
    assert [i["type"] for i in out] == ["reasoning", "function_call"]
    back = response_from_responses({"output": out})
    assert back.finish_reason == "tool_calls"
    assert back.message["tool_calls"][0]["id"] == "c9"


def _reasoned(answer: dict[str, Any], pulled: list[str]) -> Any:
    """An openai client whose upstream streams ``answer`` as OpenAI does, noting each event's
    type in ``pulled`` as the caller's side reads it off the wire."""

    def handler(request: Any) -> Any:
        def body() -> Any:
            for event in response_events(answer):
                pulled.append(event["type"])
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()

        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http.Client(transport=http.MockTransport(handler)),
        max_retries=0,
    )


def test_a_streamed_responses_reasoning_goes_out_as_it_comes() -> None:
    """A reasoning model's summary deltas reach the caller as they arrive, before the upstream
    is read for the answer's text (they were held until the first text delta), and the caller
    gets the upstream's own events, in order."""
    answer = reasoning_answer("The user wants a.txt; read it first.", "Reading a.txt now.")
    config = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    raw = _reasoned(answer, [])
    expected = [e.model_dump() for e in raw.responses.create(model="m", input="hi", stream=True)]
    pulled: list[str] = []
    client = ag.wrap(_reasoned(answer, pulled), config)
    got, text_read_before = [], []
    for event in client.responses.create(model="m", input="hi", stream=True):
        got.append(event.model_dump())
        if event.type == "response.reasoning_summary_text.delta":
            text_read_before.append("response.output_text.delta" in pulled)
    assert got == expected
    assert len(text_read_before) > 1
    assert not any(text_read_before)


def test_a_streamed_responses_degenerate_reasoning_is_cut() -> None:
    """Reasoning summary deltas that repeat one line are watched like chat's
    ``reasoning_content``: the stream is cut at the BREAK level, the report says so, and the
    stream still ends as a Responses stream does: ``response.incomplete``, cut at the cap."""
    answer = reasoning_answer("I should look at the file again. " * 300, "Done.")
    config = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    pulled: list[str] = []
    client = ag.wrap(_reasoned(answer, pulled), config)
    stream = client.responses.create(model="m", input="hi", stream=True)
    events = list(stream)
    report = ag.report_of(stream)
    assert report is not None
    assert any("stream cut" in w for w in report.warnings)
    assert pulled.count("response.reasoning_summary_text.delta") < 300 * 33 // 5
    assert "response.output_text.delta" not in pulled
    assert [e.type for e in events].count("response.incomplete") == 1
    closing = events[-1].model_dump()
    assert closing["type"] == "response.incomplete"
    assert closing["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert sorted(e.sequence_number for e in events) == [e.sequence_number for e in events]


def _answering(answer: dict[str, Any]) -> Any:
    """An openai client whose upstream answers ``answer`` whole."""

    def handler(request: Any) -> Any:
        return http.Response(200, json=answer)

    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http.Client(transport=http.MockTransport(handler)),
        max_retries=0,
    )


def _reasoning_text(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with its reasoning as text (gpt-oss on vLLM or Ollama) instead of a summary."""
    thought = answer["output"][0]["summary"][0]["text"]
    item = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": thought}],
    }
    return {**answer, "output": [item, *answer["output"][1:]]}


@pytest.mark.parametrize("form", [lambda a: a, _reasoning_text], ids=["summary", "text"])
def test_degenerate_reasoning_in_a_whole_responses_answer_is_a_loop(form: Any) -> None:
    """A whole Responses answer whose reasoning item degenerates is judged as chat's
    ``reasoning_content`` is: not delivered, the structured loop error (no other tier)."""
    answer = form(reasoning_answer("Wait, let me reconsider the question once more. " * 60, "Hi."))
    config = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    with pytest.raises(ag.LoopDetected) as info:
        ag.wrap(_answering(answer), config).responses.create(model="m", input="hi")
    assert info.value.detector == "degenerate_text"


@pytest.mark.parametrize("form", [lambda a: a, _reasoning_text], ids=["summary", "text"])
def test_healthy_reasoning_in_a_whole_responses_answer_is_untouched(form: Any) -> None:
    answer = form(reasoning_answer("The user greets me; greet back briefly.", "Hi."))
    config = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    raw = _answering(answer).responses.create(model="m", input="hi")
    guarded = ag.wrap(_answering(answer), config).responses.create(model="m", input="hi")
    assert guarded.model_dump() == raw.model_dump()
    report = ag.report_of(guarded)
    assert report is not None
    assert report.warnings == ()


def test_a_pinned_re_ask_speaks_the_responses_format() -> None:
    """An answer of nothing but the wire syntax (``functions.read_file:``) is re-asked with the
    tool pinned — in the Responses API's own form (``{"type": "function", "name": ...}``); the
    chat form the guard used before is a 400 on a real Responses endpoint."""

    def answer(output: list[dict[str, Any]]) -> dict[str, Any]:
        return {**reasoning_answer("", ""), "output": output}

    text = {"type": "output_text", "text": "functions.read_file:", "annotations": []}
    wire = answer([{"type": "message", "id": "m1", "role": "assistant", "content": [text]}])
    args = '{"path": "a.txt"}'
    call = {"type": "function_call", "id": "fc1", "call_id": "c1", "name": "read_file"}
    good = answer([{**call, "arguments": args, "status": "completed"}])
    bodies: list[dict[str, Any]] = []

    def handler(request: Any) -> Any:
        bodies.append(json.loads(request.content))
        return http.Response(200, json=[wire, good][len(bodies) - 1])

    raw = openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http.Client(transport=http.MockTransport(handler)),
        max_retries=0,
    )
    config = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
    response = ag.wrap(raw, config).responses.create(model="m", input="read a.txt", tools=TOOLS)
    assert [item.type for item in response.output] == ["function_call"]
    assert len(bodies) == 2
    assert bodies[1]["tool_choice"] == {"type": "function", "name": "read_file"}
    assert bodies[1]["tools"] == TOOLS  # the caller's list, as given
    assert bodies[0] == {"model": "m", "input": "read a.txt", "tools": TOOLS}


def test_a_re_ask_offering_other_tools_sends_them_in_the_responses_format() -> None:
    """Where a re-ask offers other tools than the caller's (fewer, or with narrowed choices),
    they go upstream in the Responses format; unchanged, the caller's list goes as given."""
    request = request_from_responses({"model": "m", "input": "hi", "tools": TOOLS})
    assert responses_body(request)["tools"] is TOOLS
    fn = request.tools[0]["function"]
    path = {"type": "string", "enum": ["a.txt"]}
    choices = {**fn, "parameters": {**fn["parameters"], "properties": {"path": path}}}
    narrowed = dataclasses.replace(request, tools=[{"type": "function", "function": choices}])
    assert responses_body(narrowed)["tools"] == [{"type": "function", **choices}]


# -- history kept upstream: previous_response_id and conversation -------------------------------

STATEFUL = ag.GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}},
        "memory_pressure": {"enabled": False},
        "token_budget": {"per_session": 10_000, "max_output_tokens": 512},
    },
    env={},
)


IDENTICAL_3 = (
    "You have called `read_file` with identical arguments 3 times and the result has not "
    "changed. Use the information you already have, or try a different approach."
)


def _follow_up(call_id: str, output: str) -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": call_id, "output": output}]


def _turns(
    client: Any, conversations: dict[str, dict[str, Any]], turns: int
) -> dict[str, list[Any]]:
    """Each conversation in turn, ``turns`` times: its opening, then the output of the call the
    last answer made, the history left upstream (``previous_response_id`` or ``conversation``)."""
    seen: dict[str, list[Any]] = {name: [] for name in conversations}
    last: dict[str, Any] = {}
    for _ in range(turns):
        for name, how in conversations.items():
            kwargs: dict[str, Any] = {"model": "fast", "tools": TOOLS[:1], **how.get("extra", {})}
            before = last.get(name)
            if before is None:
                kwargs["input"] = how["opening"]
            else:
                call = next(o for o in before.output if o.type == "function_call")
                kwargs["input"] = _follow_up(call.call_id, how["result"])
                if "conversation" not in kwargs:
                    kwargs["previous_response_id"] = before.id
            last[name] = client.responses.create(**kwargs)
            seen[name].append(last[name])
    return seen


def _interleaved(n: int) -> ScriptedModel:
    replies: list[Reply] = []
    for i in range(n):
        replies.append(Reply.call("read_file", {"path": "same.txt"}))  # loops
        replies.append(Reply.call("read_file", {"path": f"part{i}.txt"}))  # works
    return ScriptedModel(replies)


@pytest.mark.parametrize("keep", ["previous_response_id", "conversation"])
def test_a_conversation_kept_upstream_is_one_session_and_its_loop_is_seen(keep: str) -> None:
    """With the history kept upstream each request carries only the new tool output. Such a
    conversation stays one session (its budget and its loop judgment go on from turn to turn;
    before, every turn was a new session, judged afresh), and two conversations of one caller
    are never merged: the one repeating a call is warned by its third call, the other is not."""
    model = _interleaved(4)
    client = wrapped_client(model, STATEFUL)
    extra = {"A": {}, "B": {}}
    if keep == "conversation":
        extra = {"A": {"conversation": "conv_a"}, "B": {"conversation": {"id": "conv_b"}}}
    conversations = {
        "A": {"opening": "read same.txt", "result": "unchanged", "extra": extra["A"]},
        "B": {"opening": "read the parts", "result": "a part", "extra": extra["B"]},
    }
    seen = _turns(client, conversations, 4)
    reports = {name: [ag.report_of(r) for r in answers] for name, answers in seen.items()}
    sessions = {name: {r.session for r in rs} for name, rs in reports.items()}
    assert len(sessions["A"]) == len(sessions["B"]) == 1
    assert sessions["A"] != sessions["B"]
    # the third identical call is warned about as it is answered, and the turn after it
    # (which brings its unchanged result) is recovered
    assert [bool(r.warnings) for r in reports["A"]] == [False, False, True, True]
    assert [r.recovery for r in reports["A"]][2:] == [(), ("hint",)]
    assert not any(r.recovery or r.warnings for r in reports["B"])
    # the session's tokens add up across its turns
    tokens = [r.session_tokens for r in reports["B"]]
    assert tokens == sorted(tokens)
    assert tokens[0] < tokens[-1]
    assert tokens[-1] == sum(r.usage.total_tokens for r in reports["B"])


def test_a_retried_turn_kept_upstream_is_judged_once() -> None:
    """The same ``previous_response_id`` sent again (a retry, another sample) forks the run:
    the repeated request is not a second step of the loop (the fork is judged from what it
    carries: its history is upstream)."""
    model = ScriptedModel([Reply.call("read_file", {"path": "same.txt"}) for _ in range(6)])
    client = wrapped_client(model, STATEFUL)
    first = client.responses.create(model="fast", input="read same.txt", tools=TOOLS[:1])
    second = client.responses.create(
        model="fast",
        previous_response_id=first.id,
        input=_follow_up(first.output[0].call_id, "unchanged"),
        tools=TOOLS[:1],
    )
    for _ in range(3):  # the third turn, three times over
        third = client.responses.create(
            model="fast",
            previous_response_id=second.id,
            input=_follow_up(second.output[0].call_id, "unchanged"),
            tools=TOOLS[:1],
        )
    report = ag.report_of(third)
    assert report is not None
    assert not report.warnings  # before: 'identical arguments 5 times', then refused
    assert not report.recovery


@pytest.mark.anyio
async def test_a_streamed_conversation_kept_upstream_is_one_session() -> None:
    """A streamed answer's id (from its ``response.created`` event) is the thread the next
    request follows."""
    upstream = Upstream(http, [Reply.call("read_file", {"path": "same.txt"}) for _ in range(3)])
    client = ag.wrap(upstream.client(openai, asynchronous=True), STATEFUL)
    previous: Any = None
    sessions = set()
    for _ in range(3):
        kwargs: dict[str, Any] = {"model": "fast", "tools": TOOLS[:1], "stream": True}
        if previous is None:
            kwargs["input"] = "read same.txt"
        else:
            kwargs["previous_response_id"] = previous.id
            call = next(o for o in previous.output if o.type == "function_call")
            kwargs["input"] = _follow_up(call.call_id, "unchanged")
        stream = await client.responses.create(**kwargs)
        events = [event async for event in stream]
        previous = events[-1].response
        sessions.add(ag.report_of(stream).session)
    assert len(sessions) == 1
    assert ag.report_of(stream).warnings == (IDENTICAL_3,)


# -- an error the upstream reports inside its stream --------------------------------------------

FAILED_RESPONSE = {
    "id": "resp_failed",
    "object": "response",
    "created_at": 1,
    "model": "small",
    "status": "failed",
    "error": {"code": "server_error", "message": "The server had an error"},
    "output": [],
    "incomplete_details": None,
    "instructions": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "temperature": 1.0,
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
}
ERROR_EVENTS = {
    "error": [
        {"type": "error", "code": "server_error", "message": "The server had an error",
         "param": None, "sequence_number": 0},
    ],
    "response.failed": [
        {"type": "response.created", "sequence_number": 0,
         "response": {**FAILED_RESPONSE, "status": "in_progress", "error": None}},
        {"type": "response.failed", "sequence_number": 1, "response": FAILED_RESPONSE},
    ],
}  # fmt: skip


def _failing(kind: str, failures: int, *, asynchronous: bool = False) -> tuple[Any, list[int]]:
    """An upstream whose first ``failures`` streams are the error ``kind``, then answers."""
    model = ScriptedModel([Reply.text("Hello there.")])
    inner = model.mock_transport(http)
    calls: list[int] = []

    def handler(request: Any) -> Any:
        calls.append(1)
        if len(calls) <= failures:
            events = ERROR_EVENTS[kind]
        else:
            body = json.loads(request.content)
            del body["stream"]
            plain = http.Request("POST", request.url, content=json.dumps(body).encode())
            events = list(response_events(json.loads(inner.handler(plain).content)))
        sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
        return http.Response(200, headers={"content-type": "text/event-stream"}, content=sse)

    base = {"api_key": "sk-test", "base_url": "http://upstream.invalid/v1", "max_retries": 0}
    if asynchronous:
        transport = http.MockTransport(handler)
        return openai.AsyncOpenAI(**base, http_client=http.AsyncClient(transport=transport)), calls
    return openai.OpenAI(
        **base, http_client=http.Client(transport=http.MockTransport(handler))
    ), calls


@pytest.mark.parametrize("kind", ["error", "response.failed"])
def test_an_error_event_before_the_answer_is_retried(kind: str) -> None:
    """The upstream's stream fails before any of its answer (an ``error`` event, or
    ``response.failed``: the raw client hands either on and raises nothing): the guard tries
    again, and the caller reads the next attempt's answer (before: the failure, as an answer
    the guard called fine)."""
    client, calls = _failing(kind, 1)
    raw = [e.type for e in client.responses.create(model="small", input="hi", stream=True)]
    assert raw[-1] == kind
    calls.clear()
    guarded = ag.wrap(client, CONFIG, sleep=lambda seconds: None)
    stream = guarded.responses.create(model="fast", input="hi", stream=True)
    events = list(stream)
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Hello there."
    assert [e.type for e in events].count("response.created") == 1
    assert len(calls) == 2
    report = ag.report_of(stream)
    assert report is not None
    assert report.retries == 1


@pytest.mark.parametrize("kind", ["error", "response.failed"])
def test_an_error_event_on_every_attempt_reaches_the_caller_as_it_came(kind: str) -> None:
    """Every attempt on the one tier fails so: the caller reads the last one's events, the
    error last, as the raw client does (no exception), with the guard's report. (With a tier to
    move to, the guard tries it, and raises ``TiersExhausted`` when it fails too.)"""
    client, _ = _failing(kind, 100)
    raw = [e.model_dump() for e in client.responses.create(model="small", input="hi", stream=True)]
    guarded = ag.wrap(client, STATEFUL, sleep=lambda seconds: None)
    stream = guarded.responses.create(model="small", input="hi", stream=True)
    assert [e.model_dump() for e in stream] == raw
    report = ag.report_of(stream)
    assert report is not None
    assert report.retries > 0


@pytest.mark.anyio
@pytest.mark.parametrize("failures", [1, 100], ids=["then-answers", "always"])
async def test_an_error_event_through_an_async_client(failures: int) -> None:
    """The same through ``AsyncOpenAI``: retried, or handed on as it came."""
    client, _ = _failing("response.failed", failures, asynchronous=True)
    guarded = ag.wrap(client, STATEFUL, sleep=_no_wait)
    stream = await guarded.responses.create(model="small", input="hi", stream=True)
    kinds = [event.type async for event in stream]
    assert kinds[-1] == ("response.completed" if failures == 1 else "response.failed")


async def _no_wait(seconds: float) -> None:
    return None


# -- a conversation kept upstream stays where it is kept ------------------------------------------

TWO_ORIGINS = ag.GuardConfig.from_dict(
    {
        "tiers": {
            "local": {"model": "small"},
            "cloud": {
                "model": "big",
                "base_url": "https://cloud.invalid/v1",
                "api_key_env": "CLOUD_KEY",
            },
        },
        "escalation": {"chain": ["local", "cloud"], "max_retries_before_escalate": 1},
        "memory_pressure": {"enabled": False},
    },
    env={},
)


def _two_origins(local: list[Any], cloud: list[Any], asynchronous: bool) -> Any:
    from agentguard.guard import AsyncGuard, Guard
    from agentguard.testing import FakeClock

    models = {"local": ScriptedModel(local), "cloud": ScriptedModel(cloud)}
    clock = FakeClock()
    kind, sleep = (AsyncGuard, clock.asleep) if asynchronous else (Guard, clock.sleep)
    guard = kind(
        tier_transport=lambda tier: models[tier.name],
        config=TWO_ORIGINS,
        clock=clock,
        sleep=sleep,
    )
    return guard, models


def _ask(guard: Any, asynchronous: bool, **params: Any) -> Any:
    from agentguard.transport import ModelRequest

    request = ModelRequest(
        model="small", messages=[{"role": "user", "content": "next step"}], params=params
    )
    if not asynchronous:
        return guard.complete(request)

    async def main() -> Any:
        return await guard.acomplete(request)

    import anyio

    return anyio.run(main)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_turn_following_an_escalated_answer_goes_where_that_answer_was_given(
    asynchronous: bool,
) -> None:
    """Turn 1 failed on the local tier and the cloud tier answered it. Turn 2 names that answer
    (``previous_response_id``) and, as the caller's model, the local one: it went to the local
    server, which keeps no such conversation (a real one answers 400 "previous response not
    found"). Now it goes to the tier that gave the answer it follows."""
    guard, models = _two_origins(
        [Fault.server_error(), Fault.server_error()],
        [Reply.text("turn 1"), Reply.text("turn 2")],
        asynchronous,
    )
    first = _ask(guard, asynchronous)
    assert first.report.tier == "cloud"
    second = _ask(guard, asynchronous, previous_response_id=first.id)
    assert second.message["content"] == "turn 2"
    assert second.report.tier == "cloud"
    assert [r.model for r in models["local"].requests] == ["small", "small"]  # turn 1 only
    assert [r.params.get("previous_response_id") for r in models["cloud"].requests] == [
        None,
        first.id,
    ]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_turn_kept_upstream_is_never_moved_to_another_endpoint(asynchronous: bool) -> None:
    """The local tier keeps the conversation and fails on turn 2: the request went to the cloud
    tier with the local answer's id, which the cloud cannot know. Now a tier at another endpoint
    is not tried for it: the local tier's failure is the answer."""
    guard, models = _two_origins(
        [Reply.text("turn 1"), *[Fault.server_error()] * 4], [Reply.text("never")], asynchronous
    )
    first = _ask(guard, asynchronous)
    assert first.report.tier == "local"
    with pytest.raises(ag.AgentGuardError) as failed:
        _ask(guard, asynchronous, previous_response_id=first.id)
    assert models["cloud"].requests == []
    assert getattr(failed.value, "status_code", None) == 500  # the local tier's own answer
    # a turn that carries its whole history may still move
    moved = _ask(guard, asynchronous)
    assert moved.report.tier == "cloud"


def _store(kind: str, tmp_path: Any, request: Any) -> Any:
    from agentguard.storage import MemoryStore, SQLiteStore

    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "fleet.db")
    from agentguard.storage import RedisStore

    server = request.getfixturevalue("redis_server")
    return RedisStore(server.url, key_prefix=f"threads-{tmp_path.name}")


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_fleet_sends_a_turn_to_the_tier_keeping_its_conversation(
    kind: str, asynchronous: bool, tmp_path: Any, request: Any
) -> None:
    """Two processes on one store (a fleet of ``agentguard serve`` behind a load balancer).
    Turn 1 escalated to the cloud tier through process A; turn 2, following it, reached
    process B, which had not given that answer: it went to the local tier, which keeps no such
    conversation. Now the tier that keeps it is shared through the store, and turn 2 goes
    there through any process; turn 3, answered by B, is shared the same way."""
    import anyio

    from agentguard.transport import ModelRequest

    store = _store(kind, tmp_path, request)

    def guard(local: list[Any], cloud: list[Any]) -> Any:
        made, models = _two_origins(local, cloud, asynchronous)
        made.pipeline.session_store = store
        return made, models

    async def ask(guard: Any, **params: Any) -> Any:  # one event loop for the whole scenario
        messages = [{"role": "user", "content": "next step"}]
        asked = ModelRequest(model="small", messages=messages, params=params)
        return await guard.acomplete(asked) if asynchronous else guard.complete(asked)

    async def scenario() -> None:
        a, _ = guard([Fault.server_error(), Fault.server_error()], [Reply.text("turn 1")])
        b, b_models = guard([], [Reply.text("turn 2")])
        c, c_models = guard([], [Reply.text("turn 3")])
        first = await ask(a)
        assert first.report.tier == "cloud"
        second = await ask(b, previous_response_id=first.id)
        assert second.report.tier == "cloud"
        assert b_models["local"].requests == []
        third = await ask(c, previous_response_id=second.id)
        assert third.report.tier == "cloud"
        assert c_models["local"].requests == []
        # a conversation's first turn, or a turn following one the store never heard of,
        # starts where its model says
        assert (await ask(guard([Reply.text("new")], [])[0])).report.tier == "local"
        unknown = await ask(guard([Reply.text("new")], [])[0], previous_response_id="resp_x")
        assert unknown.report.tier == "local"
        aclose = getattr(store, "aclose", None)
        if aclose is not None:  # Redis: the asyncio client of this event loop
            await aclose()

    try:
        anyio.run(scenario)
    finally:
        store.close()
