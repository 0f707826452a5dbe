"""The validator on real public tool schemas (BFCL): no false positives, mutations caught."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from _bfcl import cases
from agentguard.testing import Reply
from agentguard.validation import ToolCallValidator

FILES = [
    "BFCL_v4_simple_python.json",
    "BFCL_v4_multiple.json",
    "BFCL_v4_parallel.json",
    "BFCL_v4_live_simple.json",
]


def _all() -> list[tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]]:
    out = []
    for name in FILES:
        out += cases(name)
    return out


@pytest.fixture(scope="module")
def bfcl() -> list[tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]]:
    data = _all()
    assert len(data) > 900
    return data


def _message(calls: list[tuple[str, Any]]) -> dict[str, Any]:
    return Reply.calls([(name, args, f"c{i}") for i, (name, args) in enumerate(calls)]).message()


def test_ground_truth_calls_validate(bfcl: list[Any]) -> None:
    """Real ground-truth calls pass: false positives at most 0.5 %."""
    false_positives = []
    total = 0
    for tools, calls in bfcl:
        validator = ToolCallValidator(tools)
        report = validator.validate(_message(calls))
        total += 1
        if not report.ok:
            false_positives.append((calls, [str(e) for e in report.errors]))
    rate = len(false_positives) / total
    print(f"BFCL ground truth: {total} messages, false-positive rate {rate:.3%}")
    assert rate <= 0.005, false_positives[:5]


def test_valid_calls_come_back_untouched(bfcl: list[Any]) -> None:
    """A valid call's arguments are returned byte for byte."""
    for tools, calls in bfcl[:300]:
        message = _message(calls)
        report = ToolCallValidator(tools).validate(message)
        if report.ok and not report.repairs:
            sent = [c["function"]["arguments"] for c in message["tool_calls"]]
            assert [c.arguments for c in report.tool_calls] == sent


def _mutations(
    tools: list[dict[str, Any]], name: str, args: dict[str, Any], rng: random.Random
) -> list[tuple[str, Any, str, str | None]]:
    """``(mutation, message, expected error kind or 'repaired', finish_reason)``."""
    spec = next(t["function"] for t in tools if t["function"]["name"] == name)
    required = [r for r in spec["parameters"].get("required", []) if r in args]
    out: list[tuple[str, Any, str, str | None]] = []
    if required:
        dropped = {k: v for k, v in args.items() if k != required[0]}
        out.append(("drop_required", _message([(name, dropped)]), "missing_required", None))
        key = required[0]
        ptype = spec["parameters"]["properties"].get(key, {}).get("type")
        if ptype in ("integer", "number"):
            out.append(
                ("wrong_type", _message([(name, {**args, key: [1, 2]})]), "type_mismatch", None)
            )
        if ptype == "string":
            out.append(
                (
                    "placeholder",
                    _message([(name, {**args, key: "<" + key + ">"})]),
                    "placeholder_argument",
                    None,
                )
            )
            out.append(("empty", _message([(name, {**args, key: ""})]), "empty_argument", None))
    text = json.dumps(args)
    if len(text) > 4:
        out.append(("truncated", _message([(name, text[: len(text) // 2])]), "truncated", "length"))
        out.append(("trailing_comma", _message([(name, text[:-1] + ",}")]), "repaired", None))
        out.append(
            ("code_fence", _message([(name, "```json\n" + text + "\n```")]), "repaired", None)
        )
    for style in ("hermes", "function_tag", "python_tag", "mistral", "fenced", "bare"):
        out.append(
            (
                f"embedded_{style}",
                Reply.embedded(name, args, style=style).message(),
                "repaired",
                None,
            )
        )
    out.append(
        (
            "invented_tool",
            _message([("zz_" + "".join(rng.sample("qwxjkv", 5)), args)]),
            "unknown_tool",
            None,
        )
    )
    out.append(
        (
            "unexpected_argument",
            _message([(name, {**args, "zz_bogus_flag": True})]),
            "unexpected_argument",
            None,
        )
    )
    return out


def test_mutations_are_caught_or_repaired(bfcl: list[Any]) -> None:
    """Each mutation of a ground-truth call is reported with the right kind, or repaired."""
    rng = random.Random(1234)
    sample = rng.sample(bfcl, 250)
    stats: dict[str, list[int]] = {}
    misses = []
    for tools, calls in sample:
        name, args = calls[0]
        baseline = ToolCallValidator(tools).validate(_message([(name, args)]))
        if not baseline.ok:
            continue
        validator = ToolCallValidator(tools)
        for mutation, message, expected, finish in _mutations(tools, name, args, rng):
            report = validator.validate(message, finish_reason=finish)
            if expected == "repaired":
                good = (
                    report.ok
                    and report.repairs != ()
                    and report.tool_calls[0].name == name
                    and json.loads(report.tool_calls[0].arguments) == json.loads(json.dumps(args))
                )
            else:
                good = any(e.kind == expected for e in report.errors)
            stats.setdefault(mutation, [0, 0])
            stats[mutation][0] += int(good)
            stats[mutation][1] += 1
            if not good:
                misses.append((mutation, name, [str(e) for e in report.errors][:2]))
    lines = [f"{m}: {ok}/{n}" for m, (ok, n) in sorted(stats.items())]
    print("BFCL mutations caught or repaired: " + "; ".join(lines))
    caught = sum(ok for ok, _ in stats.values())
    total = sum(n for _, n in stats.values())
    assert caught / total >= 0.98, misses[:10]
