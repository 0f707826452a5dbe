"""OpenTelemetry GenAI spans in OTLP JSON (the collector's file exporter, ``otlp/json``).

Each item is an ``ExportTraceServiceRequest`` (``resourceSpans``); its spans are read in start
order. A ``chat`` span (``gen_ai.operation.name``) that carries its messages
(``gen_ai.input.messages`` / ``gen_ai.output.messages``, as span attributes or on the
``gen_ai.client.inference.operation.details`` event) is one logged model call, read like a
request log: only the history not seen yet is fed. Its usage, model and tool definitions come
from ``gen_ai.usage.*``, ``gen_ai.request.model`` and ``gen_ai.tool.definitions``. A session is
``gen_ai.conversation.id``, else the trace. Without message content (the conventions' default),
the ``execute_tool`` spans' calls and results (``gen_ai.tool.call.arguments`` / ``.result``)
are fed instead, and chat spans count their tokens.

A tool result the messages record is its raw content (pydantic-ai's retried and failed returns
included: the conventions' ``tool_call_response`` part has no error flag), while the model was
sent it as an error, ``{"error": ...}`` (or the provider's own error flag). A result is read so
when the call's ``execute_tool`` span ended in error, or when the call names a tool the chat
span does not declare (no tool ran: the agent refused it, as pydantic-ai does an unknown name),
so that it counts as a failure as the other formats' results do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from ._base import Record, State, call, from_json, obj, seq, str_or_none, text_of
from ._chat import request_log

__all__ = ["otlp"]

_CHAT = ("chat", "text_completion", "generate_content")
_DETAILS = "gen_ai.client.inference.operation.details"


def otlp(request: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """Every GenAI span of one OTLP JSON export request."""
    spans = []
    for resource in seq(request.get("resourceSpans")):
        for scope in seq(obj(resource).get("scopeSpans")):
            for span in seq(obj(scope).get("spans")):
                if isinstance(span, dict):
                    spans.append(span)
    spans.sort(key=lambda s: int(s.get("startTimeUnixNano") or 0))
    for span in spans:
        attrs = _attributes(span.get("attributes"))
        for event in seq(span.get("events")):
            if obj(event).get("name") == _DETAILS:
                attrs = {**attrs, **_attributes(obj(event).get("attributes"))}
        op = attrs.get("gen_ai.operation.name") or str(span.get("name", "")).split(" ")[0]
        session = str(attrs.get("gen_ai.conversation.id") or span.get("traceId") or "otlp")
        if op in _CHAT:
            yield from _chat(attrs, session, where, state)
        elif op == "execute_tool":
            failed = obj(span.get("status")).get("code") in (2, "STATUS_CODE_ERROR")
            if session not in state.content:
                yield from _tool(attrs, span, session, where, failed)
            elif failed:  # its result comes in the next chat span's messages
                state.failed.add(str(attrs.get("gen_ai.tool.call.id") or span.get("spanId")))


def _chat(attrs: Mapping[str, Any], session: str, where: str, state: State) -> Iterator[Record]:
    prompt = attrs.get("gen_ai.usage.input_tokens")
    out = attrs.get("gen_ai.usage.output_tokens")
    usage = {
        "prompt_tokens": prompt if isinstance(prompt, int) else 0,
        "completion_tokens": out if isinstance(out, int) else 0,
    }
    model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")
    inputs = from_json(attrs.get("gen_ai.input.messages"))
    outputs = from_json(attrs.get("gen_ai.output.messages"))
    if not isinstance(inputs, list) and not isinstance(outputs, list):
        tokens = usage["prompt_tokens"] + usage["completion_tokens"]
        if tokens:
            yield Record(
                session, None, where, tokens, model=str_or_none(model), prompt_tokens=prompt
            )
        return
    state.content.add(session)
    tools = seq(from_json(attrs.get("gen_ai.tool.definitions"))) or None
    messages = [m for part in seq(from_json(attrs.get("gen_ai.system_instructions"))) for m in
                _messages([{"role": "system", "parts": [part]}])]  # fmt: skip
    messages += _messages(seq(inputs), state.failed, _names(tools))
    answer = _messages(seq(outputs)[:1])
    item = {
        "session_id": session,
        "messages": messages,
        "model": model,
        "tools": tools,
        "response": {"choices": [{"message": answer[0]}] if answer else [], "usage": usage},
    }
    yield from request_log(item, where, state)


def _tool(attrs: Mapping[str, Any], span: Mapping[str, Any], session: str, where: str,
          failed: bool) -> Iterator[Record]:  # fmt: skip
    call_id = attrs.get("gen_ai.tool.call.id") or span.get("spanId")
    arguments = attrs.get("gen_ai.tool.call.arguments", "{}")
    tool_call = call(call_id, attrs.get("gen_ai.tool.name"), arguments)
    yield Record(session, {"role": "assistant", "content": "", "tool_calls": [tool_call]}, where)
    result = attrs.get("gen_ai.tool.call.result")
    if failed:
        if result is None:
            result = "Error: " + str(obj(span.get("status")).get("message") or "the tool failed")
        else:  # (the attribute holds structures as JSON text)
            decoded = from_json(result)
            result = {"error": result if decoded is None else decoded}
    if result is not None:
        content = result if isinstance(result, str) else json.dumps(result)
        yield Record(session, {"role": "tool", "tool_call_id": call_id, "content": content}, where)


def _names(tools: list[Any] | None) -> frozenset[str] | None:
    """The names of a chat span's tool definitions; ``None`` when it declares none."""
    if not tools:
        return None
    names = (obj(obj(t).get("function") or t).get("name") for t in tools)
    return frozenset(name for name in names if isinstance(name, str))


def _messages(
    items: list[Any], failed: set[str] | None = None, declared: frozenset[str] | None = None
) -> list[dict[str, Any]]:
    """GenAI convention messages (``role`` and ``parts``) as OpenAI chat messages; a tool
    result is an error (``{"error": ...}``) when its call is among the ``failed`` (taken out
    of them) or names a tool not ``declared``."""
    out: list[dict[str, Any]] = []
    names: dict[Any, Any] = {}  # call id -> the tool it called, for a response naming none
    for value in items:
        m = obj(value)
        role = str(m.get("role") or "user")
        parts = m.get("parts")
        if not isinstance(parts, list):  # already chat-shaped
            out.append(dict(m))
            continue
        text, calls, answered = [], [], False
        for raw in parts:
            part = obj(raw)
            kind = part.get("type")
            if kind == "tool_call":
                calls.append(call(part.get("id"), part.get("name"), part.get("arguments", {})))
                names[part.get("id")] = part.get("name")
            elif kind == "tool_call_response":
                response = part.get("response", part.get("result"))
                call_id = part.get("id")
                name = part.get("name") or names.get(call_id)
                if (failed and call_id in failed) or (
                    declared is not None and name not in declared and not part.get("builtin")
                ):
                    if failed:
                        failed.discard(call_id)
                    response = {"error": response}
                content = response if isinstance(response, str) else json.dumps(response)
                out.append({"role": "tool", "tool_call_id": call_id, "content": content})
                answered = True
            elif kind == "text" or "content" in part:
                text.append(text_of(part.get("content")))
        if answered and not text and not calls:
            continue  # a message of tool responses only: they were added above
        message: dict[str, Any] = {"role": role, "content": "\n".join(text)}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _attributes(values: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` list to a dict of plain values."""
    out: dict[str, Any] = {}
    for value in seq(values):
        kv = obj(value)
        if isinstance(kv.get("key"), str):
            out[kv["key"]] = _value(kv.get("value"))
    return out


def _value(value: Any) -> Any:
    value = obj(value)
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:  # int64 is a JSON string in OTLP JSON
        try:
            return int(value["intValue"])
        except (TypeError, ValueError):
            return None
    for key in ("boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "arrayValue" in value:
        return [_value(v) for v in seq(obj(value["arrayValue"]).get("values"))]
    if "kvlistValue" in value:
        return _attributes(obj(value["kvlistValue"]).get("values"))
    return None
