"""The Pydantic AI adapter, through a real ``Agent.run`` / ``run_stream``.

The scripted model is Pydantic AI's own ``FunctionModel`` (faults), or its ``OpenAIChatModel``
over a scripted HTTP upstream (healthy traffic byte for byte). Runs in the ``pydantic_ai`` nox
session (skipped where Pydantic AI is not installed).
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import sys
import warnings
from collections.abc import AsyncIterator, Callable
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic_ai nox session installs it")

import openai
from pydantic_ai import Agent, ModelRetry, UsageLimits
from pydantic_ai.exceptions import ModelTimeoutError, UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

import agentguard as ag
from _frameworks import FAULTS, recovery_results, run_docs_example
from _openai_upstream import Upstream, answering, reasoned_calls, text_item
from _otel import recorded_spans
from agentguard.integrations.pydantic_ai import AgentGuard, GuardedModel
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel

http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
pytestmark = pytest.mark.anyio
CONFIG = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})


def options() -> dict[str, Any]:
    clock = FakeClock()
    return {"clock": clock, "sleep": clock.asleep, "rng": random.Random(0)}


def guard(config: ag.GuardConfig = CONFIG, **kw: Any) -> AgentGuard:
    clock = FakeClock()
    tools = ag.ToolGuard(config, clock=clock, asleep=clock.asleep, rng=random.Random(0))
    return AgentGuard(config, tools=tools, options=options(), **kw)


Script = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


def scripted(*answers: ModelResponse | Script) -> tuple[FunctionModel, list[list[ModelMessage]]]:
    """A FunctionModel answering in order (a function answers from the request), and the
    messages of every request it received."""
    seen: list[list[ModelMessage]] = []
    steps = list(answers)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        return step(messages, info) if callable(step) else step

    return FunctionModel(respond), seen


def call(name: str, args: str | dict[str, Any], id: str = "c1") -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=id)])


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


def weather_agent(model: Any, capabilities: list[Any] | None = None, **kw: Any) -> Agent[Any, str]:
    agent: Agent[Any, str] = Agent(model, capabilities=capabilities or [], **kw)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return f"sunny in {city}"

    return agent


def _parts(messages: list[ModelMessage]) -> list[Any]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]


def tool_returns(messages: list[ModelMessage]) -> list[Any]:
    """The results of the tool calls that ran (not Pydantic AI's retry feedback)."""
    return [
        p.content
        for p in _parts(messages)
        if isinstance(p, ToolReturnPart) and getattr(p, "outcome", None) != "retried"
    ]


def retries(messages: list[ModelMessage]) -> list[Any]:
    """Pydantic AI's retry feedback (a retried tool return, or a retry prompt)."""
    return [
        p
        for p in _parts(messages)
        if isinstance(p, RetryPromptPart) or getattr(p, "outcome", None) == "retried"
    ]


# -- healthy traffic ---------------------------------------------------------------------------


def openai_model(upstream: Upstream) -> OpenAIChatModel:
    provider = OpenAIProvider(openai_client=upstream.client(openai, asynchronous=True))
    return OpenAIChatModel("gpt-test", provider=provider)


@pytest.mark.parametrize("stream", [False, True])
async def test_healthy_run_sends_upstream_exactly_what_the_agent_sends(stream: bool) -> None:
    """Over the real OpenAI model, a guarded run sends the same bytes and ends alike."""
    script = [Reply.call("get_weather", {"city": "Paris"}, id="c1"), Reply.text("Sunny.")]
    raw, guarded = Upstream(http, list(script)), Upstream(http, list(script))

    async def go(agent: Agent[Any, str]) -> str:
        if not stream:
            return (await agent.run("Weather in Paris?")).output
        async with agent.run_stream("Weather in Paris?") as result:
            return await result.get_output()

    expected = await go(weather_agent(openai_model(raw)))
    assert await go(weather_agent(openai_model(guarded), [guard()])) == expected == "Sunny."
    assert [(p, b) for _, p, b, _ in guarded.seen] == [(p, b) for _, p, b, _ in raw.seen]


async def test_the_chat_spans_name_the_models_provider() -> None:
    """Telemetry names the provider as Pydantic AI's model does (``Model.system``)."""
    script = [Reply.call("get_weather", {"city": "Paris"}, id="c1"), Reply.text("Sunny.")]
    with recorded_spans() as exporter:
        result = await weather_agent(openai_model(Upstream(http, script)), [guard()]).run("Paris?")
    assert result.output == "Sunny."
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert len(chats) == 2
    assert {s.attributes["gen_ai.provider.name"] for s in chats} == {"openai"}


async def test_healthy_function_model_run_is_unchanged_and_reported() -> None:
    """The scripted model sees the same messages; the answer carries the guard's report."""
    answers = (call("get_weather", {"city": "Rome"}), text("Warm."))
    plain_model, plain_seen = scripted(*answers)
    model, seen = scripted(*answers)
    expected = await weather_agent(plain_model).run("Rome?")
    result = await weather_agent(model, [guard()]).run("Rome?")
    assert result.output == expected.output == "Warm."
    assert [[type(p) for p in m.parts] for m in seen[-1]] == [
        [type(p) for p in m.parts] for m in plain_seen[-1]
    ]
    assert tool_returns(seen[-1]) == tool_returns(plain_seen[-1]) == ["sunny in Rome"]
    report = ag.report_of(result.all_messages()[-1])
    assert report is not None
    assert report.corrections == 0
    assert result.usage.requests == expected.usage.requests == 2


# -- faults ------------------------------------------------------------------------------------


async def test_broken_json_arguments_are_repaired_without_a_retry() -> None:
    """Broken JSON arguments are repaired before Pydantic AI validates them: no retry prompt,
    no extra request, where the agent alone spends one."""
    answers = (call("get_weather", "{'city': 'Paris',}"), text("Sunny."))
    model, seen = scripted(*answers)
    result = await weather_agent(model, [guard()]).run("Weather in Paris?")
    assert result.output == "Sunny."
    assert tool_returns(result.all_messages()) == ["sunny in Paris"]
    assert (len(seen), retries(result.all_messages())) == (2, [])
    plain_model, _ = scripted(*answers)
    plain = await weather_agent(plain_model).run("Weather in Paris?")
    assert len(retries(plain.all_messages())) == 1  # the agent alone: the tool never ran
    assert tool_returns(plain.all_messages()) == []


async def test_broken_json_arguments_are_repaired_in_a_streamed_run() -> None:
    """run_stream: the streamed answer is judged whole, repaired, then replayed."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            for word in ("Sunny ", "in ", "Paris."):
                yield word
        else:
            yield {0: DeltaToolCall("get_weather", "{'city': ", tool_call_id="c1")}
            yield {0: DeltaToolCall(None, "'Paris',}")}

    agent = weather_agent(FunctionModel(stream_function=stream), [guard()])
    async with agent.run_stream("Weather in Paris?") as result:
        output = await result.get_output()
    assert output == "Sunny in Paris."
    assert tool_returns(result.all_messages()) == ["sunny in Paris"]
    assert retries(result.all_messages()) == []


@pytest.mark.parametrize("stream", [False, True])
async def test_a_repaired_call_keeps_its_part_beside_its_reasoning(stream: bool) -> None:
    """A reasoning model's item must go back to OpenAI's Responses API followed by the very
    item it was paired with (400, "provided without its required following item", otherwise).
    When the guard repairs one of the calls, every part keeps its place and id: what Pydantic AI
    sends next is what it sends after a healthy answer."""
    text = text_item("Sunny.")
    healthy, healthy_seen = answering(http, [reasoned_calls('{"city": "Paris"}'), [text]])
    broken, broken_seen = answering(http, [reasoned_calls("{'city': 'Paris',}"), [text]])

    async def go(client: Any, capabilities: list[Any]) -> str:
        provider = OpenAIProvider(openai_client=client)
        agent = weather_agent(OpenAIResponsesModel("gpt-5", provider=provider), capabilities)
        if not stream:
            return (await agent.run("Weather in Rome and Paris?")).output
        async with agent.run_stream("Weather in Rome and Paris?") as result:
            return await result.get_output()

    assert await go(broken, [guard()]) == await go(healthy, []) == "Sunny."
    assert broken_seen[1]["input"] == healthy_seen[1]["input"]


async def test_hallucinated_tool_name_is_corrected() -> None:
    """A near-miss tool name is corrected onto the one read-only tool it can mean."""
    model, seen = scripted(call("get_wether", {"city": "Oslo"}), text("Done."))
    result = await weather_agent(model, [guard()]).run("Weather in Oslo?")
    assert tool_returns(result.all_messages()) == ["sunny in Oslo"]
    assert retries(result.all_messages()) == []
    assert len(seen) == 2


def looping(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model stuck on one call, that answers once told (the guard's hint or tool_choice)."""
    settings = info.model_settings or {}
    last = json.dumps([str(p) for p in messages[-1].parts])
    if settings.get("tool_choice") == "none" or "[agentguard]" in last:
        return text("Sunny in Paris, as the first call said.")
    return call("get_weather", {"city": "Paris"}, id=f"c{len(messages)}")


async def test_tool_loop_is_broken_with_an_answer() -> None:
    """A model repeating one call with the same result is made to answer; the agent alone
    runs into its request limit."""
    model, _ = scripted(looping)
    limits = UsageLimits(request_limit=12)
    result = await weather_agent(model, [guard()]).run("Weather?", usage_limits=limits)
    assert result.output.startswith("Sunny in Paris")
    assert 2 <= len(tool_returns(result.all_messages())) < 10
    bare, _ = scripted(looping)
    with pytest.raises(UsageLimitExceeded):
        await weather_agent(bare).run("Weather?", usage_limits=limits)


def weather_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One run of a healthy agent: the weather, then an answer (the call's id every run's)."""
    if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
        return text("Sunny.")
    return call("get_weather", {"city": "Paris"}, id="c1")


async def test_separate_runs_making_the_same_call_all_run_the_tool() -> None:
    """Twelve runs of one agent, each calling the same tool once with the same arguments: each
    run has loop state of its own (the guard's session of the answer that asked for the call),
    so the tool runs every time. Before, one history spanned the runs and the seventh was
    refused as a loop."""
    model, _ = scripted(weather_once)
    capability = guard()
    agent = weather_agent(model, [capability])
    returns = []
    for i in range(12):
        result = await agent.run(f"I am user {i}. Weather in Paris?")
        returns += tool_returns(result.all_messages())
    assert returns == ["sunny in Paris"] * 12
    assert capability.tools is not None
    runs = list(capability.tools._runs)
    assert len(runs) == 12
    assert all(run.startswith("auto-") for run in runs)  # the guard's sessions


async def test_flaky_tool_is_retried_by_the_tool_guard() -> None:
    """A tool failing transiently is retried by the ToolGuard; alone, the error ends the run."""
    attempts: list[str] = []

    def build(model: Any, capabilities: list[Any]) -> Agent[Any, str]:
        agent: Agent[Any, str] = Agent(model, capabilities=capabilities)

        @agent.tool_plain
        def fetch(url: str) -> str:
            """Fetch a page."""
            attempts.append(url)
            if len(attempts) % 2:
                raise ConnectionError("connection reset")
            return "<html>ok</html>"

        return agent

    answers = (call("fetch", {"url": "https://x.test"}), text("Fetched."))
    model, _ = scripted(*answers)
    result = await build(model, [guard()]).run("Fetch it.")
    assert (result.output, attempts) == ("Fetched.", ["https://x.test"] * 2)
    assert tool_returns(result.all_messages()) == ["<html>ok</html>"]
    attempts.clear()
    with pytest.raises(ConnectionError):
        await build(scripted(*answers)[0], []).run("Fetch it.")


async def test_a_tool_that_keeps_failing_gives_the_model_a_structured_error() -> None:
    """When retries do not help, the model gets the guard's structured error as the result."""
    agent: Agent[Any, str] = Agent(
        scripted(call("fetch", {"url": "u"}), text("Gave up."))[0], capabilities=[guard()]
    )

    @agent.tool_plain
    def fetch(url: str) -> str:
        """Fetch a page."""
        raise ConnectionError("down")

    result = await agent.run("Fetch.")
    (error,) = tool_returns(result.all_messages())
    assert (error["error"], error["tool"], result.output) == ("transient", "fetch", "Gave up.")


async def test_model_retry_from_a_tool_is_pydantic_ais_own() -> None:
    """A tool's ModelRetry reaches Pydantic AI untouched: a retry prompt, no ToolGuard retry."""
    runs: list[str] = []
    model, _ = scripted(
        call("lookup", {"city": "paris"}), call("lookup", {"city": "Paris"}, "c2"), text("Ok.")
    )
    agent: Agent[Any, str] = Agent(model, capabilities=[guard()])

    @agent.tool_plain
    def lookup(city: str) -> str:
        """Look a city up (capitalised)."""
        runs.append(city)
        if not city[0].isupper():
            raise ModelRetry("write the city with a capital letter")
        return "found"

    result = await agent.run("Find Paris.")
    assert runs == ["paris", "Paris"]
    (retry,) = retries(result.all_messages())
    assert "capital letter" in str(retry.content)
    assert result.output == "Ok."


async def test_usage_limits_count_the_guards_own_requests() -> None:
    """Corrections are requests: a request_limit stops them, and run usage counts every one."""
    model, seen = scripted(call("execute_code", {"code": "print(1)"}))
    with pytest.raises(UsageLimitExceeded):
        await weather_agent(model, [guard()]).run("Go.", usage_limits=UsageLimits(request_limit=2))
    assert len(seen) == 2
    model, seen = scripted(
        call("execute_code", {"code": "1"}), call("get_weather", {"city": "A"}, "c2"), text("Ok.")
    )
    result = await weather_agent(model, [guard()]).run("Go.")
    assert tool_returns(result.all_messages()) == ["sunny in A"]
    assert result.usage.requests == len(seen) == 3


async def test_budget_exhaustion_stops_the_run_with_a_typed_error() -> None:
    """Under hard_stop the run ends with BudgetExceeded, the budget never overrun."""
    config = ag.GuardConfig.from_dict(
        {
            "memory_pressure": {"enabled": False},
            "token_budget": {"per_session": 400, "max_output_tokens": 50, "policy": "hard_stop"},
        },
        env={},
    )
    model, seen = scripted(lambda m, i: call("get_weather", {"city": f"C{len(m)}"}, f"c{len(m)}"))
    with pytest.raises(ag.BudgetExceeded):
        await weather_agent(model, [guard(config)]).run("Go.")
    assert 1 <= len(seen) < 20


async def test_escalation_moves_to_a_stronger_tier() -> None:
    """A tier that keeps answering with unusable calls is left for the stronger one."""
    weak, weak_seen = scripted(call("execute_code", {"code": "x"}))
    strong, _ = scripted(call("get_weather", {"city": "Lima"}, "c9"), text("Mild in Lima."))
    result = await weather_agent(weak, [guard(tiers={"strong": strong})]).run("Lima?")
    assert result.output == "Mild in Lima."
    report = ag.report_of(result.all_messages()[1])
    assert report is not None
    assert report.escalated_from == "primary"
    assert len(weak_seen) >= 2


async def test_guarded_model_works_without_the_capability() -> None:
    """GuardedModel alone guards the model requests (no tool guard)."""
    model, _ = scripted(call("get_weather", "{'city': 'Bonn'"), text("Cool."))
    guarded = GuardedModel(model, CONFIG, **options())
    result = await weather_agent(guarded).run("Bonn?")
    assert tool_returns(result.all_messages()) == ["sunny in Bonn"]
    assert guarded.last_report is not None


async def test_without_the_guard_an_unknown_tool_exhausts_pydantic_ais_retries() -> None:
    """The baseline the corrections are measured against: the agent alone gives up."""
    model, _ = scripted(call("execute_code", {"code": "x"}))
    with pytest.raises(UnexpectedModelBehavior):
        await weather_agent(model).run("Go.")


# A script's provider client keeps its keep-alive connection (and run_sync its event loop) until
# the script exits; here both are closed and collected inside the test.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_docs_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs page's example runs as written, against a scripted model on loopback HTTP."""
    monkeypatch.chdir(tmp_path)
    script = run_docs_example("pydantic-ai", "{'path': 'README.md',}", monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        loop = asyncio.get_event_loop()  # the one run_sync made this thread's: close it
    loop.close()
    asyncio.set_event_loop(None)
    gc.collect()  # the example's client, while the warning filter still applies
    out = capsys.readouterr().out
    assert "Fewer loops." in out
    assert "repairs=(" in out  # the broken JSON was repaired, as the report says
    assert "repairs=()" not in out
    assert len(script.requests) == 2


def test_the_adapter_names_the_extra_when_pydantic_ai_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing the adapter without Pydantic AI says which extra to install."""
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    monkeypatch.delitem(sys.modules, "agentguard.integrations.pydantic_ai")
    with pytest.raises(ImportError, match=r'pip install "agentguard\[pydantic-ai\]"'):
        import agentguard.integrations.pydantic_ai  # noqa: F401


def quiet_openai_model(upstream: Upstream) -> OpenAIChatModel:
    """The OpenAI model over a client without retries of its own (as the docs advise)."""
    client = upstream.client(openai, asynchronous=True).with_options(max_retries=0)
    return OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))


async def test_a_timeout_is_retried_by_the_guard_and_stays_pydantic_ais_when_it_persists() -> None:
    """A transport timeout under Pydantic AI's wrapping is retried by the guard; when every
    attempt times out the agent gets Pydantic AI's own ModelTimeoutError."""
    up = Upstream(http, ScriptedModel([Fault.timeout(), Reply.text("Late.")]))
    result = await weather_agent(quiet_openai_model(up), [guard()]).run("Weather?")
    assert (result.output, len(up.seen)) == ("Late.", 2)
    dead = Upstream(http, ScriptedModel([Fault.timeout()], cycle=True))
    with pytest.raises(ModelTimeoutError):
        await weather_agent(quiet_openai_model(dead), [guard()]).run("Weather?")
    assert len(dead.seen) > 1


def test_the_recovery_benchmark_runs_the_framework_alone_and_guarded() -> None:
    """The recovery suite's pydantic_ai stacks run; guarded, every task survives a tool loop and
    broken JSON, where the framework alone loses the loop runs."""
    results = recovery_results("pydantic_ai")
    assert [results[(f, "pydantic_ai+agentguard")].successes for f in FAULTS] == [3, 3]
    assert results[("tool_loop", "pydantic_ai")].successes < 3


async def test_a_message_the_guard_cannot_read_goes_through_unguarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault in the adapter's own translation never breaks the agent: the request goes to
    the model as the agent built it."""
    adapter = import_module("agentguard.integrations.pydantic_ai")

    def broken(messages: Any) -> Any:
        raise RuntimeError("unreadable")

    monkeypatch.setattr(adapter, "_chat", broken)
    model, seen = scripted(call("get_weather", {"city": "Rome"}), text("Warm."))
    result = await weather_agent(model, [guard()]).run("Rome?")
    assert (result.output, len(seen)) == ("Warm.", 2)
    assert ag.report_of(result.all_messages()[-1]) is None


async def test_a_message_the_guard_cannot_read_raises_a_guard_failure_when_fail_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``fail_mode: closed`` the adapter's own fault is a typed error and the model is
    never asked unguarded; the fault is reported as an event either way."""
    adapter = import_module("agentguard.integrations.pydantic_ai")

    def broken(messages: Any) -> Any:
        raise RuntimeError("unreadable")

    monkeypatch.setattr(adapter, "_chat", broken)
    events: list[Any] = []
    closed = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "fail_mode": "closed"}, env={}
    )
    model, seen = scripted(text("Warm."))
    capability = AgentGuard(closed, options={**options(), "hooks": [events.append]})
    with pytest.raises(ag.GuardFailure):
        await weather_agent(model, [capability]).run("Rome?")
    assert seen == []
    assert [type(e).__name__ for e in events] == ["GuardInternalError"]


async def test_a_tool_the_guard_forces_is_asked_for_in_pydantic_ais_form() -> None:
    """When the guard's re-asks force one tool (chat ``tool_choice`` naming a function), the
    model is asked with Pydantic AI's own ``tool_choice`` (a list of tool names)."""
    choices: list[Any] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        choices.append((info.model_settings or {}).get("tool_choice"))
        if "sunny in" in str(tool_returns(messages)):  # (not the guard's feedback)
            return text("Sunny.")
        if len(choices) < 3:
            return call("get_weather", {"city": "<city>"}, f"c{len(choices)}")
        return call("get_weather", {"city": "Paris"}, "c9")

    result = await weather_agent(FunctionModel(respond), [guard()]).run("Weather in Paris?")
    assert result.output == "Sunny."
    assert tool_returns(result.all_messages()) == ["sunny in Paris"]
    assert choices[2] == ["get_weather"]  # the third attempt: that tool, and no other
