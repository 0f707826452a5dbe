"""A guarded chat stream as the upstream's own chunks, wherever the guard changed nothing.

Shared by the openai client's guarded stream (SDK chunk objects) and ``agentguard serve``
(server-sent events): both record every chunk of the attempt being served beside its neutral
reading, and :class:`ChatReplay` decides, for each chunk of the guard's stream, which chunks the
caller gets.

- Text the guard lets through goes out as the upstream's chunk, preceded by the chunks before it
  that carry nothing the guard judges (:func:`bare`: the opening ``role`` chunk, Azure's
  ``prompt_filter_results``, a ``refusal``, another answer's delta when ``n`` > 1).
- The guard's closing chunks (its calls, released whole; the finish; the usage) wait for the
  end. When the answer served is the upstream's own (the same text, calls and finish), the
  upstream's chunks not handed on go out instead, as sent: a call's fragments, the finish chunk
  with its ``logprobs`` or ``content_filter_results``, the usage chunk. A chunk held back for its
  text (released whole by the guard) goes without that text, or not at all when nothing else is
  in it.
- When the guard changed the answer, its own chunks go out, and the upstream's usage chunk.
  A server that puts the usage on its finish chunk (llama.cpp) has that chunk go out without
  its choices when the adapter can make it so (``usage_only``): the guard's finish went out
  already, and clients that add chunks up (LangChain) would read a second one as
  ``"tool_callstool_calls"``.
- Once the caller has an attempt's chunks, a later attempt's bare chunks (a re-ask's ``role``
  chunk) stay back: the answer was opened once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentguard.transport import Accumulator, StreamChunk

__all__ = ["ChatReplay", "bare", "call_keys", "text_only"]

#: The chunks of the attempt being served, each with its neutral reading, in order.
Chunks = list[tuple[Any, StreamChunk]]


def bare(chunk: StreamChunk, *, finished: bool = True) -> bool:
    """Whether an upstream chunk carries nothing the guard holds back or judges: no text, call,
    reasoning, finish or usage of the first answer. Such a chunk goes out as it came.

    ``finished``: whether the answer's finish has come (with this chunk or before it). A usage
    count before it is a running one (see :attr:`StreamChunk.usage`), which holds nothing back:
    vLLM's ``continuous_usage_stats`` puts one on the opening ``role`` chunk too."""
    return not (
        chunk.content
        or chunk.tool_calls
        or chunk.reasoning
        or chunk.finish_reason
        or (chunk.usage is not None and finished)
    )


def text_only(chunk: StreamChunk, choices: int, logprobs: Any) -> bool:
    """Whether a chunk with ``choices`` choices (the first's ``logprobs``) holds nothing besides
    the first answer's text and reasoning: nothing is left of it once they went out."""
    return (
        choices == 1
        and not chunk.tool_calls
        and not chunk.finish_reason
        and chunk.usage is None
        and not chunk.refusal
        and logprobs is None
    )


def _closing(chunk: StreamChunk) -> bool:
    """Whether a chunk of the guard's is one of its closing ones (a call released whole, the
    finish, the usage), which wait for the end to decide whose chunks go out."""
    return bool(chunk.tool_calls or chunk.finish_reason) or (
        chunk.usage is not None and not chunk.content and not chunk.reasoning
    )


def call_keys(calls: Iterable[Mapping[str, Any]]) -> list[tuple[Any, Any, Any]]:
    """Tool calls (chat form) as comparable ``(id, name, arguments)`` triples: whether the
    calls served are the upstream's own."""
    out = []
    for call in calls:
        fn = call.get("function")
        fn = fn if isinstance(fn, Mapping) else {}
        out.append((call.get("id"), fn.get("name"), fn.get("arguments")))
    return out


class ChatReplay:
    """Which chunks the caller gets for each chunk of a guarded chat stream.

    :meth:`of` and :meth:`end` return the upstream's own chunk objects (to pass on as they are)
    and :class:`StreamChunk` objects (the guard's, for the caller to make into its chunk type).

    The replay consumes the recorded chunks as it decides on them: it removes them from the
    front of the list it reads and keeps only what it may still hand on (a call's fragments,
    the finish and usage chunks, a chunk's fields besides text already released), so a long
    stream is not held in memory twice.

    Args:
        chunks: the chunks of the attempt being served so far (a new list for each attempt,
            which the recorder only appends to), or ``None`` when they are not recorded: then
            every closing chunk is the guard's.
        without_text: an upstream chunk without the first answer's text, or ``None`` when
            nothing else is in it.
        usage_only: an upstream chunk with its usage alone (no choices), for the usage of an
            answer the guard changed when the upstream sent it on its finish chunk; ``None``
            when the adapter cannot make one (that chunk then goes out as it came).
    """

    #: consumed chunks are cut from the list once this many have gathered at its front
    _COMPACT = 256

    def __init__(
        self,
        chunks: Callable[[], Chunks] | None,
        without_text: Callable[[Any, StreamChunk], Any],
        usage_only: Callable[[Any], Any] | None = None,
    ) -> None:
        self._chunks = chunks
        self._without_text = without_text
        self._usage_only = usage_only
        self._attempt: Chunks | None = None
        self._at = 0  # the attempt's chunks before it were decided on
        self._upstream_answer = Accumulator()  # the attempt's answer, from the chunks decided
        # held back (as they would go out if unchanged), each with whether it is bare
        self._held: list[tuple[Any, bool]] = []
        self._sent: list[str] = []  # the text the caller got
        self._closing: list[StreamChunk] = []  # the guard's closing chunks, until the end
        self._began = False  # an upstream chunk went to the caller
        # this attempt's bare chunks stay back: an earlier attempt's went out
        self._quiet = False

    def _upstream(self) -> Chunks:
        chunks = self._chunks() if self._chunks is not None else []
        if chunks is not self._attempt:  # another attempt: its chunks are the ones served
            self._attempt, self._at, self._held = chunks, 0, []
            self._upstream_answer = Accumulator()
            # The caller has the answer's opening already (its ``role`` chunk, Azure's filter
            # results): a re-ask's would open it again, and clients that add deltas up (the
            # SDK's stream helper) would read the role as "assistantassistant".
            self._quiet = self._began
        return chunks

    def _find(self, raw: Any) -> int | None:
        """Where ``raw`` is among the attempt's chunks not decided on yet."""
        chunks = self._upstream()
        for at in range(self._at, len(chunks)):
            if chunks[at][0] is raw:
                return at
        return None

    def _decide(self, upto: int, *, until: Any = None) -> list[Any]:
        """The attempt's chunks before ``upto`` decided on: bare ones go out, unless a chunk
        before them is held (then they wait behind it, in order); the others are held. And
        ``until``, the upstream chunk at ``upto`` the guard passes on, if any."""
        chunks = self._upstream()
        end = min(upto, len(chunks))
        out = []
        for at in range(self._at, end):
            raw, neutral = chunks[at]
            answer = self._upstream_answer
            answer.add(neutral)
            if bare(neutral, finished=answer.finish is not None):
                if self._quiet:
                    continue
                if self._held:
                    self._held.append((raw, True))
                else:
                    out.append(raw)
                continue
            # its text, if any, goes out as the guard releases it: kept without it
            kept = self._without_text(raw, neutral) if neutral.content else raw
            if kept is not None:
                self._held.append((kept, False))
        self._at = max(self._at, end)
        if until is not None and self._at < len(chunks):
            self._upstream_answer.add(chunks[self._at][1])
            self._at += 1
            out.append(until)
        if self._at >= self._COMPACT and 2 * self._at >= len(chunks):
            del chunks[: self._at]  # decided on: the recorder only appends
            self._at = 0
        self._began = self._began or bool(out)
        return out

    def of(self, chunk: StreamChunk) -> list[Any]:
        """What to hand on now for one chunk of the guard's stream."""
        if _closing(chunk):
            self._closing.append(chunk)
            return self._decide(len(self._upstream()))
        self._sent.append(chunk.content or "")
        at = self._find(chunk.raw) if chunk.raw is not None else None
        if at is not None:  # the upstream's own chunk
            return self._decide(at, until=chunk.raw)
        return [*self._decide(len(self._upstream())), chunk]

    def failed(self) -> list[Any]:
        """What to hand on when the guard's stream ends with an error (the upstream's, in its
        body, or the guard's refusal): the attempt's bare chunks not handed on yet that no held
        chunk is before (the opening ``role`` chunk the raw client yields before the error);
        what the guard holds (a call not judged yet, the finish) stays back."""
        return self._decide(len(self._upstream()))

    def end(self) -> list[Any]:
        """What to hand on once the guard's stream ended: the upstream's chunks when the
        answer served is the upstream's, else its bare chunks and the guard's closing ones."""
        tail = self._decide(len(self._upstream()))
        if self._chunks is not None and self._unchanged():
            return [*(item for item, _ in self._held), *tail]
        bare_held = [item for item, is_bare in self._held if is_bare]
        # the usage chunk among the guard's closing ones is the upstream's own
        return [*bare_held, *tail, *(self._closed(c) for c in self._closing)]

    def _closed(self, chunk: StreamChunk) -> Any:
        """One of the guard's closing chunks as it goes out when the answer changed: the
        upstream's usage chunk as it came, or without its choices when it is the finish chunk
        too (the guard's own finish went out before it)."""
        if chunk.raw is None:
            return chunk
        if chunk.finish_reason and self._usage_only is not None:
            return self._usage_only(chunk.raw)
        return chunk.raw

    def _unchanged(self) -> bool:
        guard = Accumulator()
        for chunk in self._closing:
            guard.add(chunk)
        mine, theirs = guard.response(), self._upstream_answer.response()
        return (
            # calls streamed at one index go out at an index each (see Accumulator)
            not self._upstream_answer.split
            and "".join(self._sent) == "".join(self._upstream_answer.content)
            and call_keys(mine.message.get("tool_calls") or ())
            == call_keys(theirs.message.get("tool_calls") or ())
            and mine.finish_reason == theirs.finish_reason
        )
