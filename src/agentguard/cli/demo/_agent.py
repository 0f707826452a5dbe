"""The demo agent: a plain tool-calling loop over the real openai client, wrapped by agentguard.

Everything that happens is reported as a :class:`DemoEvent` as it happens: what the agent asks,
what goes over the (mocked) wire, the faults the script injects, the tools it runs, and every
decision of the guard (its events, delivered through a hook).
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Literal

import agentguard as ag
from agentguard.events import (
    BreakerStateChanged,
    BudgetExhausted,
    BudgetWarning,
    Escalated,
    Event,
    LoopFlagged,
    ToolCallFailed,
    ToolCallRefused,
    ToolCallRejected,
    ToolCallRepaired,
    ToolCallRetried,
    ToolDeadLettered,
)
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, Step
from agentguard.transport import tool_arguments
from agentguard.types import Choice, EscalationPrompt

from ._scenarios import Scenario, base_config
from ._workspace import TASK, TOOLS, TicketService, Workspace

__all__ = ["DemoEvent", "RunResult", "run_scenario"]

Source = Literal["agent", "model", "http", "tool", "guard", "fault", "user"]
Level = Literal["debug", "info", "ok", "warn", "error"]
MAX_STEPS = 20
_SYSTEM = "You are a careful assistant. Use the tools to do the task, then say when it is done."
_NUDGE = "summary.md does not exist yet: use the tools to finish the task."


@dataclass(frozen=True, slots=True)
class DemoEvent:
    """One line of the demo's timeline.

    Attributes:
        t: simulated seconds since the scenario started.
        scenario: the scenario's name.
        source: who acted (the agent, the model, the wire, a tool, the guard, an injected fault,
            the user answering a prompt).
        kind: a short, stable name (``model_call``, ``loop_flagged`` ...).
        text: the line for people.
        level: how to colour it (``debug``: routine, left out of the timeline).
        data: the details, for ``--json``.
    """

    t: float
    scenario: str
    source: Source
    kind: str
    text: str
    level: Level = "info"
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The event as one JSON-ready object."""
        return {
            "t": round(self.t, 3),
            "scenario": self.scenario,
            "source": self.source,
            "kind": self.kind,
            "text": self.text,
            **self.data,
        }


@dataclass
class RunResult:
    """How one scenario ended, and what it cost.

    Attributes:
        scenario: the scenario.
        outcome: ``done`` (the task was completed), ``stopped`` (the guard stopped the run with
            a clear reason) or ``failed``.
        reason: why the run ended, in words.
        steps: agent steps (model turns) taken.
        requests: HTTP requests the model endpoint received.
        faults: faults injected.
        how: what the guard did, in order of first use (``repair``, ``correction``,
            ``hint``, ``warning``, ``retry``, ``escalation``, ``breaker``, ``stop``).
        tokens: tokens spent, every attempt included.
        saved: tokens an unguarded run would have spent on top (an estimate: a re-ask for
            each repaired answer; the steps a stopped run would still have taken).
        cost: money spent at the demo's prices.
    """

    scenario: Scenario
    outcome: Literal["done", "stopped", "failed"] = "failed"
    reason: str = ""
    steps: int = 0
    requests: int = 0
    faults: int = 0
    how: list[str] = field(default_factory=list)
    tokens: int = 0
    saved: int = 0
    cost: float = 0.0

    def used(self, label: str) -> None:
        """Record that the guard acted by ``label`` (kept once, in order)."""
        if label not in self.how:
            self.how.append(label)

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return {
            "scenario": self.scenario.name,
            "fault": self.scenario.title,
            "outcome": self.outcome,
            "reason": self.reason,
            "steps": self.steps,
            "requests": self.requests,
            "faults": self.faults,
            "how": list(self.how),
            "tokens": self.tokens,
            "tokens_saved": self.saved,
            "cost": round(self.cost, 6),
        }


Emit = Callable[[DemoEvent], None]
#: How to wait: ``wait(seconds, why)``; the demo's clock advances by ``seconds`` either way.
Wait = Callable[[float, str], None]
#: Confirm mode's question to the user, shown with the run so far.
Ask = Callable[[EscalationPrompt, "RunResult"], Choice]


def _http_module() -> Any:
    openai = import_module("openai")
    return import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _guard_line(event: Event) -> tuple[str, Level, str | None]:
    """The timeline text of a guard event, its level, and the recovery it stands for."""
    if isinstance(event, LoopFlagged):
        if event.severity == "break":
            return f"loop break: {event.detector} ×{event.count}", "error", None
        if event.tool is None:  # a repeated answer: reported, escalated at BREAK
            return f"loop {event.severity}: {event.detector} ×{event.count}", "warn", "warning"
        return (
            f"loop {event.severity}: {event.detector} ×{event.count} on {event.tool} — "
            "a hint goes to the model with the tool result",
            "warn",
            "hint",
        )
    if isinstance(event, ToolCallRepaired):
        return f"repaired for free: {event.repair} at {event.path}", "ok", "repair"
    if isinstance(event, ToolCallRejected):
        return f"invalid call {event.tool_name}: {event.error} at {event.path}", "warn", None
    if isinstance(event, Escalated):
        return (
            f"escalate {event.from_tier} → {event.to_tier} ({event.reason})",
            "warn",
            ("escalation"),
        )
    if isinstance(event, BudgetWarning):
        return (
            f"{event.budget} budget at {event.ratio:.0%} ({event.used:,} of {event.limit:,} "
            "tokens)",
            "warn",
            None,
        )
    if isinstance(event, BudgetExhausted):
        return (
            f"{event.budget} budget exhausted: {event.used:,} used + {event.requested:,} asked "
            f"> {event.limit:,} → {event.action}",
            "error",
            None,
        )
    if isinstance(event, ToolCallRetried):
        return (
            f"tool {event.tool}: attempt {event.attempt} failed ({event.error}), retry in "
            f"{event.delay:.1f} s",
            "warn",
            "retry",
        )
    if isinstance(event, ToolCallFailed):
        return (
            f"tool {event.tool} failed for good ({event.error}, {event.attempts} attempts): "
            "the model is told",
            "error",
            None,
        )
    if isinstance(event, ToolDeadLettered):
        return f"tool {event.tool}: the failed call is kept as a dead letter", "info", None
    if isinstance(event, ToolCallRefused):
        return f"tool {event.tool} not run ({event.reason}): the model is told", "warn", None
    if isinstance(event, BreakerStateChanged):
        return (
            f"breaker {event.name}: {event.previous} → {event.state}",
            "error" if event.state == "open" else "ok",
            ("breaker" if event.state == "open" else None),
        )
    return event.kind.replace("_", " "), "info", None


class _Run:
    """The state of one scenario run."""

    def __init__(
        self, scenario: Scenario, *, emit: Emit, wait: Wait, ask: Ask | None, confirm: bool
    ) -> None:
        self.scenario = scenario
        self.emit_event = emit
        self.wait = wait
        self.ask = ask
        self.clock = FakeClock()
        self.t0 = self.clock()
        self.result = RunResult(scenario)
        self.why_wait = "backoff"
        self.model = "fast"
        self.step = 0
        self.cancelled = False
        config = base_config()
        for section, values in scenario.config.items():
            config[section] = {**config.get(section, {}), **values}
        if confirm:
            config["escalation"] = {**config["escalation"], "mode": "confirm"}
        self.config = ag.GuardConfig.from_dict(config, env={})

    def emit(
        self,
        source: Source,
        kind: str,
        text: str,
        level: Level = "info",
        **data: Any,
    ) -> None:
        self.emit_event(
            DemoEvent(self.clock() - self.t0, self.scenario.name, source, kind, text, level, data)
        )

    # -- hooks ---------------------------------------------------------------------------------

    def inject(self, label: str, step: Reply | Fault) -> Step:
        def served(request: Any) -> Reply | Fault:
            self.fault(label)
            return step

        return served

    def fault(self, label: str) -> None:
        self.result.faults += 1
        self.emit("fault", "fault_injected", f"injected: {label}", "error", fault=label)

    def on_guard_event(self, event: Event) -> None:
        text, level, label = _guard_line(event)
        if event.level <= logging.DEBUG:
            level = "debug"  # routine (a tool call started, succeeded): the JSON log only
        if label is not None:
            self.result.used(label)
        self.emit("guard", event.kind, text, level, event=event.to_dict())

    def sleep(self, seconds: float) -> None:
        self.emit(
            "guard",
            "wait",
            f"wait {seconds:.1f} s ({self.why_wait}), then retry",
            "warn",
            seconds=round(seconds, 3),
            why=self.why_wait,
        )
        self.result.used("retry")
        self.wait(seconds, self.why_wait)
        self.clock.advance(seconds)

    def confirm(self, prompt: EscalationPrompt) -> Choice:
        assert self.ask is not None
        self.emit(
            "guard",
            "confirm",
            "asking before changing tier: " + prompt.render().splitlines()[0],
            "warn",
            prompt={
                "reason": prompt.reason,
                "current": prompt.current.name,
                "proposed": prompt.proposed.name if prompt.proposed else None,
                "options": [o.value for o in prompt.options],
                "tokens_spent": prompt.tokens_spent,
                "cost_spent": prompt.cost_spent,
            },
        )
        choice = self.ask(prompt, self.result)
        self.emit("user", "choice", f"you chose: {choice.value}", "info", choice=choice.value)
        self.cancelled = choice == Choice.CANCEL
        if choice == Choice.USE_BACKUP and prompt.proposed is not None:
            self.model = prompt.proposed.name  # a real app keeps the backup for the run
        return choice

    def wire(self, http: Any, inner: Any) -> Any:
        """The mock transport, with every request and answer on the timeline."""

        def handler(request: Any) -> Any:
            model = json.loads(request.content or b"{}").get("model", "?")
            self.result.requests += 1
            try:
                response = inner.handle_request(request)
            except http.TimeoutException:
                self.emit("http", "http", f"POST /chat/completions {model} → timeout", "error")
                self.why_wait = "backoff after a timeout"
                raise
            status = response.status_code
            retry_after = response.headers.get("retry-after")
            extra = f", Retry-After: {retry_after}" if retry_after else ""
            self.why_wait = f"Retry-After: {retry_after}" if retry_after else "backoff"
            self.emit(
                "http",
                "http",
                f"POST /chat/completions {model} → {status}{extra}",
                "error" if status >= 400 else "info",
                model=model,
                status=status,
            )
            return response

        return http.MockTransport(handler)


def run_scenario(
    scenario: Scenario,
    *,
    emit: Emit,
    wait: Wait,
    ask: Ask | None = None,
    confirm: bool = False,
) -> RunResult:
    """Run the demo agent on ``scenario`` and report every step through ``emit``.

    Args:
        scenario: the failure mode to inject.
        emit: receives each :class:`DemoEvent` as it happens.
        wait: how to wait out a retry delay (the demo's own clock moves by it regardless).
        ask: confirm mode's question to the user (required with ``confirm``).
        confirm: run under escalation mode ``confirm`` (no silent failover).
    """
    import openai  # noqa: PLC0415 - optional dependency; the CLI checks it first

    run = _Run(scenario, emit=emit, wait=wait, ask=ask, confirm=confirm)
    http = _http_module()
    with tempfile.TemporaryDirectory(prefix="agentguard-demo-") as tmp:
        tickets = TicketService(scenario.tickets, on_fault=run.fault)
        workspace = Workspace(Path(tmp), tickets)
        model = ScriptedModel(scenario.script(run.inject))
        client = openai.OpenAI(
            api_key="demo-key-not-a-secret",
            base_url="http://scripted.invalid/v1",
            http_client=http.Client(transport=run.wire(http, model.mock_transport(http))),
        )
        guarded = ag.wrap(
            client,
            run.config,
            clock=run.clock,
            sleep=run.sleep,
            rng=random.Random(7),
            hooks=[run.on_guard_event],
            confirm=run.confirm if confirm else None,
        )
        _agent_loop(run, guarded, workspace)
    return run.result


def _agent_loop(run: _Run, client: Any, workspace: Workspace) -> None:
    import openai  # noqa: PLC0415 - optional dependency

    result = run.result
    tools = _tool_guard(run, workspace)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": TASK},
    ]
    run.emit("agent", "task", f"task: {TASK}")
    per_step: list[int] = []
    for step in range(1, MAX_STEPS + 1):
        run.step = result.steps = step
        tools.new_turn()
        try:
            completion = client.chat.completions.create(
                model=run.model,
                messages=messages,
                tools=TOOLS,
                extra_headers={"x-agentguard-session": f"demo-{run.scenario.name}"},
            )
        except (ag.AgentGuardError, openai.OpenAIError) as exc:
            _stopped(run, exc, per_step)
            return
        message = completion.choices[0].message
        per_step.append(_account(run, completion))
        entry: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        calls = message.tool_calls or []
        if calls:
            entry["tool_calls"] = [c.model_dump(mode="json", exclude_none=True) for c in calls]
        messages.append(entry)
        for call in calls:
            content = _run_tool(run, workspace, call, tools)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if calls:
            continue
        if workspace.done:
            result.outcome, result.reason = "done", "summary.md written"
            run.emit("agent", "done", f"task done in {step} steps: {message.content}", "ok")
            return
        messages.append({"role": "user", "content": _NUDGE})
        run.emit("agent", "nudge", "no summary yet: the agent asks the model to go on")
    result.outcome, result.reason = "failed", f"no result after {MAX_STEPS} steps"
    run.emit("agent", "failed", result.reason, "error")


def _stopped(run: _Run, exc: Exception, per_step: list[int]) -> None:
    """End the run on an error: the guard's own (a clear stop), a cancel, or anything else."""
    result = run.result
    if run.cancelled:
        result.outcome, result.reason = "stopped", "cancelled by the user"
        run.emit("agent", "cancelled", "run cancelled: no failover without consent")
        return
    if not isinstance(exc, ag.AgentGuardError):
        result.outcome, result.reason = "failed", f"{type(exc).__name__}: {exc}"
        run.emit("agent", "failed", f"model call failed: {result.reason}", "error")
        return
    result.outcome, result.reason = "stopped", f"{type(exc).__name__}: {exc}"
    result.used("stop")
    mean = sum(per_step) // len(per_step) if per_step else 0
    result.saved += (MAX_STEPS - run.step + 1) * mean  # the steps an unguarded run still had
    run.emit("guard", "stopped", f"run stopped: {result.reason}", "error")


def _account(run: _Run, completion: Any) -> int:
    """Add one answer's tokens, cost and recoveries to the result; returns its tokens."""
    result = run.result
    report = ag.report_of(completion)
    if report is None:
        return 0
    tokens = report.usage.total_tokens
    result.tokens += tokens
    result.cost += report.cost or 0.0
    if report.repairs:
        result.saved += tokens  # the re-ask a local repair made unnecessary
    if report.corrections:
        result.used("correction")
    _model_line(run, report, completion.choices[0].message, tokens)
    return tokens


def _model_line(run: _Run, report: ag.GuardReport, message: Any, tokens: int) -> None:
    calls = message.tool_calls or []
    if calls:
        said = ", ".join(f"{c.function.name}({_short(c.function.arguments, 48)})" for c in calls)
    else:
        said = f'"{_short(message.content or "", 70)}"'
    extras = []
    if report.retries:
        extras.append(f"{report.retries} retr{'y' if report.retries == 1 else 'ies'}")
    if report.corrections:
        extras.append(f"{report.corrections} correction(s)")
    if report.repairs:
        extras.append(f"{len(report.repairs)} repair(s)")
    tail = f" [{'; '.join(extras)}]" if extras else ""
    run.emit(
        "model",
        "model_call",
        f"{report.tier} ({report.model}) → {said}  {tokens:,} tok{tail}",
        "info",
        report=report.to_dict(),
    )


def _tool_guard(run: _Run, workspace: Workspace) -> ag.ToolGuard:
    """The flaky network tool runs through ToolGuard: bounded retries, its own breaker."""
    config = ag.GuardConfig.from_dict(
        {
            "tools": {
                "breaker": {"min_calls": 4, "open_seconds": 60},
                "retry": {"max_attempts": 3, "base_seconds": 0.2, "cap_seconds": 1.0},
                "sync_timeouts": False,  # the stand-in tracker times out by itself
            }
        },
        env={},
    )
    tools = ag.ToolGuard(
        config,
        clock=run.clock,
        sleep=run.sleep,
        rng=random.Random(11),
        hooks=[run.on_guard_event],
        session=f"demo-{run.scenario.name}",
    )
    tools.register(workspace.tickets.fetch, name="fetch_ticket", criticality="optional")
    return tools


def _run_tool(run: _Run, workspace: Workspace, call: Any, tools: ag.ToolGuard) -> str:
    name = call.function.name
    if name in tools.tools:
        run.why_wait = "tool retry backoff"
        outcome = tools.call(name, call.function.arguments)
        content, ok = outcome.content, outcome.ok
    else:
        content, ok = _run_plain(workspace, name, call.function.arguments)
    first = content.splitlines()[0] if content else ""
    lines = content.count("\n") + 1
    summary = first if lines == 1 else f"{first} … ({lines} lines)"
    run.emit(
        "tool",
        "tool_result",
        f"{name} → {_short(summary, 70)}",
        "info" if ok else "warn",
        tool=name,
        ok=ok,
    )
    return content


def _run_plain(workspace: Workspace, name: str, raw: str | None) -> tuple[str, bool]:
    """The file tools run directly; a tool error goes back to the model, as agents do."""
    try:
        arguments: dict[str, Any] | None = tool_arguments(raw)
    except (TypeError, ValueError):
        arguments = None
    fn = workspace.functions.get(name)
    if fn is None or not isinstance(arguments, dict):
        return f"error: cannot run {name} with {raw!r}", False
    try:
        content = fn(**arguments)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}", False
    return content, not content.startswith("error:")
