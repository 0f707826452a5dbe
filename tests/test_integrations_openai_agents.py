"""The OpenAI Agents SDK adapter, through a real ``Runner.run`` / ``run_streamed``.

The SDK's own models talk to a scripted upstream over an HTTP mock transport
(``_openai_upstream.Upstream``: chat completions and Responses, streamed or not), offline, with
tracing off. Runs in the ``openai_agents`` nox session (skipped where the SDK is not installed).
"""

from __future__ import annotations

import gc
import itertools
import json
import random
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents", reason="the openai_agents nox session installs it")

import openai  # noqa: E402
from agents import (  # noqa: E402
    Agent,
    MaxTurnsExceeded,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

import agentguard as ag  # noqa: E402
from _frameworks import FAULTS, recovery_results, run_docs_example  # noqa: E402
from _openai_upstream import Upstream, answering, reasoned_calls, text_item  # noqa: E402
from agentguard.integrations.openai_agents import (  # noqa: E402
    GuardedProvider,
    guard_tools,
    guarded_model,
)
from agentguard.testing import FakeClock, Reply, ScriptedModel  # noqa: E402
from agentguard.transport import ModelRequest  # noqa: E402

set_tracing_disabled(True)  # offline: no trace export

http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
APIS = ["responses", "chat_completions"]
CONFIG = {"memory_pressure": {"enabled": False}}

pytestmark = pytest.mark.anyio


@function_tool
def get_weather(city: str) -> str:
    """The weather of a city."""
    return f"sunny in {city}"


def options(clock: FakeClock | None = None) -> dict[str, Any]:
    clock = clock or FakeClock()
    return {"clock": clock, "sleep": clock.asleep, "rng": random.Random(0)}


def model(upstream: Upstream, api: str, config: Any = None, **kw: Any) -> Any:
    client = upstream.client(openai, asynchronous=True)
    return guarded_model("gpt-test", client, config or CONFIG, api=api, **options(), **kw)


def plain(upstream: Upstream, api: str) -> Any:
    client = upstream.client(openai, asynchronous=True)
    if api == "responses":
        return agents.OpenAIResponsesModel("gpt-test", client)
    return agents.OpenAIChatCompletionsModel("gpt-test", client)


async def run(agent: Agent[Any], prompt: str, stream: bool, **kw: Any) -> Any:
    if not stream:
        return await Runner.run(agent, prompt, **kw)
    result = Runner.run_streamed(agent, prompt, **kw)
    async for _ in result.stream_events():
        pass
    return result


def bodies(upstream: Upstream) -> list[dict[str, Any]]:
    return [json.loads(body) for _, _, body, _ in upstream.seen]


def weather_agent(llm: Any, tools: list[Any] | None = None) -> Agent[Any]:
    return Agent(name="w", instructions="Be brief.", tools=tools or [get_weather], model=llm)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
async def test_healthy_run_is_unchanged(api: str, stream: bool) -> None:
    """A healthy run sends the upstream exactly what the unguarded SDK sends, and ends alike."""
    script = [Reply.call("get_weather", {"city": "Paris"}, id="c1"), Reply.text("Sunny.")]
    raw, guarded = Upstream(http, list(script)), Upstream(http, list(script))
    expected = await run(weather_agent(plain(raw, api)), "Weather in Paris?", stream)
    result = await run(weather_agent(model(guarded, api)), "Weather in Paris?", stream)
    assert result.final_output == expected.final_output == "Sunny."
    assert bodies(guarded) == bodies(raw)
    assert [s[1] for s in guarded.seen] == [s[1] for s in raw.seen]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
async def test_broken_json_arguments_are_repaired_locally(api: str, stream: bool) -> None:
    """Arguments in broken JSON are repaired before the SDK parses them: the tool runs with
    the meant arguments, and no round trip is added."""
    up = Upstream(
        http, [Reply.call("get_weather", "{'city': 'Paris',}", id="c1"), Reply.text("Sunny.")]
    )
    result = await run(weather_agent(model(up, api)), "Weather in Paris?", stream)
    assert result.final_output == "Sunny."
    outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
    assert outputs == ["sunny in Paris"]
    assert len(up.seen) == 2


@pytest.mark.parametrize("api", APIS)
async def test_hallucinated_tool_name_is_corrected(api: str) -> None:
    """A near-miss tool name is corrected onto the one tool it can mean (read-only), where the
    SDK alone ends the run with ModelBehaviorError."""
    script = [Reply.call("get_wether", {"city": "Oslo"}, id="c1"), Reply.text("Done.")]
    up = Upstream(http, list(script))
    result = await run(weather_agent(model(up, api)), "Weather in Oslo?", False)
    outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
    assert outputs == ["sunny in Oslo"]
    with pytest.raises(agents.exceptions.ModelBehaviorError):
        await run(weather_agent(plain(Upstream(http, list(script)), api)), "Weather?", False)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_repaired_call_keeps_its_item_beside_its_reasoning(stream: bool) -> None:
    """A reasoning model's item must go back followed by the very item it was paired with
    (OpenAI answers 400, "provided without its required following item", otherwise). When the
    guard repairs one of the calls, every item keeps its place and id in what the SDK sends
    next: only the repaired arguments differ from a healthy run's."""
    text = text_item("Sunny.")
    healthy, healthy_seen = answering(http, [reasoned_calls('{"city": "Paris"}'), [text]])
    broken, broken_seen = answering(http, [reasoned_calls("{'city': 'Paris',}"), [text]])
    plain_model = agents.OpenAIResponsesModel("gpt-test", healthy)
    guarded = guarded_model("gpt-test", broken, CONFIG, **options())
    expected = await run(weather_agent(plain_model), "Weather in Rome and Paris?", stream)
    result = await run(weather_agent(guarded), "Weather in Rome and Paris?", stream)
    assert result.final_output == expected.final_output == "Sunny."

    def items(seen: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(i.get("type"), i.get("id"), i.get("call_id")) for i in seen[1]["input"]]

    assert items(broken_seen) == items(healthy_seen)
    assert [i.get("arguments") for i in broken_seen[1]["input"]][2:5:2] == [
        '{"city": "Rome"}',
        '{"city": "Paris"}',
    ]


async def test_a_re_ask_after_live_text_keeps_the_new_calls_beside_their_reasoning() -> None:
    """The text went out live, then the call was corrected by a re-ask whose answer is a
    reasoning item and a call: the served answer carries the text first, and the re-ask's
    reasoning item still followed by its call (as OpenAI wants it back)."""
    rocket = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "launch_rocket",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    }
    client, seen = answering(
        http,
        [
            [text_item("Let me check."), rocket],
            reasoned_calls('{"city": "Paris"}')[2:],
            [text_item("Sunny.")],
        ],
    )
    result = await run(
        weather_agent(guarded_model("gpt-test", client, CONFIG, **options())), "?", True
    )
    assert result.final_output == "Sunny."
    assert [(i.get("type"), i.get("id")) for i in seen[2]["input"]][1:4] == [
        ("message", "msg_agentguard_0"),
        ("reasoning", "rs_2"),
        ("function_call", "fc_2"),
    ]


def looping(request: ModelRequest) -> Reply:
    """A model stuck on one call, that answers once the guard forces an answer."""
    if request.params.get("tool_choice") == "none" or "[agentguard]" in json.dumps(
        list(request.messages)[-1:]
    ):
        return Reply.text("Sunny in Paris, as the first call said.")
    return Reply.call("get_weather", {"city": "Paris"}, id=f"c{len(request.messages)}")


@pytest.mark.parametrize("api", APIS)
async def test_tool_loop_is_broken_with_an_answer(api: str) -> None:
    """A model repeating one call with the same result gets the guard's hint and answers; the
    SDK alone runs into MaxTurnsExceeded."""
    up = Upstream(http, ScriptedModel([looping], cycle=True))
    result = await run(weather_agent(model(up, api)), "Weather in Paris?", False, max_turns=10)
    assert result.final_output.startswith("Sunny in Paris")
    executed = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert 2 <= len(executed) < 10
    bare = Upstream(http, ScriptedModel([looping], cycle=True))
    with pytest.raises(MaxTurnsExceeded):
        await run(weather_agent(plain(bare, api)), "Weather in Paris?", False, max_turns=10)


async def test_a_run_chained_upstream_is_one_session_and_its_loop_is_broken() -> None:
    """With ``auto_previous_response_id`` the SDK sends each turn only its new items, chained
    by ``previous_response_id`` (the history kept upstream): the guard follows the chain as one
    session, sees the loop and breaks it with an answer. Before, each turn was a session of its
    own, judged afresh, and the run hit MaxTurnsExceeded."""
    ids = itertools.count()

    def stuck(request: ModelRequest) -> Reply:  # ``looping``, each call with an id of its own
        reply = looping(request)
        if not reply.tool_calls:
            return reply
        return Reply.call("get_weather", {"city": "Paris"}, id=f"c{next(ids)}")

    up = Upstream(http, ScriptedModel([stuck], cycle=True))
    result = await run(
        weather_agent(model(up, "responses")),
        "Weather in Paris?",
        False,
        max_turns=10,
        auto_previous_response_id=True,
    )
    assert result.final_output.startswith("Sunny in Paris")
    sent = bodies(up)
    assert all("previous_response_id" in body for body in sent[1:])
    assert all(len(body["input"]) <= 2 for body in sent[1:])  # only what is new, and a hint
    executed = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert 2 <= len(executed) < 10


async def test_budget_exhaustion_stops_the_run_with_a_typed_error() -> None:
    """Under hard_stop the run ends with BudgetExceeded before the budget is overrun."""
    config = {
        **CONFIG,
        "token_budget": {"per_session": 1500, "max_output_tokens": 100, "policy": "hard_stop"},
    }
    calls = [Reply.call("get_weather", {"city": f"C{i}"}, id=f"c{i}") for i in range(20)]
    up = Upstream(http, calls)
    with pytest.raises(ag.BudgetExceeded):
        await run(weather_agent(model(up, "chat_completions", config)), "Go.", False)
    assert 1 <= len(up.seen) < 20


async def test_provider_guards_every_agent_of_a_run() -> None:
    """GuardedProvider serves every agent of a run through one guarded client."""
    up = Upstream(
        http, [Reply.call("get_weather", "{'city': 'Rome'", id="c1"), Reply.text("Warm.")]
    )
    provider = GuardedProvider(
        up.client(openai, asynchronous=True), CONFIG, api="chat_completions", **options()
    )
    agent = Agent(name="w", instructions="Be brief.", tools=[get_weather])
    result = await Runner.run(agent, "Rome?", run_config=RunConfig(model_provider=provider))
    assert result.final_output == "Warm."
    assert provider.get_model(None) is provider.get_model(None)
    with pytest.raises(TypeError, match="AsyncOpenAI"):
        GuardedProvider(up.client(openai, asynchronous=False))
    with pytest.raises(ValueError, match="api must be"):
        GuardedProvider(up.client(openai, asynchronous=True), api="completions")


# -- tools -------------------------------------------------------------------------------------


def tool_guard(clock: FakeClock) -> ag.ToolGuard:
    return ag.ToolGuard(
        ag.GuardConfig.from_dict(CONFIG, env={}),
        clock=clock,
        asleep=clock.asleep,
        rng=random.Random(0),
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_flaky_tool_is_retried_and_the_outcome_recorded(stream: bool) -> None:
    """A tool failing transiently is retried by the ToolGuard; the output guardrail carries
    the outcome (two attempts)."""
    attempts: list[str] = []

    @function_tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        attempts.append(url)
        if len(attempts) == 1:
            raise ConnectionError("connection reset")
        return "<html>ok</html>"

    clock = FakeClock()
    up = Upstream(http, [Reply.call("fetch", {"url": "https://x.test"}, id="c1"), Reply.text("Ok")])
    agent = guard_tools(weather_agent(model(up, "responses"), [fetch]), tool_guard(clock))
    result = await run(agent, "Fetch it.", stream)
    assert result.final_output == "Ok"
    assert attempts == ["https://x.test", "https://x.test"]
    outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
    assert outputs == ["<html>ok</html>"]
    (decision,) = result.tool_output_guardrail_results
    assert decision.output.output_info["ok"] is True
    assert decision.output.output_info["attempts"] == 2


async def test_a_failing_tool_gives_the_model_a_structured_error_and_the_breaker_opens() -> None:
    """A tool that keeps failing: the model gets the guard's structured error; once its breaker
    is open, the input guardrail refuses the call before anything runs."""
    runs: list[str] = []

    @function_tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        runs.append(url)
        raise ConnectionError("down")

    clock = FakeClock()
    tools = tool_guard(clock)
    calls = [Reply.call("fetch", {"url": f"https://x.test/{i}"}, id=f"c{i}") for i in range(8)]
    up = Upstream(http, [*calls, Reply.text("Gave up.")])
    agent = guard_tools(weather_agent(model(up, "chat_completions"), [fetch]), tools)
    result = await run(agent, "Fetch them.", False, max_turns=20)
    assert result.final_output == "Gave up."
    outputs = [json.loads(i.output) for i in result.new_items if i.type == "tool_call_output_item"]
    assert outputs[0]["error"] in {"transient", "timeout", "permanent"}
    refused = [
        r for r in result.tool_input_guardrail_results if r.output.behavior["type"] != "allow"
    ]
    assert refused, "the open breaker refuses calls up front"
    assert outputs[-1]["error"] == "breaker_open"
    assert len(runs) < 8 * 3  # not every call retried to the end


def weather_once(request: ModelRequest) -> Reply:
    """One run of a healthy agent: the weather, then an answer (the call's id every run's)."""
    if any(m.get("role") == "tool" for m in request.messages):
        return Reply.text("Sunny.")
    return Reply.call("get_weather", {"city": "Paris"}, id="c1")


@pytest.mark.parametrize("guarded", [True, False])
@pytest.mark.parametrize("api", APIS)
async def test_separate_runs_making_the_same_call_all_run_the_tool(api: str, guarded: bool) -> None:
    """Twelve runs of one agent, each calling the same tool once with the same arguments: each
    run has loop state of its own (the guard's session of the answer, or, with no guarded
    model, the SDK run), so the tool runs every time. Before, one history spanned the runs and
    the seventh was refused as a loop."""
    executed: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        executed.append(city)
        return f"sunny in {city}"

    up = Upstream(http, ScriptedModel([weather_once], cycle=True))
    llm = model(up, api) if guarded else plain(up, api)
    tools = tool_guard(FakeClock())
    agent = guard_tools(weather_agent(llm, [get_weather]), tools)
    outputs = []
    for i in range(12):
        result = await run(agent, f"I am user {i}. Weather in Paris?", False)
        outputs += [o.output for o in result.new_items if o.type == "tool_call_output_item"]
    assert outputs == ["sunny in Paris"] * 12
    assert len(executed) == 12
    prefix = "auto-" if guarded else "agents-run-"  # the run each call was judged in
    assert len(tools._runs) == 12
    assert all(run.startswith(prefix) for run in tools._runs)


async def test_guard_tool_leaves_the_original_tool_alone() -> None:
    """guard_tools clones the agent: the original agent and its tool are unchanged."""
    agent = weather_agent(plain(Upstream(http, []), "responses"))
    guarded = guard_tools(agent)
    assert agent.tools == [get_weather]
    assert get_weather.tool_output_guardrails in (None, [])
    assert guarded.tools[0] is not get_weather
    assert [g.get_name() for g in guarded.tools[0].tool_output_guardrails] == [
        "agentguard:get_weather"
    ]


# A script's client keeps its keep-alive connection until exit; here it is collected in the test.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_docs_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs page's example runs as written, against a scripted model on loopback HTTP."""
    monkeypatch.chdir(tmp_path)
    script = run_docs_example("openai-agents", "{'path': 'README.md'", monkeypatch)
    gc.collect()
    out = capsys.readouterr().out
    assert "Fewer loops." in out
    assert "'ok': True" in out  # the tool ran through the ToolGuard, its outcome carried
    assert len(script.requests) == 2  # the broken arguments were repaired, not re-asked for


def test_the_adapter_names_the_extra_when_the_sdk_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing the adapter without the Agents SDK says which extra to install."""
    monkeypatch.setitem(sys.modules, "agents", None)
    monkeypatch.delitem(sys.modules, "agentguard.integrations.openai_agents")
    with pytest.raises(ImportError, match=r'pip install "agentguard\[openai-agents\]"'):
        import agentguard.integrations.openai_agents  # noqa: F401


def test_the_recovery_benchmark_runs_the_framework_alone_and_guarded() -> None:
    """The recovery suite's openai_agents stacks run; guarded, every task survives a tool loop and
    broken JSON, where the framework alone loses the loop runs."""
    results = recovery_results("openai_agents")
    assert [results[(f, "openai_agents+agentguard")].successes for f in FAULTS] == [3, 3]
    assert results[("tool_loop", "openai_agents")].successes < 3
