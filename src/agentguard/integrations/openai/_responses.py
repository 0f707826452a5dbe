"""The OpenAI Responses API in the pipeline's neutral (chat) form, and back.

The pipeline judges chat messages; a ``responses.create`` call speaks *items*. Each input item
becomes one chat message that remembers its item (under :data:`~agentguard.transport.ORIGINAL`),
so an unchanged message turns back into exactly the item it came from (reasoning items, ids and
all), and only what the guard added — corrective messages, a loop hint — is converted. Function
tools are flattened in the Responses format (``{"type": "function", "name": ...}``); the
validator gets them in chat format (``ModelRequest.tools``) while the caller's own tool list
travels in the request's extensions and goes back upstream as given. ``max_output_tokens`` is
the Responses API's own name for the output cap. Output items become one assistant message: its
text, and ``function_call`` items as ``tool_calls``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentguard.exceptions import ModelError
from agentguard.transport import (
    ORIGINAL,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    message_from_items,
)
from agentguard.types import Usage

__all__ = [
    "ENDS",
    "FAILURES",
    "ITEM",
    "OPENINGS",
    "REASONING_DELTAS",
    "RESPONSES",
    "ReportedError",
    "ResponsesCall",
    "chat_tools",
    "chunk_of_event",
    "cut_response",
    "is_responses",
    "is_text_event",
    "messages_to_items",
    "read_usage",
    "request_from_responses",
    "response_from_responses",
    "responses_body",
    "responses_output",
    "responses_tools",
]

#: The key under which a converted message keeps the Responses item it came from.
ITEM = ORIGINAL
#: The ``ModelRequest.extensions`` key of a Responses API call (a :class:`ResponsesCall`).
RESPONSES = "agentguard.openai.responses"
#: The events that end a streamed response.
ENDS = ("response.completed", "response.incomplete")
#: The events that open a streamed response (each once), carrying the response begun.
OPENINGS = ("response.created", "response.in_progress", "response.queued")
#: The events carrying a reasoning delta (a summary's, or the reasoning text gpt-oss-style
#: servers stream): read as the answer's reasoning, which streams live and is watched for
#: degeneration like chat's ``reasoning_content``.
REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
#: The output items the guard reads into its answer (text, calls, reasoning); an item of
#: another kind (a hosted tool's call, a generated image, a custom tool's input) is output
#: it passes on as it came, and an answer though it holds no text.
READ_ITEMS = ("message", "function_call", "reasoning")
#: The event of a refusal's delta (the model declined: an answer, never an empty one).
REFUSAL_DELTA = "response.refusal.delta"
#: The events by which the upstream reports its own failure inside a 200 stream.
FAILURES = ("error", "response.failed")
#: The role of a message standing for an item the pipeline has no chat form for (reasoning ...).
OPAQUE = "x-agentguard-opaque"
#: The events of an answer's text (its parts and deltas), besides its message item's own
TEXT_EVENTS = (
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.added",
    "response.content_part.done",
)


def is_text_event(kind: Any, item_type: Any) -> bool:
    """Whether a stream event (its ``type``, and its ``item``'s type if it has one) belongs to
    the answer's message: its text, its parts, the message item itself."""
    if kind in TEXT_EVENTS:
        return True
    return kind in ("response.output_item.added", "response.output_item.done") and (
        item_type == "message"
    )


def _text_of(content: Any) -> Any:
    """A message's content parts as one string when they are all text, else unchanged."""
    if isinstance(content, str) or not isinstance(content, Sequence):
        return content
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") not in (
            "input_text",
            "output_text",
            "text",
        ):
            return list(content)
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _message(item: Mapping[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "message" or (kind is None and "role" in item):
        out: dict[str, Any] = {
            "role": item.get("role", "user"),
            "content": _text_of(item.get("content")),
        }
    elif kind == "function_call":
        call_id = item.get("call_id") or item.get("id")
        out = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": item.get("name", ""),
                        "arguments": item.get("arguments", ""),
                    },
                }
            ],
        }
    elif kind == "function_call_output":
        output = item.get("output")
        out = {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text_of(output)}
    else:
        out = {"role": OPAQUE}
    out[ITEM] = dict(item)
    return out


def _item(message: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses item of a chat message without tool calls: its own item, else converted."""
    item = message.get(ITEM)
    if isinstance(item, Mapping):
        return dict(item)
    role = message.get("role")
    if role == "tool":
        return {
            "type": "function_call_output",
            "call_id": message.get("tool_call_id"),
            "output": message.get("content") or "",
        }
    return {"role": role or "user", "content": message.get("content") or ""}


def messages_to_items(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items for chat messages (the inverse of the request conversion)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls") or ()
        if ITEM not in message and message.get("role") == "assistant" and calls:
            if message.get("content"):
                items.append({"role": "assistant", "content": message["content"]})
            for call in calls:
                fn = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": fn.get("name", ""),
                        "arguments": fn.get("arguments", ""),
                    }
                )
            continue
        items.append(_item(message))
    return items


def chat_tools(tools: Any) -> list[Mapping[str, Any]]:
    """Responses function tools in chat format (other tool kinds are not the validator's)."""
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        return []
    out: list[Mapping[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            continue
        if isinstance(tool.get("function"), Mapping):  # already chat format
            out.append(tool)
            continue
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def cut_response(opened: Mapping[str, Any]) -> dict[str, Any]:
    """The response a stream opened with (``opened``), as the guard closes it when it cut the
    stream (a degenerating answer): ``incomplete``, cut at the output cap, as a chat stream
    finishes with ``length``."""
    details = {"reason": "max_output_tokens"}
    return {**opened, "status": "incomplete", "incomplete_details": details}


def responses_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat-format function tools in the Responses format (the inverse of :func:`chat_tools`)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool.get("function")
        if not isinstance(fn, Mapping):  # already the Responses format
            out.append(dict(tool))
            continue
        keys = ("name", "description", "parameters", "strict")
        out.append({"type": "function", **{k: fn[k] for k in keys if k in fn}})
    return out


@dataclass(frozen=True, slots=True)
class ResponsesCall:
    """What a Responses API call keeps beside its neutral request (in its extensions).

    Attributes:
        tools: the caller's ``tools`` argument as given (every kind, Responses format).
        has_tools: whether the caller gave ``tools`` at all (an explicit ``None`` included,
            which goes upstream as sent).
        input: the caller's ``input`` argument as given (a string, or items).
        messages: the messages made of it: while the request still carries exactly these,
            ``input`` goes upstream as given.
        has_input: whether the caller gave ``input`` at all (a call continuing a stored
            conversation by ``previous_response_id`` may give none: then none goes upstream
            while the request carries no message of the guard's).
        has_model: whether the caller gave ``model`` (a stored prompt may name it): without
            one, none goes upstream unless a tier names its own.
    """

    tools: Any = None
    has_tools: bool = False
    input: Any = None
    messages: Sequence[Mapping[str, Any]] = ()
    has_input: bool = True
    has_model: bool = True


def is_responses(request: ModelRequest) -> bool:
    """Whether ``request`` is a Responses API call (built by :func:`request_from_responses`)."""
    return RESPONSES in request.extensions


def request_from_responses(kwargs: Mapping[str, Any]) -> ModelRequest:
    """The neutral request of ``responses.create(**kwargs)`` (``model`` and ``input`` may be
    left out, as the API allows: the request's model is then ``""``).

    ``headers`` and ``timeout`` are left to the caller, as for chat requests.
    """
    params = dict(kwargs)
    if params.get("stream"):  # an explicit ``stream=False`` goes upstream as sent
        del params["stream"]
    has_model, has_input = "model" in params, "input" in params
    model = params.pop("model", None)
    raw_input = params.pop("input", None)
    if not isinstance(raw_input, (str, Sequence)):  # None, or the SDK's omit
        raw_input = []
    has_tools = "tools" in params
    tools = params.pop("tools", None)
    cap = params.get("max_output_tokens")
    if isinstance(cap, int):
        del params["max_output_tokens"]
    items = [{"role": "user", "content": raw_input}] if isinstance(raw_input, str) else raw_input
    messages = [_message(item) for item in items if isinstance(item, Mapping)]
    return ModelRequest(
        model="" if model is None and not has_model else str(model),
        messages=messages,
        params=params,
        tools=chat_tools(tools),
        max_output_tokens=cap if isinstance(cap, int) else None,
        extensions={
            RESPONSES: ResponsesCall(
                tools, has_tools, kwargs.get("input"), messages, has_input, has_model
            )
        },
    )


def responses_body(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The keyword arguments of ``responses.create`` for a neutral request."""
    call = request.extensions.get(RESPONSES)
    unchanged = isinstance(call, ResponsesCall) and (
        request.messages is call.messages or list(request.messages) == list(call.messages)
    )
    body: dict[str, Any] = {}
    if request.model or call is None or call.has_model:
        body["model"] = request.model
    if not unchanged or call is None:
        body["input"] = messages_to_items(request.messages)
    elif call.has_input:
        body["input"] = call.input
    body.update(request.params)
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        # a re-ask pinning a tool (the guard speaks chat): the Responses API names it flat
        body["tool_choice"] = {"type": "function", "name": choice["function"].get("name")}
    if isinstance(call, ResponsesCall) and call.has_tools:
        tools = request.tools
        same = tools is None or list(tools) == chat_tools(call.tools)
        # the caller's list as given, unless a re-ask offers other tools (fewer, or with the
        # choices narrowed): those, in the Responses format
        body["tools"] = call.tools if same else responses_tools(tools or ())
    if request.max_output_tokens is not None:
        body["max_output_tokens"] = request.max_output_tokens
    if stream:
        body["stream"] = True
    return body


def failed_error(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The error of a whole Responses API answer whose ``status`` is ``"failed"`` (HTTP 200,
    the provider's failure in the body: its ``error`` object, ``{}`` when it has none), else
    ``None``. The guard retries it as the upstream error it reports, as a stream's
    ``response.failed`` event."""
    if body.get("status") != "failed":
        return None
    error = body.get("error")
    return dict(error) if isinstance(error, Mapping) else {}


def response_from_responses(body: Mapping[str, Any], *, raw: Any = None) -> ModelResponse:
    """One Responses API ``response`` object as a neutral answer."""
    output = body.get("output")
    message = message_from_items(output if isinstance(output, list) else [])
    calls = message.get("tool_calls")
    details = body.get("incomplete_details")
    details = details if isinstance(details, Mapping) else {}
    if calls:
        finish = "tool_calls"
    elif body.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        finish = "length"
    else:
        finish = "stop"
    return ModelResponse(
        message=message,
        finish_reason=finish,
        usage=_body_usage(body.get("usage")),
        model=str(body.get("model", "")),
        id=body.get("id"),
        raw=body if raw is None else raw,
    )


def _body_usage(usage: Any) -> Usage | None:
    """A Responses (or chat) ``usage`` object, as JSON data, read as :func:`read_usage` does."""
    if not isinstance(usage, Mapping):
        return None
    prompt = usage.get("input_tokens", usage.get("prompt_tokens"))
    completion = usage.get("output_tokens", usage.get("completion_tokens"))
    if prompt is None and completion is None:
        return None
    return read_usage(prompt, completion)


def read_usage(prompt: Any, completion: Any) -> Usage | None:
    """Usage from the two counts an upstream reported (a missing one counts 0), or ``None`` (the
    guard estimates) when either is not a finite non-negative number: a string, ``Infinity``,
    ``NaN``, a negative number is no count the guard can trust."""
    counts = [_tokens(prompt), _tokens(completion)]
    if counts[0] is None or counts[1] is None:
        return None
    return Usage(counts[0], counts[1])


def _tokens(value: Any) -> int | None:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def responses_output(body: Mapping[str, Any], message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``body``'s output items rewritten to carry ``message`` (the guard's repaired answer).

    Items stay where they are, with their ids: a reasoning model's reasoning item must be
    followed by the very item it was paired with when the conversation goes back (OpenAI
    answers 400, "provided without its required following item", otherwise). Items other than
    text messages and function calls (reasoning ...) are kept as they are; the text goes into
    the first message item; a ``function_call`` item carries the guard's call with its
    ``call_id`` (a repaired call keeps its item's ``id``), and is left out when the guard's
    answer has no such call. Text with no message item to carry it (another attempt's, sent
    live) goes first; the guard's other calls (taken out of the text ...) follow.
    """
    kept: list[dict[str, Any]] = []
    text_done = False
    content = message.get("content")
    ids = itertools.count()
    calls = {call.get("id"): call for call in message.get("tool_calls") or () if call.get("id")}
    for original in body.get("output") or ():
        item = dict(original)
        kind = item.get("type")
        if kind == "function_call":
            call = calls.pop(item.get("call_id") or item.get("id"), None)
            if call is None:
                continue
            fn = call.get("function") or {}
            item = {**item, "name": fn.get("name", ""), "arguments": fn.get("arguments", "")}
        elif kind == "message":
            if text_done or not content:
                continue
            item = {
                **item,
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
            text_done = True
        kept.append(item)
    if content and not text_done:  # the text first, as a model writes it before its calls
        kept.insert(
            0,
            {
                "type": "message",
                "id": f"msg_agentguard_{next(ids)}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            },
        )
    for i, call in enumerate(message.get("tool_calls") or ()):
        if call.get("id") and call.get("id") not in calls:
            continue  # carried by the upstream's own item
        fn = call.get("function") or {}
        kept.append(
            {
                "type": "function_call",
                "id": f"fc_agentguard_{i}",
                "call_id": call.get("id") or f"call_agentguard_{i}",
                "name": fn.get("name", ""),
                "arguments": fn.get("arguments", ""),
                "status": "completed",
            }
        )
    return kept


class ReportedError(ModelError):
    """An error the upstream reported inside its 200 stream: an ``error`` event, or
    ``response.failed`` (the openai client hands both on as events, raising nothing).

    ``body`` is the error (``code``, ``message``), classified as the openai client's in-band
    ``APIError`` is (see :mod:`agentguard.resilience`): retried while nothing of the attempt
    reached the caller; then, or once every attempt failed so, the stream hands on ``event``
    as the last of the upstream's events, as the raw client does.
    """

    def __init__(self, event: Any) -> None:
        found = getattr(getattr(event, "response", None), "error", None) or event
        code, message = getattr(found, "code", None), getattr(found, "message", None)
        super().__init__("the upstream reported an error in its stream", status_code=None)
        self.event = event
        self.body = {"code": code, "message": message}


def unchanged_text(text: str, final: str | None, events: Iterable[Any]) -> bool:
    """Whether ``text`` (what the guard passed on of a Responses stream) is the upstream's: its
    final response's text (``final``), or the text of its ``response.output_text.delta``
    events (JSON mappings or SDK objects), when a server's final text is not exactly what its
    deltas added up to (whitespace trimmed ...). The answer is then handed on as it came."""
    if text == (final or ""):
        return True
    deltas = []
    for event in events:
        data = event if isinstance(event, Mapping) else None
        kind = data.get("type") if data is not None else getattr(event, "type", None)
        if kind == "response.output_text.delta":
            delta = data.get("delta") if data is not None else getattr(event, "delta", None)
            deltas.append(delta if isinstance(delta, str) else "")
    return text == "".join(deltas)


def _field(value: Any, name: str) -> Any:
    """A field of an event or of its item: a JSON mapping's key or an SDK object's attribute."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def chunk_of_event(event: Any, calls: dict[int, int], kind: str | None = None) -> StreamChunk:
    """One upstream event as a neutral chunk (``calls``: output index -> tool-call index).

    ``event`` is an SDK event object (the openai transport) or the event's JSON mapping
    (``agentguard serve``, which passes ``kind`` when the type came as the SSE event name).
    Both are read the same way, so the two front doors judge a stream alike.

    Raises:
        ReportedError: the event is the upstream's error (``error``, ``response.failed``).
    """
    if kind is None:
        kind = _field(event, "type")
    if kind in FAILURES:
        raise ReportedError(event)
    delta = _field(event, "delta")
    if kind == "response.output_text.delta" and isinstance(delta, str):
        return StreamChunk(content=delta, raw=event)
    if kind in REASONING_DELTAS and isinstance(delta, str):
        return StreamChunk(reasoning=delta, raw=event)
    if kind == REFUSAL_DELTA and isinstance(delta, str):
        return StreamChunk(refusal=delta, raw=event)
    at = _field(event, "output_index")
    if kind == "response.output_item.added":
        item = _field(event, "item")
        if item is None or (isinstance(event, Mapping) and not isinstance(item, Mapping)):
            return StreamChunk(raw=event)
        if _field(item, "type") not in READ_ITEMS:
            return StreamChunk(other_output=True, raw=event)
        if _field(item, "type") == "function_call" and isinstance(at, int):
            index = calls.setdefault(at, len(calls))
            fn = {"name": _field(item, "name"), "arguments": _field(item, "arguments") or ""}
            call = {"index": index, "id": _field(item, "call_id"), "function": fn}
            return StreamChunk(tool_calls=(call,), raw=event)
    if kind == "response.function_call_arguments.delta" and at in calls:
        piece = {"index": calls[at], "function": {"arguments": delta or ""}}
        return StreamChunk(tool_calls=(piece,), raw=event)
    if kind in ENDS:
        body = _field(event, "response")
        if body is not None and not isinstance(body, Mapping):
            body = body.model_dump(mode="json", warnings=False)
        answer = response_from_responses(body if isinstance(body, Mapping) else {})
        return StreamChunk(finish_reason=answer.finish_reason, usage=answer.usage, raw=event)
    return StreamChunk(raw=event)
