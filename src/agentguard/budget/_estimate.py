"""Estimating tokens without a tokenizer.

The ledger must admit a request before the model has counted anything, and must account a
response that came back without ``usage``. It never downloads tokenizer files at run time, so it
estimates, with a heuristic that deliberately errs high (an over-estimate only reserves a little
too much; an under-estimate lets a budget overshoot):

- ASCII text: one token per ``chars_per_token`` characters (4 by default, the usual figure for
  English and code with BPE tokenizers), rounded up;
- every other character (CJK, emoji, accented letters): one token each — BPE vocabularies split
  such text into roughly one token per character or more;
- every message: 4 tokens of framing (role and separators), plus 3 for the reply's priming;
- tool calls and tool schemas: their JSON text, counted as above.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from agentguard.types import Usage

__all__ = ["estimate_tokens", "estimate_usage"]

#: Framing tokens per chat message, and for the priming of the reply.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
#: The output tokens a guarded call reserves when neither the request nor the configuration
#: caps its output. Held in the ledger only, never sent upstream as a cap.
UNCAPPED_OUTPUT = 16_384


def _text_tokens(text: str, chars_per_token: float) -> int:
    if not text:
        return 0
    ascii_chars = len(text.encode("ascii", "ignore")) if not text.isascii() else len(text)
    other = len(text) - ascii_chars
    return math.ceil(ascii_chars / chars_per_token) + other


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def estimate_tokens(
    value: str | Iterable[Mapping[str, Any]],
    *,
    tools: Iterable[Mapping[str, Any]] | None = None,
    chars_per_token: float = 4.0,
) -> int:
    """Estimate the tokens of a text, or of a chat request (messages and tool schemas).

    Args:
        value: a text, or OpenAI-format messages.
        tools: the request's tool schemas (OpenAI ``tools`` format), counted as JSON.
        chars_per_token: ASCII characters per token.

    Returns:
        An estimate that errs high; see the module docstring for the heuristic.
    """
    if isinstance(value, str):
        return _text_tokens(value, chars_per_token)
    total = REPLY_PRIMING
    for message in value:
        total += MESSAGE_OVERHEAD
        for key in ("content", "name", "tool_calls", "function_call", "tool_call_id"):
            part = message.get(key)
            if part is None:
                continue
            if key == "content" and isinstance(part, list):
                # multi-part content: count the text parts; images etc. as their JSON
                for item in part:
                    text = item.get("text") if isinstance(item, Mapping) else None
                    chunk = text if isinstance(text, str) else _json_text(item)
                    total += _text_tokens(chunk, chars_per_token)
            else:
                total += _text_tokens(_json_text(part), chars_per_token)
    for tool in tools or ():
        total += _text_tokens(_json_text(tool), chars_per_token)
    return total


def estimate_usage(
    messages: Iterable[Mapping[str, Any]],
    completion: str | Mapping[str, Any] | None,
    *,
    tools: Iterable[Mapping[str, Any]] | None = None,
    chars_per_token: float = 4.0,
) -> Usage:
    """Estimate the usage of a call whose response carried none; the result is marked estimated.

    Args:
        messages: the request's messages.
        completion: the response's text, or its assistant message (content and tool calls).
        tools: the request's tool schemas.
        chars_per_token: ASCII characters per token.
    """
    prompt = estimate_tokens(messages, tools=tools, chars_per_token=chars_per_token)
    if completion is None:
        output = 0
    elif isinstance(completion, str):
        output = _text_tokens(completion, chars_per_token)
    else:
        output = estimate_tokens([completion], chars_per_token=chars_per_token) - REPLY_PRIMING
    return Usage(prompt, output, estimated=True)
