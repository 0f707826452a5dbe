"""Reading recorded agent traces as a stream of ``(session, message, tokens, tools)`` records.

Formats, told apart item by item (a file may mix them):

- OpenAI chat format: a transcript per JSONL line (an array of messages, or an object with
  ``messages`` and optionally ``id`` / ``session`` / ``session_id`` and ``tools``), one message
  per line (objects with ``role``, grouped by ``session`` / ``session_id``), or a JSON array
  file of messages or transcripts (decoded item by item, so a large file streams too);
- request logs (LiteLLM's ``StandardLoggingPayload`` and the common ``{"request", "response"}``
  shape): one model call per line, its whole ``messages`` history and its ``response``; only
  the messages not seen in the session's earlier calls are fed, and a call re-sent with the
  same history counts as a retry;
- OpenHands event logs (``event_to_dict``: ``action`` / ``observation`` events with
  ``tool_call_metadata`` carrying the model's response and its usage).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple

__all__ = ["InputError", "Record", "open_counted", "records"]

_CHUNK = 1 << 16


class InputError(Exception):
    """The input cannot be scanned; the message names the file and line."""


class Record(NamedTuple):
    """One message of one session, with what the trace says about it.

    Attributes:
        session: the session (agent run) it belongs to.
        message: the OpenAI-format message; ``None`` for a failed call that produced none.
        where: ``file:line``, for errors.
        tokens: tokens the trace reports for producing it (a model call's total), if any.
        tools: the tool definitions the trace declares for the session, if any.
        retry_tokens: tokens of an earlier attempt this one repeated (request logs).
    """

    session: str
    message: Mapping[str, Any] | None
    where: str
    tokens: int | None = None
    tools: Sequence[Any] | None = None
    retry_tokens: int = 0


class _Counting(io.RawIOBase):
    """A raw reader that counts the bytes read, for a progress bar."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self.count += n or 0
        return n or 0

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_counted(path: str) -> tuple[IO[str], _Counting]:
    """Open ``path`` as UTF-8 text, with a counter of the bytes read so far."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - owned by the returned stream
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    counting = _Counting(raw)
    return io.TextIOWrapper(io.BufferedReader(counting), encoding="utf-8"), counting


class _Sessions:
    """Per-session state of the request-log and OpenHands readers."""

    def __init__(self) -> None:
        self.fed: dict[str, int] = {}  # request logs: history messages already fed
        self.last_tokens: dict[str, int] = {}  # request logs: the previous call's tokens
        self.response_id: dict[str, str] = {}  # OpenHands: the model response last fed
        self.names: dict[str, int] = {}  # transcripts: unique names


def records(stream: IO[str], path: str) -> Iterator[Record]:
    """Every message of every session in ``stream``, in file order."""
    state = _Sessions()
    try:
        for line_no, item in _items(stream, path):
            where = f"{path}:{line_no}"
            yield from _records_of(item, where, state)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _records_of(item: Any, where: str, state: _Sessions) -> Iterator[Record]:
    if isinstance(item, _Batch):
        for message in item:
            yield Record("transcript", _message(message, where), where)
    elif isinstance(item, list):
        name = _unique(state, f"line {where.rsplit(':', 1)[1]}")
        for message in item:
            yield Record(name, _message(message, where), where)
    elif not isinstance(item, dict):
        raise InputError(f"{where}: expected a JSON object or array, got {type(item).__name__}")
    elif "action" in item or "observation" in item:
        yield from _openhands(item, where, state)
    elif _is_request_log(item):
        yield from _request_log(item, where, state)
    elif isinstance(item.get("messages"), list):
        label = item.get("id") or item.get("session") or item.get("session_id")
        session = _unique(state, str(label or f"line {where.rsplit(':', 1)[1]}"))
        tools = item.get("tools") if isinstance(item.get("tools"), list) else None
        if not item["messages"]:
            yield Record(session, None, where, tools=tools)  # an empty transcript still counts
        for message in item["messages"]:
            yield Record(session, _message(message, where), where, tools=tools)
    elif "role" in item:
        session = item.get("session") or item.get("session_id") or "default"
        yield Record(str(session), item, where)
    else:
        raise InputError(
            f"{where}: expected a transcript (array of messages or object with 'messages'), a "
            "message (object with 'role'), a request log (with 'messages' and 'response') or "
            "an OpenHands event (with 'action' or 'observation')"
        )


def _obj(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _message(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a message object, got {type(value).__name__}")
    return value


def _unique(state: _Sessions, name: str) -> str:
    n = state.names.get(name, 0) + 1
    state.names[name] = n
    return name if n == 1 else f"{name} ({n})"


# -- request logs ----------------------------------------------------------------------------


def _is_request_log(item: Mapping[str, Any]) -> bool:
    if isinstance(item.get("request"), dict) and "response" in item:
        return True
    return isinstance(item.get("messages"), list) and (
        "response" in item or "call_type" in item or "standard_logging_object" in item
    )


def _request_log(item: Mapping[str, Any], where: str, state: _Sessions) -> Iterator[Record]:
    item = _obj(item.get("standard_logging_object")) or item
    request = _obj(item.get("request")) or item
    metadata = _obj(item.get("metadata"))
    session = str(
        item.get("session_id")
        or metadata.get("session_id")
        or metadata.get("litellm_session_id")
        or item.get("trace_id")
        or "default"
    )
    params = _obj(item.get("model_parameters"))
    tools = request.get("tools") or params.get("tools") or item.get("tools")
    tools = tools if isinstance(tools, list) else None
    messages = request.get("messages") or []
    if not isinstance(messages, list):
        raise InputError(f"{where}: 'messages' must be an array")
    response = item.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    tokens = item.get("total_tokens")
    if not isinstance(tokens, int) and isinstance(usage, dict):
        tokens = usage.get("total_tokens")
    tokens = tokens if isinstance(tokens, int) else None
    fed = state.fed.get(session, 0)
    retry = 0
    if fed and len(messages) == fed - 1:  # the same history sent again: the last call was redone
        retry = state.last_tokens.get(session, 0)
        fed -= 1
    elif len(messages) < fed:  # a new conversation, or a condensed history: feed the newest
        fed = max(0, len(messages) - 1)
    for message in messages[fed:]:
        yield Record(session, _message(message, where), where, tools=tools)
    failed = str(item.get("status", "success")) not in ("success", "ok")
    reply = _choice_message(response)
    if failed or reply is None:
        state.fed[session] = len(messages)
        state.last_tokens[session] = 0
        if failed and tokens:  # a failed call's tokens are spent and must be spent again
            yield Record(session, None, where, tokens=tokens, retry_tokens=tokens)
        return
    state.fed[session] = len(messages) + 1
    state.last_tokens[session] = tokens or 0
    yield Record(session, reply, where, tokens=tokens, tools=tools, retry_tokens=retry)


def _choice_message(response: Any) -> Mapping[str, Any] | None:
    if isinstance(response, str):
        try:
            response = json.loads(response)
        except ValueError:
            return None
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    return None


# -- OpenHands -------------------------------------------------------------------------------


def _openhands(event: Mapping[str, Any], where: str, state: _Sessions) -> Iterator[Record]:
    session = str(event.get("session_id") or event.get("sid") or "openhands")
    meta = _obj(event.get("tool_call_metadata")) or None
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
    args = _obj(event.get("args"))
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
    reply = _choice_message(response)
    rid = str(response.get("id")) if isinstance(response, dict) else None
    if reply is not None and rid is not None:
        if state.response_id.get(session) == rid:
            return  # one response, several actions: its message is fed once
        state.response_id[session] = rid
        usage = response.get("usage") if isinstance(response, dict) else None
        tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
        yield Record(session, reply, where, tokens=tokens if isinstance(tokens, int) else None)
        return
    arguments = {k: v for k, v in args.items() if k not in ("thought", "security_risk")}
    call = {
        "id": meta.get("tool_call_id"),
        "type": "function",
        "function": {"name": meta.get("function_name"), "arguments": json.dumps(arguments)},
    }
    yield Record(
        session,
        {"role": "assistant", "content": args.get("thought") or "", "tool_calls": [call]},
        where,
    )


# -- JSON items ------------------------------------------------------------------------------


def _items(stream: IO[str], path: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, JSON value)``: JSONL lines, or the items of a top-level array."""
    first = stream.readline()
    line_no = 1
    while first and not first.strip():
        first = stream.readline()
        line_no += 1
    if not first:
        return
    try:
        value = _loads(first, path, line_no)
    except InputError:
        if first.lstrip().startswith("["):
            yield from _array_items(first, stream, path, line_no)
            return
        raise
    messages = isinstance(value, list) and all(isinstance(v, dict) and "role" in v for v in value)
    if (
        isinstance(value, list)
        and value
        and not messages
        and all(isinstance(v, (list, dict)) for v in value)
    ):
        yield from ((line_no, v) for v in value)  # one line holding transcripts or events
    else:
        yield line_no, value
    for line in stream:
        line_no += 1
        if not line.strip():
            continue
        yield line_no, _loads(line, path, line_no)


def _loads(text: str, path: str, line_no: int) -> Any:
    """One JSON value, or an :class:`InputError` naming the line (too deep included)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{path}:{line_no}: JSON nested too deep to read") from None
    except ValueError as exc:
        raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None


def _array_items(head: str, stream: IO[str], path: str, line_no: int) -> Iterator[tuple[int, Any]]:
    """Decode a JSON array spread over many lines item by item.

    Linear in the file's size however its items are laid out: an item that does not decode
    yet is retried only after the buffer has grown by twice its size (so an item is decoded at
    most a few times over, not once per chunk read), and the buffer is read by position, not
    sliced after every item. The buffer holds at most a few times the largest item.
    """
    decoder = json.JSONDecoder()
    buf = head[head.index("[") + 1 :]
    pos = 0
    eof = False
    as_messages: bool | None = None
    pending: list[Any] = []
    while True:
        n = len(buf)
        while pos < n and buf[pos] in " \t\r\n,":
            if buf[pos] == "\n":
                line_no += 1
            pos += 1
        if pos < n and buf[pos] == "]":
            break
        if pos >= n:
            if eof:
                raise InputError(f"{path}:{line_no}: unterminated JSON array")
            chunk = stream.read(_CHUNK)
            eof = not chunk
            buf, pos = chunk, 0
            continue
        try:
            item, end = decoder.raw_decode(buf, pos)
        except RecursionError:
            raise InputError(f"{path}:{line_no}: JSON nested too deep to read") from None
        except ValueError as exc:
            if eof:
                raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None
            chunk = stream.read(max(_CHUNK, 2 * (n - pos)))
            eof = not chunk
            buf, pos = buf[pos:] + chunk, 0
            continue
        if as_messages is None:
            as_messages = isinstance(item, dict) and "role" in item
        if as_messages:
            pending.append(item)  # one transcript: feed messages in bounded batches
            if len(pending) >= 256:
                yield line_no, _Batch(pending)
                pending = []
        else:
            yield line_no, item
        line_no += buf.count("\n", pos, end)
        pos = end
    if pending or as_messages:
        yield line_no, _Batch(pending)


class _Batch(list[Any]):
    """Consecutive messages of the single transcript held by a JSON array file."""
