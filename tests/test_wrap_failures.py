"""Every failure mode and escalation path through the *real* openai client (either major),
sync and async, streaming included, against ScriptedModel over an HTTP mock transport."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

import anyio
import pytest

import agentguard as ag
from agentguard.escalation import Choice, EscalationPrompt
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, capture_events
from agentguard.transport import ModelRequest

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "show me setup.cfg"}]
GOOD = Reply.call("read_file", {"path": "setup.cfg"})


def _config(**sections: Any) -> ag.GuardConfig:
    data: dict[str, Any] = {
        "tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}},
        "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 1},
        "memory_pressure": {"enabled": False},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ag.GuardConfig.from_dict(data, env={})


@dataclass
class Run:
    """One call through a wrapped client: what came back (or was raised) and what was slept."""

    answer: Any = None
    error: BaseException | None = None
    slept: list[float] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)

    @property
    def report(self) -> ag.GuardReport:
        report = ag.report_of(self.answer)
        assert report is not None
        return report

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        message = self.answer.choices[0].message
        return [
            (c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()
        ]


def _run(
    script: Any,
    *,
    asynchronous: bool = False,
    config: ag.GuardConfig | None = None,
    **options: Any,
) -> Run:
    model = ScriptedModel(script)
    clock = FakeClock()
    run = Run(requests=model.requests)

    def sleep(seconds: float) -> None:
        run.slept.append(seconds)
        clock.advance(seconds)

    async def asleep(seconds: float) -> None:
        sleep(seconds)

    kwargs = {"model": "fast", "messages": MESSAGES, "tools": TOOLS}
    common = {"clock": clock, "rng": random.Random(0), **options}
    with capture_events() as events:
        try:
            if asynchronous:
                client: Any = openai.AsyncOpenAI(
                    api_key="sk-test",
                    base_url="http://scripted.invalid/v1",
                    http_client=http.AsyncClient(transport=model.mock_transport(http)),
                )
                wrapped = ag.wrap(client, config or _config(), sleep=asleep, **common)

                async def go() -> Any:
                    return await wrapped.chat.completions.create(**kwargs)

                run.answer = anyio.run(go)
            else:
                client = openai.OpenAI(
                    api_key="sk-test",
                    base_url="http://scripted.invalid/v1",
                    http_client=http.Client(transport=model.mock_transport(http)),
                )
                wrapped = ag.wrap(client, config or _config(), sleep=sleep, **common)
                run.answer = wrapped.chat.completions.create(**kwargs)
        except Exception as exc:
            run.error = exc
    run.events = list(events)
    return run


MODES = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])


@MODES
def test_repairable_json_is_fixed_locally(asynchronous: bool) -> None:
    """Single quotes and a trailing comma: repaired with no extra round trip."""
    run = _run([Reply.call("read_file", "{'path': 'setup.cfg',}")], asynchronous=asynchronous)
    assert run.calls() == [("read_file", {"path": "setup.cfg"})]
    assert run.report.repairs
    assert len(run.requests) == 1


@MODES
@pytest.mark.parametrize(
    "bad",
    [
        Reply.call("read_file", '{"path": "setup'),  # truncated
        Reply.call("delete_everything", {"force": True}),  # hallucinated tool
        Reply.call("read_file", {}),  # missing required argument
        Reply.call("read_file", {"path": "<path>"}),  # placeholder
    ],
    ids=["truncated", "hallucinated", "missing_required", "placeholder"],
)
def test_invalid_calls_are_corrected_on_the_same_tier(asynchronous: bool, bad: Reply) -> None:
    """An invalid call gets one precise correction and the fixed call comes back."""
    run = _run([bad, GOOD], asynchronous=asynchronous)
    assert run.calls() == [("read_file", {"path": "setup.cfg"})]
    assert run.report.corrections == 1
    assert run.report.tier == "fast"
    correction = run.requests[1].messages
    assert any(m.get("role") == "tool" for m in correction)


@MODES
@pytest.mark.parametrize("style", ["hermes", "function_tag", "python_tag", "mistral", "fenced"])
def test_text_embedded_calls_become_tool_calls(asynchronous: bool, style: Any) -> None:
    """A call written as text (local-model formats) arrives as a real tool call."""
    run = _run(
        [Reply.embedded("read_file", {"path": "setup.cfg"}, style=style)], asynchronous=asynchronous
    )
    assert run.calls() == [("read_file", {"path": "setup.cfg"})]
    assert run.answer.choices[0].finish_reason == "tool_calls"


@MODES
def test_validation_failure_after_corrections_escalates(asynchronous: bool) -> None:
    """Still invalid after every correction: the next tier answers, and the report says why."""
    bad = Reply.call("delete_everything", {})
    run = _run({"small": [bad] * 4, "big": [GOOD]}, asynchronous=asynchronous)
    assert run.calls() == [("read_file", {"path": "setup.cfg"})]
    assert (run.report.tier, run.report.escalated_from) == ("premium", "fast")
    assert run.report.reasons == ("tool_validation_failure",)
    assert any(e.kind == "escalated" for e in run.events)


@MODES
def test_rate_limit_with_retry_after_is_waited_out(asynchronous: bool) -> None:
    """429 with Retry-After: the guard waits that long (its only retry layer) and retries."""
    run = _run([Fault.rate_limit(retry_after=2), GOOD], asynchronous=asynchronous)
    assert run.report.retries == 1
    assert run.report.tier == "fast"
    assert run.slept
    assert run.slept[0] >= 2


@MODES
def test_rate_limit_with_retry_after_ms_is_honoured(asynchronous: bool) -> None:
    """retry-after-ms wins over a coarser Retry-After."""
    run = _run(
        [Fault.rate_limit(retry_after=None, retry_after_ms=1500), GOOD], asynchronous=asynchronous
    )
    assert run.slept
    assert 1.5 <= run.slept[0] < 2.5


@MODES
def test_a_retry_after_beyond_the_cap_escalates_instead_of_waiting(asynchronous: bool) -> None:
    """A one-hour Retry-After is not waited for: the next tier serves now."""
    run = _run(
        {"small": [Fault.rate_limit(retry_after=3600)], "big": [GOOD]}, asynchronous=asynchronous
    )
    assert run.report.tier == "premium"
    assert run.report.reasons == ("rate_limited",)
    assert all(s < 3600 for s in run.slept)


@MODES
@pytest.mark.parametrize(
    ("fault", "reason"),
    [(Fault.server_error(503), "server_error"), (Fault.timeout(), "timeout")],
    ids=["5xx", "timeout"],
)
def test_a_dead_tier_escalates(asynchronous: bool, fault: Fault, reason: str) -> None:
    """Repeated 5xx or timeouts: retried once (max_retries_before_escalate), then the next tier."""
    run = _run({"small": [fault] * 2, "big": [GOOD]}, asynchronous=asynchronous)
    assert run.report.tier == "premium"
    assert run.report.reasons == (reason,)
    assert [r.model for r in run.requests] == ["small", "small", "big"]


@MODES
def test_every_tier_dead_raises_tiers_exhausted_with_the_history(asynchronous: bool) -> None:
    """When the chain is exhausted the error carries every attempt."""
    run = _run({"*": [Fault.server_error(500)] * 10}, asynchronous=asynchronous)
    assert isinstance(run.error, ag.TiersExhausted)
    assert {a.tier for a in run.error.attempts} == {"fast", "premium"}


@MODES
def test_a_client_error_is_not_retried(asynchronous: bool) -> None:
    """A 400 (context too long) comes back as the SDK's own error, at once."""
    run = _run([Fault.context_length()], asynchronous=asynchronous)
    assert isinstance(run.error, openai.BadRequestError)
    assert len(run.requests) == 1


@MODES
def test_an_upstream_error_after_retries_carries_the_guards_record(asynchronous: bool) -> None:
    """Retried and still failing, with no tier to move to: the SDK's own error type, with the
    attempt history as ``agentguard_report`` and a note in the traceback."""
    config = _config(escalation={"enabled": False})
    run = _run([Fault.server_error(503)] * 3, asynchronous=asynchronous, config=config)
    assert isinstance(run.error, openai.InternalServerError)
    report = run.error.agentguard_report  # type: ignore[attr-defined]
    assert [a.outcome for a in report.attempts] == ["transient", "transient"]
    assert report.retries == 1
    assert any(n.startswith("agentguard: 2 attempt(s)") for n in run.error.__notes__)


@MODES
def test_given_up_corrections_carry_their_tokens(asynchronous: bool) -> None:
    """ToolValidationFailed through the real client: the tokens of every re-ask are on it."""
    config = _config(escalation={"enabled": False})
    bad = Reply.call("read_file", {"file": "setup.cfg"})
    run = _run([bad] * 4, asynchronous=asynchronous, config=config)
    assert isinstance(run.error, ag.ToolValidationFailed)
    # the same answer each time: corrected, then narrowed and pinned to the one tool; a third
    # re-ask would repeat the second request, so none is sent
    assert run.error.n_attempts == 3
    usage = run.error.total_usage
    assert usage.completion_tokens > 0
    assert len(run.requests) == 3  # each of the three answers is counted, not only the last
    assert usage.prompt_tokens > 3 * 10


@MODES
def test_degenerate_text_escalates(asynchronous: bool) -> None:
    """An answer that degenerates into repetition is a loop: the next tier answers."""
    run = _run(
        {"small": [Reply.degenerate("I will try again.", times=40)], "big": [Reply.text("done")]},
        asynchronous=asynchronous,
    )
    assert run.answer.choices[0].message.content == "done"
    assert run.report.reasons == ("loop_detected",)


@MODES
def test_missing_usage_is_estimated(asynchronous: bool) -> None:
    """A server that reports no usage still gets accounted, marked as estimated."""
    run = _run([Reply.text("fine", usage=None)], asynchronous=asynchronous)
    assert run.report.usage.estimated
    assert run.report.usage.total_tokens > 0


@MODES
def test_hard_stop_budget_refuses_before_calling(asynchronous: bool) -> None:
    """A session over its budget under hard_stop raises BudgetExceeded and calls nothing."""
    config = _config(token_budget={"per_session": 10, "policy": "hard_stop"})
    run = _run([GOOD], asynchronous=asynchronous, config=config)
    assert isinstance(run.error, ag.BudgetExceeded)
    assert run.requests == []


@MODES
def test_confirm_mode_without_a_callback_raises_the_choice(asynchronous: bool) -> None:
    """No silent failover: the options, the reason and the spend come back to the caller."""
    config = _config(escalation={"mode": "confirm"})
    run = _run(
        {"small": [Fault.server_error(503)] * 2, "big": [GOOD]},
        asynchronous=asynchronous,
        config=config,
    )
    assert isinstance(run.error, ag.EscalationRequired)
    prompt = run.error.prompt
    assert set(prompt.options) == {Choice.RETRY, Choice.USE_BACKUP, Choice.CANCEL}
    assert prompt.reason == "server_error"
    assert [r.model for r in run.requests] == ["small", "small"]


@MODES
@pytest.mark.parametrize(
    ("choice", "served"), [(Choice.USE_BACKUP, "premium"), (Choice.RETRY, "fast")]
)
def test_confirm_mode_follows_the_users_choice(
    asynchronous: bool, choice: Choice, served: str
) -> None:
    """The callback's answer decides: use the backup tier, or try the same tier again."""
    asked: list[EscalationPrompt] = []

    def confirm(prompt: EscalationPrompt) -> Choice:
        asked.append(prompt)
        return choice

    config = _config(escalation={"mode": "confirm"})
    script = {"small": [Fault.server_error(503)] * 2 + [GOOD], "big": [GOOD]}
    run = _run(script, asynchronous=asynchronous, config=config, confirm=confirm)
    assert run.report.tier == served
    assert len(asked) == 1


def _caller(model: ScriptedModel, *, asynchronous: bool, **options: Any) -> Any:
    """A wrapped client over ``model`` (time injected), as a function making one call: the
    answer, or the exception raised. One client for every call: its breakers carry over."""
    clock = FakeClock()

    async def asleep(seconds: float) -> None:
        clock.advance(seconds)

    kwargs = {"model": "fast", "messages": MESSAGES, "tools": TOOLS}
    common: dict[str, Any] = {"clock": clock, "rng": random.Random(0), **options}
    if asynchronous:
        client: Any = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url="http://scripted.invalid/v1",
            http_client=http.AsyncClient(transport=model.mock_transport(http)),
        )
        wrapped = ag.wrap(client, sleep=asleep, **common)

        async def go() -> Any:
            return await wrapped.chat.completions.create(**kwargs)

        make = lambda: anyio.run(go)  # noqa: E731
    else:
        client = openai.OpenAI(
            api_key="sk-test",
            base_url="http://scripted.invalid/v1",
            http_client=http.Client(transport=model.mock_transport(http)),
        )
        wrapped = ag.wrap(client, sleep=clock.advance, **common)
        make = lambda: wrapped.chat.completions.create(**kwargs)  # noqa: E731

    def call() -> Any:
        try:
            return make()
        except Exception as exc:
            return exc

    return call


class _Retrying:
    """A confirm callback answering retry up to ``limit`` times, then cancel; it notes how many
    requests the upstream had when each question came."""

    def __init__(self, model: ScriptedModel, limit: int = 10) -> None:
        self.model, self.limit = model, limit
        self.prompts: list[EscalationPrompt] = []
        self.requests_at: list[int] = []

    def __call__(self, prompt: EscalationPrompt) -> Choice:
        self.prompts.append(prompt)
        self.requests_at.append(len(self.model.requests))
        return Choice.RETRY if len(self.prompts) <= self.limit else Choice.CANCEL


@MODES
def test_confirm_retry_while_the_breaker_is_open_sends_the_request(asynchronous: bool) -> None:
    """Retry chosen after the tier's breaker opened: the request goes to the tier (the user's
    choice is the probe), one per answer, so the call ends when the tier answers. It re-asked
    at once with no request, forever for a callback that kept answering retry."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 7 + [GOOD], "big": [GOOD]})
    confirm = _Retrying(model)
    config = _config(escalation={"mode": "confirm"})
    answer = _caller(model, asynchronous=asynchronous, config=config, confirm=confirm)()
    report = ag.report_of(answer)
    assert report is not None
    assert report.tier == "fast"
    assert [r.model for r in model.requests] == ["small"] * 8
    # two failures per question while the breaker is closed, then one per retry chosen
    assert confirm.requests_at == [2, 4, 5, 6, 7]
    assert [("circuit breaker is open" in p.message) for p in confirm.prompts] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert all(p.options[0] == Choice.RETRY for p in confirm.prompts)


@MODES
def test_confirm_retry_at_a_start_on_an_open_breaker_sends_the_request(
    asynchronous: bool,
) -> None:
    """The next call starts on a tier whose breaker is open: confirm mode asks before moving,
    and retry sends that call to the tier instead of asking again without a request."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 5 + [GOOD], "big": [GOOD]})
    confirm = _Retrying(model, limit=2)
    config = _config(escalation={"mode": "confirm"})
    call = _caller(model, asynchronous=asynchronous, config=config, confirm=confirm)
    assert isinstance(call(), openai.InternalServerError)  # retry, retry, then cancel
    assert len(model.requests) == 5  # the breaker opened on the fifth failure
    confirm.prompts.clear()
    confirm.requests_at.clear()
    answer = call()
    report = ag.report_of(answer)
    assert report is not None
    assert report.tier == "fast"
    assert confirm.requests_at == [5]  # asked once, at the start, before the request
    assert "circuit breaker is open" in confirm.prompts[0].message
    assert [r.model for r in model.requests] == ["small"] * 6


@MODES
@pytest.mark.parametrize(
    ("answer", "cancelled"),
    [
        (None, False),  # a callback that forgot to return
        ("no", False),
        (True, False),  # not the number 1
        ("4", False),  # no such option
        ("3", True),  # the number render() shows for Cancel
        (3, True),
        ("CANCEL", True),
        (" cancel\n", True),
    ],
)
def test_confirm_answers_that_are_not_a_yes_never_move(
    asynchronous: bool, answer: Any, cancelled: bool
) -> None:
    """No silent failover: an answer that picks no option, or picks Cancel by its number or
    name, ends the call on the failing tier; the backup tier is never called. Anything but
    exactly RETRY or CANCEL moved to the (paid) backup."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 2, "big": [GOOD]})
    config = _config(escalation={"mode": "confirm"})
    call = _caller(model, asynchronous=asynchronous, config=config, confirm=lambda p: answer)
    error = call()
    assert isinstance(error, openai.InternalServerError)
    assert [r.model for r in model.requests] == ["small", "small"]
    warnings = error.agentguard_report.warnings
    assert any("taken as cancel" in w for w in warnings) is not cancelled


@MODES
@pytest.mark.parametrize(
    ("answer", "served"),
    [
        ("2", "premium"),
        (2, "premium"),
        ("USE_BACKUP", "premium"),
        ("use_backup", "premium"),
        ("1", "fast"),
        ("Retry", "fast"),
    ],
)
def test_confirm_answers_by_number_or_name_pick_that_option(
    asynchronous: bool, answer: Any, served: str
) -> None:
    """A terminal callback may return what the user typed: the option's number as
    ``render()`` shows it, or its name."""
    model = ScriptedModel({"small": [Fault.server_error(503)] * 2 + [GOOD], "big": [GOOD]})
    config = _config(escalation={"mode": "confirm"})
    call = _caller(model, asynchronous=asynchronous, config=config, confirm=lambda p: answer)
    report = ag.report_of(call())
    assert report is not None
    assert report.tier == served
    assert not report.warnings


@MODES
def test_off_mode_never_changes_tier(asynchronous: bool) -> None:
    """escalation.mode off: the failing tier's error comes back; the backup is never called."""
    config = _config(escalation={"mode": "off"})
    run = _run(
        {"small": [Fault.server_error(503)] * 2, "big": [GOOD]},
        asynchronous=asynchronous,
        config=config,
    )
    assert run.error is not None
    assert all(r.model == "small" for r in run.requests)


def test_a_tool_loop_across_turns_is_warned_then_stopped() -> None:
    """The same call with the same result turn after turn: a hint first, then LoopDetected."""
    model = ScriptedModel([GOOD], cycle=True)
    client = ag.wrap(
        openai.OpenAI(
            api_key="sk-test",
            base_url="http://scripted.invalid/v1",
            http_client=http.Client(transport=model.mock_transport(http)),
        ),
        _config(escalation={"mode": "off"}),
    )
    messages: list[dict[str, Any]] = list(MESSAGES)
    warned = False
    with pytest.raises(ag.LoopDetected) as info:  # noqa: PT012 - the loop is the behaviour
        for _ in range(40):
            answer = client.chat.completions.create(model="fast", messages=messages, tools=TOOLS)
            warned = warned or bool(ag.report_of(answer).warnings)
            message = answer.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            call_id = message.tool_calls[0].id
            messages.append({"role": "tool", "tool_call_id": call_id, "content": "[same]"})
    assert warned
    assert info.value.to_error()["type"] == "loop_detected"


# -- streaming ---------------------------------------------------------------------------------


def _stream(
    script: Any, config: ag.GuardConfig | None = None
) -> tuple[list[Any], Any, ScriptedModel]:
    model = ScriptedModel(script)
    clock = FakeClock()
    client = ag.wrap(
        openai.OpenAI(
            api_key="sk-test",
            base_url="http://scripted.invalid/v1",
            http_client=http.Client(transport=model.mock_transport(http)),
        ),
        config or _config(),
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
    )
    stream = client.chat.completions.create(
        model="fast",
        messages=MESSAGES,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    return list(stream), stream, model


def _streamed_calls(chunks: list[Any]) -> list[str]:
    """The names of the streamed calls (a call's later fragments carry none)."""
    return [
        tc.function.name
        for c in chunks
        if c.choices
        for tc in (c.choices[0].delta.tool_calls or [])
        if tc.function is not None and tc.function.name
    ]


def test_streaming_text_embedded_call_is_released_as_a_tool_call() -> None:
    """A streamed call written as text arrives as a whole tool-call chunk."""
    chunks, stream, _ = _stream([Reply.embedded("read_file", {"path": "a"}, style="hermes")])
    assert _streamed_calls(chunks) == ["read_file"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls"
    assert ag.report_of(stream).repairs


def test_streaming_invalid_call_is_corrected_before_release() -> None:
    """A hallucinated streamed call is never released; the corrected one is."""
    chunks, stream, model = _stream([Reply.call("delete_everything", {}), GOOD])
    assert _streamed_calls(chunks) == ["read_file"]
    assert len(model.requests) == 2
    assert ag.report_of(stream).corrections == 1


def test_streaming_dead_tier_escalates_before_any_content() -> None:
    """A stream whose tier is down is served by the next tier."""
    chunks, stream, _ = _stream({"small": [Fault.server_error(503)] * 2, "big": [Reply.text("hi")]})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi"
    assert ag.report_of(stream).tier == "premium"


def test_streaming_rate_limit_is_retried() -> None:
    """429 before the stream starts: waited out and retried on the same tier."""
    chunks, stream, _ = _stream([Fault.rate_limit(retry_after=1), Reply.text("hello")])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello"
    assert ag.report_of(stream).retries == 1


def test_streaming_degenerate_text_is_cut() -> None:
    """A degenerating stream stops early with finish_reason length."""
    chunks, stream, _ = _stream([Reply.degenerate("over and over again.", times=300)])
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert any("stream cut" in w for w in ag.report_of(stream).warnings)


def test_streaming_usage_chunk_reaches_the_caller() -> None:
    """With include_usage the caller still gets the usage chunk (choices == []) at the end."""
    chunks, _, _ = _stream([Reply.call("delete_everything", {}), GOOD])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.total_tokens > 0
    assert chunks[-2].choices[0].finish_reason == "tool_calls"


# -- what wrap() accepts -------------------------------------------------------------------------


def _client(model: ScriptedModel) -> Any:
    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://scripted.invalid/v1",
        http_client=http.Client(transport=model.mock_transport(http)),
    )


def test_wrap_takes_a_plain_dict() -> None:
    """``ag.wrap(client, {...})``: the dict is the reliability block (no AttributeError)."""
    model = ScriptedModel([Reply.call("read_file", {"path": "a"}), GOOD])
    wrapped = ag.wrap(_client(model), {"tool_validation": {"max_retries": 0}, "tiers": {}})
    answer = wrapped.chat.completions.create(model="fast", messages=MESSAGES, tools=[{**TOOLS[0]}])
    assert ag.report_of(answer) is not None


def test_wrap_without_config_reads_agentguard_config_and_overrides(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Like the LiteLLM proxy handler: AGENTGUARD_CONFIG names the file, AGENTGUARD_* override,
    unrelated AGENTGUARD_ variables are ignored."""
    path = tmp_path / "agentguard.yaml"
    path.write_text("reliability:\n  token_budget: {policy: hard_stop, per_session: 1}\n")
    monkeypatch.setenv("AGENTGUARD_CONFIG", str(path))
    monkeypatch.setenv("AGENTGUARD_TOKEN_BUDGET__PER_SESSION", "2")
    monkeypatch.setenv("AGENTGUARD_WRAP", "1")
    wrapped = ag.wrap(_client(ScriptedModel([GOOD])))
    with pytest.raises(ag.BudgetExceeded) as info:
        wrapped.chat.completions.create(model="fast", messages=MESSAGES)
    assert info.value.limit == 2


@pytest.mark.parametrize("thing", [object(), "gpt-4o", None])
def test_wrapping_something_else_is_a_type_error(thing: Any) -> None:
    """Not an openai client: a TypeError saying what wrap() takes and where to go instead."""
    with pytest.raises(TypeError, match=r"openai\.OpenAI or openai\.AsyncOpenAI"):
        ag.wrap(thing)


def test_wrap_rejects_a_config_of_the_wrong_type() -> None:
    """A config that is no GuardConfig, dict or path: TypeError naming the accepted types."""
    with pytest.raises(TypeError, match="a dict or a file path"):
        ag.wrap(_client(ScriptedModel([GOOD])), 42)  # type: ignore[arg-type]


def test_a_stream_that_breaks_off_after_its_first_words_ends_on_the_error() -> None:
    """The connection drops after the first words went out. Another attempt cannot go on from
    them (its text would be held back: the caller got ``"The docs "`` and ``finish_reason:
    "stop"``, a cut answer ending as if whole): the stream ends on the error the raw client
    raises, after one upstream call, and what it delivered is counted, nothing left held."""
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode()

    class BreaksOff(http.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield event({"role": "assistant", "content": ""})
            yield event({"content": "The docs "})
            raise http.ReadError("connection reset by peer")

    calls: list[int] = []

    def upstream(request: Any) -> Any:
        calls.append(1)
        return http.Response(200, headers={"content-type": "text/event-stream"}, stream=BreaksOff())

    def read(client: Any) -> tuple[list[str], type[BaseException] | None]:
        words: list[str] = []
        ask = {"model": "m", "messages": [{"role": "user", "content": "docs?"}], "stream": True}
        ask["extra_headers"] = {"x-agentguard-session": "cut"}
        try:
            for chunk in client.chat.completions.create(**ask):
                words += [c.delta.content or "" for c in chunk.choices]
        except Exception as exc:  # the error each client ends on
            return words, type(exc)
        return words, None

    def client() -> Any:
        return openai.OpenAI(
            api_key="sk-test",
            base_url="http://upstream.invalid/v1",
            http_client=http.Client(transport=http.MockTransport(upstream)),
            max_retries=0,
        )

    raw = read(client())
    calls.clear()
    config = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "token_budget": {"per_session": 100_000}}, env={}
    )
    ledger = ag.TokenLedger(config)
    clock = FakeClock()
    guarded_client = ag.wrap(client(), config, ledger=ledger, clock=clock, sleep=clock.sleep)
    guarded = read(guarded_client)
    assert raw[0] == ["", "The docs "]
    assert raw[1] is not None  # openai 3.x: APIConnectionError; 2.x: httpx's ReadError
    assert guarded == raw
    assert len(calls) == 1
    usage = ledger.usage("cut")
    assert (usage.session_reserved, usage.session_tokens > 0) == (0, True)


@pytest.mark.anyio
async def test_a_call_cancelled_while_upstream_thinks_gives_its_hold_back() -> None:
    """A non-streaming call whose task is cancelled (a timeout around it, a client gone) while
    the upstream has not answered: its hold returns at once, and the ledger keeps no call in
    flight to renew (before lease renewal it lapsed after ``lease_seconds``; kept in flight, it
    would have been renewed for ``max_call_seconds``)."""
    entered = anyio.Event()

    async def upstream(request: Any) -> Any:
        entered.set()
        await anyio.sleep_forever()

    config = ag.GuardConfig.from_dict(
        {"memory_pressure": {"enabled": False}, "token_budget": {"per_session": 100_000}}, env={}
    )
    clock = FakeClock()
    ledger = ag.TokenLedger(config, clock=clock)
    client = openai.AsyncOpenAI(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http.AsyncClient(transport=http.MockTransport(upstream)),
        max_retries=0,
    )
    guarded = ag.wrap(client, config, ledger=ledger, clock=clock, sleep=clock.sleep)
    ask = {"model": "m", "messages": [{"role": "user", "content": "think"}]}
    ask["extra_headers"] = {"x-agentguard-session": "gone"}
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lambda: guarded.chat.completions.create(**ask))
        await entered.wait()
        assert ledger.usage("gone").session_reserved > 0
        tasks.cancel_scope.cancel()
    assert ledger.usage("gone").session_reserved == 0
    clock.advance(config.token_budget.lease_seconds)
    assert ledger.renew_due() == 0


@pytest.mark.parametrize(
    "error",
    [
        {"error": {"message": "Provider returned error", "code": 502}},  # OpenRouter
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        {"error": {"message": "The server had an error", "type": "server_error", "code": None}},
    ],
    ids=["openrouter-502", "overloaded", "server-error"],
)
def test_an_error_event_before_the_answer_begins_is_retried(error: dict[str, Any]) -> None:
    """A stream whose first event is the provider's error (its 200 head already sent): the raw
    client raises ``APIError``, with no status; the guard reads the error's code or type,
    retries, and the caller gets the next attempt's answer (before: raised, not retried)."""
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    text = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]}
    end = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    calls: list[int] = []

    def upstream(request: Any) -> Any:
        calls.append(1)
        events = [{"error": error["error"]}] if len(calls) == 1 else [text, end]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    raw = openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http.Client(transport=http.MockTransport(upstream)),
        max_retries=0,
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with pytest.raises(openai.APIError):
        list(raw.chat.completions.create(**ask))
    calls.clear()
    clock = FakeClock()
    guarded = ag.wrap(raw, _config(), clock=clock, sleep=clock.sleep)
    stream = guarded.chat.completions.create(**ask)
    assert [c.delta.content for chunk in stream for c in chunk.choices] == ["Hi", None]
    assert len(calls) == 2
    report = ag.report_of(stream)
    assert report is not None
    assert report.retries == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_text_where_tool_choice_names_a_tool_is_re_asked(stream: bool) -> None:
    """LangChain's ``with_structured_output`` names its schema's tool in ``tool_choice``; a
    server that ignores it (Ollama) lets the model answer in text. That text is re-asked, the
    tool pinned, and the caller gets the call (streamed: the text never went out)."""
    model = ScriptedModel([Reply.text("setup.cfg holds the settings."), GOOD])
    clock = FakeClock()
    client = ag.wrap(_client(model), _config(), clock=clock, sleep=clock.sleep)
    pinned = {"type": "function", "function": {"name": "read_file"}}
    ask = {"model": "fast", "messages": MESSAGES, "tools": TOOLS, "tool_choice": pinned}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **ask))
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert _streamed_calls(chunks) == ["read_file"]
    else:
        answer = client.chat.completions.create(**ask)
        assert [c.function.name for c in answer.choices[0].message.tool_calls] == ["read_file"]
    assert len(model.requests) == 2
    assert model.requests[1].params["tool_choice"] == pinned


@pytest.mark.parametrize(("n", "refused"), [(1, False), (2, False), (8, True)])
def test_a_budget_holds_the_output_of_every_answer_asked_for(n: int, refused: bool) -> None:
    """``n`` answers may each use the whole output cap (``max_tokens`` applies per answer): a
    hard_stop budget admits the call only when all of them fit (before: one answer's worth was
    held, and eight answers of 1,000 tokens could pass a 5,000-token budget)."""
    config = _config(token_budget={"per_session": 5_000, "policy": "hard_stop"})
    model = ScriptedModel([GOOD])
    client = ag.wrap(_client(model), config, clock=FakeClock())
    ask = {"model": "fast", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 1_000, "n": n}
    if refused:
        with pytest.raises(ag.BudgetExceeded):
            client.chat.completions.create(**ask)
        assert model.requests == []
    else:
        client.chat.completions.create(**ask)
        assert model.requests[0].params["n"] == n  # sent as asked


def test_a_forced_answer_is_not_judged_against_the_callers_tool_choice() -> None:
    """The caller asks for a call (``tool_choice: "required"``) and the model repeats one its
    history has answered: the guard asks for the answer from the results in hand, tools off,
    and the text that comes back is that answer, not a ``call_required`` failure to re-ask
    (the re-ask's own tool_choice rules the judgment)."""

    def repeats(request: ModelRequest) -> Reply:
        if request.params.get("tool_choice") == "none":
            return Reply.text("setup.cfg sets the package name to demo.")
        return Reply.call("read_file", {"path": "setup.cfg"}, id="c2")

    model = ScriptedModel([repeats], cycle=True)
    config = _config(tool_validation={"answered_repeats_after": 1}, escalation={"mode": "off"})
    client = ag.wrap(_client(model), config, clock=FakeClock())
    read = {"name": "read_file", "arguments": '{"path": "setup.cfg"}'}
    messages = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": read}]},
        {"role": "tool", "tool_call_id": "c1", "content": "[metadata]\nname = demo"},
    ]
    answer = client.chat.completions.create(
        model="fast", messages=messages, tools=TOOLS, tool_choice="required"
    )
    assert answer.choices[0].message.content == "setup.cfg sets the package name to demo."
    assert [r.params.get("tool_choice") for r in model.requests] == ["required", "none"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_under_tool_choice_none_a_call_written_as_text_reaches_the_caller_as_text(
    stream: bool,
) -> None:
    """``tool_choice: "none"`` (a final turn: "now answer") and a small model that writes a call
    in its text all the same: the guard turned the text into a tool call, one the caller had
    ruled out. Now the caller gets the text, as from the raw client, and nothing is re-asked."""
    text = '<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.cfg"}}\n</tool_call>'
    model = ScriptedModel([Reply.text(text)])
    client = ag.wrap(_client(model), _config(), clock=FakeClock())
    ask = {"model": "fast", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **ask))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        assert _streamed_calls(chunks) == []
    else:
        message = client.chat.completions.create(**ask).choices[0].message
        assert (message.content, message.tool_calls) == (text, None)
    assert len(model.requests) == 1


def test_under_tool_choice_none_a_native_call_is_re_asked() -> None:
    """A server that ignores ``tool_choice: "none"`` (Ollama) lets the model call a tool: the
    call is a failed answer, re-asked with the reason, and the caller gets the text."""
    model = ScriptedModel([GOOD, Reply.text("setup.cfg names the package demo.")])
    client = ag.wrap(_client(model), _config(), clock=FakeClock(), sleep=lambda _: None)
    answer = client.chat.completions.create(
        model="fast", messages=MESSAGES, tools=TOOLS, tool_choice="none"
    )
    assert answer.choices[0].message.content == "setup.cfg names the package demo."
    assert answer.choices[0].message.tool_calls is None
    assert "tool_choice is 'none'" in json.dumps(model.requests[1].messages)


# -- an error object inside a 200 answer -----------------------------------------------------------


def _error_body(code: Any) -> tuple[int, str, bytes]:
    error = {"message": "Provider returned error", "code": code, "metadata": {"raw": "overloaded"}}
    return 200, "application/json", json.dumps({"error": error}).encode()


def _healthy() -> tuple[int, str, bytes]:
    from _hostile import completion

    return 200, "application/json", json.dumps(completion(content="Hello.")).encode()


def _create(client: Any, asynchronous: bool, *, responses: bool = False) -> Any:
    """One call, chat (or Responses), sync or async."""
    if responses:
        endpoint, ask = client.responses, {"model": "small", "input": "hi"}
    else:
        endpoint = client.chat.completions
        ask = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
    if not asynchronous:
        return endpoint.create(**ask)

    async def main() -> Any:
        return await endpoint.create(**ask)

    return anyio.run(main)


def _assert_retried_then_as_it_came(
    first: Any, last: Any, *, requests: int, asynchronous: bool, responses: bool = False
) -> None:
    """The guarded call, its upstream answering ``first`` then ``last``, gets what the raw
    client gets from ``last``, after ``requests`` requests, its report attached."""
    from _hostile import RawUpstream, guarded_client, raw_client

    raw_upstream = RawUpstream([last])
    guarded_upstream = RawUpstream([first, last])
    raw = raw_client(raw_upstream, asynchronous=asynchronous)
    expected = _create(raw, asynchronous, responses=responses)
    guarded = guarded_client(guarded_upstream, asynchronous=asynchronous)
    with capture_events() as events:
        answer = _create(guarded, asynchronous, responses=responses)
    assert answer.model_dump() == expected.model_dump()
    assert len(guarded_upstream.requests) == requests
    assert ag.report_of(answer) is not None
    assert not events.of_type(ag.events.GuardInternalError)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("code", "then", "requests"),
    [
        (502, "healthy", 2),  # retried: the next answer is the caller's
        (502, "error", 2),  # retried, failed again: the last error object, as it came
        ("rate_limit_exceeded", "error", 2),
        (400, "error", 1),  # the request's own fault: not retried, handed back as it came
    ],
)
def test_an_error_object_in_a_200_answer_is_retried_then_handed_back_as_it_came(
    asynchronous: bool, code: Any, then: str, requests: int
) -> None:
    """Gateways (OpenRouter, LiteLLM's proxy) answer a provider's failure with HTTP 200 and a
    body ``{"error": {...}}``. The raw client returns that object; the guard called it an
    answer it could not read (a ``guard_internal_error``) and passed it on. Now it is retried as
    the error it reports (its ``code``: 502 a transient failure, 400 the request's own), and
    when it is the last answer the caller gets the same object as from the raw client."""
    last = _healthy() if then == "healthy" else _error_body(code)
    _assert_retried_then_as_it_came(
        _error_body(code), last, requests=requests, asynchronous=asynchronous
    )


def _failed_response(code: str) -> tuple[int, str, bytes]:
    body = {
        "id": "resp_failed",
        "object": "response",
        "created_at": 1764000000,
        "status": "failed",
        "error": {"code": code, "message": "The model failed to generate a response."},
        "incomplete_details": None,
        "model": "small",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }
    return 200, "application/json", json.dumps(body).encode()


def _completed_response() -> tuple[int, str, bytes]:
    body = {
        "id": "resp_ok",
        "object": "response",
        "created_at": 1764000000,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": "small",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
    }
    return 200, "application/json", json.dumps(body).encode()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("code", "then", "requests"),
    [
        ("server_error", "completed", 2),  # retried: the next answer is the caller's
        ("server_error", "failed", 2),  # retried, failed again: the last answer, as it came
        ("vector_store_timeout", "failed", 2),
        ("invalid_prompt", "failed", 1),  # no failure of the upstream's: not retried
    ],
)
def test_a_failed_responses_answer_is_retried_then_handed_back_as_it_came(
    asynchronous: bool, code: str, then: str, requests: int
) -> None:
    """A whole Responses API answer can be HTTP 200 with ``status: "failed"`` and an ``error``
    object (google/adk-go#1359 met it). The guard read it as an empty answer and handed it
    on after one try, while a stream's ``response.failed`` was retried. Now it is retried as
    the error it reports, and the last one reaches the caller as from the raw client."""
    last = _completed_response() if then == "completed" else _failed_response(code)
    _assert_retried_then_as_it_came(
        _failed_response(code), last, requests=requests, asynchronous=asynchronous, responses=True
    )
