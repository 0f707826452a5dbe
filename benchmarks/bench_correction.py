"""Correction loops: round trips and tokens to recover the same malformed calls with an
Instructor-style re-ask (full error, no local repair) vs agentguard (local repair first, then
one correction naming every error)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jsonschema

from _harness import Table
from agentguard.budget import estimate_tokens
from agentguard.testing import Reply
from agentguard.validation import ToolCallValidator

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1},
        "mode": {"type": "string", "enum": ["fast", "deep"]},
    },
    "required": ["path", "mode"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "write_file", "parameters": SCHEMA}},
]
GOOD = {"path": "notes.txt", "limit": 5, "mode": "fast"}
HISTORY = [
    {"role": "system", "content": "You are a careful agent with file tools."},
    {"role": "user", "content": "Read the first five lines of notes.txt."},
]

# (case, what the model sent, how many independent errors it holds)
CASES: list[tuple[str, Reply, int]] = [
    ("single quotes", Reply.call("read_file", str(GOOD)), 1),  # a Python repr
    ("trailing comma", Reply.call("read_file", json.dumps(GOOD)[:-1] + ",}"), 1),
    ("markdown-fenced JSON", Reply.call("read_file", f"```json\n{json.dumps(GOOD)}\n```"), 1),
    ("near-miss tool name", Reply.call("read_files", GOOD), 1),
    ("synonym tool name", Reply.call("open_file", GOOD), 1),
    ("call written as text", Reply.embedded("read_file", GOOD, style="hermes"), 1),
    ("number as a string", Reply.call("read_file", {**GOOD, "limit": "5"}), 1),
    ("missing required field", Reply.call("read_file", {"path": "notes.txt", "limit": 5}), 1),
    ("bad enum value", Reply.call("read_file", {**GOOD, "mode": "quick"}), 1),
    (
        "three errors at once",
        Reply.call("read_file", {"path": "notes.txt", "limit": 0, "mode": "quick", "x": 1}),
        3,
    ),
]


def _call_of(reply: Reply) -> tuple[str, Any] | None:
    """What a plain client sees: the native call's name and decoded arguments, if any."""
    if not reply.tool_calls:
        return None
    fn = reply.tool_calls[0]["function"]
    return fn["name"], fn["arguments"]


def _instructor_errors(reply: Reply) -> list[str]:
    """Instructor-style validation: parse strictly, check the name, validate, report all."""
    call = _call_of(reply)
    if call is None:
        return ["no tool call in the response"]
    name, text = call
    if name not in {"read_file", "write_file"}:
        return [f"unknown tool {name!r}"]
    try:
        args = json.loads(text)
    except ValueError as exc:
        return [f"invalid JSON: {exc}"]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [e.message for e in validator.iter_errors(args)]


def _tokens(messages: list[Mapping[str, Any]], reply: Reply) -> int:
    return estimate_tokens(messages, tools=TOOLS) + estimate_tokens(json.dumps(reply.message()))


def _instructor(reply: Reply, errors_in_call: int) -> tuple[int, int]:
    """Round trips and tokens until valid. Models usually fix what they are told; a re-ask that
    names every error is answered with a valid call (the friendliest assumption for the peer)."""
    messages = list(HISTORY)
    tokens = _tokens(messages, reply)
    trips = 0
    errors = _instructor_errors(reply)
    while errors:
        trips += 1
        messages = [
            *messages,
            reply.message(),
            {"role": "user", "content": "Validation failed:\n" + "\n".join(errors) + "\nRetry."},
        ]
        reply = Reply.call("read_file", GOOD)
        tokens += _tokens(messages, reply)
        errors = _instructor_errors(reply)
    return trips, tokens


def _agentguard(reply: Reply, validator: ToolCallValidator) -> tuple[int, int]:
    messages = list(HISTORY)
    tokens = _tokens(messages, reply)
    report = validator.validate(reply.message(), finish_reason=reply.finish())
    trips = 0
    while not report.ok:
        trips += 1
        messages = [*messages, *report.corrective_messages()]
        reply = Reply.call("read_file", GOOD)
        tokens += _tokens(messages, reply)
        report = validator.validate(reply.message(), finish_reason=reply.finish())
    return trips, tokens


def run(quick: bool) -> list[Table]:
    del quick  # deterministic counts, no timing: the same work either way
    validator = ToolCallValidator(TOOLS)
    rows: list[list[object]] = []
    totals = [0, 0, 0, 0]
    for case, reply, _errors in CASES:
        i_trips, i_tokens = _instructor(reply, _errors)
        a_trips, a_tokens = _agentguard(reply, validator)
        rows.append([case, i_trips, i_tokens, a_trips, a_tokens, f"{a_tokens / i_tokens:.2f}"])
        for k, v in enumerate((i_trips, i_tokens, a_trips, a_tokens)):
            totals[k] += v
    rows.append(
        ["**all cases**", *(f"**{v:,}**" for v in totals), f"**{totals[3] / totals[1]:.2f}**"]
    )
    return [
        Table(
            "Correction loops: Instructor-style re-ask vs agentguard",
            [
                "malformed call",
                "re-ask: round trips",
                "re-ask: tokens",
                "agentguard: round trips",
                "agentguard: tokens",
                "token ratio",
            ],
            rows,
            description=(
                "The same malformed calls recovered two ways: strict parsing and schema "
                "validation with a re-ask carrying the full error list (Instructor's approach, "
                "no local repair), vs the ToolCallValidator (safe local repair first, then one "
                "correction naming every error). Tokens are estimated for each round trip's "
                "prompt and answer (system + user history, 2 tools). The peer is given its best "
                "case: every re-ask is answered with a valid call."
            ),
            notes=[
                "Local repair recovers syntax, fencing, names, text-embedded calls and "
                "coercible types with no round trip. Schema errors a repair cannot decide "
                "(a missing field, a bad enum value, an ambiguous name) cost one correction "
                "either way. There agentguard is not ahead: its correction re-sends the failed "
                "call with one tool message per error, 15-25 % more tokens than a bare error "
                "list.",
            ],
        )
    ]
