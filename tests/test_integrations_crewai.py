"""The CrewAI adapter, through a real ``Crew.kickoff()`` driven by scripted crewai LLMs.

Runs in the ``crewai`` nox session (the main ``tests`` session skips it: crewai is not installed
there). Offline: the LLMs are scripted ``BaseLLM`` subclasses, or crewai's own OpenAI LLM talking
to a scripted model on loopback; CrewAI's telemetry and tracing are off, except in the tests of
its own spans, which send them to memory or to a collector on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

for _var, _value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
}.items():
    os.environ.setdefault(_var, _value)

crewai = pytest.importorskip("crewai", reason="the crewai nox session installs crewai")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

import agentguard as ag  # noqa: E402
from _otel import otlp_collector, recorded_trace  # noqa: E402
from agentguard.events import (  # noqa: E402
    Escalated,
    ToolCallRefused,
    ToolCallRejected,
    ToolCallStarted,
)
from agentguard.exceptions import ModelError  # noqa: E402
from agentguard.integrations.crewai import (  # noqa: E402
    GuardedLLM,
    ToolHooks,
    instrument,
    without_retries,
)
from agentguard.testing import FakeClock, Reply, ScriptedModel  # noqa: E402

# crewai's own internals read fields crewai itself deprecates (warned from within crewai)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")


def call(name: str, arguments: dict[str, Any] | str, id: str = "c") -> list[dict[str, Any]]:
    """A native tool-call answer, the shape crewai's OpenAI LLM returns."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return [{"id": id, "type": "function", "function": {"name": name, "arguments": text}}]


class ScriptedLLM(BaseLLM):
    """A crewai LLM answering from a script; exceptions in the script are raised."""

    _script: list[Any] = PrivateAttr(default_factory=list)
    _calls: list[list[dict[str, Any]]] = PrivateAttr(default_factory=list)

    def __init__(self, model: str, script: list[Any]) -> None:
        super().__init__(model=model)
        self._script = list(script)

    def call(  # noqa: PLR0917 - crewai's BaseLLM.call signature
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        self._calls.append([dict(m) for m in messages])
        answer = self._script.pop(0) if self._script else "(script exhausted)"
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def supports_function_calling(self) -> bool:
        return True

    @property
    def calls(self) -> list[list[dict[str, Any]]]:
        return self._calls


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("remember the milk")
    (tmp_path / "todo.txt").write_text("buy bread")
    return tmp_path


def file_tools(root: Path) -> list[Any]:
    @tool("list_files")
    def list_files() -> str:
        """List the files in the work directory."""
        return ", ".join(sorted(p.name for p in root.iterdir()))

    @tool("read_file")
    def read_file(path: str) -> str:
        """Read one file of the work directory."""
        return (root / path).read_text()

    return [list_files, read_file]


def crew_of(llm: BaseLLM, tools: list[Any]) -> Crew:
    agent = Agent(role="clerk", goal="answer from files", backstory="careful", llm=llm, tools=tools)
    task = Task(description="What do the notes say?", expected_output="the notes", agent=agent)
    return Crew(agents=[agent], tasks=[task])


CONFIG = ag.GuardConfig.from_dict(
    {
        "loop_detection": {
            "no_progress_warn_at": 2,
            "no_progress_critical_at": 3,
            "no_progress_break_at": 4,
        },
        "escalation": {"escalate_on": ["tool_validation_failure", "loop_detected"]},
    },
    env={},
)


def test_crew_finishes_through_malformed_calls_and_a_loop(workdir: Path) -> None:
    """A looping, malformed-call-emitting LLM still finishes the crew: repaired, corrected, escalated."""
    weak = ScriptedLLM(
        "weak",
        [
            call("read_fle", {"path": "notes.txt"}, "c1"),  # hallucinated name: repaired
            call("read_file", '{"path": "notes.tx', "c2"),  # cut off in a string: re-asked
            call("read_file", {"path": "notes.txt"}, "c3"),
            *[call("list_files", {}, f"l{i}") for i in range(10)],  # the loop
        ],
    )
    strong = ScriptedLLM("strong", ["The notes say: remember the milk."])
    clock = FakeClock()
    crew = crew_of(weak, file_tools(workdir))
    with ag.testing.capture_events() as events:
        tools = ag.ToolGuard(CONFIG, clock=clock, sleep=clock.sleep, rng=random.Random(0))
        with instrument(
            crew, CONFIG, tiers={"strong": strong}, tools=tools, clock=clock, sleep=clock.sleep
        ) as (guarded,):
            result = crew.kickoff()
    assert result.raw == "The notes say: remember the milk."
    # the hallucinated name and the cut-off arguments never reached a tool: each was re-asked
    rejected = events.of_type(ToolCallRejected)
    assert [(e.error, e.tool_call_id) for e in rejected] == [
        ("unknown_tool", "c1"),
        ("truncated", "c2"),
    ]
    assert "read_fle" in json.dumps(weak.calls[1][-2:])  # the correction named the bad call
    assert "read_fle" not in json.dumps(strong.calls)  # crewai's history holds the valid call
    # the fourth identical list_files (its result unchanged three times) was a loop at BREAK:
    # it never ran; the weak LLM was asked once more with the recovery turn and tools off (the
    # recovery ladder's force rung), called again anyway, and the stronger LLM answered instead
    assert [e.reason for e in events.of_type(Escalated)] == ["loop_detected"]
    assert len(weak.calls) == 3 + 5
    assert "give your final answer now" in json.dumps(weak.calls[-1][-1])
    assert guarded.last_report is not None
    assert guarded.last_report.recovery[-2:] == ("force", "escalate")
    assert len(strong.calls) == 1
    assert guarded.last_report is not None
    assert (guarded.last_report.tier, guarded.last_report.escalated_from) == ("strong", "primary")
    # every tool call that ran, ran once, through the ToolGuard
    started = [e.tool for e in events.of_type(ToolCallStarted)]
    assert started == ["read_file"] + ["list_files"] * 3


def test_instrument_restores_the_crew_and_the_hooks(workdir: Path) -> None:
    """After the block the agents have their own LLMs back and no agentguard hook remains."""
    from crewai.hooks import get_after_tool_call_hooks, get_before_tool_call_hooks

    llm = ScriptedLLM("weak", ["done"])
    crew = crew_of(llm, file_tools(workdir))
    before = (len(get_before_tool_call_hooks()), len(get_after_tool_call_hooks()))
    with instrument(crew) as guarded:
        assert crew.agents[0].llm is guarded[0]
        assert isinstance(crew.agents[0].llm, GuardedLLM)
        assert len(get_before_tool_call_hooks()) == before[0] + 1
    assert crew.agents[0].llm is llm
    assert (len(get_before_tool_call_hooks()), len(get_after_tool_call_hooks())) == before


def test_rate_limits_are_retried_once_not_nested() -> None:
    """A 429 is retried by the guard alone: crewai's own retry is off around both LLMs."""
    limited = ModelError("rate limited", status_code=429)
    llm = ScriptedLLM("weak", [limited, limited, "ok"])
    clock = FakeClock()
    guarded = GuardedLLM(llm, clock=clock, sleep=clock.sleep, rng=random.Random(0))
    assert guarded.call("hi") == "ok"
    assert len(llm.calls) == 3  # one call + two retries, each seen once
    assert guarded.last_report is not None
    assert guarded.last_report.retries == 2
    assert len(clock.sleeps) == 2  # the guard's backoff only, never crewai's real sleep


def test_a_persistent_rate_limit_surfaces_after_the_guards_retries_only() -> None:
    """When the guard gives up, crewai does not start the whole guarded call again."""
    llm = ScriptedLLM("weak", [ModelError("rate limited", status_code=429)] * 20)
    clock = FakeClock()
    config = ag.GuardConfig.from_dict({"escalation": {"max_retries_before_escalate": 2}}, env={})
    guarded = GuardedLLM(llm, config, clock=clock, sleep=clock.sleep)
    with pytest.raises(ModelError):
        guarded.call("hi")
    assert len(llm.calls) == 3


def test_acall_runs_the_guarded_call() -> None:
    """The async entry point gives the same guarded answer."""
    import anyio

    llm = ScriptedLLM("weak", [ModelError("rate limited", status_code=429), "ok"])
    clock = FakeClock()
    guarded = GuardedLLM(llm, clock=clock, sleep=clock.sleep, rng=random.Random(0))
    assert anyio.run(guarded.acall, "hi") == "ok"
    assert len(llm.calls) == 2


def test_without_retries_turns_off_the_sdk_retries_of_a_real_llm() -> None:
    """crewai's own OpenAI LLM is copied with max_retries=0; the user's keeps its setting."""
    llm = crewai.LLM(model="openai/gpt-4o-mini", api_key="sk-test-not-a-real-key")
    quiet = without_retries(llm)
    assert quiet.max_retries == 0
    assert llm.max_retries == 2
    assert quiet.model == llm.model
    assert without_retries(quiet) is quiet


def test_tool_hooks_alone_guard_a_crews_tool_calls(workdir: Path) -> None:
    """ToolHooks without GuardedLLM: a failing tool is retried and its breaker opens."""
    failures = iter([ConnectionError("disk gone")] * 50)

    @tool("flaky")
    def flaky() -> str:
        """A tool whose storage is unreachable."""
        raise next(failures)

    llm = ScriptedLLM("weak", [call("flaky", {}, f"f{i}") for i in range(6)] + ["gave up"])
    crew = crew_of(llm, [flaky])
    clock = FakeClock()
    config = ag.GuardConfig.from_dict(
        {"tools": {"breaker": {"min_calls": 3}, "retry_budget_per_turn": 100}}, env={}
    )
    hooks = ToolHooks(ag.ToolGuard(config, clock=clock, sleep=clock.sleep), crew=crew)
    with ag.testing.capture_events() as events, hooks.installed():
        result = crew.kickoff()
    assert result.raw == "gave up"
    assert "breaker_open" in [e.reason for e in events.of_type(ToolCallRefused)]
    tool_messages = [m for m in llm.calls[-1] if m.get("role") == "tool"]
    assert json.loads(tool_messages[-1]["content"].split("\n\n")[0])["error"] in {
        "breaker_open",
        "loop_detected",
    }


# -- What the model reads: CrewAI's own rendering --------------------------------------------
# Differential: the same crew run by CrewAI alone and under instrument(), its crewai OpenAI LLM
# served by a scripted model on loopback. On a healthy run every upstream request (messages and
# parameters) and the final answer must be the same.


def run_served(
    script: list[Reply], tools: list[Any], *, guarded: bool
) -> tuple[str, list[tuple[Any, ...]]]:
    """The final answer of a one-agent crew and every request its model received."""
    model = ScriptedModel(script)
    with model.serve() as url:
        llm = crewai.LLM(model="openai/gpt-4o-mini", base_url=url, api_key="sk-test")
        agent = Agent(role="clerk", goal="answer", backstory="careful", llm=llm, tools=tools)
        task = Task(description="Stats of Paris?", expected_output="one line", agent=agent)
        crew = Crew(agents=[agent], tasks=[task])
        with instrument(crew) if guarded else contextlib.nullcontext():
            answer = crew.kickoff().raw
    return answer, [(r.model, r.messages, r.params) for r in model.requests]


@pytest.mark.parametrize("calling", ["native", "text"])
def test_a_tools_result_reaches_the_model_as_crewai_renders_it(
    calling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool's non-string result reaches the model as CrewAI alone renders it (the tool's
    formatter: ``str`` of a dict, not JSON), by native tool calls and by text-mode ones."""

    @tool("stats")
    def stats(city: str) -> dict[str, Any]:
        """Stats of a city."""
        return {"pop": 2, "ok": True, "x": None, "tags": ["a"]}

    if calling == "native":
        first = Reply.call("stats", {"city": "Paris"}, id="c1")
    else:  # crewai parses the call from the text
        from crewai.llms.providers.openai.completion import OpenAICompletion

        monkeypatch.setattr(OpenAICompletion, "supports_function_calling", lambda self: False)
        first = Reply.text('Thought: I need stats.\nAction: stats\nAction Input: {"city": "Paris"}')
    script = [first, Reply.text("Thought: I know it.\nFinal Answer: two people")]
    plain = run_served(script, [stats], guarded=False)
    guarded = run_served(script, [stats], guarded=True)
    read = "\n".join(str(m.get("content")) for m in plain[1][1][1])  # the second request's
    assert "{'pop': 2, 'ok': True, 'x': None, 'tags': ['a']}" in read
    assert guarded == plain


def test_the_executors_stop_words_cut_a_guarded_answer_as_they_cut_crewais() -> None:
    """CrewAI cuts the model's text at its executor's stop words ("\nObservation:"); a guarded
    LLM's answer is cut the same way, from the same requests."""
    answer = "Thought: I know it.\nFinal Answer: Sunny in Paris.\nObservation: made up"
    plain = run_served([Reply.text(answer)], [], guarded=False)
    assert plain[0] == "Sunny in Paris."
    assert run_served([Reply.text(answer)], [], guarded=True) == plain


def test_a_guarded_llm_is_called_with_the_executors_stop_words() -> None:
    """The LLM under a GuardedLLM sees the stop words CrewAI gives for the call (its
    ``stop_sequences``, which providers send upstream and cut at), as it does unguarded."""

    def stops_seen(guarded: bool) -> list[list[str]]:
        llm = StopRecordingLLM("weak", ["Thought: I know it.\nFinal Answer: done"])
        crew = crew_of(llm, [])
        with instrument(crew) if guarded else contextlib.nullcontext():
            crew.kickoff()
        return llm.stops

    plain = stops_seen(False)
    assert plain == [["\nObservation:"]]
    assert stops_seen(True) == plain


class StopRecordingLLM(ScriptedLLM):
    """A scripted LLM that records the stop words in effect for each call."""

    _stops: list[list[str]] = PrivateAttr(default_factory=list)

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        self._stops.append(list(self.stop_sequences))
        return super().call(messages, *args, **kwargs)

    @property
    def stops(self) -> list[list[str]]:
        return self._stops


def test_the_docs_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs page's example runs as written, scripted LLMs in place of the real ones."""
    page = Path(__file__).parent.parent / "docs" / "integrations" / "crewai.md"
    example = page.read_text().split("```python\n# example: crewai\n")[1].split("```")[0]
    scripts = {
        "openai/gpt-4o-mini": [call("read_file", {"path": "README.md"}, f"r{i}") for i in range(9)],
        "openai/gpt-4o": ["It promises fewer loops."],
    }
    monkeypatch.setattr(crewai, "LLM", lambda model: ScriptedLLM(model, scripts[model]))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("fewer loops")
    exec(compile(example, str(page), "exec"), {})
    out = capsys.readouterr().out
    assert "It promises fewer loops." in out  # the cheap LLM looped; the strong one answered
    assert "tier='strong'" in out


def test_the_adapter_names_the_extra_when_crewai_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing the adapter without crewai says which extra to install."""
    monkeypatch.setitem(sys.modules, "crewai", None)
    monkeypatch.delitem(sys.modules, "agentguard.integrations.crewai")
    with pytest.raises(ImportError, match=r'pip install "agentguard\[crewai\]"'):
        import agentguard.integrations.crewai  # noqa: F401


def test_a_crew_run_is_one_trace_with_the_guards_spans(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside the application's span, a crew's guarded LLM calls and tool calls are its
    children: ``agentguard chat`` with a ``chat`` attempt each, ``execute_tool`` per tool run,
    the correction and the loop escalation as guardrail events, all in the one trace."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentguard import telemetry

    monkeypatch.delenv("OTEL_SDK_DISABLED")  # set for crewai's own telemetry; not for ours
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=provider)
    weak = ScriptedLLM(
        "weak",
        [
            call("read_fle", {"path": "notes.txt"}, "c1"),  # hallucinated: re-asked
            call("read_file", {"path": "notes.txt"}, "c3"),
            *[call("list_files", {}, f"l{i}") for i in range(10)],  # the loop
        ],
    )
    strong = ScriptedLLM("strong", ["The notes say: remember the milk."])
    clock = FakeClock()
    crew = crew_of(weak, file_tools(workdir))
    try:
        tools = ag.ToolGuard(CONFIG, clock=clock, sleep=clock.sleep, rng=random.Random(0))
        guarded = instrument(
            crew, CONFIG, tiers={"strong": strong}, tools=tools, clock=clock, sleep=clock.sleep
        )
        with provider.get_tracer("app").start_as_current_span("crew kickoff") as root, guarded:
            assert crew.kickoff().raw == "The notes say: remember the milk."
    finally:
        telemetry.configure()
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {root.get_span_context().trace_id}
    names = [s.name for s in spans]
    assert "execute_tool read_file" in names  # the corrected call ran, through the ToolGuard
    assert "execute_tool list_files" in names
    tool_calls = [s for s in spans if s.name == "agentguard tool read_file"]
    assert tool_calls
    assert tool_calls[0].parent is not None  # under the crew's trace, not a root of its own
    calls = [s for s in spans if s.name.startswith("agentguard chat")]
    assert calls
    assert {s.parent.span_id if s.parent else None for s in calls} == {
        root.get_span_context().span_id
    }
    events = [dict(e.attributes or {}) for s in calls for e in s.events]
    values = {(e["gen_ai.guardrail.policy.id"], e["gen_ai.guardrail.result.value"]) for e in events}
    assert ("tool_validation", "correction") in values
    assert ("escalation", "escalated") in values
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert {dict(s.attributes or {})["gen_ai.provider.name"] for s in chats} == {
        ag.telemetry.provider_name(weak.provider)
    }


# -- CrewAI's own spans -----------------------------------------------------------------------
# CrewAI records spans of its own two ways, both through tracer providers of its own (never the
# application's): its anonymous telemetry (on unless OTEL_SDK_DISABLED, CREWAI_DISABLE_TELEMETRY
# or CREWAI_DISABLE_TRACKING; exported to telemetry.crewai.com), and its execution tracing (GenAI
# spans of the crew, its agents, model calls and tools, built from its event bus: exported to
# CrewAI AMP, or to the exporters a host hands to ``telemetry_session``). These runs use
# crewai's own OpenAI LLM, served by a scripted model on loopback, so the model calls are crewai's.

# One unknown tool name (the guard re-asks), the tool call, the answer: three model calls.
SERVED = [
    Reply.call("read_fle", {"path": "notes.txt"}),
    Reply.call("read_file", {"path": "notes.txt"}),
    Reply.text("The notes say: remember the milk."),
]


def kickoff_served(workdir: Path, tracer: Any, *within: Any) -> tuple[str, Any]:
    """Run a guarded crew whose crewai LLM talks to a scripted model on loopback, inside the
    application's span and the context managers ``within``; its answer and the span."""
    with ScriptedModel(SERVED).serve() as url:
        llm = crewai.LLM(model="openai/gpt-4o-mini", base_url=url, api_key="sk-test")
        crew = crew_of(llm, file_tools(workdir))
        clock = FakeClock()
        with (
            tracer.start_as_current_span("crew kickoff") as root,
            contextlib.ExitStack() as stack,
        ):
            for manager in within:
                stack.enter_context(manager)
            stack.enter_context(instrument(crew, CONFIG, clock=clock, sleep=clock.sleep))
            answer = crew.kickoff().raw
    return answer, root


def test_crewais_execution_trace_is_a_trace_of_its_own(workdir: Path) -> None:
    """With CrewAI's execution tracing on (a host's ``telemetry_session``, exporting to memory),
    CrewAI records the crew, its agent, each model call the guard makes (``call llm``, the
    re-asked one too) and the tool run, in a trace of its own rooted at ``execute crew``:
    CrewAI starts its spans on its event bus's threads with parents of its own and makes none of
    them current. agentguard's spans stay in the application's trace, under no span of CrewAI's."""
    from crewai.telemetry.tracing import telemetry_session
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    theirs = InMemorySpanExporter()
    with recorded_trace() as (exporter, tracer):
        session = telemetry_session("kickoff-1", "crewai", exporters=[theirs])
        answer, root = kickoff_served(workdir, tracer, session)
    assert answer == "The notes say: remember the milk."
    crew_spans = theirs.get_finished_spans()
    ours = [
        s for s in exporter.get_finished_spans() if s.instrumentation_scope.name == "agentguard"
    ]
    names = [s.name for s in crew_spans]
    assert {"execute crew", "execute task", "execute agent", "call tool"} <= set(names)
    attempts = [s for s in ours if s.name.startswith("chat ")]
    assert names.count("call llm") == len(attempts) == 3  # each of the guard's attempts
    (crew_root,) = [s for s in crew_spans if s.name == "execute crew"]
    assert crew_root.parent is None  # not under the application's span
    assert {s.context.trace_id for s in crew_spans} == {crew_root.context.trace_id}
    assert {s.context.trace_id for s in ours} == {root.get_span_context().trace_id}
    assert crew_root.context.trace_id != root.get_span_context().trace_id
    calls = [s for s in ours if s.name.startswith("agentguard chat")]
    assert {s.parent.span_id for s in calls if s.parent} == {root.get_span_context().span_id}


def test_crewais_anonymous_telemetry_goes_to_its_collector_only(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CrewAI's anonymous telemetry on (its collector's address pointed at a loopback
    collector), the guarded crew runs as before and the application's exporter gets agentguard's
    spans in its trace and none of CrewAI's. CrewAI's telemetry spans (crew and task created and
    run; none around a model call) go to its collector alone; they take the application's span
    as parent, so they carry its trace id there, but are never current: none is a parent of ours."""
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.event_listener import EventListener
    from crewai.telemetry import telemetry as crewai_telemetry

    for flag in ("CREWAI_DISABLE_TELEMETRY", "CREWAI_DISABLE_TRACKING", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(flag, raising=False)
    with otlp_collector() as (endpoint, received), recorded_trace() as (exporter, tracer):
        base = endpoint.removesuffix("/v1/traces")
        monkeypatch.setattr(crewai_telemetry, "CREWAI_TELEMETRY_BASE_URL", base)
        monkeypatch.setattr(crewai_telemetry.Telemetry, "_instance", None)
        # no signal handlers or exit hook in the test process: the test shuts it down itself
        monkeypatch.setattr(
            crewai_telemetry.Telemetry, "_register_shutdown_handlers", lambda self: None
        )
        anonymous = crewai_telemetry.Telemetry()
        assert anonymous.ready
        # crewai's listener took its telemetry (off) at import; this run's is on
        monkeypatch.setattr(EventListener(), "_telemetry", anonymous)
        try:
            answer, root = kickoff_served(workdir, tracer)
            crewai_event_bus.flush(timeout=10)  # its telemetry is written by the bus's threads
        finally:
            anonymous._shutdown()  # exports what is left, to the loopback collector
    assert answer == "The notes say: remember the milk."
    assert {"Crew Created", "Task Execution", "Crew Completed"} <= {s.name for s in received}
    assert {s.scope for s in received} == {"crewai.telemetry"}
    assert {s.service for s in received} == {"crewAI-telemetry"}
    spans = exporter.get_finished_spans()
    assert {s.instrumentation_scope.name for s in spans} == {"app", "agentguard"}
    trace_id = root.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {s.trace_id for s in received} == {trace_id}
    assert not {s.parent.span_id for s in spans if s.parent} & {s.span_id for s in received}
    assert len([s for s in spans if s.name.startswith("chat ")]) == 3
