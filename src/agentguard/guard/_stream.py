"""Streaming: assembling a streamed answer, watching its text for degeneration, and releasing
held-back tool calls once they are valid."""

from __future__ import annotations

import re
from typing import Literal

from agentguard.config import GuardConfig
from agentguard.loops._text import degenerate_repeats
from agentguard.transport import Accumulator, ModelResponse, StreamChunk

__all__ = ["Accumulator", "CallGate", "DegenerationWatch", "tool_call_chunks"]


class DegenerationWatch:
    """Judges a streaming text and its reasoning, every few hundred characters each, for
    degenerate repetition."""

    __slots__ = ("_at", "_enabled", "_limit", "_reasoning_at")

    STEP = 512

    def __init__(self, config: GuardConfig) -> None:
        loops = config.loop_detection
        self._enabled = loops.enabled and loops.cut_degenerate_streams
        self._limit = 4 * loops.degenerate_min_repeats  # the detector's BREAK level
        self._at = self._reasoning_at = self.STEP

    def degenerate(self, acc: Accumulator) -> bool:
        """Whether the text or the reasoning so far degenerates (each judged once per ``STEP``
        new characters of its own)."""
        if not self._enabled:
            return False
        if acc.chars >= self._at:
            self._at = acc.chars + self.STEP
            if degenerate_repeats("".join(acc.content)) >= self._limit:
                return True
        if acc.reasoning_chars >= self._reasoning_at:
            self._reasoning_at = acc.reasoning_chars + self.STEP
            return degenerate_repeats("".join(acc.reasoning)) >= self._limit
        return False


# How a tool call written as text opens, blanks removed (see validation/_extract.py, which
# decides at the end whether it was one): a tag, or a JSON object (or a list of them, or either
# in a json fence) whose first key is one a call has.
_TAGS = ("<tool_call>", "<function=", "<|python_tag|>", "[TOOL_CALLS]")
_KEYS = ("name", "function", "type", "arguments", "parameters")
_OBJECTS = tuple(f'{bracket}"{key}":' for bracket in ("{", "[{") for key in _KEYS)
_OPENINGS = frozenset(
    (
        *_TAGS,
        *(
            f"{fence}{obj}"
            for fence in ("", "```", "```json", "```tool", "```tool_call")
            for obj in _OBJECTS
        ),
    )
)
_WIRE = "functions."  # llama.cpp's function-calling syntax, only where the message begins
_LENGTHS = sorted({len(o) for o in _OPENINGS} | {len(_WIRE)})
_PREFIXES = frozenset(o[:i] for o in (*_OPENINGS, _WIRE) for i in range(1, len(o)))
_TRIGGER = re.compile(r"[<\[{`]")
_BLANKS = re.compile(r"\s+")


class CallGate:
    """Holds a streamed text back from where a tool call written as text may begin.

    A local model that writes its call into ``content`` (``<tool_call>{...}``, a bare
    ``{"name": ...}`` object, ``functions.NAME:`` ...) must not reach the caller as text while
    the guard hands it over as a tool call at the end. The text streams live up to a possible
    opening; there the gate waits for the few characters that decide (at most ``LOOKAHEAD``). A
    call's opening holds everything after it until the answer is complete; anything else goes
    on. Work is linear: each character is scanned once and each opening judged on at most
    ``LOOKAHEAD`` characters.

    Attributes:
        held: whether an opening was found (the rest of the answer waits for the end).
    """

    __slots__ = ("_begun", "_pending", "_sent", "held")

    LOOKAHEAD = 64

    def __init__(self) -> None:
        self._pending = ""  # not yet released: a possible opening and what followed it
        self._begun = False  # some text other than blanks was released
        self.held = False
        self._sent: list[str] = []

    @property
    def sent(self) -> str:
        """The text released so far."""
        return "".join(self._sent)

    def feed(self, text: str) -> str:
        """Take the next piece of text; return what may go out now."""
        if self.held:
            return ""
        text = self._pending + text
        self._pending = ""
        out = []
        i = 0
        while i < len(text):
            if self._begun:
                found = _TRIGGER.search(text, i)
                start = found.start() if found is not None else len(text)
            else:  # where the message begins, its leading blanks wait with the first word
                start = i
            out.append(text[i:start])
            if start == len(text):
                break
            window = text[start : start + self.LOOKAHEAD]
            verdict = _opening(window, first=not self._begun)
            if verdict == "wait":
                self._pending = text[start:]
                break
            if verdict == "call":
                self.held = True
                break
            blanks = len(window) - len(window.lstrip())
            i = start + min(blanks + 1, len(window))  # through the character judged
            out.append(text[start:i])
            self._begun = self._begun or blanks < len(window)
        released = "".join(out)
        self._sent.append(released)
        return released


def _opening(window: str, *, first: bool) -> Literal["call", "wait", "no"]:
    """Whether ``window`` opens a call written as text, may still, or cannot."""
    compact = _BLANKS.sub("", window)
    if not compact:  # blanks where the message begins: the first word decides
        return "wait" if len(window) < CallGate.LOOKAHEAD else "no"
    for length in _LENGTHS:
        head = compact[:length]
        if head in _OPENINGS or (first and head == _WIRE):
            return "call"
    if compact in _PREFIXES and len(window) < CallGate.LOOKAHEAD:
        return "wait"
    return "no"


def tool_call_chunks(final: ModelResponse) -> list[StreamChunk]:
    """The held-back tool calls, released as whole deltas once valid."""
    calls = final.message.get("tool_calls") or []
    return [StreamChunk(tool_calls=({"index": i, **call},)) for i, call in enumerate(calls)]
