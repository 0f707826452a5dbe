"""OpenAI chat transcripts, request logs (LiteLLM) and OpenHands event logs.

- OpenAI chat format: a transcript per item (an array of messages, or an object with
  ``messages`` and optionally ``id`` / ``session`` / ``session_id`` and ``tools``), or one
  message per item (objects with ``role``, grouped by ``session`` / ``session_id``);
- request logs (LiteLLM's ``StandardLoggingPayload`` and the common ``{"request", "response"}``
  shape): one model call per line, its whole ``messages`` history and its ``response``; only
  the messages not seen in the session's earlier calls are fed, and a call re-sent with the
  same history counts as a retry;
- OpenHands event logs (``event_to_dict``: ``action`` / ``observation`` events with
  ``tool_call_metadata`` carrying the model's response and its usage).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ._base import InputError, Messages, Record, State, call, from_json, message, obj

__all__ = [
    "choice_message",
    "is_request_log",
    "openai",
    "openhands",
    "request_log",
    "session_of",
    "transcript",
    "usage_of",
]


def transcript(item: Any, where: str, state: State) -> Messages | None:
    """A transcript (an array of messages, or an object with ``messages``) as a run of its
    session's messages; ``None`` when ``item`` is none."""
    if isinstance(item, list):
        return Messages(state.unique(f"line {where.rsplit(':', 1)[1]}"), item, where, whole=True)
    if isinstance(item, dict) and isinstance(item.get("messages"), list):
        label = item.get("id") or item.get("session") or item.get("session_id")
        session = state.unique(str(label or f"line {where.rsplit(':', 1)[1]}"))
        tools = item.get("tools") if isinstance(item.get("tools"), list) else None
        return Messages(session, item["messages"], where, tools, keep=True, whole=True)
    return None


def openai(item: Any, where: str, state: State) -> Iterator[Record]:
    """A transcript (array, or object with ``messages``) or one message."""
    run = transcript(item, where, state)
    if run is not None:
        yield from run.records()
    elif not isinstance(item, dict):
        raise InputError(f"{where}: expected a JSON object or array, got {type(item).__name__}")
    elif "role" in item:
        yield message_record(item, where)
    else:
        raise InputError(f"{where}: not an OpenAI chat transcript or message")


def message_record(item: Mapping[str, Any], where: str) -> Record:
    """One message of a file of messages, in the session it names (:func:`session_of`)."""
    return Record(session_of(item), item, where)


def session_of(item: Mapping[str, Any]) -> str:
    """The session a message of a file of messages names (``default`` when none)."""
    return str(item.get("session") or item.get("session_id") or "default")


# -- request logs ----------------------------------------------------------------------------


def is_request_log(item: Mapping[str, Any]) -> bool:
    """Whether ``item`` is one logged model call (request and response)."""
    if isinstance(item.get("request"), dict) and "response" in item:
        return True
    return isinstance(item.get("messages"), list) and (
        "response" in item or "call_type" in item or "standard_logging_object" in item
    )


def usage_of(usage: Any) -> tuple[int | None, int | None]:
    """``(total, prompt)`` tokens of an OpenAI / Anthropic / OTel style usage object."""
    if not isinstance(usage, dict):
        return None, None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    out = usage.get("completion_tokens", usage.get("output_tokens"))
    total = usage.get("total_tokens")
    prompt = prompt if isinstance(prompt, int) else None
    out = out if isinstance(out, int) else None
    if not isinstance(total, int):
        total = (prompt or 0) + (out or 0) if prompt is not None or out is not None else None
    return total, prompt


def request_log(item: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """One logged model call: the history's new messages, then the answer."""
    item = obj(item.get("standard_logging_object")) or item
    request = obj(item.get("request")) or item
    metadata = obj(item.get("metadata"))
    session = str(
        item.get("session_id")
        or metadata.get("session_id")
        or metadata.get("litellm_session_id")
        or item.get("trace_id")
        or "default"
    )
    params = obj(item.get("model_parameters"))
    tools = request.get("tools") or params.get("tools") or item.get("tools")
    tools = tools if isinstance(tools, list) else None
    messages = request.get("messages") or []
    if not isinstance(messages, list):
        raise InputError(f"{where}: 'messages' must be an array")
    response = from_json(item.get("response"))
    tokens, prompt = usage_of(response.get("usage") if isinstance(response, dict) else None)
    if isinstance(item.get("total_tokens"), int):
        tokens = item["total_tokens"]
        prompt = item.get("prompt_tokens") if isinstance(item.get("prompt_tokens"), int) else prompt
    model = item.get("model") or request.get("model")
    model = str(model) if model else None
    fed = state.fed.get(session, 0)
    retry = 0
    if fed and len(messages) == fed - 1:  # the same history sent again: the last call was redone
        retry = state.last_tokens.get(session, 0)
        fed -= 1
    elif len(messages) < fed:  # a new conversation, or a condensed history: feed the newest
        fed = max(0, len(messages) - 1)
    for m in messages[fed:]:
        yield Record(session, message(m, where), where, tools=tools)
    failed = str(item.get("status", "success")) not in ("success", "ok")
    reply = choice_message(response)
    if failed or reply is None:
        state.fed[session] = len(messages)
        state.last_tokens[session] = 0
        if failed and tokens:  # a failed call's tokens are spent and must be spent again
            yield Record(session, None, where, tokens, retry_tokens=tokens, model=model)
        return
    state.fed[session] = len(messages) + 1
    state.last_tokens[session] = tokens or 0
    yield Record(session, reply, where, tokens, tools, retry, model, prompt)


def choice_message(response: Any) -> Mapping[str, Any] | None:
    """The first choice's message of a chat completion (an object, or its JSON text)."""
    response = from_json(response)
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        m = choices[0].get("message")
        if isinstance(m, dict):
            return m
    return None


# -- OpenHands -------------------------------------------------------------------------------


def openhands(event: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """One OpenHands event: an action (the model's call) or an observation (its result)."""
    session = str(event.get("session_id") or event.get("sid") or "openhands")
    meta = obj(event.get("tool_call_metadata")) or None
    if "observation" in event:
        if meta is not None:
            yield Record(
                session,
                {
                    "role": "tool",
                    "tool_call_id": meta.get("tool_call_id"),
                    "name": meta.get("function_name"),
                    "content": str(event.get("content", "")),
                },
                where,
            )
        return
    args = obj(event.get("args"))
    if meta is None:
        action = event.get("action")
        if action in ("message", "system") and isinstance(args.get("content"), str):
            role = (
                "system"
                if action == "system"
                else ("user" if event.get("source") == "user" else "assistant")
            )
            yield Record(session, {"role": role, "content": args["content"]}, where)
        return
    response = meta.get("model_response")
    reply = choice_message(response)
    rid = str(response.get("id")) if isinstance(response, dict) else None
    if reply is not None and rid is not None and isinstance(response, dict):
        if state.response_id.get(session) == rid:
            return  # one response, several actions: its message is fed once
        state.response_id[session] = rid
        tokens, prompt = usage_of(response.get("usage"))
        model = str(response["model"]) if response.get("model") else None
        yield Record(session, reply, where, tokens, model=model, prompt_tokens=prompt)
        return
    arguments = {k: v for k, v in args.items() if k not in ("thought", "security_risk")}
    tool_call = call(meta.get("tool_call_id"), meta.get("function_name"), arguments)
    yield Record(
        session,
        {"role": "assistant", "content": args.get("thought") or "", "tool_calls": [tool_call]},
        where,
    )


def tools_of(value: Any) -> Sequence[Any] | None:
    """A ``tools`` list, or ``None``."""
    return value if isinstance(value, list) and value else None
