"""LangChain v1: ``AgentGuardMiddleware`` in a real ``create_agent(...).invoke()`` run.

The agent is LangChain's own loop (LangGraph underneath) with langchain-openai's ``ChatOpenAI``
over the real openai client, talking HTTP to a scripted upstream (an in-process mock transport),
offline. Each fault is run through the agent as LangChain ships it and through the same agent
with the middleware. Skipped where langchain (v1) is not installed: ``nox -s langchain``.
"""

from __future__ import annotations

import json
import random
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import agentguard as ag
from _openai_upstream import Upstream, answering, reasoned_calls, text_item
from _otel import recorded_spans
from agentguard.testing import FakeClock, Reply, ScriptedModel

openai = pytest.importorskip("openai")
pytest.importorskip("langchain.agents")
langchain_openai = pytest.importorskip("langchain_openai")

from langchain.agents import create_agent  # noqa: E402
from langchain.agents.structured_output import ToolStrategy  # noqa: E402
from langchain.tools import ToolRuntime  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from agentguard.integrations.langchain import AgentGuardMiddleware  # noqa: E402

http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
CONFIG = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
FILES = {"a.txt": "alpha", "b.txt": "beta"}
CHAT_OPENAI = langchain_openai.ChatOpenAI  # the docs example test puts a scripted one in its place


@tool
def read_file(path: str) -> str:
    """Read a text file."""
    return FILES[path]


class Flaky:
    """A tool that fails with a connection error ``failures`` times, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, city: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("weather service unreachable")
        return f"{city}: 18C"


def weather_tool(flaky: Flaky) -> Any:
    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return flaky(city)

    return weather


def chat(model: ScriptedModel | Upstream, name: str = "m", **kw: Any) -> Any:
    """``ChatOpenAI`` over the real openai client (no SDK retries: the guard is the one retry
    layer), serving ``model``."""
    transport = model.transport if isinstance(model, Upstream) else model.mock_transport(http)
    base = {"api_key": "sk-test", "base_url": "http://scripted.invalid/v1", "max_retries": 0}
    sync = openai.OpenAI(**base, http_client=http.Client(transport=transport))
    asynchronous = openai.AsyncOpenAI(**base, http_client=http.AsyncClient(transport=transport))
    return CHAT_OPENAI(
        model=name,
        api_key="sk-test",
        root_client=sync,
        client=sync.chat.completions,
        root_async_client=asynchronous,
        async_client=asynchronous.chat.completions,
        **kw,
    )


def guard(config: ag.GuardConfig = CONFIG, **kw: Any) -> AgentGuardMiddleware:
    """The middleware on a fake clock (retries wait on it, never for real)."""
    clock = FakeClock()
    tools = ag.ToolGuard(config, clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    return AgentGuardMiddleware(
        config,
        tool_guard=tools,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        rng=random.Random(0),
        **kw,
    )


def run(llm: Any, tools: list[Any], middleware: list[Any], text: str = "go") -> list[Any]:
    agent = create_agent(llm, tools, middleware=middleware)
    return list(agent.invoke({"messages": [{"role": "user", "content": text}]})["messages"])


def results(messages: list[Any]) -> list[str]:
    return [m.content for m in messages if isinstance(m, ToolMessage)]


def test_healthy_traffic_is_unchanged() -> None:
    """A healthy run sends upstream byte for byte what the agent alone sends, and the agent
    gets the same answers; the report is on the AI messages."""
    script = [Reply.call("read_file", {"path": "a.txt"}, id="c1"), Reply.text("It says alpha.")]
    plain, guarded = Upstream(http, list(script)), Upstream(http, list(script))
    alone = run(chat(plain), [read_file], [])
    middleware = guard()
    with_guard = run(chat(guarded), [read_file], [middleware])
    assert [body for _, _, body, _ in guarded.seen] == [body for _, _, body, _ in plain.seen]
    shape = [(type(m), m.content, getattr(m, "tool_calls", None)) for m in alone]
    assert [(type(m), m.content, getattr(m, "tool_calls", None)) for m in with_guard] == shape
    assert with_guard[-1].response_metadata == alone[-1].response_metadata
    assert (
        tuple(ag.report_of(m) for m in with_guard if isinstance(m, AIMessage)) == middleware.reports
    )
    assert [r.attempts[0].outcome for r in middleware.reports] == ["ok", "ok"]


def test_the_chat_spans_name_the_models_provider() -> None:
    """Telemetry names the provider as LangChain's chat model does for tracing."""
    script = [Reply.call("read_file", {"path": "a.txt"}, id="c1"), Reply.text("It says alpha.")]
    with recorded_spans() as exporter:
        messages = run(chat(ScriptedModel(script)), [read_file], [guard()])
    assert messages[-1].content == "It says alpha."
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert len(chats) == 2
    assert {s.attributes["gen_ai.provider.name"] for s in chats} == {"openai"}


def test_a_hallucinated_tool_name_is_corrected() -> None:
    """A near-miss tool name runs the real tool; alone, the agent gets an error instead."""
    script = [Reply.call("readFile", {"path": "b.txt"}, id="c1"), Reply.text("done")]
    alone = run(chat(ScriptedModel(list(script))), [read_file], [])
    assert "not a valid tool" in results(alone)[0]
    model = ScriptedModel(list(script))
    with_guard = run(chat(model), [read_file], [guard()])
    assert results(with_guard) == ["beta"]
    assert len(model.requests) == 2  # corrected locally, no re-ask


def test_a_tool_that_does_not_exist_ends_in_a_bounded_stop() -> None:
    """A model that keeps calling a tool that does not exist: alone, the agent pays for model
    calls until LangGraph's recursion limit; guarded, a few corrective re-asks, then
    ToolValidationFailed."""
    model = ScriptedModel([Reply.call("execute_code", {"code": "ls"})], cycle=True)
    agent = create_agent(chat(model), [read_file])
    with pytest.raises(Exception, match="Recursion limit"):
        agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"recursion_limit": 60})
    assert len(model.requests) == 30
    model = ScriptedModel([Reply.call("execute_code", {"code": "ls"})], cycle=True)
    with pytest.raises(ag.ToolValidationFailed):
        run(chat(model), [read_file], [guard()])
    assert len(model.requests) <= 1 + CONFIG.tool_validation.max_retries


def test_broken_json_arguments_are_repaired() -> None:
    """Arguments that are not valid JSON are repaired and the tool runs; alone, the agent
    stops at the broken call without running anything."""
    script = [Reply.call("read_file", '{"path": "a.txt",', id="c1"), Reply.text("alpha it is")]
    alone = run(chat(ScriptedModel(list(script))), [read_file], [])
    assert alone[-1].invalid_tool_calls  # the run ended there, no tool run
    assert results(alone) == []
    middleware = guard()
    with_guard = run(chat(ScriptedModel(list(script))), [read_file], [middleware])
    assert results(with_guard) == ["alpha"]
    assert with_guard[-1].content == "alpha it is"
    assert middleware.reports[0].repairs


def _looping(request: Any) -> Reply:
    """A model that repeats one call until the guard's hint reaches it (then it answers)."""
    if "has not changed" in str(request.messages[-1].get("content")):
        return Reply.text("It says alpha.")
    return Reply.call("read_file", {"path": "a.txt"}, id=f"c{len(request.messages)}")


def test_a_tool_loop_is_broken_by_the_hint() -> None:
    """The same call again and again: the guard's hint reaches the model, which answers; alone,
    the loop runs on until LangGraph's recursion limit."""
    model = ScriptedModel([_looping], cycle=True)
    agent = create_agent(chat(model), [read_file])
    with pytest.raises(Exception, match="Recursion limit"):
        agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"recursion_limit": 40})
    assert len(model.requests) == 20
    model = ScriptedModel([_looping], cycle=True)
    messages = run(chat(model), [read_file], [guard()])
    assert messages[-1].content == "It says alpha."
    assert len(model.requests) == 4


def test_a_loop_the_model_ignores_is_stopped() -> None:
    """A model that ignores every hint is stopped with LoopDetected after a few calls."""
    model = ScriptedModel([Reply.call("read_file", {"path": "a.txt"})], cycle=True)
    with pytest.raises(ag.LoopDetected):
        run(chat(model), [read_file], [guard()])
    assert len(model.requests) <= 7


def _read_once(request: Any) -> Reply:
    """One run of a healthy agent: one read, then an answer (the call's id every run's)."""
    if any(m.get("role") == "tool" for m in request.messages):
        return Reply.text("It says alpha.")
    return Reply.call("read_file", {"path": "a.txt"}, id="c1")


@pytest.mark.anyio
async def test_separate_runs_making_the_same_call_all_run_the_tool() -> None:
    """Twelve runs through one middleware (``invoke`` and ``ainvoke`` in turn), each reading
    the same file once: each run has loop state of its own (the session of the answer that
    asked for the call), so every read runs. Before, one history spanned the runs and the
    seventh was refused as a loop."""
    reads: list[str] = []

    @tool
    def read_file(path: str) -> str:
        """Read a text file."""
        reads.append(path)
        return FILES[path]

    middleware = guard()
    agent = create_agent(
        chat(ScriptedModel([_read_once], cycle=True)), [read_file], middleware=[middleware]
    )
    outputs = []
    for i in range(12):
        state = {"messages": [{"role": "user", "content": f"I am user {i}. Read a.txt."}]}
        out = await agent.ainvoke(state) if i % 2 else agent.invoke(state)
        outputs += results(out["messages"])
    assert outputs == ["alpha"] * 12
    assert len(reads) == 12
    sessions = {r.session for r in middleware.reports}
    assert middleware.tool_guard is not None
    assert set(middleware.tool_guard._runs) == sessions  # judged in the runs the guard saw
    assert len(sessions) == 12


TIERED = ag.GuardConfig.from_dict(
    {
        "memory_pressure": {"enabled": False},
        "tiers": {"fast": {"model": "m"}, "strong": {"model": "strong"}},
        "escalation": {"chain": ["fast", "strong"]},
    },
    env={},
)


@pytest.mark.parametrize(("config", "start"), [(CONFIG, "primary"), (TIERED, "fast")])
def test_a_loop_escalates_to_a_stronger_model(config: ag.GuardConfig, start: str) -> None:
    """With a stronger chat model as a tier, a loop moves the call there: after the agent's
    own model (``primary``) when the config has no tiers, or as the config's tier of that name."""
    model = ScriptedModel(
        {
            "m": [Reply.call("read_file", {"path": "a.txt"})],
            "strong": [Reply.text("Strong answer.")],
        },
        cycle=True,
    )
    middleware = guard(config, tiers={"strong": chat(model, "strong")})
    messages = run(chat(model), [read_file], [middleware])
    assert messages[-1].content == "Strong answer."
    assert middleware.last_report is not None
    assert middleware.last_report.tier == "strong"
    assert middleware.last_report.escalated_from == start
    assert [r.model for r in model.requests][-1] == "strong"


def test_a_flaky_tool_is_retried() -> None:
    """A tool that fails twice with a connection error is retried by the ToolGuard; alone,
    the error ends the agent's run."""
    script = [Reply.call("weather", {"city": "Paris"}, id="c1"), Reply.text("18C in Paris.")]
    with pytest.raises(ConnectionError):
        run(chat(ScriptedModel(list(script))), [weather_tool(Flaky(2))], [])
    flaky = Flaky(2)
    messages = run(chat(ScriptedModel(list(script))), [weather_tool(flaky)], [guard()])
    assert results(messages) == ["Paris: 18C"]
    assert flaky.calls == 3


def test_a_dead_tool_gets_a_structured_error_then_its_breaker_opens() -> None:
    """A tool that always fails: the model gets a structured error it can act on, and after
    enough failures the breaker refuses calls without running the tool."""
    flaky = Flaky(10_000)
    script = [Reply.call("weather", {"city": c}, id=f"c{c}") for c in "ABCDEFGH"]
    middleware = guard()
    messages = run(
        chat(ScriptedModel([*script, Reply.text("Gave up.")])), [weather_tool(flaky)], [middleware]
    )
    errors = [json.loads(m.content)["error"] for m in messages if isinstance(m, ToolMessage)]
    assert errors[0] == "transient"
    assert errors[-1] == "breaker_open"
    assert all(m.status == "error" for m in messages if isinstance(m, ToolMessage))
    assert flaky.calls < 3 * len(script)  # the open breaker spared the tool


def test_a_side_effecting_tool_runs_once_per_operation() -> None:
    """The same side-effecting call twice: the second is answered from the idempotency
    record, the tool is not run again."""
    sent: list[str] = []

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    script = [
        Reply.call("send_email", {"to": "a@example.com"}, id="c1"),
        Reply.call("send_email", {"to": "a@example.com"}, id="c2"),
        Reply.text("Sent."),
    ]
    middleware = guard(tool_options={"send_email": {"side_effecting": True}})
    messages = run(chat(ScriptedModel(script)), [send_email], [middleware])
    assert sent == ["a@example.com"]
    assert results(messages) == ["sent to a@example.com"] * 2


def test_a_side_effecting_tool_that_takes_a_key_gets_one_and_is_retried() -> None:
    """A side-effecting tool that takes an ``idempotency_key`` gets the operation's key, the
    same on every attempt, so a transient failure is retried safely."""
    keys: list[str] = []

    @tool
    def charge(amount: int, idempotency_key: str = "") -> str:
        """Charge the card."""
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise ConnectionError("payment gateway unreachable")
        return f"charged {amount}"

    script = [Reply.call("charge", {"amount": 5}, id="c1"), Reply.text("Charged.")]
    middleware = guard(tool_options={"charge": {"side_effecting": True}})
    messages = run(chat(ScriptedModel(script)), [charge], [middleware])
    assert results(messages) == ["charged 5"]
    assert len(keys) == 2
    assert keys[0] == keys[1] != ""


def test_a_tool_whose_argument_names_are_python_keywords() -> None:
    """A tool with a JSON-schema argument named ``from`` is guarded like any other."""
    from langchain_core.tools import StructuredTool

    schema = {"type": "object", "properties": {"from": {"type": "string"}}, "required": ["from"]}
    route = StructuredTool.from_function(
        lambda **kw: f"from {kw['from']}",
        name="route",
        description="Plan a route.",
        args_schema=schema,
    )
    script = [Reply.call("route", {"from": "Oslo"}, id="c1"), Reply.text("ok")]
    with ag.testing.capture_events() as events:
        messages = run(chat(ScriptedModel(script)), [route], [guard()])
    assert results(messages) == ["from Oslo"]
    assert events.of_type(ag.events.GuardInternalError) == []
    assert events.of_type(ag.events.ToolCallSucceeded)


def test_budget_exhaustion_stops_the_run() -> None:
    """With a hard per-session budget, the run stops with BudgetExceeded before the call that
    would pass it; alone, nothing stops it."""
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "token_budget": {"per_session": 1_000, "policy": "hard_stop"},
            "loop_detection": {"enabled": False},
        },
        env={},
    )
    calls = [Reply.call("read_file", {"path": "a.txt"}, id=f"c{i}") for i in range(30)]
    model = ScriptedModel(calls)
    with pytest.raises(ag.BudgetExceeded):
        run(chat(model, max_tokens=64), [read_file], [guard(config)])
    assert 1 < len(model.requests) < 30
    assert all(r.max_output_tokens == 64 for r in model.requests)  # the caller's cap, as set


def responses_chat(client: Any, **kw: Any) -> Any:
    """``ChatOpenAI`` for a reasoning model over the Responses API, on the sync ``client``."""
    return CHAT_OPENAI(
        model="gpt-5",
        api_key="sk-test",
        root_client=client,
        client=client.chat.completions,
        use_responses_api=True,
        **kw,
    )


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("output_version", ["responses/v1", "v1"])
def test_a_repaired_responses_call_keeps_its_block_beside_its_reasoning(
    output_version: str, streaming: bool
) -> None:
    """ChatOpenAI over the Responses API keeps the answer's items as content blocks and sends
    them back from there. When the guard repairs one of a reasoning model's calls, the call
    runs once (not again from its content block) and its block keeps its place and ids: a
    reasoning item goes back followed by the very item it was paired with, as OpenAI requires.
    What the agent sends next is what it sends after a healthy answer (but the arguments)."""
    seen = {}
    tool_results = {}
    for name, arguments, middleware in (
        ("healthy", '{"city": "Paris"}', []),
        ("broken", "{'city': 'Paris',}", [guard()]),
    ):
        client, seen[name] = answering(
            http, [reasoned_calls(arguments), [text_item("Sunny.")]], asynchronous=False
        )
        llm = responses_chat(client, output_version=output_version, streaming=streaming)
        messages = run(llm, [get_weather], middleware, "Weather in Rome and Paris?")
        tool_results[name] = [(m.tool_call_id, m.content) for m in messages if m.type == "tool"]

    def items(name: str) -> list[tuple[Any, ...]]:
        return [(i.get("type"), i.get("id"), i.get("call_id")) for i in seen[name][1]["input"]]

    assert (
        tool_results["broken"]
        == tool_results["healthy"]
        == [
            ("call_1", "sunny in Rome"),
            ("call_2", "sunny in Paris"),
        ]
    )
    assert items("broken") == items("healthy")


@pytest.mark.parametrize("output_version", [None, "responses/v1", "v1"])
def test_a_call_written_in_a_responses_answers_text_becomes_a_call(output_version: Any) -> None:
    """ChatOpenAI over the Responses API keeps the answer as content blocks (by default, and
    with ``output_version="responses/v1"`` or ``"v1"``): the guard reads their text, so a call
    the model wrote in it is handed over as a call there too, as with plain text content."""
    written = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gA1"}
    client, seen = answering(
        http, [[reasoning, text_item(written)], [text_item("Sunny.")]], asynchronous=False
    )
    llm = responses_chat(client, output_version=output_version)
    messages = run(llm, [get_weather], [guard()], "Weather in Paris?")
    assert results(messages) == ["sunny in Paris"]
    assert messages[-1].text == "Sunny."
    assert len(seen) == 2


def test_parallel_calls_each_run_their_own_tool() -> None:
    """Two calls in one answer (LangGraph runs them in parallel): each is guarded and answered
    under its own id."""
    calls = [("read_file", {"path": "a.txt"}, "c1"), ("read_file", {"path": "b.txt"}, "c2")]
    model = ScriptedModel([Reply.calls(calls), Reply.text("ok")])
    messages = run(chat(model), [read_file], [guard()])
    answered = {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}
    assert answered == {"c1": "alpha", "c2": "beta"}


def test_a_fallback_tool_answers_for_a_dead_one() -> None:
    """A ToolGuard fallback may name another of the agent's tools: it runs through LangChain."""

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        raise ConnectionError("down")

    @tool
    def weather_backup(city: str) -> str:
        """The weather in a city, from another service."""
        return f"{city}: 20C"

    model = ScriptedModel([Reply.call("weather", {"city": "Oslo"}, id="c1"), Reply.text("ok")])
    middleware = guard(tool_options={"weather": {"fallbacks": ["weather_backup"]}})
    messages = run(chat(model), [weather, weather_backup], [middleware])
    assert results(messages) == ["Oslo: 20C"]


def test_injected_runtime_and_structured_output_work_as_before() -> None:
    """A tool that takes LangChain's ToolRuntime gets it; a structured-output tool call is no
    unknown tool to the guard (one attempt, no re-ask)."""

    class Weather(BaseModel):
        city: str
        celsius: int

    @tool
    def whoami(runtime: ToolRuntime) -> str:
        """Say the call's id."""
        return f"id={runtime.tool_call_id}"

    script = [
        Reply.call("whoami", {}, id="w1"),
        Reply.call("Weather", {"city": "Oslo", "celsius": 3}),
    ]
    middleware = guard()
    agent = create_agent(
        chat(ScriptedModel(script)),
        [whoami],
        middleware=[middleware],
        response_format=ToolStrategy(Weather),
    )
    out = agent.invoke({"messages": [{"role": "user", "content": "go"}]})
    assert results(out["messages"])[0] == "id=w1"
    assert out["structured_response"] == Weather(city="Oslo", celsius=3)
    assert [len(r.attempts) for r in middleware.reports] == [1, 1]


def test_a_repaired_structured_output_call_gives_the_structured_response() -> None:
    """A structured-output call with broken JSON: repaired, and parsed as LangChain parses one
    (the structured response and its tool message); alone, the run ends without one."""

    class Weather(BaseModel):
        city: str
        celsius: int

    script = [Reply.call("Weather", '{"city": "Oslo", "celsius": 3', id="s1")]
    for middleware, expected in (([], None), ([guard()], Weather(city="Oslo", celsius=3))):
        model = ScriptedModel(list(script))
        agent = create_agent(
            chat(model), [read_file], middleware=middleware, response_format=ToolStrategy(Weather)
        )
        out = agent.invoke({"messages": [{"role": "user", "content": "go"}]})
        assert out.get("structured_response") == expected
        assert len(model.requests) == 1
    assert results(out["messages"]) == ["Returning structured response: city='Oslo' celsius=3"]


def test_an_interrupt_in_a_tool_pauses_and_resumes_the_run() -> None:
    """LangGraph's ``interrupt()`` inside a tool is no tool failure: the run pauses, and resumes
    with the answer."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command, interrupt

    @tool
    def deploy(target: str) -> str:
        """Deploy after a person approves."""
        return f"deployed {target}: {interrupt(f'deploy {target}?')}"

    model = ScriptedModel([Reply.call("deploy", {"target": "prod"}, id="c1"), Reply.text("ok")])
    agent = create_agent(chat(model), [deploy], middleware=[guard()], checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "t1"}}
    paused = agent.invoke({"messages": [{"role": "user", "content": "deploy"}]}, thread)
    assert paused["__interrupt__"][0].value == "deploy prod?"
    resumed = agent.invoke(Command(resume="approved"), thread)
    assert results(resumed["messages"]) == ["deployed prod: approved"]


@pytest.mark.anyio
async def test_a_sync_run_inside_an_event_loop() -> None:
    """``invoke`` called where an event loop runs (a notebook): tools still run guarded."""
    flaky = Flaky(1)
    script = [Reply.call("weather", {"city": "Rome"}, id="c1"), Reply.text("ok")]
    messages = run(chat(ScriptedModel(script)), [weather_tool(flaky)], [guard()])
    assert results(messages) == ["Rome: 18C"]
    assert flaky.calls == 2


@pytest.mark.anyio
async def test_ainvoke_repairs_and_retries() -> None:
    """Async: ``ainvoke`` repairs a broken call and retries a flaky async tool."""
    calls = 0

    @tool
    async def weather(city: str) -> str:
        """The weather in a city."""
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("weather service unreachable")
        return f"{city}: 18C"

    script = [Reply.call("weather", '{"city": "Paris"', id="c1"), Reply.text("18C.")]
    middleware = guard()
    agent = create_agent(chat(ScriptedModel(script)), [weather], middleware=[middleware])
    out = await agent.ainvoke({"messages": [{"role": "user", "content": "weather?"}]})
    assert results(out["messages"]) == ["Paris: 18C"]
    assert calls == 2
    assert middleware.reports[0].repairs


@pytest.mark.anyio
async def test_ainvoke_corrects_a_hallucinated_name_with_a_sync_tool() -> None:
    """Async run, sync tool: a near-miss name is corrected and the tool runs."""
    script = [Reply.call("read-file", {"path": "a.txt"}, id="c1"), Reply.text("alpha")]
    agent = create_agent(chat(ScriptedModel(script)), [read_file], middleware=[guard()])
    out = await agent.ainvoke({"messages": [{"role": "user", "content": "read"}]})
    assert results(out["messages"]) == ["alpha"]


def test_each_message_of_a_run_is_translated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's view of the history is built incrementally: over a ten-step run each
    message is translated to chat form once, not once per model call."""
    import agentguard.integrations.langchain as adapter

    translated: list[Any] = []
    real = adapter._chat

    def counting(message: Any) -> dict[str, Any]:
        translated.append(message)
        return real(message)

    monkeypatch.setattr(adapter, "_chat", counting)
    script = [
        Reply.call("read_file", {"path": p}, id=f"c{i}") for i, p in enumerate(list(FILES) * 5)
    ]
    calm = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "loop_detection": {"enabled": False}}, env={}
    )
    model = ScriptedModel([*script, Reply.text("done")])
    messages = run(chat(model), [read_file], [guard(calm)])
    assert len(messages) == 22
    assert len(translated) >= len(messages)
    assert len({id(m) for m in translated}) == len(translated)  # none translated twice


def test_a_translation_lives_as_long_as_its_message() -> None:
    """The translations are kept per live message only: a message gone, its entry is gone."""
    import gc

    import agentguard.integrations.langchain as adapter

    message = AIMessage(content="x" * 1000)
    key = id(message)
    assert adapter._chat_form(message)["content"] == "x" * 1000
    assert key in adapter._chat_form._forms
    del message
    gc.collect()
    assert key not in adapter._chat_form._forms


@pytest.mark.parametrize(
    ("name", "component"),
    [("convert_to_openai_tool", "request"), ("attach_report", "response")],
)
def test_a_fault_of_the_adapter_fails_open(
    monkeypatch: pytest.MonkeyPatch, name: str, component: str
) -> None:
    """The adapter's own faults (building the guard's request, handing the answer back) never
    break the agent: the call goes on unguarded and a GuardInternalError says so, without the
    fault's text; fail-closed, a GuardFailure is raised instead."""
    import agentguard.integrations.langchain as adapter

    def broken(*args: Any) -> Any:
        raise RuntimeError("adapter bug sk-secret-123")

    monkeypatch.setattr(adapter, name, broken)
    script = [Reply.call("read_file", {"path": "a.txt"}, id="c1"), Reply.text("It says alpha.")]
    with ag.testing.capture_events() as events:
        messages = run(chat(ScriptedModel(script)), [read_file], [guard()])
    assert messages[-1].content == "It says alpha."
    assert results(messages) == ["alpha"]
    faults = events.of_type(ag.events.GuardInternalError)
    assert {e.component for e in faults} == {f"langchain.{component}"}
    assert all("sk-secret" not in e.message for e in faults)
    closed = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "fail_mode": "closed"}, env={}
    )
    with pytest.raises(ag.GuardFailure):
        run(chat(ScriptedModel(script)), [read_file], [guard(closed)])


def test_the_docs_example_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs page's example runs as written, a scripted upstream in place of OpenAI."""
    page = Path(__file__).parent.parent / "docs" / "integrations" / "langchain.md"
    example = page.read_text().split("```python\n# example: langchain\n")[1].split("```")[0]
    upstream = ScriptedModel(
        {
            "gpt-4o-mini": [
                Reply.call("get_weather", '{"city": "Paris"', id="c1"),
                Reply.text("Sunny, 21C."),
            ]
        }
    )
    monkeypatch.setattr(langchain_openai, "ChatOpenAI", lambda **kw: chat(upstream, kw["model"]))
    exec(compile(example, str(page), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Sunny, 21C."
    assert "json_repaired" in out[1]  # the broken call was repaired, then the tool ran
    assert len(out) == 3


def test_the_adapter_names_the_extra_when_langchain_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing the adapter without langchain says which extra to install."""
    monkeypatch.setitem(sys.modules, "langchain.agents", None)
    monkeypatch.delitem(sys.modules, "agentguard.integrations.langchain")
    with pytest.raises(ImportError, match=r'pip install "agentguard\[langchain\]"'):
        import agentguard.integrations.langchain  # noqa: F401


def test_the_recovery_suite_langchain_stacks() -> None:
    """The recovery benchmark's LangChain stacks (a small seed): with the middleware every
    task is done under every fault class that needs no real waiting; alone, broken JSON, calls
    written as text and loops defeat LangChain's agent."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    recovery = import_module("recovery")
    faults = tuple(f for f in recovery.FAULTS if f not in recovery.TRANSPORT_FAULTS)
    results, _ = recovery.suite(
        n_tasks=3, rate=0.4, seed=7, faults=faults, stacks=recovery.LANGCHAIN_STACKS
    )
    guarded = {f: r.successes for (f, s), r in results.items() if s == "langchain_guarded"}
    assert guarded == dict.fromkeys(faults, 3)
    for fault in ("malformed_json", "text_call", "tool_loop"):
        assert results[(fault, "langchain")].successes < 3, fault
    assert results[("malformed_json", "langchain_guarded")].requests == 0  # repaired locally
