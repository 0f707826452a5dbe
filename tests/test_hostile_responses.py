"""Hostile battery: response bodies the raw openai client accepts, through the guarded client.

Property: whatever the raw client does with a body (returns, or raises its own exception), the
guarded client returns an answer or raises an ``AgentGuardError`` or that same SDK exception.
An upstream error body echoing a secret never puts the secret in anything the guard shows.
"""

from __future__ import annotations

import json
import logging
import warnings
from typing import Any

import anyio
import pytest
from hypothesis import given

import agentguard as ag
from _hostile import (
    CANARY,
    MESSAGES,
    TOOLS,
    Outcome,
    RawUpstream,
    assert_no_canary,
    assert_typed,
    bulk,
    call,
    cases,
    completion,
    deep_json,
    encode,
    guarded_client,
    hostile_bodies,
    outcome,
    rand_body,
    raw_client,
    sane_bodies,
    seeds,
)
from agentguard.testing import capture_events

JSON = "application/json"


def _both(body: bytes, *, status: int = 200, tools: bool = True) -> tuple[Outcome, Outcome]:
    kwargs: dict[str, Any] = {"model": "fast", "messages": MESSAGES}
    if tools:
        kwargs["tools"] = TOOLS
    raw = raw_client(RawUpstream([(status, JSON, body)]))
    guarded = guarded_client(RawUpstream([(status, JSON, body)]))
    return (
        outcome(lambda: raw.chat.completions.create(**kwargs)),
        outcome(lambda: guarded.chat.completions.create(**kwargs)),
    )


def _both_async(body: bytes) -> tuple[Outcome, Outcome]:
    kwargs: dict[str, Any] = {"model": "fast", "messages": MESSAGES, "tools": TOOLS}

    async def run(client: Any) -> Any:
        return await client.chat.completions.create(**kwargs)

    raw = raw_client(RawUpstream([(200, JSON, body)]), asynchronous=True)
    guarded = guarded_client(RawUpstream([(200, JSON, body)]), asynchronous=True)
    return (
        outcome(lambda: anyio.run(run, raw)),
        outcome(lambda: anyio.run(run, guarded)),
    )


@cases(300)
@given(body=sane_bodies)
def test_odd_but_typed_bodies_end_in_an_answer_or_a_typed_error(body: Any) -> None:
    """Typed fields with odd values (reused ids, empty content, bad calls): no untyped error."""
    raw, guarded = _both(encode(body))
    assert_typed(guarded, raw)
    if raw.error is None and guarded.error is None:
        assert type(guarded.value) is type(raw.value)


@cases(100)
@given(body=sane_bodies)
def test_odd_but_typed_bodies_through_the_async_client(body: Any) -> None:
    """The same property through ``AsyncOpenAI``."""
    raw, guarded = _both_async(encode(body))
    assert_typed(guarded, raw)


@cases(60)
@given(seed=seeds)
def test_bulk_bodies_end_in_an_answer_or_a_typed_error(seed: int) -> None:
    """10 generated bodies per seed (600 in all) through the raw and the guarded client."""

    def check(body: dict[str, Any]) -> None:
        raw, guarded = _both(encode(body))
        assert_typed(guarded, raw)

    bulk(seed, 10, rand_body, check)


@cases(300)
@given(body=hostile_bodies)
def test_every_body_the_sdk_accepts_ends_in_an_answer_or_a_typed_error(body: Any) -> None:
    """Every shape, hostile ones included; the classes it finds today are pinned below."""
    raw, guarded = _both(encode(body))
    assert_typed(guarded, raw)


def _surrogate_name() -> bytes:
    # a lone surrogate, escaped as JSON allows; the SDK decodes it into a str, and the guard's
    # correction re-sends it: the SDK cannot encode that request
    return encode(completion(content=None, tool_calls=[call("\ud800x", "{}")]))


# Minimal reproductions of the classes the generative test found, one per class.
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(encode(completion(usage="lots")), id="usage-as-string"),
        pytest.param(
            encode(completion(usage={"prompt_tokens": float("inf"), "completion_tokens": 1})),
            id="usage-infinity",
        ),
        pytest.param(
            encode(completion(usage={"prompt_tokens": float("nan"), "completion_tokens": 1})),
            id="usage-nan",
        ),
        pytest.param(encode(completion(choices={"a": 1})), id="choices-object"),
        pytest.param(encode(completion(choices=[None])), id="choices-[null]"),
        pytest.param(encode(completion(message=None)), id="message-null"),
        pytest.param(_surrogate_name(), id="lone-surrogate-in-name"),
        pytest.param(
            encode(completion(content="\ud800", tool_calls=[call("wipe", "{}")])),
            id="lone-surrogate-in-content",
        ),
        pytest.param(b"null", id="null-body"),
        pytest.param(b"[1, 2]", id="array-body"),
        pytest.param(encode(completion(content=None, usage=None)), id="no-usage-no-content"),
        pytest.param(b"{}", id="empty-object"),
    ],
)
def test_body_shapes_the_sdk_accepts(body: bytes) -> None:
    """Each shape: the raw client returns; the guarded one must not raise untyped."""
    raw, guarded = _both(body)
    assert raw.error is None, raw
    assert_typed(guarded, raw)


def test_a_custom_tool_call_is_not_reported_as_a_nameless_function() -> None:
    """A ``custom`` tool call (openai's non-function tool type) is never a call named ''."""
    body = encode(
        completion(
            content=None,
            finish="tool_calls",
            tool_calls=[{"id": "c1", "type": "custom", "custom": {"name": "grep", "input": "x"}}],
        )
    )
    raw, guarded = _both(body)
    assert raw.error is None
    assert guarded.error is None or "named ''" not in str(guarded.error), guarded


TWO_TIERS = ag.GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}, "big": {"model": "large"}},
        "escalation": {"chain": ["fast", "big"], "max_retries_before_escalate": 1},
        "memory_pressure": {"enabled": False},
    },
    env={},
)


@pytest.mark.parametrize("status", [400, 401, 404, 422, 429, 500, 503])
def test_an_error_body_echoing_the_key_leaks_it_nowhere(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """An upstream echoing the caller's (non-``sk-``) key in its error: the guard never repeats it.

    A client error passes through as the SDK's own exception (its text is the SDK's); whatever
    the guard itself builds (its errors, their attempts, reports, events, logs) is redacted.
    """
    body = json.dumps(
        {"error": {"message": f"invalid api key {CANARY}", "type": "invalid_request_error"}}
    ).encode()
    raw = raw_client(RawUpstream([(status, JSON, body)]))
    client = guarded_client(RawUpstream([(status, JSON, body)]), TWO_TIERS)
    create: dict[str, Any] = {"model": "fast", "messages": MESSAGES, "tools": TOOLS}
    caplog.set_level(logging.DEBUG, logger="agentguard")
    with capture_events() as events:
        got = outcome(lambda: client.chat.completions.create(**create))
    assert got.error is not None
    assert_typed(got, outcome(lambda: raw.chat.completions.create(**create)))
    shown: list[Any] = [caplog.text, [repr(e) for e in events]]
    if isinstance(got.error, ag.AgentGuardError):
        shown += [got.error, getattr(got.error, "attempts", None), ag.report_of(got.error)]
    assert_no_canary(*shown)


def test_arguments_nested_deeply_in_a_response_get_a_correction() -> None:
    """Arguments nested 1,000 levels: the raw client returns; the guarded one does not crash."""
    args = deep_json(1_000, "dict")
    body = encode(
        completion(content=None, finish="tool_calls", tool_calls=[call("read_file", args)])
    )
    raw, guarded = _both(body)
    assert raw.error is None
    assert_typed(guarded, raw)


def _guarded(*bodies: bytes, **create: Any) -> tuple[RawUpstream, Outcome]:
    upstream = RawUpstream([(200, JSON, b) for b in bodies])
    client = guarded_client(upstream)
    kwargs: dict[str, Any] = {"model": "fast", "messages": MESSAGES, "tools": TOOLS, **create}
    return upstream, outcome(lambda: client.chat.completions.create(**kwargs))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(encode(completion(message=None)), id="message-null"),
        pytest.param(encode(completion(choices=[None])), id="choices-[null]"),
        pytest.param(encode(completion(choices={"a": 1})), id="choices-object"),
        pytest.param(encode(completion(choices=[])), id="choices-empty"),
    ],
)
def test_an_answer_without_a_readable_message_fails_open_unchanged(body: bytes) -> None:
    """Nothing the guard can judge: the SDK's own object, as the raw client returns it, the
    report marked ``fail_open`` (and one upstream call: nothing was re-asked)."""
    raw, _ = _both(body)
    with capture_events() as events:
        upstream, guarded = _guarded(body)
    assert guarded.error is None, guarded
    assert type(guarded.value) is type(raw.value)
    assert guarded.value.model_dump(warnings=False) == raw.value.model_dump(warnings=False)
    report = ag.report_of(guarded.value)
    assert report is not None
    assert report.fail_open
    assert len(upstream.requests) == 1
    assert any(e.kind == "guard_internal_error" for e in events)


@pytest.mark.parametrize("body", [b"null", b"[1, 2]"])
def test_a_body_that_is_no_object_comes_back_as_the_sdk_made_it(body: bytes) -> None:
    """A null or array body: the SDK hands back ``None`` / a list; so does the guarded client."""
    raw, guarded = _both(body)
    assert guarded.error is None, guarded
    assert guarded.value == raw.value


@pytest.mark.parametrize("usage", ["lots", float("inf"), float("nan"), -5, True])
def test_usage_that_is_not_a_count_is_estimated(usage: Any) -> None:
    """Usage the upstream reports as a string, ``Infinity``, ``NaN``, a negative number: no
    usage, so the guard estimates it (never a crash, never a negative or infinite count)."""
    body = encode(completion(usage={"prompt_tokens": usage, "completion_tokens": 1}))
    _, guarded = _guarded(body)
    assert guarded.error is None, guarded
    report = ag.report_of(guarded.value)
    assert report is not None
    assert not report.fail_open
    assert report.usage.estimated
    assert report.usage.prompt_tokens >= 0


def test_a_custom_tool_call_passes_through_untouched() -> None:
    """A ``custom`` tool call is not the guard's to judge: the answer comes back as sent, with
    no correction; a function call beside it is still validated and repaired."""
    custom = {"id": "c1", "type": "custom", "custom": {"name": "grep", "input": "x"}}
    body = encode(completion(content=None, finish="tool_calls", tool_calls=[custom]))
    upstream, guarded = _guarded(body)
    assert guarded.error is None, guarded
    assert len(upstream.requests) == 1
    (only,) = guarded.value.choices[0].message.tool_calls
    assert only.type == "custom"
    assert only.custom.name == "grep"
    repairable = call("read_file", "{'path': 'a',}")
    body = encode(completion(content=None, finish="tool_calls", tool_calls=[repairable, custom]))
    upstream, guarded = _guarded(body)
    assert guarded.error is None, guarded
    calls = guarded.value.choices[0].message.tool_calls
    assert [c.type for c in calls] == ["function", "custom"]
    assert json.loads(calls[0].function.arguments) == {"path": "a"}
    assert calls[1].custom.input == "x"


def test_a_lone_surrogate_is_replaced_in_the_correction_that_re_sends_it() -> None:
    """An answer's lone surrogate (a tool name, content) is re-sent as U+FFFD in the correction:
    the request is one the SDK can encode; the caller's own messages go out as given."""
    bad = encode(completion(content="\ud800", tool_calls=[call("\ud800x", "{}")]))
    good = encode(completion(content=None, tool_calls=[call("read_file", '{"path": "a"}')]))
    upstream, guarded = _guarded(bad, good)
    assert guarded.error is None, guarded
    assert len(upstream.requests) == 2
    resent = json.dumps(upstream.requests[1]["messages"][len(MESSAGES) :], ensure_ascii=False)
    assert "\ufffd" in resent
    assert "\ud800" not in resent
    assert upstream.requests[1]["messages"][: len(MESSAGES)] == MESSAGES


def test_odd_shapes_raise_no_pydantic_serializer_warnings() -> None:
    """Reading (and rebuilding, after a repair) an answer with odd field types warns nothing."""
    odd = completion(content=None, finish="tool_calls", usage="lots")
    odd["choices"][0]["message"]["tool_calls"] = [call("read_file", "{'path': 'a',}")]
    odd["system_fingerprint"] = 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, guarded = _guarded(encode(odd))
    assert guarded.error is None, guarded
    assert ag.report_of(guarded.value).repairs  # type: ignore[union-attr]


@pytest.mark.parametrize("missing", ["model", "messages"])
def test_a_call_without_model_or_messages_raises_the_sdks_type_error(missing: str) -> None:
    """The SDK's own ``TypeError`` (as the raw client raises it), before anything is sent."""
    kwargs: dict[str, Any] = {"model": "fast", "messages": MESSAGES}
    del kwargs[missing]
    upstream = RawUpstream([(200, JSON, encode(completion()))])
    client = guarded_client(upstream)
    with pytest.raises(TypeError, match=missing):
        client.chat.completions.create(**kwargs)
    assert upstream.requests == []


def test_messages_that_are_no_list_go_upstream_unguarded_as_sent() -> None:
    """``messages`` the guard cannot read (a number): sent as the raw client sends it, the
    report marked ``fail_open``."""
    upstream, guarded = _guarded(encode(completion()), messages=1.5)
    assert guarded.error is None, guarded
    assert upstream.requests[0]["messages"] == 1.5
    report = ag.report_of(guarded.value)
    assert report is not None
    assert report.fail_open


def test_the_async_client_fails_open_alike() -> None:
    """``AsyncOpenAI``: an answer without a readable message and a request whose ``messages``
    is no list both come back unguarded, the report marked ``fail_open``."""

    async def run(create: dict[str, Any]) -> Any:
        client = guarded_client(
            RawUpstream([(200, JSON, encode(completion(message=None)))]), asynchronous=True
        )
        return await client.chat.completions.create(model="fast", **create)

    for create in ({"messages": MESSAGES, "tools": TOOLS}, {"messages": 1.5}):
        got = outcome(lambda create=create: anyio.run(run, create))  # type: ignore[misc]
        assert got.error is None, got
        report = ag.report_of(got.value)
        assert report is not None
        assert report.fail_open


def _response_body(**fields: Any) -> bytes:
    return json.dumps({"id": "resp_1", "object": "response", **fields}).encode()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"null", id="null-body"),
        pytest.param(b"[1]", id="array-body"),
        pytest.param(_response_body(output={"a": 1}), id="output-an-object"),
        pytest.param(_response_body(output=5), id="output-a-number"),
        pytest.param(_response_body(output=[None]), id="output-[null]"),
        pytest.param(_response_body(output=[], usage="lots"), id="usage-as-string"),
        pytest.param(_response_body(output=[], usage={"input_tokens": -3}), id="usage-negative"),
        pytest.param(_response_body(output=[], incomplete_details="x"), id="details-a-string"),
    ],
)
def test_responses_api_shapes_the_sdk_accepts(body: bytes) -> None:
    """``responses.create``: what the raw client returns, the guarded one returns too."""
    raw_upstream = RawUpstream([(200, JSON, body)])
    guarded_upstream = RawUpstream([(200, JSON, body)])
    raw = outcome(lambda: raw_client(raw_upstream).responses.create(model="fast", input="hi"))
    client = guarded_client(guarded_upstream)
    guarded = outcome(lambda: client.responses.create(model="fast", input="hi"))
    assert raw.error is None, raw
    assert guarded.error is None, guarded
    assert type(guarded.value) is type(raw.value)


def test_an_answer_with_odd_field_types_comes_back_unchanged() -> None:
    """A valid answer whose ``finish_reason``, ``id`` and ``model`` are not text: the guard
    changes nothing, so the caller gets the SDK's own object (not a rebuilt one)."""
    body = completion(content="fine", finish=5, rid=7)
    body["model"] = ["x"]
    raw, _ = _both(encode(body))
    _upstream, guarded = _guarded(encode(body))
    assert guarded.error is None, guarded
    assert guarded.value.model_dump(warnings=False) == raw.value.model_dump(warnings=False)
    report = ag.report_of(guarded.value)
    assert report is not None
    assert not report.fail_open
