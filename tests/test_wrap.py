"""agentguard.wrap(): the real openai client, guarded, over an HTTP mock (both majors)."""

from __future__ import annotations

import random
from importlib import import_module
from typing import Any

import pytest

import agentguard as ag
from _hostile import completion
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, capture_events

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
CANARY = "sk-canary-wrap-0123456789abcdef"
CONFIG = ag.GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}, "premium": {"model": "big"}},
        "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 1},
        "memory_pressure": {"enabled": False},
    },
    env={},
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "show me setup.cfg"}]


def _wrapped(model: ScriptedModel, *, asynchronous: bool = False, **kw: Any) -> Any:
    clock = FakeClock()
    if asynchronous:
        client: Any = openai.AsyncOpenAI(
            api_key=CANARY,
            base_url="http://scripted.invalid/v1",
            http_client=http.AsyncClient(transport=model.mock_transport(http)),
        )
        return ag.wrap(client, CONFIG, clock=clock, sleep=clock.asleep, rng=random.Random(0), **kw)
    client = openai.OpenAI(
        api_key=CANARY,
        base_url="http://scripted.invalid/v1",
        max_retries=4,
        http_client=http.Client(transport=model.mock_transport(http)),
    )
    return ag.wrap(client, CONFIG, clock=clock, sleep=clock.sleep, rng=random.Random(0), **kw)


def test_wrapped_client_keeps_its_class_and_copies_stay_guarded() -> None:
    """wrap() returns the client's own class; with_options() and copy() stay guarded."""
    model = ScriptedModel([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    client = _wrapped(model)
    assert isinstance(client, openai.OpenAI)
    first = client.chat.completions.create(model="fast", messages=MESSAGES)
    assert ag.report_of(first) is not None
    assert ag.report_of(
        client.with_options(timeout=5).chat.completions.create(model="fast", messages=MESSAGES)
    )
    assert ag.report_of(client.copy().chat.completions.create(model="fast", messages=MESSAGES))


def test_sdk_types_come_back_and_repairs_are_applied() -> None:
    """The caller gets a real ChatCompletion; a text-embedded call arrives as a tool call."""
    model = ScriptedModel([Reply.embedded("read_file", {"path": "setup.cfg"}, style="fenced")])
    completion = _wrapped(model).chat.completions.create(
        model="fast", messages=MESSAGES, tools=TOOLS
    )
    assert type(completion).__name__ == "ChatCompletion"
    call = completion.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("read_file", '{"path": "setup.cfg"}')
    assert completion.choices[0].finish_reason == "tool_calls"


def test_retries_are_the_guards_alone_and_escalation_works() -> None:
    """The client's own max_retries (4) is off: one guard retry per tier, then the next tier."""
    model = ScriptedModel({"small": [Fault.server_error(502)] * 3, "big": [Reply.text("rescued")]})
    completion = _wrapped(model).chat.completions.create(model="fast", messages=MESSAGES)
    assert completion.choices[0].message.content == "rescued"
    assert [r.model for r in model.requests] == ["small", "small", "big"]  # 1 retry, then move
    report = ag.report_of(completion)
    assert report is not None
    assert report.escalated_from == "fast"


def test_session_header_is_used_and_not_sent_upstream() -> None:
    """x-agentguard-session names the session (reported as such) and stays on this side."""
    model = ScriptedModel([Reply.text("ok")])
    completion = _wrapped(model).chat.completions.create(
        model="fast", messages=MESSAGES, extra_headers={"x-agentguard-session": "run-42"}
    )
    report = ag.report_of(completion)
    assert report is not None
    assert (report.session, report.session_source) == ("run-42", "header")
    assert "x-agentguard-session" not in {k.lower() for k in model.requests[0].headers}


def test_session_precedence_is_the_guards() -> None:
    """A header beats an ag.session() block, an explicit argument aside: as for Guard itself."""
    model = ScriptedModel([Reply.text("ok")], cycle=True)
    create = _wrapped(model).chat.completions.create
    header = {"x-agentguard-session": "from-header"}
    with ag.session("from-context"):
        by_header = ag.report_of(create(model="fast", messages=MESSAGES, extra_headers=header))
        by_context = ag.report_of(create(model="fast", messages=MESSAGES))
    assert (by_header.session, by_header.session_source) == ("from-header", "header")
    assert (by_context.session, by_context.session_source) == ("from-context", "context")


def test_streaming_through_the_wrapped_client() -> None:
    """stream=True yields SDK chunks; tool calls arrive whole once valid."""
    model = ScriptedModel(
        [Reply(content="Reading. ", tool_calls=Reply.call("read_file", {"path": "a"}).tool_calls)]
    )
    stream = _wrapped(model).chat.completions.create(
        model="fast", messages=MESSAGES, tools=TOOLS, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Reading. "
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "read_file"
    assert ag.report_of(stream) is not None


def test_canary_api_key_never_appears_in_events_or_reports() -> None:
    """The client's API key is in no event, report or error text."""
    model = ScriptedModel([Fault.server_error(500)], cycle=True)
    client = _wrapped(model)
    with capture_events() as events, pytest.raises(ag.TiersExhausted) as info:
        client.chat.completions.create(model="fast", messages=MESSAGES)
    assert CANARY not in str(info.value)
    assert all(CANARY not in str(e.to_dict()) for e in events)


@pytest.mark.anyio
async def test_async_client() -> None:
    """AsyncOpenAI is guarded the same way."""
    model = ScriptedModel([Fault.rate_limit(retry_after=1), Reply.text("async ok")])
    client = _wrapped(model, asynchronous=True)
    assert isinstance(client, openai.AsyncOpenAI)
    completion = await client.chat.completions.create(model="fast", messages=MESSAGES)
    assert completion.choices[0].message.content == "async ok"
    report = ag.report_of(completion)
    assert report is not None
    assert report.retries == 1


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("https://premium.invalid/v1", "Bearer agentguard-tier-without-key"),
        ("http://local.invalid/other/v1", f"Bearer {CANARY}"),  # the client's own origin
    ],
    ids=["elsewhere", "same-origin"],
)
def test_a_tier_elsewhere_never_gets_the_clients_key(base_url: str, expected: str) -> None:
    """The client's key was given for the client's endpoint: a tier at another origin that names
    no key of its own is sent a placeholder, not the client's key; one at the client's origin
    gets the client's key, as before."""
    seen: list[tuple[str, str]] = []
    answer = completion(content="ok")

    def upstream(request: Any) -> Any:
        seen.append((str(request.url), request.headers.get("authorization", "")))
        if str(request.url).startswith("http://local.invalid/v1/"):
            return http.Response(503, json={"error": {"message": "down", "type": "server_error"}})
        return http.Response(200, json=answer)

    config = ag.GuardConfig.from_dict(
        {
            "tiers": {
                "fast": {"model": "small"},
                "premium": {"model": "big", "base_url": base_url},
            },
            "escalation": {"chain": ["fast", "premium"], "max_retries_before_escalate": 0},
            "memory_pressure": {"enabled": False},
        },
        env={},
    )
    raw = openai.OpenAI(
        api_key=CANARY,
        base_url="http://local.invalid/v1",
        http_client=http.Client(transport=http.MockTransport(upstream)),
    )
    clock = FakeClock()
    client = ag.wrap(raw, config, clock=clock, sleep=clock.sleep, rng=random.Random(0))
    answer_got = client.chat.completions.create(model="fast", messages=MESSAGES)
    assert answer_got.choices[0].message.content == "ok"
    assert seen[0] == ("http://local.invalid/v1/chat/completions", f"Bearer {CANARY}")
    assert seen[-1] == (base_url + "/chat/completions", expected)
