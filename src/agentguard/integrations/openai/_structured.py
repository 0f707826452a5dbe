"""Structured outputs on a guarded client: ``chat.completions.parse`` and the ``stream`` helper.

``parse`` goes through the guard like ``create`` (tool calls validated and repaired, retries,
escalation); then the answer's content is checked against the ``response_format`` schema with
the same validator and local repairs as tool arguments (broken JSON, a fenced block, a
double-encoded object, ``"5"`` for an integer), and only then does the SDK's own parser build
the ``ParsedChatCompletion``: JSON the guard can repair never reaches it broken. Content the
guard cannot repair reaches the SDK's parser unchanged, which raises as it would unguarded.

The ``stream`` helper is the SDK's own, run over the guarded ``create(stream=True)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agentguard.config import GuardConfig
from agentguard.exceptions import ToolSchemaError
from agentguard.guard import GuardReport
from agentguard.integrations._lazy import require
from agentguard.transport import attach_report
from agentguard.validation import ToolCallValidator

from ._transport import dump

__all__ = ["AsyncStreamManager", "StreamManager", "parsed", "parsed_response"]

_CALL_ID = "agentguard-structured"


def _schema(response_format: Any) -> tuple[str, Mapping[str, Any]] | None:
    """The name and JSON schema a ``response_format`` asks the content to follow, if any."""
    parsing = require("openai.lib._parsing", "openai")
    param = parsing.type_to_response_format_param(response_format)
    if not isinstance(param, Mapping):
        return None
    if param.get("type") == "json_object":
        return "json_object", {"type": "object"}
    spec = param.get("json_schema")
    if param.get("type") == "json_schema" and isinstance(spec, Mapping):
        schema = spec.get("schema")
        if isinstance(schema, Mapping):
            return str(spec.get("name") or "response"), schema
    return None


def repair_content(
    content: str, name: str, schema: Mapping[str, Any], config: GuardConfig
) -> tuple[str, list[str]] | None:
    """``content`` repaired to JSON that follows ``schema``, with the repairs made; ``None``
    when it needs none or cannot be repaired locally."""
    if not config.tool_validation.enabled:
        return None
    tool = {"type": "function", "function": {"name": name, "parameters": dict(schema)}}
    call = {"id": _CALL_ID, "type": "function", "function": {"name": name, "arguments": content}}
    try:
        validator = ToolCallValidator([tool], config)
    except ToolSchemaError:  # a schema the validator cannot use: the SDK's parser judges alone
        return None
    report = validator.validate({"role": "assistant", "content": None, "tool_calls": [call]})
    if not report.ok or not report.repairs or len(report.tool_calls) != 1:
        return None
    fixed = report.tool_calls[0].arguments
    return fixed, [f"response_format: {r}" for r in report.repairs]


def parsed(
    completion: Any, kwargs: Mapping[str, Any], report: GuardReport | None, config: GuardConfig
) -> Any:
    """The ``ParsedChatCompletion`` of a guarded ``parse`` call, its content repaired first."""
    openai = require("openai", "openai")
    parsing = require("openai.lib._parsing", "openai")
    response_format = kwargs.get("response_format", openai.NOT_GIVEN)
    wanted = _schema(response_format)
    if wanted is not None and completion.choices:
        content = completion.choices[0].message.content
        repaired = repair_content(content, *wanted, config) if isinstance(content, str) else None
        if repaired is not None:
            data = dump(completion)
            data["choices"][0]["message"]["content"] = repaired[0]
            completion = type(completion).construct(**data)
            report = _with_repairs(report, repaired[1])
    out = parsing.parse_chat_completion(
        response_format=response_format,
        chat_completion=completion,
        input_tools=parsing.validate_input_tools(kwargs.get("tools", openai.NOT_GIVEN)),
    )
    if report is not None:
        attach_report(out, report)
    return out


def _adopt(stream: Any) -> Any:
    """Give the helper's stream the report of the guarded stream it reads, when it ends."""
    owners = getattr(getattr(stream, "_raw_stream", None), "owners", None)
    if isinstance(owners, list):
        owners.append(stream)
    return stream


def _with_repairs(report: GuardReport | None, repairs: list[str]) -> GuardReport | None:
    if report is None or not repairs:
        return report
    return dataclasses.replace(report, repairs=(*report.repairs, *repairs))


def parsed_response(
    response: Any, kwargs: Mapping[str, Any], report: GuardReport | None, config: GuardConfig
) -> Any:
    """The ``ParsedResponse`` of a guarded ``responses.parse`` call, its text repaired first."""
    openai = require("openai", "openai")
    parsing = require("openai.lib._parsing._responses", "openai")
    text_format = kwargs.get("text_format", openai.NOT_GIVEN)
    wanted = None
    if isinstance(text_format, type):
        param = parsing.type_to_text_format_param(text_format)
        wanted = (str(param.get("name") or "response"), param.get("schema") or {})
    repairs: list[str] = []
    if wanted is not None:
        data = dump(response)
        for item in data.get("output") or ():
            for part in item.get("content") or () if item.get("type") == "message" else ():
                text = part.get("text") if part.get("type") == "output_text" else None
                fixed = repair_content(text, *wanted, config) if isinstance(text, str) else None
                if fixed is not None:
                    part["text"] = fixed[0]
                    repairs.extend(fixed[1])
        if repairs:
            response = type(response).construct(**data)
    report = _with_repairs(report, repairs)
    out = parsing.parse_response(
        text_format=text_format,
        input_tools=kwargs.get("tools", openai.NOT_GIVEN),
        response=response,
    )
    if report is not None:
        attach_report(out, report)
    return out


class StreamManager:
    """The SDK's ``chat.completions.stream`` manager over a guarded stream.

    The stream it opens gets the report once exhausted: ``report_of(stream)`` after the
    ``with`` block's loop.
    """

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def __enter__(self) -> Any:
        return _adopt(self._manager.__enter__())

    def __exit__(self, *exc: Any) -> Any:
        return self._manager.__exit__(*exc)


class AsyncStreamManager:
    """Async twin of :class:`StreamManager`."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    async def __aenter__(self) -> Any:
        return _adopt(await self._manager.__aenter__())

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._manager.__aexit__(*exc)
