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
- tool calls and tool schemas: their JSON text, counted as above;
- an image part (chat ``image_url``, Responses ``input_image``, Anthropic-style ``image``): one
  token per 400 pixels when its size can be read from its data (PNG, JPEG, GIF and WebP data
  URLs or base64; the widest-erring of the providers' rules, whose per-image counts run from 85
  to a few thousand), at least 85 and at most 16,384 (a local vision model's default ceiling);
  :data:`IMAGE_UNKNOWN` when it cannot be read (a URL, a file id). Counted as text, a
  screenshot's base64 would be a hundred thousand tokens for an image the server counts as a
  thousand;
- an audio part (``input_audio``): one token per 250 bytes of audio (32 tokens a second, the
  highest of the providers' rates, at 64 kbit/s, the lowest common bitrate).
"""

from __future__ import annotations

import binascii
import json
import math
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from agentguard.types import Usage

__all__ = ["estimate_tokens", "estimate_usage", "holds_media", "image_size"]

#: Framing tokens per chat message, and for the priming of the reply.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
#: The output tokens a guarded call reserves when neither the request nor the configuration
#: caps its output. Held in the ledger only, never sent upstream as a cap.
UNCAPPED_OUTPUT = 16_384
#: An image part's tokens when its size cannot be read (a URL or a file id): above every cloud
#: provider's count for one image (OpenAI's highest, about 3,800; Anthropic's, about 1,600).
IMAGE_UNKNOWN = 4_096
#: The bounds of an image part's tokens (see the module docstring).
IMAGE_FLOOR, IMAGE_CEILING, PIXELS_PER_TOKEN = 85, 16_384, 400
#: Bytes of audio per token (see the module docstring).
AUDIO_BYTES_PER_TOKEN = 250
#: Base64 characters read to find an image's size (a JPEG's frame header follows its metadata).
_SIZE_WINDOW = 1 << 18


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
    media: bool = True,
) -> int:
    """Estimate the tokens of a text, or of a chat request (messages and tool schemas).

    Args:
        value: a text, or OpenAI-format messages.
        tools: the request's tool schemas (OpenAI ``tools`` format), counted as JSON.
        chars_per_token: ASCII characters per token.
        media: count image and audio parts (else they count nothing: a floor of what the
            server counts, where servers differ most).

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
                # multi-part content: text parts as text, images and audio by their size, other
                # parts (files ...) as their JSON
                for item in part:
                    total += _part_tokens(item, chars_per_token, media)
            else:
                total += _text_tokens(_json_text(part), chars_per_token)
    for tool in tools or ():
        total += _text_tokens(_json_text(tool), chars_per_token)
    return total


#: The content part types counted by size, not text (see the module docstring).
_MEDIA = frozenset(["image_url", "input_image", "image", "input_audio"])


def holds_media(content: Any) -> bool:
    """Whether a message's content holds an image or audio part."""
    if not isinstance(content, list):
        return False
    return any(isinstance(item, Mapping) and item.get("type") in _MEDIA for item in content)


def _part_tokens(item: Any, chars_per_token: float, media: bool) -> int:
    """One part of a message's content (see the module docstring)."""
    if not isinstance(item, Mapping):
        return _text_tokens(_json_text(item), chars_per_token)
    text = item.get("text")
    if isinstance(text, str):
        return _text_tokens(text, chars_per_token)
    kind = item.get("type")
    if kind in ("image_url", "input_image", "image"):
        return _image_tokens(item) if media else 0
    if kind == "input_audio":
        audio = item.get("input_audio")
        data = audio.get("data") if isinstance(audio, Mapping) else None
        if isinstance(data, str):
            return math.ceil(len(data) * 3 / 4 / AUDIO_BYTES_PER_TOKEN) if media else 0
    return _text_tokens(_json_text(item), chars_per_token)


def _image_tokens(item: Mapping[str, Any]) -> int:
    """An image part's tokens, from its size when its data shows it."""
    found: Any = item.get("image_url")
    if isinstance(found, Mapping):  # chat: {"url": ..., "detail": ...}
        found = found.get("url")
    source = item.get("source")
    if found is None and isinstance(source, Mapping):  # Anthropic-style: base64 or a URL
        found = source.get("data") or source.get("url")
    if not isinstance(found, str):
        return IMAGE_UNKNOWN
    if found.startswith("data:"):
        head, _, found = found.partition(",")
        if not head.endswith(";base64"):
            return IMAGE_UNKNOWN
    elif found.startswith(("http:", "https:", "file:", "gs:", "s3:")):
        return IMAGE_UNKNOWN
    size = image_size(found)
    if size is None:
        return IMAGE_UNKNOWN
    pixels = size[0] * size[1]
    return min(IMAGE_CEILING, max(IMAGE_FLOOR, math.ceil(pixels / PIXELS_PER_TOKEN)))


def image_size(data: str) -> tuple[int, int] | None:
    """The width and height of a base64 PNG, JPEG, GIF or WebP image, from its header (at most
    the first 256 KiB of its text is decoded); ``None`` when they cannot be read."""
    window = data[: _SIZE_WINDOW if data[:4] == "/9j/" else 64]  # a JPEG: its frame header
    try:
        raw = binascii.a2b_base64(window[: len(window) - len(window) % 4])
    except (binascii.Error, ValueError):
        return None
    try:
        if raw.startswith(b"\x89PNG\r\n\x1a\n") and raw[12:16] == b"IHDR":
            width, height = struct.unpack(">II", raw[16:24])
        elif raw[:6] in (b"GIF87a", b"GIF89a"):
            width, height = struct.unpack("<HH", raw[6:10])
        elif raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
            width, height = _webp_size(raw)
        elif raw[:2] == b"\xff\xd8":
            width, height = _jpeg_size(raw)
        else:
            return None
    except (struct.error, ValueError):
        return None
    return (width, height) if width > 0 and height > 0 else None


def _webp_size(raw: bytes) -> tuple[int, int]:
    chunk = raw[12:16]
    if chunk == b"VP8X":  # 24-bit width and height, less one
        return int.from_bytes(raw[24:27], "little") + 1, int.from_bytes(raw[27:30], "little") + 1
    if chunk == b"VP8L":  # 14 bits each, less one, after the signature byte
        bits = int.from_bytes(raw[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":  # after the frame tag and start code: 14 bits each
        width, height = struct.unpack("<HH", raw[26:30])
        return width & 0x3FFF, height & 0x3FFF
    raise ValueError("not a WebP image")


def _jpeg_size(raw: bytes) -> tuple[int, int]:
    """A JPEG's size from its first frame header (SOF0-SOF15 but DHT, JPG and DAC), walking the
    segments after the start marker."""
    at = 2
    while at + 9 <= len(raw):
        if raw[at] != 0xFF:
            raise ValueError("not a JPEG segment")
        marker = raw[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", raw[at + 5 : at + 9])
            return width, height
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", raw[at + 2 : at + 4])
        at += 2 + length
    raise ValueError("no JPEG frame header in the window read")


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
