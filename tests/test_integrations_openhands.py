"""The OpenHands adapter, through a real ``Conversation`` with the SDK's own scripted ``TestLLM``;
and the OpenHands app's route, a plain SDK ``LLM`` talking to a real litellm proxy that guards.

Runs only where the SDK is installed (``nox -s openhands``, Python >= 3.12); offline. litellm's
proxy cannot be installed next to the SDK, so the proxy test runs the ``litellm`` executable
named by ``TESTS_LITELLM_PROXY_BIN`` (the session builds it a virtualenv of its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openhands.sdk", reason="the OpenHands SDK (Python >= 3.12) is not installed")

from openhands.sdk import LLM, Agent, Conversation, Message, TextContent, Tool
from openhands.sdk.conversation.exceptions import ConversationRunError
from openhands.sdk.event import AgentErrorEvent, ObservationEvent
from openhands.sdk.llm import MessageToolCall
from openhands.sdk.testing import TestLLM
from openhands.sdk.tool import (
    Action,
    Observation,
    ToolAnnotations,
    ToolDefinition,
    ToolExecutor,
    register_tool,
)
from pydantic import Field, PrivateAttr, SecretStr

from _litellm_kit import Upstream, guard_config, litellm_proxy
from _otel import ReceivedSpan, otlp_collector
from _processes import process_env
from agentguard import GuardConfig, LoopDetected, report_of
from agentguard.integrations.openhands import GuardedLLM, GuardMixin, report
from agentguard.testing import Reply, ScriptedModel

# litellm's types trip a pydantic warning when the SDK first validates them (not ours to fix).
pytestmark = pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier")

CITIES: list[str] = []


class WeatherAction(Action):
    city: str = Field(description="The city.")


class WeatherObservation(Observation):
    pass


class WeatherExecutor(ToolExecutor[WeatherAction, WeatherObservation]):
    def __call__(self, action: WeatherAction, conversation: Any = None) -> WeatherObservation:
        CITIES.append(action.city)
        return WeatherObservation.from_text(text=f"sunny in {action.city}")


class WeatherTool(ToolDefinition[WeatherAction, WeatherObservation]):
    @classmethod
    def create(cls, conv_state: Any = None, **params: Any) -> Sequence[WeatherTool]:
        return [
            cls(
                description="The weather of a city.",
                action_type=WeatherAction,
                observation_type=WeatherObservation,
                executor=WeatherExecutor(),
                annotations=ToolAnnotations(readOnlyHint=True),
            )
        ]


register_tool("WeatherTool", WeatherTool)

COMMANDS: list[str] = []


class TerminalAction(Action):
    command: str = Field(description="The command.")


class TerminalExecutor(ToolExecutor[TerminalAction, WeatherObservation]):
    def __call__(self, action: TerminalAction, conversation: Any = None) -> WeatherObservation:
        COMMANDS.append(action.command)
        return WeatherObservation.from_text(text="ran")


class TerminalTool(ToolDefinition[TerminalAction, WeatherObservation]):
    """A stand-in for openhands-tools' ``terminal`` (same name; annotated like it, or not)."""

    @classmethod
    def create(
        cls, conv_state: Any = None, annotated: bool = True, **params: Any
    ) -> Sequence[TerminalTool]:
        hints = ToolAnnotations(readOnlyHint=False, destructiveHint=True) if annotated else None
        return [
            cls(
                description="Run a shell command.",
                action_type=TerminalAction,
                observation_type=WeatherObservation,
                executor=TerminalExecutor(),
                annotations=hints,
            )
        ]


register_tool("TerminalTool", TerminalTool)


class RecordingLLM(TestLLM):
    """The SDK's TestLLM, keeping the messages each call was given."""

    __test__ = False
    _seen: list[list[Message]] = PrivateAttr(default_factory=list)

    def completion(self, messages: list[Message], tools: Any = None, **kwargs: Any) -> Any:
        self._seen.append(list(messages))
        return super().completion(messages, tools, **kwargs)

    async def acompletion(self, messages: list[Message], tools: Any = None, **kwargs: Any) -> Any:
        # TestLLM's own acompletion re-enters self.completion on a worker thread (outside the
        # guarded call's context), which would guard the call twice; a real LLM does not.
        return RecordingLLM.completion(self, messages, tools, **kwargs)


class ScriptedLLM(GuardMixin, RecordingLLM):
    """The guarded scripted LLM."""

    __test__ = False


def call(name: str, arguments: str, id: str = "c1") -> Message:
    """An assistant message with one tool call."""
    tool_call = MessageToolCall(id=id, name=name, arguments=arguments, origin="completion")
    return Message(role="assistant", content=[TextContent(text="")], tool_calls=[tool_call])


FINISH = call("finish", '{"message": "It is sunny in Paris."}', "done")


def llm(script: list[Message], config: dict[str, Any] | None = None, **kw: Any) -> ScriptedLLM:
    return ScriptedLLM(
        model="test-model",
        usage_id="test",
        scripted_responses=script,
        guard_config=GuardConfig.from_dict(config or {}, env={}),
        **kw,
    )


@pytest.fixture(autouse=True)
def _reset() -> None:
    CITIES.clear()
    COMMANDS.clear()


def start(model: Any, tmp_path: Path) -> Any:
    conversation = Conversation(
        agent=Agent(llm=model, tools=[Tool(name="WeatherTool")]),
        workspace=str(tmp_path),
        visualizer=None,
    )
    conversation.send_message("What is the weather in Paris?")
    return conversation


def run(model: Any, tmp_path: Path) -> Any:
    conversation = start(model, tmp_path)
    conversation.run()
    return conversation


def finished_cleanly(conversation: Any) -> bool:
    """The run finished, the weather tool ran once for Paris, and the agent saw no tool error."""
    events = conversation.state.events
    return (
        conversation.state.execution_status.value == "finished"
        and CITIES == ["Paris"]
        and not any(isinstance(e, AgentErrorEvent) for e in events)
    )


def test_malformed_arguments_are_repaired_and_the_tool_runs(tmp_path: Path) -> None:
    """Cut-off JSON arguments are repaired for free; the tool runs and the run finishes."""
    model = llm([call("weather", '{"city": "Paris"'), FINISH])
    conversation = run(model, tmp_path)
    assert finished_cleanly(conversation)
    first = report(conversation).guard_reports[0]
    assert first.repairs
    assert first.corrections == 0


def test_hallucinated_tool_name_is_corrected(tmp_path: Path) -> None:
    """A near-miss name of a read-only tool is corrected locally; the real tool runs."""
    model = llm([call("weathr", '{"city": "Paris"}'), FINISH])
    conversation = run(model, tmp_path)
    assert finished_cleanly(conversation)
    assert any("tool_name" in r for r in report(conversation).guard_reports[0].repairs)


def test_unknown_side_effecting_tool_gets_a_corrective_reask(tmp_path: Path) -> None:
    """A hallucinated name is never guessed for a side-effecting tool: the model is re-asked
    with the error, and its corrected call is what the agent runs."""
    config = {"tool_validation": {"side_effecting": ["weather"]}}
    script = [
        call("execute_code", '{"code": "weather(\'Paris\')"}', "bad"),
        call("weather", '{"city": "Paris"}'),
        FINISH,
    ]
    model = llm(script, config)
    conversation = run(model, tmp_path)
    assert finished_cleanly(conversation)
    assert report(conversation).guard_reports[0].corrections == 1
    reask = model._seen[1]  # the corrective re-ask, as SDK messages
    assert reask[-2].role == "assistant"
    assert reask[-2].tool_calls is not None
    assert reask[-2].tool_calls[0].name == "execute_code"
    assert reask[-1].role == "tool"
    assert reask[-1].tool_call_id == "bad"
    feedback = reask[-1].content[0]
    assert isinstance(feedback, TextContent)
    assert "weather" in feedback.text


@pytest.mark.parametrize("annotated", [True, False])
@pytest.mark.parametrize("invented", ["run_shell", "execute_bash", "bash"])
def test_an_invented_shell_tool_never_runs_the_terminal(
    invented: str, annotated: bool, tmp_path: Path
) -> None:
    """A made-up shell tool is never corrected to ``terminal`` (by its annotations, and by its
    name alone): the model is re-asked, and the terminal runs only what it then asks for."""
    script = [
        call(invented, '{"command": "rm -rf build"}', "bad"),
        call("weather", '{"city": "Paris"}'),
        FINISH,
    ]
    model = llm(script)
    tools = [Tool(name="WeatherTool"), Tool(name="TerminalTool", params={"annotated": annotated})]
    conversation = Conversation(
        agent=Agent(llm=model, tools=tools), workspace=str(tmp_path), visualizer=None
    )
    conversation.send_message("What is the weather in Paris?")
    conversation.run()
    assert finished_cleanly(conversation)
    assert COMMANDS == []
    first = report(conversation).guard_reports[0]
    assert first.corrections == 1
    assert not first.repairs
    feedback = model._seen[1][-1].content[0]
    assert isinstance(feedback, TextContent)
    assert "terminal" in feedback.text


def test_identical_call_loop_is_flagged_by_both_detectors(tmp_path: Path) -> None:
    """On the defaults the guard hints the model at the third identical call and result, and
    the SDK's stuck detector (left on) stops the run at the fourth: both are reported."""
    model = llm([call("weather", '{"city": "Paris"}', f"c{i}") for i in range(8)] + [FINISH])
    conversation = run(model, tmp_path)
    both = report(conversation)
    assert both.status == "stuck"
    assert both.stuck
    assert both.guard_stop is None
    assert any("identical arguments 3 times" in w for w in both.warnings), both.warnings
    hinted = model._seen[-1][-1]  # the hint: a user turn after the tool results
    assert hinted.role == "user"
    assert "identical arguments" in hinted.content[0].text
    assert model._seen[-1][-2].role == "tool"
    assert len(CITIES) == 4


LOOP_FAST = {
    "loop_detection": {
        "no_progress_warn_at": 2,
        "no_progress_critical_at": 2,
        "no_progress_break_at": 3,
    }
}


def test_guard_stops_a_loop_before_the_stuck_detector(tmp_path: Path) -> None:
    """With a tighter ladder and no stronger tier, the guard refuses the next call: the run
    stops with LoopDetected as the reason, not as a stuck conversation."""
    model = llm([call("weather", '{"city": "Paris"}', f"c{i}") for i in range(8)], LOOP_FAST)
    conversation = start(model, tmp_path)
    with pytest.raises(ConversationRunError) as info:
        conversation.run()
    assert isinstance(info.value.__cause__, LoopDetected)
    both = report(conversation)
    assert isinstance(both.guard_stop, LoopDetected)
    assert both.status == "error"
    assert not both.stuck
    assert len(CITIES) == 2  # the third identical attempt is refused


#: A recovery ladder that goes from the hint straight to the stronger tier.
ESCALATE = {"loop_detection": {**LOOP_FAST["loop_detection"], "recovery": {"rungs": ["hint", "escalate", "stop"]}}}  # fmt: skip


def test_loop_escalates_to_a_stronger_tier_that_finishes(tmp_path: Path) -> None:
    """With tiers configured (and a ladder going from the hint to the next tier), a loop moves
    the call to the stronger tier (an LLM copy on the tier's model), whose answer finishes the
    run; the report says so."""
    config = {
        **ESCALATE,
        "tiers": {"fast": {"model": "test-model"}, "premium": {"model": "test-model-premium"}},
        "escalation": {"chain": ["fast", "premium"]},
    }
    script = [call("weather", '{"city": "Paris"}', f"c{i}") for i in range(3)] + [FINISH]
    model = llm(script, config)
    conversation = run(model, tmp_path)
    assert conversation.state.execution_status.value == "finished"
    last = report(conversation).guard_reports[-1]
    assert last.escalated_from == "fast"
    assert last.tier == "premium"
    assert "loop_detected" in last.reasons
    observations = [e for e in conversation.state.events if isinstance(e, ObservationEvent)]
    assert observations[-1].tool_name == "finish"


def test_sdk_retries_are_off() -> None:
    """The SDK's own retry loop is disabled, so retries never nest with the guard's."""
    assert llm([], num_retries=5).num_retries == 0


def test_guarded_llm_is_the_sdk_llm() -> None:
    """GuardedLLM is an OpenHands LLM and a GuardMixin, and serialises like one."""
    from openhands.sdk.llm import LLM

    model = GuardedLLM(model="openai/gpt-4o-mini", api_key="sk-not-a-real-key", usage_id="g")
    assert isinstance(model, LLM)
    assert isinstance(model, GuardMixin)
    assert "guard" not in " ".join(model.model_dump())
    assert model.guard_reports == ()


def test_direct_calls_carry_the_report() -> None:
    """completion() and responses() called directly hand back the SDK's LLMResponse, with the
    guard's report on it; a call the SDK makes inside a guarded one is not guarded twice."""
    model = llm([Message(role="assistant", content=[TextContent(text="hi")])] * 2)
    ask = [Message(role="user", content=[TextContent(text="hello")])]
    for method in (model.completion, model.responses):
        response = method(ask)
        assert type(response).__name__ == "LLMResponse"
        assert response.message.content[0].text == "hi"
        assert report_of(response) is not None
    assert len(model.guard_reports) == 2


@pytest.mark.anyio
async def test_async_conversation_is_guarded(tmp_path: Path) -> None:
    """arun() goes through acompletion and the async guard the same way."""
    model = llm([call("weather", '{"city": "Paris"'), FINISH])
    conversation = start(model, tmp_path)
    await conversation.arun()
    assert finished_cleanly(conversation)
    assert report(conversation).guard_reports[0].repairs


WEATHER_SCRIPT = [
    Reply.call("weather", {"city": "Paris"}, id="c1"),
    Reply.call("finish", {"message": "It is sunny in Paris."}, id="c2"),
]


def served(cls: type, url: str, **kw: Any) -> Any:
    """An SDK LLM (plain or guarded) on a scripted server, through litellm's openai provider."""
    return cls(
        model="openai/m",
        base_url=url,
        api_key=SecretStr("sk-not-a-real-key"),
        usage_id="agent",
        input_cost_per_token=0.0,
        output_cost_per_token=0.0,
        **kw,
    )


def tokens(conversation: Any) -> tuple[int, int]:
    """The conversation's token totals, as ``conversation_stats`` reports them."""
    usage = conversation.conversation_stats.get_combined_metrics().accumulated_token_usage
    return (usage.prompt_tokens, usage.completion_tokens) if usage is not None else (0, 0)


def test_conversation_stats_count_a_guarded_llm_like_a_plain_one(tmp_path: Path) -> None:
    """The SDK registers only exact ``LLM`` objects with a conversation's stats; the guarded LLM
    makes its calls through one it keeps for that, so the totals match a plain LLM's."""
    totals = {}
    for cls in (LLM, GuardedLLM):
        CITIES.clear()
        with ScriptedModel(WEATHER_SCRIPT).serve() as url:
            conversation = run(served(cls, url), tmp_path / cls.__name__)
        assert finished_cleanly(conversation)
        assert set(conversation.conversation_stats.usage_to_metrics) == {"agent"}
        totals[cls] = tokens(conversation)
    assert totals[GuardedLLM] == totals[LLM]
    assert totals[LLM][0] > 0
    assert conversation.agent.llm.metrics.accumulated_token_usage.prompt_tokens > 0


def test_conversation_stats_count_each_tier(tmp_path: Path) -> None:
    """A stronger tier's calls are counted under ``<usage_id>:<tier>``; with the caller's own
    they add up to what the guard's reports accounted."""
    config = {
        **ESCALATE,
        "tiers": {"fast": {"model": "openai/m"}, "premium": {"model": "openai/m-premium"}},
        "escalation": {"chain": ["fast", "premium"]},
    }
    looping = [Reply.call("weather", {"city": "Paris"}, id=f"c{i}") for i in range(3)]
    script = {"m": looping, "m-premium": [WEATHER_SCRIPT[1]]}
    guard_config = GuardConfig.from_dict(config, env={})
    with ScriptedModel(script).serve() as url:
        conversation = run(served(GuardedLLM, url, guard_config=guard_config), tmp_path)
    assert conversation.state.execution_status.value == "finished"
    assert report(conversation).guard_reports[-1].tier == "premium"
    stats = conversation.conversation_stats.usage_to_metrics
    assert set(stats) == {"agent", "agent:premium"}
    assert all(m.accumulated_token_usage.prompt_tokens > 0 for m in stats.values())
    accounted = sum(r.usage.total_tokens for r in report(conversation).guard_reports)
    assert sum(tokens(conversation)) == accounted


def test_persisted_conversation_resumes_with_its_stats(tmp_path: Path) -> None:
    """The SDK persists the agent (the guard's state and ``tier_llms`` stay out) and restores
    the stats into the resumed conversation's LLM, whose calls keep adding to them."""
    persisted = tmp_path / "state"
    script = [*WEATHER_SCRIPT, Reply.call("finish", {"message": "Still sunny."}, id="c3")]
    with ScriptedModel(script).serve() as url:
        first = Conversation(
            agent=Agent(llm=served(GuardedLLM, url), tools=[Tool(name="WeatherTool")]),
            workspace=str(tmp_path),
            persistence_dir=str(persisted),
            visualizer=None,
        )
        first.send_message("What is the weather in Paris?")
        first.run()
        before = tokens(first)
        saved = (persisted / first.id.hex / "base_state.json").read_text()
        assert "tier_llms" not in saved
        assert "guard" not in saved
        resumed = Conversation(
            agent=Agent(llm=served(GuardedLLM, url), tools=[Tool(name="WeatherTool")]),
            workspace=str(tmp_path),
            persistence_dir=str(persisted),
            conversation_id=first.id,
            visualizer=None,
        )
        assert tokens(resumed) == before
        resumed.send_message("And now?")
        resumed.run()
    assert resumed.state.execution_status.value == "finished"
    assert report(resumed).guard_reports
    after = tokens(resumed)
    assert after[0] > before[0]
    assert after[1] > before[1]


def test_copies_have_llms_of_their_own() -> None:
    """``model_copy`` (how the SDK derives a condenser's or a side question's LLM) gives the
    copy its own ``tier_llms``, under its own usage id; equal LLMs compare equal."""
    model = GuardedLLM(model="openai/gpt-4o-mini", api_key="sk-not-a-real-key", usage_id="g")
    copy = model.model_copy(update={"usage_id": "condenser"})
    assert type(copy.tier_llms[""]) is LLM
    assert copy.tier_llms[""].usage_id == "condenser"
    assert model.tier_llms[""].usage_id == "g"
    assert model.model_copy() == model
    assert model.model_copy() != copy


PROXY_BIN = "TESTS_LITELLM_PROXY_BIN"


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Upstream, str, str]]:
    """A real litellm proxy process guarding a scripted upstream: upstream, base URL, key."""
    litellm_cli = os.environ.get(PROXY_BIN)
    if not litellm_cli:
        pytest.skip(f"{PROXY_BIN} is unset: no litellm proxy to run (nox -s openhands sets it)")
    up = Upstream()
    with (
        up.model.serve() as url,
        litellm_proxy(litellm_cli, tmp_path_factory.mktemp("proxy"), guard_config(url)) as proxy,
    ):
        yield up, *proxy


def test_app_route_through_the_litellm_proxy(
    proxied: tuple[Upstream, str, str], tmp_path: Path
) -> None:
    """The app's documented route: a plain SDK LLM on ``litellm_proxy/agent``, guarded in the
    proxy. The fast tier is dead and the strong tier first leaves out a required argument: the
    guard escalates and re-asks inside the proxy, and the run finishes cleanly."""
    up, base_url, key = proxied
    paris = {"city": "Paris"}
    done = {"message": "It is sunny in Paris."}
    steps = [Reply.call("weather", {}), Reply.call("weather", paris), Reply.call("finish", done)]
    start = up.script(strong_model=steps)
    model = LLM(
        model="litellm_proxy/agent",
        base_url=base_url,
        api_key=key,
        usage_id="agent",
        num_retries=0,
        # the SDK prices calls by model name, and warns for a proxy alias it cannot price
        input_cost_per_token=0.0,
        output_cost_per_token=0.0,
    )
    conversation = run(model, tmp_path)
    assert finished_cleanly(conversation)
    requests = up.model.requests[start:]
    assert requests[0].model == "fast-model"  # dead: every answer came from the next tier
    answered = [r for r in requests if r.model == "strong-model"]
    assert len(answered) == len(steps)
    correction = answered[1].messages[-1]  # the re-ask with the validation error
    assert correction["role"] == "tool"
    assert "city" in correction["content"]


def test_documented_example_compiles() -> None:
    """The copy-paste example of docs/integrations/openhands.md is valid Python."""
    page = Path(__file__).resolve().parent.parent / "docs" / "integrations" / "openhands.md"
    example = page.read_text().split("```python\n# example: openhands\n")[1].split("```")[0]
    compile(example, str(page), "exec")


def test_a_conversation_is_one_trace_with_the_guards_spans(tmp_path: Path) -> None:
    """Run inside the application's span, each guarded LLM call of a conversation is an
    ``agentguard chat`` span with its ``chat`` attempt, the repair a guardrail event, all in the
    application's trace."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentguard import telemetry

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=provider)
    try:
        with provider.get_tracer("app").start_as_current_span("agent task") as root:
            conversation = run(llm([call("weather", '{"city": "Paris"'), FINISH]), tmp_path)
    finally:
        telemetry.configure()
    assert finished_cleanly(conversation)
    spans = exporter.get_finished_spans()
    trace_id = root.get_span_context().trace_id
    calls = [s for s in spans if s.name.startswith("agentguard chat")]
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(calls) == len(chats) == 2  # the repaired call, then finish
    assert {s.context.trace_id for s in calls + chats} == {trace_id}
    events = [dict(e.attributes or {}) for e in calls[0].events]
    assert any(e["gen_ai.guardrail.result.value"] == "repaired" for e in events)


# -- The SDK's own spans: Laminar ---------------------------------------------------------------
# The SDK turns its Laminar observability on at import when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
# (or LMNR_PROJECT_API_KEY ...) is set (openhands/sdk/observability/laminar.py): spans of the
# conversation, each agent step (current while the step calls the LLM), each SDK LLM call and
# tool, from Laminar's own tracer provider, which becomes the global one when the application set
# none. Laminar is set up once per process, so each case runs tests/_openhands_laminar.py in an
# interpreter of its own, exporting to a loopback collector.


def laminar_run(mode: str, tmp_path: Path) -> tuple[dict[str, Any], list[ReceivedSpan]]:
    """Run the conversation of tests/_openhands_laminar.py in ``mode``; what it printed, and
    every span the collector received (Laminar's, agentguard's, the application's)."""
    pytest.importorskip("lmnr", reason="the SDK's observability needs lmnr")
    script = Path(__file__).with_name("_openhands_laminar.py")
    with otlp_collector() as (endpoint, received):
        env = process_env(
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "OPENHANDS_SUPPRESS_BANNER": "1",
            }
        )
        for name in ("LMNR_PROJECT_API_KEY", "LMNR_BASE_URL", "OTEL_SDK_DISABLED"):
            env.pop(name, None)  # never Laminar's service; the SDK on
        done = subprocess.run(
            [sys.executable, str(script), mode],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    printed: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert printed["status"] == "finished"
    return printed, list(received)


def guard_under_steps(spans: list[ReceivedSpan]) -> tuple[list[ReceivedSpan], list[ReceivedSpan]]:
    """Check the nesting both cases share, and return Laminar's spans and agentguard's: one
    trace; each guarded call a child of the agent step that made it, its attempt under it, the
    repair on the first; each of Laminar's LLM spans a child of the step, not of agentguard's
    attempt (Laminar picks parents from a context of its own, where only its spans are)."""
    laminar = [s for s in spans if s.scope == "lmnr.tracer"]
    ours = [s for s in spans if s.scope == "agentguard"]
    assert len({s.trace_id for s in spans}) == 1
    steps = {s.span_id for s in laminar if s.name == "agent.step"}
    calls = [s for s in ours if s.name == "agentguard chat openai/m"]
    attempts = [s for s in ours if s.name == "chat openai/m"]
    assert len(steps) == len(calls) == len(attempts) == 2  # the weather call, then finish
    assert {s.parent_id for s in calls} == steps
    assert {s.parent_id for s in attempts} == {s.span_id for s in calls}
    values = {e.get("gen_ai.guardrail.result.value") for s in calls for e in s.events}
    assert "repaired" in values
    model_calls = [s for s in laminar if s.name == "llm.openai/m"]
    assert len(model_calls) == 2
    assert {s.parent_id for s in model_calls} == steps
    assert {"conversation.run", "WeatherAction"} <= {s.name for s in laminar}  # the tool ran
    return laminar, ours


def test_laminar_on_the_guards_spans_nest_under_the_sdks_agent_steps(tmp_path: Path) -> None:
    """With the SDK's Laminar observability on and no tracer provider of the application's,
    Laminar's provider is the global one, so agentguard records through it, to the same
    endpoint: the conversation is one trace, each guarded call under the agent step that made
    it."""
    _, spans = laminar_run("laminar", tmp_path)
    laminar, ours = guard_under_steps(spans)
    (conversation,) = [s for s in laminar if s.name == "conversation"]
    assert conversation.parent_id == 0  # the trace's root
    assert {s.service for s in ours} == {s.service for s in laminar}  # one provider


def test_laminar_and_the_apps_provider_one_trace_under_the_apps_span(tmp_path: Path) -> None:
    """With the application's own global provider set first, Laminar keeps a provider of its
    own and agentguard records with the application's: given the application's span as the
    conversation's parent, Laminar's spans and agentguard's (each exported by its own provider)
    are one trace under it, agentguard's calls under the SDK's agent steps."""
    printed, spans = laminar_run("app", tmp_path)
    laminar, ours = guard_under_steps(spans)
    assert {s.trace_id for s in spans} == {printed["trace_id"]}
    (conversation,) = [s for s in laminar if s.name == "conversation"]
    assert conversation.parent_id == printed["span_id"]
    assert {s.service for s in ours} == {"app"}
    assert "app" not in {s.service for s in laminar}
