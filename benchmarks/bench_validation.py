"""ToolCallValidator costs side by side with naive jsonschema.validate() and json_repair alone."""

from __future__ import annotations

import json

import json_repair
import jsonschema

from _harness import Table, per_call, us, verdict
from agentguard.loops import call_fingerprint
from agentguard.testing import Reply
from agentguard.validation import ToolCallValidator


def _tools(n: int) -> list[dict[str, object]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Tool number {i}.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "limit": {"type": "integer", "minimum": 1},
                        "mode": {"type": "string", "enum": ["fast", "deep"]},
                        "tags": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["path"],
                },
            },
        }
        for i in range(n)
    ]


def run(quick: bool) -> list[Table]:
    repeat = 3 if quick else 7
    min_time = 0.02 if quick else 0.2
    tools = _tools(10)
    validator = ToolCallValidator(tools)
    args = {"path": "/srv/app/config.yaml", "limit": 5, "mode": "fast", "tags": ["a", "b"]}
    clean = Reply.call("tool_7", args).message()
    schema = tools[7]["function"]["parameters"]  # type: ignore[index]

    def naive() -> None:
        jsonschema.validate(json.loads(clean["tool_calls"][0]["function"]["arguments"]), schema)

    cached_validator = jsonschema.Draft202012Validator(schema)

    def cached() -> None:
        cached_validator.validate(json.loads(clean["tool_calls"][0]["function"]["arguments"]))

    ours = us(per_call(lambda: validator.validate(clean), repeat=repeat, min_time=min_time))
    peer = us(per_call(naive, repeat=repeat, min_time=min_time))
    cached_peer = us(per_call(cached, repeat=repeat, min_time=min_time))
    broken = Reply.call("tool_7", "{'path': '/srv/app/config.yaml', 'limit': 5,}").message()
    repaired = us(per_call(lambda: validator.validate(broken), repeat=repeat, min_time=min_time))
    raw = "{'path': '/srv/app/config.yaml', 'limit': 5,}"
    repair_only = us(
        per_call(
            lambda: json_repair.repair_json(raw, return_objects=True),
            repeat=repeat,
            min_time=min_time,
        )
    )
    embedded = Reply.embedded("tool_7", args, style="hermes").message()
    extracted = us(per_call(lambda: validator.validate(embedded), repeat=repeat, min_time=min_time))
    calls = Table(
        "Tool-call validation",
        ["operation", "µs per call", "ratio to naive jsonschema.validate()", "goal"],
        [
            [
                "ToolCallValidator.validate, clean call, 10 tools",
                ours,
                f"{ours / peer:.2f}",
                f"≤ 40 µs: {verdict(ours, 40)}",
            ],
            ["naive jsonschema.validate() (re-checks the schema)", peer, "1.00", "-"],
            [
                "a cached jsonschema validator alone (no names, repair, placeholders)",
                cached_peer,
                f"{cached_peer / peer:.2f}",
                "-",
            ],
            ["validate, broken JSON repaired locally", repaired, f"{repaired / peer:.2f}", "-"],
            ["json_repair.repair_json alone", repair_only, f"{repair_only / peer:.2f}", "-"],
            [
                "validate, Hermes text-embedded call extracted",
                extracted,
                f"{extracted / peer:.2f}",
                "-",
            ],
        ],
        description="Same process, same run. The validator compiles each schema once.",
    )
    big_tools = [
        {
            "type": "function",
            "function": {
                "name": "write_file",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"],
                },
            },
        }
    ]
    big_validator = ToolCallValidator(big_tools)
    size = 64_000 if quick else 1_000_000
    big = Reply.call("write_file", {"path": "a", "content": "x" * size}).message()
    big_broken = Reply.call(
        "write_file", "{'path': 'a', 'content': '" + "x" * size + "',}"
    ).message()
    big_rows = [
        [
            f"valid call, {size:,} bytes of arguments",
            us(per_call(lambda: big_validator.validate(big), repeat=3, min_time=min_time)),
        ],
        [
            f"broken call, {size:,} bytes (repair skipped above max_repair_bytes)",
            us(per_call(lambda: big_validator.validate(big_broken), repeat=3, min_time=min_time)),
        ],
        [
            f"loop-detection fingerprint of the {size:,}-byte arguments",
            us(
                per_call(
                    lambda: call_fingerprint(
                        "write_file", big["tool_calls"][0]["function"]["arguments"]
                    ),
                    repeat=3,
                    min_time=min_time,
                )
            ),
        ],
    ]
    return [
        calls,
        Table(
            "Large arguments",
            ["operation", "µs per call"],
            big_rows,
            description=(
                "Cost is linear in size; repair is bounded by max_repair_bytes (16 KiB by "
                "default: json_repair costs about 3 µs per byte)."
            ),
        ),
    ]
