"""Canonical JSON, content fingerprints, and the one decoder of tool-call arguments.

Two values that mean the same JSON get the same fingerprint: key order, whitespace, ``1`` vs
``1.0`` and a JSON text vs the decoded value do not matter. Fingerprints are blake3 digests of
the canonical form, a fixed 16 bytes (32 hex characters) whatever the input size.

:func:`decode_arguments` is how every part of agentguard (validator, ToolGuard, loop identities,
``agentguard scan``, adapters) reads tool-call arguments, so they agree on what a call says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from blake3 import blake3

__all__ = [
    "arguments_object",
    "canonical_json",
    "decode_arguments",
    "fingerprint",
    "fingerprint_bytes",
    "fingerprint_canonical",
    "normalise",
]

DIGEST_SIZE = 16
# Built once: json.dumps/loads with options build a new encoder/decoder on every call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_STRICT = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def normalise(value: Any) -> Any:
    """``value`` with numbers and containers in canonical form (integral floats become ints)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        return {str(k): normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((normalise(v) for v in value), key=repr)
    return str(value)


def canonical_json(value: Any) -> bytes:
    """The canonical JSON encoding of ``value`` (sorted keys, no whitespace, UTF-8)."""
    if value.__class__ is str:  # a string holds no float: nothing to normalise
        return _ENCODER.encode(value).encode("utf-8", "surrogatepass")
    try:
        # Fast path: plain JSON data is already canonical unless it holds an integral float
        # (1.0 must encode as 1). The C encoder and, only when a "." or an exponent appears,
        # the C decoder's float hook find out without a Python walk over the value.
        text = _STRICT.encode(value)
    except (TypeError, ValueError):  # sets, mixed key types, NaN, other objects
        text = None
    if text is None or _has_integral_float(text):
        text = _ENCODER.encode(normalise(value))
    return text.encode("utf-8", "surrogatepass")


class _Found(Exception):
    pass


def _integral(token: str) -> float:
    number = float(token)
    if number.is_integer():
        raise _Found
    return number


_FLOAT_FINDER = json.JSONDecoder(parse_float=_integral)


def _has_integral_float(text: str) -> bool:
    if "." not in text and "e" not in text and "E" not in text:
        return False  # every float's repr has a "." or an exponent
    try:
        _FLOAT_FINDER.decode(text)
    except _Found:
        return True
    return False


def fingerprint_bytes(data: bytes) -> str:
    """The hex blake3 fingerprint of raw bytes."""
    return blake3(data).hexdigest(length=DIGEST_SIZE)


def _parse_float(text: str) -> Any:
    number = float(text)
    if math.isfinite(number) and number.is_integer():
        return int(number)
    return number if math.isfinite(number) else repr(number)


def _parse_constant(text: str) -> str:
    return repr(float(text))  # NaN, Infinity: as normalise() writes non-finite floats


# Built once (json.loads with options builds a decoder per call). The canonical one turns floats
# into their canonical form while parsing, so its output needs no normalise() pass.
_DECODER = json.JSONDecoder()
_CANONICAL = json.JSONDecoder(parse_float=_parse_float, parse_constant=_parse_constant)


def decode_arguments(arguments: Any, *, canonical: bool = False) -> Any:
    """Tool-call arguments as a value: the one argument decoder of agentguard.

    A mapping comes back as a ``dict``; ``None`` and ``""`` mean no arguments (``{}``); ``str``
    and UTF-8 ``bytes`` are decoded as JSON; any other value is returned as it is. Whether the
    value is a JSON object, and what to do when it is not, is the caller's to decide.

    Args:
        arguments: the arguments as the model or the caller gave them.
        canonical: decode floats in canonical form (``1.0`` becomes ``1``), as fingerprints need.

    Raises:
        ValueError: the text is not JSON (a :class:`json.JSONDecodeError`, with its position),
            or the bytes are not UTF-8.
    """
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, (bytes, bytearray)):
        arguments = arguments.decode("utf-8") if arguments else "{}"
    if isinstance(arguments, str):
        return (_CANONICAL if canonical else _DECODER).decode(arguments)
    if isinstance(arguments, Mapping):
        return dict(arguments)
    return arguments


def arguments_object(arguments: Any) -> dict[str, Any]:
    """:func:`decode_arguments`, required to be a JSON object.

    Raises:
        ValueError: the text is not JSON.
        TypeError: the arguments are not a JSON object.
    """
    decoded = decode_arguments(arguments)
    if not isinstance(decoded, dict):
        raise TypeError("tool arguments must be a JSON object")
    return decoded


def fingerprint(value: Any) -> str:
    """The fingerprint of a JSON-like value; a ``str`` holding JSON is decoded first.

    A string that is not JSON is fingerprinted as that string.
    """
    if isinstance(value, (str, bytes, bytearray)):
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value
        stripped = text.strip()
        if stripped[:1] in ("{", "[", '"') or stripped in ("true", "false", "null"):
            try:
                decoded = _CANONICAL.decode(stripped)
            except (ValueError, RecursionError):
                return fingerprint_bytes(canonical_json(text))
            return fingerprint_canonical(decoded)
        value = text
    return fingerprint_bytes(canonical_json(value))


def fingerprint_canonical(value: Any) -> str:
    """The fingerprint of a value already in canonical form, skipping the normalising pass.

    For values built from :func:`decode_arguments` with ``canonical=True`` (plus ``str``, ``int``,
    ``bool`` and ``None`` around them); equal to :func:`fingerprint` of the same value.
    """
    return fingerprint_bytes(_ENCODER.encode(value).encode("utf-8", "surrogatepass"))
