"""Model calls the server forwards unguarded still count against the caller's budgets.

``agentguard serve`` guards chat completions and the Responses API and forwards every other
request unchanged. Some of those are model calls too — legacy ``/v1/completions``,
``/v1/embeddings``, a provider's own routes (Ollama's ``/api/chat``, Anthropic-style
``/v1/messages``) — and with per-key budgets they would be a way around them. A forwarded
``POST`` whose JSON body names a ``model`` is therefore metered: its tokens are held before it
goes upstream (refused under ``hard_stop`` when they do not fit, as a guarded call is), and
when the answer has passed through, what it used is counted — the upstream's usage where the
answer reports it, else the guard's estimate of the text it carried. Nothing in the request or
the answer changes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from agentguard.budget import Reservation, TokenLedger, estimate_tokens
from agentguard.budget._estimate import UNCAPPED_OUTPUT
from agentguard.integrations.openai._responses import read_usage
from agentguard.transport import split_session_header
from agentguard.types import Usage

from ._upstream import json_object

__all__ = ["AnswerReader", "Metered", "meter", "metered_call", "usage_of"]

logger = logging.getLogger("agentguard.serve")

# The body keys that cap a forwarded call's output, by API: OpenAI's (chat, completions,
# Responses), Anthropic's (``max_tokens``), Ollama's native ``options.num_predict``.
_OUTPUT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Paths whose answers hold no generated tokens.
_NO_OUTPUT = ("/embeddings", "/moderations", "/api/embed", "/api/embeddings")
# A line of an answer longer than this is not read for usage (an embedding's vectors are): the
# bound on what the reader keeps of an answer, whatever its size.
_LINE_BYTES = 1 << 20


def metered_call(body: bytes) -> tuple[str, int, int | None] | None:
    """A forwarded request that is a model call: its model, estimated prompt tokens and the
    output cap it sets (``None``: none); ``None`` when it is no model call (not a JSON object
    naming a ``model``)."""
    start = body[:64].lstrip()
    if not start.startswith(b"{"):
        return None
    data = json_object(body)  # none the server can read: the upstream answers it
    if data is None or not isinstance(data.get("model"), str) or not data["model"]:
        return None
    cap = None
    options = data.get("options")
    values = [data.get(k) for k in _OUTPUT_KEYS]
    if isinstance(options, Mapping):
        values.append(options.get("num_predict"))
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            cap = value if cap is None else min(cap, value)
    prompt = {k: v for k, v in data.items() if k != "model"}
    return data["model"], estimate_tokens(json.dumps(prompt, ensure_ascii=False)), cap


def usage_of(obj: object) -> Usage | None:
    """The usage an answer (or one event of a streamed answer) reports, in any of the shapes
    OpenAI-compatible servers, Anthropic and Ollama use; ``None`` when it reports none (or
    counts the guard cannot trust: :func:`read_usage`)."""
    if not isinstance(obj, Mapping):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, Mapping):
        response = obj.get("response")  # the Responses API's completed event
        usage = response.get("usage") if isinstance(response, Mapping) else None
    if not isinstance(usage, Mapping):
        message = obj.get("message")  # Anthropic's message_start event
        usage = message.get("usage") if isinstance(message, Mapping) else None
    if isinstance(usage, Mapping):
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        output = usage.get("completion_tokens", usage.get("output_tokens"))
        total = usage.get("total_tokens")
        if output is None and isinstance(total, int) and isinstance(prompt, int):
            output = max(0, total - prompt)  # an embedding's usage: prompt and total
        if prompt is None and output is None:
            prompt = total  # a total alone
    else:  # Ollama's native answers
        prompt, output = obj.get("prompt_eval_count"), obj.get("eval_count")
    return None if prompt is None and output is None else read_usage(prompt, output)


def _text_of(obj: object) -> str:
    """The text an answer (or one event) carries, in the shapes :func:`usage_of` reads."""
    if not isinstance(obj, Mapping):
        return ""
    parts: list[str] = []
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, Mapping):
                continue
            text = choice.get("text")
            if isinstance(text, str):
                parts.append(text)
            for key in ("message", "delta"):
                inner = choice.get(key)
                if isinstance(inner, Mapping) and isinstance(inner.get("content"), str):
                    parts.append(inner["content"])
    for key in ("response", "delta"):  # Ollama's generate; Anthropic's text delta
        value = obj.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, Mapping) and isinstance(value.get("text"), str):
            parts.append(value["text"])
    message = obj.get("message")  # Ollama's chat
    if isinstance(message, Mapping) and isinstance(message.get("content"), str):
        parts.append(message["content"])
    content = obj.get("content")  # Anthropic's whole message
    if isinstance(content, list):
        texts = (c.get("text") for c in content if isinstance(c, Mapping))
        parts += [t for t in texts if isinstance(t, str)]
    return "".join(parts)


class AnswerReader:
    """Reads a forwarded answer's bytes as they pass, for what it used.

    The answer is one JSON document, server-sent events (``data:`` lines) or JSON lines: each
    line is decoded on its own, and the whole, when it was no more than one line's bound, once
    more at the end. The last usage reported wins; without one, the text read is estimated.
    Memory is bounded by one line (:data:`_LINE_BYTES`); a longer line is skipped.
    """

    def __init__(self) -> None:
        self._line = bytearray()
        self._whole = bytearray()
        self._skipping = False
        self.usage: Usage | None = None
        self._text: list[str] = []

    def feed(self, piece: bytes) -> None:
        """The next bytes of the answer."""
        if len(self._whole) <= _LINE_BYTES:
            self._whole += piece
        while piece:
            end = piece.find(b"\n")
            if end < 0:
                self._add(piece)
                return
            self._add(piece[:end])
            piece = piece[end + 1 :]
            self._end_line()

    def _add(self, part: bytes) -> None:
        if self._skipping:
            return
        if len(self._line) + len(part) > _LINE_BYTES:
            self._line.clear()
            self._skipping = True
            return
        self._line += part

    def _end_line(self) -> None:
        line, skipping = bytes(self._line).strip(), self._skipping
        self._line.clear()
        self._skipping = False
        if skipping or not line:
            return
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line.startswith(b"{"):
            return
        event = json_object(line)
        if event is not None:
            self._read(event)

    def _read(self, event: object) -> None:
        usage = usage_of(event)
        if usage is not None:
            self.usage = usage
        text = _text_of(event)
        if text:
            self._text.append(text)

    def used(self, prompt_estimate: int, output_cap: int | None) -> Usage:
        """What the answer used: its own usage, else the prompt's estimate and the text read
        (at most ``output_cap`` when the request capped its output)."""
        self._end_line()
        if self.usage is None and not self._text and len(self._whole) <= _LINE_BYTES:
            whole = json_object(bytes(self._whole))  # one JSON document over several lines
            if whole is not None:
                self._read(whole)
        if self.usage is not None:
            return self.usage
        output = estimate_tokens("".join(self._text))
        if output_cap is not None:
            output = min(output, output_cap)
        return Usage(prompt_estimate, output)


class Metered:
    """One forwarded model call's hold, settled when its answer has passed through."""

    def __init__(
        self, ledger: TokenLedger, reservation: Reservation, prompt: int, cap: int | None
    ) -> None:
        self._ledger = ledger
        self._reservation = reservation
        self._prompt = prompt
        self._cap = cap
        self.reader = AnswerReader()

    async def done(self, status: int) -> None:
        """The answer has passed through: a refusal (status 400 and up) used nothing; any
        other answer used what it reports (else the estimate of what it carried). Never
        raises: the answer is the caller's whatever the store does (a hold it cannot settle
        returns with its lease)."""
        try:
            if status >= 400:
                await self._ledger.arelease(self._reservation)
            else:
                used = self.reader.used(self._prompt, self._cap)
                await self._ledger.acommit(self._reservation, used)
        except Exception:  # see the docstring
            logger.warning("agentguard: could not settle a forwarded call", exc_info=True)

    def abandon(self) -> None:
        """The answer was cut off (the caller gone, the upstream failed mid-answer): what
        passed counts, now. One blocking store operation, as for an abandoned guarded stream;
        never raises (the lease frees a hold a store cannot settle)."""
        try:
            self._ledger.commit(self._reservation, self.reader.used(self._prompt, self._cap))
        except Exception:  # see the docstring
            logger.debug("could not settle a forwarded call", exc_info=True)

    async def fail(self) -> None:
        """The upstream was not reached, or did not answer: nothing was used (never raises,
        as :meth:`done`)."""
        await self.done(599)


async def meter(
    ledger: TokenLedger, path: str, headers: Mapping[str, str], body: bytes
) -> Metered | None:
    """The hold of a forwarded request that is a model call (``None`` when it is none).

    Raises:
        BudgetExceeded: under ``hard_stop``, the call does not fit (as a guarded one would not).
    """
    found = metered_call(body)
    if found is None:
        return None
    model, prompt, cap = found
    if path.rstrip("/").endswith(_NO_OUTPUT):
        cap = 0  # an embedding or a moderation answers no tokens
    header, _rest = split_session_header(headers)
    session = header or f"forwarded {path}"
    limit = ledger.output_cap(cap)
    reservation = await ledger.areserve(
        session,
        prompt,
        max_output_tokens=UNCAPPED_OUTPUT if limit is None else limit,
        model=model,
    )
    return Metered(ledger, reservation, prompt, limit)
