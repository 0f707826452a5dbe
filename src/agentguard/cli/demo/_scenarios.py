"""The demo's scenarios: one failure mode each, injected into the same small task.

Each scenario is a script for :class:`~agentguard.testing.ScriptedModel` per model tier, plus
the configuration it runs under. A step passed through ``inject`` is a fault: the agent reports
it on the timeline the moment the model serves it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentguard.testing import Fault, Reply, Step

__all__ = ["FAST", "PREMIUM", "SCENARIOS", "STANDARD", "Inject", "Scenario", "base_config"]

FAST, STANDARD, PREMIUM = "qwen2.5-coder-0.5b", "llama-3.1-8b", "gpt-4o"
SUMMARY = (
    "# Summary of May's meetings\n\n"
    "## Decisions\n"
    "- Ship the CSV export behind a feature flag.\n"
    "- Drop the legacy XML endpoint in June.\n"
    "- Pair on every on-call handover.\n\n"
    "## Open action items\n"
    "- Ana: fix the flaky upload test (AG-12); load-test the export (AG-14).\n"
    "- Raj: ask the data team for the export schema.\n"
    "- Mei: announce the XML deprecation (AG-13).\n"
)
DONE = "summary.md is written: 3 decisions and 4 open action items, with owners."


def base_config() -> dict[str, Any]:
    """The configuration every scenario starts from (three tiers, prices, tight retries)."""
    return {
        "tiers": {
            "fast": {"model": FAST},
            "standard": {"model": STANDARD},
            "premium": {"model": PREMIUM},
        },
        "escalation": {"chain": ["fast", "standard", "premium"], "max_retries_before_escalate": 1},
        "tool_validation": {"side_effecting": ["write_file"]},
        "token_budget": {
            "max_output_tokens": 1024,
            "prices": {
                FAST: {"input": 0.0, "output": 0.0},  # local: free
                STANDARD: {"input": 0.05, "output": 0.08},
                PREMIUM: {"input": 2.5, "output": 10.0},
            },
        },
        "memory_pressure": {"enabled": False},  # the demo must not depend on this host
    }


#: Wraps a faulty step so the agent can announce it when the model serves it.
Inject = Callable[[str, "Reply | Fault"], Step]


_ids = itertools.count(1)


def _call(name: str, arguments: Mapping[str, Any] | str) -> Reply:
    return Reply.call(name, arguments, id=f"call_{next(_ids)}")


def _list(directory: str = "notes") -> Reply:
    return _call("list_files", {"directory": directory})


def _read(path: str) -> Reply:
    return _call("read_file", {"path": path})


def _write() -> Reply:
    return _call("write_file", {"path": "summary.md", "content": SUMMARY})


def _done() -> Reply:
    return Reply.text(DONE)


def _task_after_reading() -> list[Step]:
    return [_read("notes/retro.md"), _write(), _done()]


@dataclass(frozen=True)
class Scenario:
    """One failure mode injected into the task.

    Attributes:
        name: the ``--scenario`` name.
        title: what goes wrong, in a few words.
        expect: what the guard should do about it.
        script: given the injector, per model, the steps (a fresh script per run).
        config: overrides merged into :func:`base_config`.
        tickets: the ticket tracker's plan (``"ok"`` / ``"timeout"`` per request).
    """

    name: str
    title: str
    expect: str
    script: Callable[[Inject], Mapping[str, Sequence[Step]]]
    config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tickets: tuple[str, ...] = ()


def _malformed(inject: Inject) -> Mapping[str, Sequence[Step]]:
    return {
        FAST: [
            _list(),
            inject(
                "truncated JSON arguments",
                _call("read_file", '{"path": "notes/standup.md"'),
            ),
            _read("notes/planning.md"),
            inject(
                "write_file without its required 'content'",
                _call("write_file", {"path": "summary.md"}),
            ),
            *_task_after_reading(),
        ]
    }


def _hallucinated(inject: Inject) -> Mapping[str, Sequence[Step]]:
    return {
        FAST: [
            _list(),
            inject(
                "invented tool 'read_text_file'",
                _call("read_text_file", {"path": "notes/standup.md"}),
            ),
            _read("notes/planning.md"),
            inject(
                "invented tool 'save_file' (side-effecting: never guessed)",
                _call("save_file", {"path": "summary.md", "content": SUMMARY}),
            ),
            *_task_after_reading(),
        ]
    }


def _text_call(inject: Inject) -> Mapping[str, Sequence[Step]]:
    return {
        FAST: [
            inject(
                "tool call written as <tool_call> text",
                Reply.embedded("list_files", {"directory": "notes"}, style="hermes"),
            ),
            inject(
                "tool call in a ```json fence",
                Reply.embedded("read_file", {"path": "notes/standup.md"}, style="fenced"),
            ),
            _read("notes/planning.md"),
            *_task_after_reading(),
        ]
    }


def _tool_loop(inject: Inject) -> Mapping[str, Sequence[Step]]:
    loop = [inject("the same list_files call again", _list()) for _ in range(6)]
    return {
        FAST: [_list(), *loop, _read("notes/planning.md"), *_task_after_reading()],
        STANDARD: [_read("notes/standup.md")],
    }


def _repeated(inject: Inject) -> Mapping[str, Sequence[Step]]:
    again = "I will now write the summary to summary.md."
    return {
        FAST: [
            _list(),
            _read("notes/standup.md"),
            _read("notes/planning.md"),
            _read("notes/retro.md"),
            *[inject("the same answer again, no tool call", Reply.text(again)) for _ in range(7)],
            _done(),
        ],
        STANDARD: [_write()],
    }


def _rate_limited(inject: Inject) -> Mapping[str, Sequence[Step]]:
    return {
        FAST: [
            _list(),
            inject("HTTP 429, Retry-After: 2", Fault.rate_limit(retry_after=2)),
            _read("notes/standup.md"),
            _read("notes/planning.md"),
            *_task_after_reading(),
        ]
    }


def _dead_tier(inject: Inject) -> Mapping[str, Sequence[Step]]:
    first = Fault(503, {"retry-after": "4"}, "Service Unavailable: maintenance")
    down = Fault.server_error(503, "Service Unavailable")
    return {
        FAST: [
            inject("HTTP 503, Retry-After: 4, from the fast tier", first),
            *[inject("HTTP 503 from the fast tier", down) for _ in range(11)],
        ],
        STANDARD: [
            _list(),
            _read("notes/standup.md"),
            _read("notes/planning.md"),
            *_task_after_reading(),
        ],
    }


def _budget(inject: Inject) -> Mapping[str, Sequence[Step]]:
    archive = [
        inject("another archived file (a runaway read)", _read(f"notes/archive/2024-{m:02d}.md"))
        for m in range(1, 13)
    ]
    return {FAST: [_list(), _list("notes/archive"), *archive, _write(), _done()]}


def _flaky_tool(inject: Inject) -> Mapping[str, Sequence[Step]]:
    return {
        FAST: [
            _list(),
            _read("notes/standup.md"),
            _call("fetch_ticket", {"ticket_id": "AG-12"}),
            _read("notes/planning.md"),
            _call("fetch_ticket", {"ticket_id": "AG-13"}),
            _call("fetch_ticket", {"ticket_id": "AG-14"}),
            *_task_after_reading(),
        ]
    }


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "malformed_call",
            "malformed tool calls",
            "repair broken JSON locally; re-ask once, naming the missing argument",
            _malformed,
        ),
        Scenario(
            "hallucinated_tool",
            "hallucinated tool names",
            "auto-correct a read-only name; re-ask with the closest names for a writing one",
            _hallucinated,
        ),
        Scenario(
            "text_call",
            "tool calls written as text",
            "extract the calls from the text, at no token cost",
            _text_call,
        ),
        Scenario(
            "tool_loop",
            "a tool loop",
            "hint the model at 3 repeats, then escalate at 7",
            _tool_loop,
        ),
        Scenario(
            "repeated_response",
            "a repeated response",
            "warn at 3 identical answers, escalate at 7",
            _repeated,
        ),
        Scenario(
            "rate_limited",
            "a 429 with Retry-After",
            "wait as long as the server asks, once, then go on",
            _rate_limited,
        ),
        Scenario(
            "dead_tier",
            "a dead model tier",
            "retry once, escalate to the next tier; the breaker then skips the dead one",
            _dead_tier,
        ),
        Scenario(
            "budget",
            "a token budget running out",
            "warn at 80 %, then stop before spending past the limit",
            _budget,
            config={"token_budget": {"per_session": 9_000, "policy": "hard_stop"}},
        ),
        Scenario(
            "flaky_tool",
            "a flaky tool",
            "retry the tool; open its breaker when it keeps failing; tell the model",
            _flaky_tool,
            tickets=("timeout", "ok", "timeout", "timeout", "timeout", "timeout"),
        ),
    )
}
