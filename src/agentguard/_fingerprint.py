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
    return json.dumps(
        normalise(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8", "surrogatepass")


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
            data = json.dumps(decoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            return fingerprint_bytes(data.encode("utf-8", "surrogatepass"))
        value = text
    return fingerprint_bytes(canonical_json(value))
