"""A streamed ``responses.create(stream=True)`` through the guard: events in, events out.

The transport turns the upstream's events into neutral chunks (:func:`chunk_of_event`): text
deltas become content, function-call items and their argument deltas become tool-call deltas,
``response.completed`` ends the answer (its usage too); every event is also kept, in order, in
the call's :class:`~agentguard.integrations.openai._transport.RawCall`.

What the caller iterates (:class:`ResponsesStream`) is the upstream's own events: each text
delta as the guard lets it through, preceded by the events the upstream sent before it; each
reasoning delta as it comes (with the events before it, up to the answer's text or calls, which
wait for the guard); at the end the rest. When the guard changed the answer (a repaired or
corrected function call), the upstream's function-call events are replaced by events for the
guard's calls, and ``response.completed`` carries the guarded output; a stream the guard cut
ends with ``response.incomplete``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from agentguard.guard import AsyncGuardedStream, GuardedStream, GuardReport
from agentguard.integrations._lazy import require
from agentguard.integrations._replay import call_keys
from agentguard.transport import StreamChunk, attach_report

from ._responses import (
    ENDS,
    OPENINGS,
    ReportedError,
    cut_response,
    is_text_event,
    response_from_responses,
    responses_output,
    unchanged_text,
)
from ._stream import AsyncIterating, Iterating, _Response
from ._transport import STARTED, RawCall, dump

__all__ = ["AsyncResponsesStream", "ResponsesStream"]

_CALL_EVENTS = (
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
)


def _is_call_event(event: Any) -> bool:
    kind = getattr(event, "type", None)
    if kind in _CALL_EVENTS:
        return True
    item = getattr(event, "item", None)
    return kind in ("response.output_item.added", "response.output_item.done") and (
        getattr(item, "type", None) == "function_call"
    )


def _is_text_event(event: Any) -> bool:
    return is_text_event(
        getattr(event, "type", None), getattr(getattr(event, "item", None), "type", None)
    )


def _waits(event: Any) -> bool:
    """Whether an event waits for the guard's judgment of the answer (its text, its calls, its
    end) before it goes out."""
    return _is_text_event(event) or _is_call_event(event) or getattr(event, "type", None) in ENDS


def _opened_empty(event: Any) -> bool:
    """Whether an event opens the answer's message or one of its parts, holding no text yet."""
    kind = getattr(event, "type", None)
    if kind == "response.output_item.added":
        item = getattr(event, "item", None)
        return getattr(item, "type", None) == "message" and not getattr(item, "content", None)
    if kind == "response.content_part.added":
        return not getattr(getattr(event, "part", None), "text", None)
    return False


class _Events:
    """The events to hand the caller for the guard's chunks (shared by sync and async)."""

    def __init__(self, raw: RawCall) -> None:
        self._raw = raw
        self._sent: set[int] = set()
        self._kinds: set[str] = set()
        self._text: list[str] = []
        self._calls: list[Mapping[str, Any]] = []
        self._end: Any = None
        self._finish: str | None = None  # the guard's answer's
        self._seq = 0
        self.owners: list[Any] = []

    def _emit(self, event: Any) -> Any:
        self._sent.add(id(event))
        self._kinds.add(str(getattr(event, "type", "")))
        self._seq = max(self._seq, int(getattr(event, "sequence_number", 0) or 0))
        return event

    def _pending(self, until: Any = None, *, judged: bool = True) -> list[Any]:
        """The upstream's events not handed on yet, up to ``until`` (included). Without
        ``judged`` (``until`` carries no text) they stop short of the first one of the answer's
        text or calls, or its end: those wait for the guard's judgment, and what follows them
        waits behind."""
        out = []
        for event in self._raw.events:
            if id(event) not in self._sent:
                if not judged and _waits(event):
                    break
                out.append(event)
            if event is until:
                break
        return out

    def of(self, chunk: StreamChunk) -> list[Any]:
        """The events to hand on for one chunk of the guard's stream."""
        raw = chunk.raw
        if raw is not None and not isinstance(raw, Mapping):
            if getattr(raw, "type", None) in ENDS:
                self._end = raw  # the usage chunk, last: the end decides what it carries
                return []
            self._text.append(chunk.content or "")
            pending = self._pending(until=raw, judged=bool(chunk.content))
            return [self._emit(e) for e in pending]
        if chunk.content:  # text the guard made: not the upstream's
            self._text.append(chunk.content)
        self._calls.extend(chunk.tool_calls)
        self._finish = chunk.finish_reason or self._finish
        return []

    def end(self) -> list[Any]:
        """The events after the last text delta: the upstream's, or the guard's answer."""
        end = self._end
        if end is None:
            ends = [e for e in self._raw.events if getattr(e, "type", None) in ENDS]
            end = ends[-1] if ends else None
        text = "".join(self._text)
        same_text = True
        if end is not None:
            upstream = response_from_responses(dump(end.response)).message
            same_text = unchanged_text(text, upstream.get("content"), self._raw.events)
            if same_text and call_keys(self._calls) == call_keys(upstream.get("tool_calls") or ()):
                return [self._emit(e) for e in self._pending()]
        return self._rebuilt(end, text, same_text=same_text)

    def _rebuilt(self, end: Any, text: str, *, same_text: bool) -> list[Any]:
        """The rest of the events for an answer the guard changed; the upstream's text events
        not handed on yet go too when the guard's text is not the upstream's (a call written
        as text, taken out of it: the final response carries the guard's text). The guard's
        calls go where their items are in the output, among the upstream's events still held
        (a reasoning item's that came after a call): clients that build the answer from the
        events in order (LangChain's) keep each reasoning item before the call it goes with."""
        types = require("openai.types.responses", "openai")
        if end is None and self._finish == "length":
            end = self._incomplete(types)
        data = dict(dump(end.response)) if end is not None else {"output": []}
        message = {"role": "assistant", "content": text or None, "tool_calls": self._calls}
        output = responses_output(data, message)
        calls = [(i, item) for i, item in enumerate(output) if item.get("type") == "function_call"]
        out: list[Any] = []
        for event in self._pending():
            kind = getattr(event, "type", None)
            if (
                _is_call_event(event)
                or kind in ENDS
                or (kind in OPENINGS and kind in self._kinds)
                or (not same_text and _is_text_event(event))
            ):
                continue
            at = getattr(event, "output_index", None)
            while calls and isinstance(at, int) and calls[0][0] < at:
                out += self._call_events(types, *calls.pop(0))
            out.append(self._emit(event))
        for index, item in calls:
            out += self._call_events(types, index, item)
        if end is not None:
            self._seq += 1
            response = type(end.response).construct(**{**data, "output": output})
            out.append(
                type(end).construct(type=end.type, response=response, sequence_number=self._seq)
            )
        return out

    def _call_events(self, types: Any, index: int, item: Mapping[str, Any]) -> list[Any]:
        """The events of one of the guard's calls, whole, at ``index`` of the output."""
        added = types.ResponseFunctionToolCall.construct(**{**item, "arguments": ""})
        done = types.ResponseFunctionToolCall.construct(**item)
        out = []
        for cls, kind, fields in (
            (types.ResponseOutputItemAddedEvent, "response.output_item.added", {"item": added}),
            (
                types.ResponseFunctionCallArgumentsDeltaEvent,
                "response.function_call_arguments.delta",
                {"item_id": item["id"], "delta": item["arguments"]},
            ),
            (
                types.ResponseFunctionCallArgumentsDoneEvent,
                "response.function_call_arguments.done",
                {"item_id": item["id"], "arguments": item["arguments"], "name": item["name"]},
            ),
            (types.ResponseOutputItemDoneEvent, "response.output_item.done", {"item": done}),
        ):
            self._seq += 1
            out.append(
                cls.construct(type=kind, output_index=index, sequence_number=self._seq, **fields)
            )
        return out

    def _incomplete(self, types: Any) -> Any:
        """The closing event of a stream the guard cut (a degenerating answer) before the
        upstream's own: ``response.incomplete``, the response the upstream opened with, as an
        answer cut at the output cap (a chat stream's ``finish_reason: "length"``)."""
        created = next((e for e in self._raw.events if getattr(e, "type", None) in OPENINGS), None)
        if created is None:
            return None
        data = cut_response(dump(created.response))
        return types.ResponseIncompleteEvent.construct(
            type="response.incomplete", response=type(created.response).construct(**data)
        )

    def broken(self) -> list[Any]:
        """The upstream's events to hand on when the guard's stream ends with an error (the
        upstream's, in its body, or the guard's refusal), as the raw stream yields them before
        it: those not handed on yet up to the first that carries what the guard holds (text,
        a call, the end); the openings, and a message's item and part opened empty, go."""
        out = []
        for event in self._pending():
            if _waits(event) and not _opened_empty(event):
                break
            out.append(self._emit(event))
        return out

    def failed(self, stream: Any, error: ReportedError) -> list[Any]:
        """The upstream's events not handed on yet, its error event last (the raw client hands
        it on as an event, raising nothing), but for those of a call: a call the guard holds
        never goes out unjudged (as from ``agentguard serve`` and the LiteLLM provider); the
        report is the error's."""
        report = error.agentguard_report
        self.done(stream, report if isinstance(report, GuardReport) else None)
        return [self._emit(e) for e in self._pending() if not _is_call_event(e)]

    def done(self, stream: Any, report: GuardReport | None) -> None:
        if report is not None:
            for owner in (stream, *self.owners):
                attach_report(owner, report)


class ResponsesStream(Iterating):
    """What a guarded ``responses.create(stream=True)`` returns on a sync client."""

    def __init__(self, inner: GuardedStream, raw: RawCall) -> None:
        self._inner = inner
        self._raw = raw
        self._events = _Events(raw)
        self._head: list[Any] = []
        self.owners = self._events.owners
        self._iterator = self._chunks()

    @property
    def response(self) -> _Response:
        """Stands for the HTTP response (the SDK's stream helper closes it)."""
        return _Response(self, self._raw)

    def prime(self) -> None:
        """Start the guarded call now (see :meth:`Stream.prime`)."""
        if not self._head:
            for chunk in self._inner:
                if chunk is not STARTED:
                    self._head.append(chunk)
                break

    def _chunks(self) -> Iterator[Any]:
        while self._head:
            yield from self._events.of(self._head.pop(0))
        try:
            for chunk in self._inner:
                if chunk is not STARTED:
                    yield from self._events.of(chunk)
        except ReportedError as error:
            yield from self._events.failed(self, error)
            return
        except Exception:
            # what the raw stream yields before the error (response.created ...), then it
            yield from self._events.broken()
            raise
        yield from self._events.end()
        self._events.done(self, self._inner.report)


class AsyncResponsesStream(AsyncIterating):
    """What a guarded ``responses.create(stream=True)`` returns on an async client."""

    def __init__(self, inner: AsyncGuardedStream, raw: RawCall) -> None:
        self._inner = inner
        self._raw = raw
        self._events = _Events(raw)
        self._head: list[Any] = []
        self.owners = self._events.owners
        self._iterator = self._chunks()

    @property
    def response(self) -> _Response:
        """Stands for the HTTP response (the SDK's stream helper closes it)."""
        return _Response(self, self._raw)

    async def prime(self) -> None:
        """Async twin of :meth:`ResponsesStream.prime`."""
        if not self._head:
            async for chunk in self._inner:
                if chunk is not STARTED:
                    self._head.append(chunk)
                break

    async def _chunks(self) -> AsyncIterator[Any]:
        while self._head:
            for event in self._events.of(self._head.pop(0)):
                yield event
        try:
            async for chunk in self._inner:
                if chunk is STARTED:
                    continue
                for event in self._events.of(chunk):
                    yield event
        except ReportedError as error:
            for event in self._events.failed(self, error):
                yield event
            return
        except Exception:
            for event in self._events.broken():  # (see ResponsesStream._chunks)
                yield event
            raise
        for event in self._events.end():
            yield event
        self._events.done(self, self._inner.report)
