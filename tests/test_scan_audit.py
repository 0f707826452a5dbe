"""The audit behind ``agentguard scan``: schema checks as the live guard makes them, the step
and action of each finding, the tokens and money it burnt, per-tool tallies, the context the
HTML report shows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentguard.budget import PriceTable
from agentguard.cli._audit import SessionAudit
from agentguard.cli._findings import Issue
from agentguard.config import GuardConfig
from agentguard.types import Severity
from agentguard.validation import ToolCallValidator

CONFIG = GuardConfig.from_dict({}, env={})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "properties": {
                    "flight": {"type": "string"},
                    "seats": {"type": "integer"},
                    "cabin": {"type": "string", "enum": ["economy", "business"]},
                },
                "required": ["flight", "seats"],
                "additionalProperties": False,
            },
        },
    }
]


def call(i: int, name: str, args: Any, content: str | None = None) -> dict[str, Any]:
    """An assistant message with one tool call (``args`` JSON-encoded unless text)."""
    text = args if isinstance(args, str) else json.dumps(args)
    fn = {"name": name, "arguments": text}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": f"c{i}", "function": fn}],
    }


def result(i: int, content: str) -> dict[str, Any]:
    """The result of call ``i``."""
    return {"role": "tool", "tool_call_id": f"c{i}", "content": content}


def audit_of(messages: list[dict[str, Any]], config: GuardConfig = CONFIG, **kw: Any
             ) -> SessionAudit:  # fmt: skip
    """The finished audit of ``messages`` with :data:`TOOLS` declared."""
    audit = SessionAudit("s", config, **kw)
    audit.declare(TOOLS)
    for m in messages:
        audit.feed(m)
    audit.finish()
    return audit


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ({"flight": "HAT030"}, "missing_required"),
        ({"flight": "HAT030", "seats": "two"}, "type_mismatch"),
        ({"flight": "HAT030", "seats": 2, "cabin": "first"}, "schema_violation"),
        ({"flight": "HAT030", "seats": 2, "meal": "veg"}, "unexpected_argument"),
        ({"flight": "<flight>", "seats": 2}, "placeholder_argument"),
        ('{"flight": "HAT030", "seats": 2', None),  # repaired by the guard, see below
    ],
)
def test_schema_checks_are_the_live_validators(args: Any, kind: str | None) -> None:
    """Each call is checked by the guard's own validator: the scan reports exactly the errors
    the live guard would have sent back, with a corrective re-ask (recovery) as its action."""
    message = call(0, "book", args)
    live = ToolCallValidator(TOOLS, CONFIG).validate(message)
    audit = audit_of([{"role": "user", "content": "book it"}, message])
    errors = [i for i in audit.issues if i.action == "recovery"]
    assert [i.detector for i in errors] == [e.kind for e in live.errors]
    if kind is None:  # broken JSON the guard mends: a repair, no re-ask, nothing burnt
        assert live.ok
        assert [(i.detector, i.action, i.tokens) for i in audit.issues] == [
            ("invalid_json", "repair", 0)
        ]
    else:
        assert kind in [e.kind for e in live.errors]
        assert all(i.step == 1 and i.tool == "book" for i in errors)
        assert all(i.tokens > 0 for i in errors)  # the call must be made again


def test_one_tool_it_cannot_read_leaves_the_others_checked() -> None:
    """A trace declaring one tool whose schema is not valid JSON Schema had every call checked
    by name only; now that tool's calls are read as JSON objects and the others' by their
    schemas, as the live guard reads such a request."""
    typo = {"type": "function", "function": {"name": "note", "parameters": {"type": "strng"}}}
    audit = SessionAudit("s", CONFIG)
    audit.declare([*TOOLS, typo])
    for m in [call(0, "book", {"flight": "HAT030", "seats": "two"}), call(1, "note", {"a": 1})]:
        audit.feed(m)
    audit.finish()
    assert [(i.detector, i.tool) for i in audit.issues] == [("type_mismatch", "book")]


def test_a_valid_call_is_no_finding() -> None:
    """A call the schema accepts, and a lossless coercion ("2" for 2), are no findings."""
    audit = audit_of([call(0, "book", {"flight": "HAT030", "seats": "2"}), result(0, "ok")])
    assert audit.issues == []
    assert audit.tools["book"].calls == 1


def test_unknown_names_against_declared_tools_are_critical() -> None:
    """A name no declared tool has is CRITICAL, as the guard's validator reports it."""
    audit = audit_of([call(0, "book_flight_now", {"flight": "X"})])
    ((detector, severity),) = [(i.detector, i.severity) for i in audit.issues]
    assert (detector, severity) == ("unknown_tool", Severity.CRITICAL)


def test_unusable_tool_definitions_fall_back_to_name_checks() -> None:
    """A definition the validator refuses still declares its name (fail open, never crash)."""
    audit = SessionAudit("s", CONFIG)
    audit.declare([{"type": "function", "function": {"name": "book", "parameters": 5}}])
    audit.feed(call(0, "bok", {}))
    audit.finish()
    assert [i.detector for i in audit.issues] == ["unknown_tool"]


def polling(n: int) -> list[dict[str, Any]]:
    """An agent polling a failed build ``n`` times."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "is build 7 fixed?"}]
    for i in range(n):
        out += [call(i, "get_build", {"id": 7}), result(i, '{"status": "failed"}')]
    return out


def test_loop_findings_carry_step_action_and_what_they_burnt() -> None:
    """A loop: the step the guard judges it at, what it does there, the rungs of its recovery
    ladder from the next request on (hint first), and the tokens and money of the model calls
    in the loop, priced by the table."""
    prices = PriceTable({"gpt-4o": (2.5, 10.0)})
    audit = SessionAudit("s", CONFIG, prices=prices)
    for m in polling(12):
        if m["role"] == "assistant":
            audit.feed(m, tokens=1000, model="gpt-4o-2024-08-06", prompt_tokens=900)
        else:
            audit.feed(m)
    audit.finish()
    loops = [i for i in audit.issues if i.category == "loop"]
    assert loops
    first = loops[0]
    # found on an answer below BREAK: the answer passes, with a warning in the guard's report
    assert first.action in ("warn", "hint")
    step, action, detector = audit.first_action() or (0, "", "")
    assert (action, detector) == ("hint", first.detector)
    assert step == first.step + (first.action == "warn")  # the next request gets the hint
    rungs = [a for _, a, _ in audit.ladder.acts]
    assert rungs[:4] == ["hint", "summary", "prune", "force"]  # one rung per looping request
    # the guard judges a result in the next call: a finding on a result is one step later
    role = "assistant" if first.index % 2 == 1 else "tool"
    steps_before = (first.index + 1) // 2
    assert first.step == (steps_before if role == "assistant" else steps_before + 1)
    assert sum(i.tokens for i in loops) == audit.loop_tokens
    per_call = prices.cost("gpt-4o", 900, 100)
    assert sum(i.cost for i in loops) == pytest.approx(per_call * audit.loop_tokens / 1000)
    assert audit.cost == pytest.approx(12 * per_call)
    stats = audit.tools["get_build"]
    assert (stats.calls, stats.findings, stats.tokens) == (12, len(loops), audit.loop_tokens)


@pytest.mark.parametrize(
    ("config", "action"),
    [
        ({}, "stop"),  # no tiers: nowhere to go
        (
            {
                "tiers": {"fast": {"model": "small"}, "strong": {"model": "large"}},
                "escalation": {"chain": ["fast", "strong"]},
            },
            "escalate",
        ),
        (
            {
                "tiers": {"fast": {"model": "small"}, "strong": {"model": "large"}},
                "escalation": {"chain": ["fast", "strong"], "escalate_on": ["server_error"]},
            },
            "stop",
        ),
    ],
)
def test_the_escalate_rung_escalates_or_stops_as_the_configured_policy_would(
    config: dict[str, Any], action: str
) -> None:
    """The ladder's escalate rung moves the request to a stronger tier when one takes the
    trigger ``loop_detected``, else stops the run: the scan asks the same EscalationPolicy."""
    cfg = GuardConfig.from_dict(config, env={})
    audit = SessionAudit("s", cfg)
    for m in polling(30):
        audit.feed(m, model="small" if m["role"] == "assistant" else None)
    audit.finish()
    taken = audit.ladder.taken
    acts = audit.ladder.acts
    assert [r for _, r in taken][:5] == ["hint", "summary", "prune", "force", "escalate"]
    assert acts[4][1] == action
    assert any(i.severity == Severity.BREAK for i in audit.issues)


def test_without_a_tool_list_business_errors_are_no_hallucination() -> None:
    """No tools declared: a tool whose every call failed with a business error is real; its
    failed results are counted per tool."""
    audit = SessionAudit("s", CONFIG)
    for i in range(3):
        audit.feed(call(i, "reserve", {"seat": f"{i}A"}))
        audit.feed(result(i, f"Error: seat {i}A is taken"))
    audit.finish()
    assert [i for i in audit.issues if i.category == "tool_call"] == []
    assert audit.tools["reserve"].errors == 3


def test_context_around_findings_is_kept_for_the_report_only() -> None:
    """With a timeline (HTML), each finding keeps the messages before and after it, shortened;
    without, nothing is kept."""
    messages = polling(8)
    messages[1]["content"] = "x" * 5000
    with_html = audit_of(messages, timeline=bytearray())
    first = with_html.issues[0]
    indexes = [n for n, _, _ in first.context]
    assert indexes == list(range(max(0, first.index - 3), first.index + 3))
    assert all(len(text) <= 402 for _, _, text in first.context)
    assert any("get_build" in text for _, _, text in first.context)
    assert audit_of(messages).issues[0].context == ()


def test_context_never_shows_a_secret() -> None:
    """A key in a call's arguments or a result is redacted in the report's context."""
    key = "sk-proj-" + "a1B2c3D4" * 5
    messages = polling(6)
    messages[3]["content"] = f"Error: rejected key {key}"
    audit = audit_of(messages, timeline=bytearray())
    texts = " ".join(text for i in audit.issues for _, _, text in i.context)
    assert "rejected key" in texts
    assert key not in texts


def test_per_tool_tallies_are_bounded() -> None:
    """A trace naming more tools than the bound tallies the rest under one name."""
    from agentguard.cli._calls import _MAX_NAMES, OTHER_TOOLS

    audit = SessionAudit("s", CONFIG)
    for i in range(_MAX_NAMES + 50):
        audit.feed(call(i, f"tool_{i}", {}))
    audit.finish()
    assert len(audit.tools) == _MAX_NAMES + 1
    assert audit.tools[OTHER_TOOLS].calls == 50


def test_a_settled_finding_keeps_every_field_as_replace_would() -> None:
    """The audit settles a finding at the end of its trace (what it burnt, its context, the
    guard's action) by ``make_issue``, not ``_replace``: no field is dropped, whatever fields
    the finding gains."""
    audit = SessionAudit("s", CONFIG, bytearray())
    for m in polling(12):
        audit.feed(m)
    found = list(audit.issues)
    audit.finish()
    assert found, "the polls must make a finding to settle"
    for before, after in zip(found, audit.issues, strict=True):
        settled = before._replace(action=after.action, tokens=after.tokens, cost=after.cost,
                                  context=after.context)  # fmt: skip
        assert after == settled
        assert type(after) is Issue
    assert any(i.tokens for i in audit.issues)
    assert any(i.context for i in audit.issues)
    assert len(Issue._fields) == 12  # a new field must be passed on by every make_issue call


@pytest.mark.parametrize("declared", [True, False], ids=["tools declared", "no tool list"])
def test_a_run_fed_at_once_is_audited_as_message_by_message(declared: bool) -> None:
    """``feed_run`` (a transcript's messages in one loop) gives the audit ``feed`` of each
    message gives: findings, steps, actions, tokens, money, timeline and context."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "book me a flight"}]
    for i in range(9):  # a stalled poll, bad calls among them, then repeated answers
        args = '{"flight": "LH1", "seats": "two"' if i == 3 else {"flight": "LH1", "seats": 2}
        messages += [call(i, "book" if i != 5 else "bok", args), result(i, "Error: sold out")]
    messages += [{"role": "assistant", "content": "I cannot book it."}] * 6
    prices = PriceTable({"*": (1.0, 2.0)})
    audits = []
    for whole in (False, True):
        audit = SessionAudit("s", CONFIG, bytearray(), prices)
        if declared:
            audit.declare(TOOLS)
        if whole:
            audit.feed_run(messages)
        else:
            for message in messages:
                audit.feed(message)
        audit.finish()
        audits.append(audit)
    one, run = audits
    assert run.issues, "the transcript must have findings to compare"
    assert run.to_dict() == one.to_dict()
    assert run.issues == one.issues  # their context included
    assert run.timeline == one.timeline


def test_a_result_the_loop_detectors_judged_is_not_judged_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether a tool result failed is decided once, by the loop detectors; the tool-call
    checks take their verdict (and judge only a result the detectors could not: no tool name
    of theirs)."""
    from agentguard.cli import _calls

    judged: list[Any] = []

    def counted(content: Any) -> bool:
        judged.append(content)
        return content.startswith("Error")

    monkeypatch.setattr(_calls, "is_error_result", counted)
    audit = SessionAudit("s", CONFIG)
    audit.feed(call(0, "reserve", {"seat": "1A"}))
    audit.feed(result(0, "Error: seat 1A is taken"))
    audit.feed(call(1, "reserve", {"seat": "2A"}))
    audit.feed(result(1, "reserved"))
    assert judged == []
    # detection off: the detectors judge no result, the checks do
    off = GuardConfig.from_dict({"loop_detection": {"enabled": False}}, env={})
    audit = SessionAudit("s", off)
    audit.feed(call(0, "reserve", {"seat": "1A"}))
    audit.feed(result(0, "Error: seat 1A is taken"))
    assert judged == ["Error: seat 1A is taken"]
    audit.finish()
    assert audit.tools["reserve"].errors == 1
