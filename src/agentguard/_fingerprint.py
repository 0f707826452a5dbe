"""Canonical JSON and content fingerprints.

Two values that mean the same JSON get the same fingerprint: key order, whitespace, ``1`` vs
``1.0`` and a JSON text vs the decoded value do not matter. Fingerprints are blake3 digests of
the canonical form, a fixed 16 bytes (32 hex characters) whatever the input size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from blake3 import blake3

__all__ = ["canonical_json", "fingerprint", "fingerprint_bytes", "normalise"]

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


def _decode(text: str) -> Any:
    # floats are canonicalised while parsing, so decoded JSON needs no normalise() pass
    return json.loads(text, parse_float=_parse_float, parse_constant=lambda c: repr(float(c)))


def fingerprint(value: Any) -> str:
    """The fingerprint of a JSON-like value; a ``str`` holding JSON is decoded first.

    A string that is not JSON is fingerprinted as that string.
    """
    if isinstance(value, (str, bytes, bytearray)):
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value
        stripped = text.strip()
        if stripped[:1] in ("{", "[", '"') or stripped in ("true", "false", "null"):
            try:
                decoded = _decode(stripped)
            except (ValueError, RecursionError):
                return fingerprint_bytes(canonical_json(text))
            return fingerprint_bytes(_ENCODER.encode(decoded).encode("utf-8", "surrogatepass"))
        value = text
    return fingerprint_bytes(canonical_json(value))
