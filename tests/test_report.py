"""GuardReport: attached to responses, serialisable, rendered as headers."""

from __future__ import annotations

import json

import pytest

from agentguard.escalation import Attempt
from agentguard.guard._report import GuardReport, attach_report, report_of
from agentguard.types import Usage

openai = pytest.importorskip("openai")


def _report(**kw: object) -> GuardReport:
    base: dict[str, object] = {
        "session": "s1",
        "tier": "standard",
        "model": "qwen-7b",
        "escalated_from": "fast",
        "reasons": ("server_error",),
        "attempts": (
            Attempt("fast", "qwen-0.5b", "server_error"),
            Attempt("standard", "qwen-7b", "ok"),
        ),
        "retries": 2,
        "usage": Usage(100, 20),
    }
    base.update(kw)
    return GuardReport(**base)  # type: ignore[arg-type]


def test_report_travels_with_an_openai_object_without_changing_it() -> None:
    """report_of finds the report; the SDK object's own serialisation is unchanged."""
    from openai.types.chat import ChatCompletion

    completion = ChatCompletion.model_validate(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "hi"},
                }
            ],
        }
    )
    before = completion.model_dump()
    attach_report(completion, _report())
    assert report_of(completion) == _report()
    assert completion.model_dump() == before
    assert "_agentguard" not in completion.to_json()


def test_unguarded_objects_have_no_report() -> None:
    """Anything the guard did not return has no report."""
    assert report_of(object()) is None
    assert report_of(None) is None
    attach_report(None, _report())  # harmless


def test_to_dict_is_json_ready() -> None:
    """The report serialises to JSON."""
    data = _report().to_dict()
    assert json.loads(json.dumps(data))["usage"]["total_tokens"] == 120
    assert data["attempts"][0]["outcome"] == "server_error"


def test_headers_carry_the_escalation_facts() -> None:
    """Proxies expose the report as x-agentguard-* headers."""
    headers = _report(budget="warning", memory_pressure="critical").headers()
    assert headers["x-agentguard-tier"] == "standard"
    assert headers["x-agentguard-escalated-from"] == "fast"
    assert headers["x-agentguard-escalation-reason"] == "server_error"
    assert headers["x-agentguard-retries"] == "2"
    assert headers["x-agentguard-budget-warning"] == "true"
    assert headers["x-agentguard-memory-pressure"] == "critical"


def test_quiet_report_has_few_headers() -> None:
    """A call with nothing to report only names its session, tier and counts."""
    headers = GuardReport(session="s", tier="fast").headers()
    assert set(headers) == {
        "x-agentguard-session",
        "x-agentguard-tier",
        "x-agentguard-retries",
        "x-agentguard-corrections",
        "x-agentguard-tokens",
    }
    assert not GuardReport(session="s").escalated
