"""Canonical JSON, content fingerprints, and the one decoder of tool-call arguments.

Two values that mean the same JSON get the same fingerprint: key order, whitespace, ``1`` vs
``1.0`` and a JSON text vs the decoded value do not matter. Fingerprints are blake3 digests of
the canonical form, a fixed 16 bytes (32 hex characters) whatever the input size.

:func:`decode_arguments` is how every part of agentguard (validator, ToolGuard, loop identities,
``agentguard scan``) reads tool-call arguments, so they agree on what a call says.
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable, Mapping
from typing import Any

from blake3 import blake3

__all__ = [
    "MAX_DEPTH",
    "UndecodableArguments",
    "arguments_object",
    "canonical_json",
    "canonical_text",
    "canonical_text_of_decoded",
    "compact_key",
    "decode_arguments",
    "fingerprint",
    "fingerprint_bytes",
    "fingerprint_text",
    "normalise",
    "safe_canonical_text",
    "too_deep",
]

DIGEST_SIZE = 16
#: How deep tool-call arguments may nest (objects and arrays). Deeper arguments are refused by
#: :func:`decode_arguments` with a clear error instead of exhausting the recursion of the JSON
#: decoder, the schema validator or the encoder: no real tool takes arguments nested this deep.
MAX_DEPTH = 64
#: Canonical texts up to this length are their own identity key (see :func:`compact_key`).
INLINE_KEY_CHARS = 256
# Built once: json.dumps/loads with options build a new encoder/decoder on every call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_encode_str: Callable[[str], str] = json.encoder.encode_basestring


def _c_encoder(*, allow_nan: bool) -> Callable[[Any], str]:
    """A canonical encoder calling the C encoder directly (``JSONEncoder.encode`` builds a new
    one per call). No circular-reference bookkeeping: a cycle ends in RecursionError, as the
    normalising fallback's would."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another Python): the standard encoder
        strict = json.JSONEncoder(
            sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
        )
        return strict.encode
    encode = make(None, _ENCODER.default, _encode_str, None, ":", ",", True, False, allow_nan)

    def run(value: Any) -> str:
        if value.__class__ is str:
            return _encode_str(value)
        return "".join(encode(value, 0))

    return run


_STRICT = _c_encoder(allow_nan=False)
_CANONICAL_ENCODE = _c_encoder(allow_nan=True)


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


def _canonical_str(value: Any) -> str:
    if value.__class__ is str:  # a string holds no float: nothing to normalise
        return _encode_str(value)
    try:
        # Fast path: plain JSON data is already canonical unless it holds an integral float
        # (1.0 must encode as 1). The C encoder and, only when a "." or an exponent appears,
        # the C decoder's float hook find out without a Python walk over the value.
        text = _STRICT(value)
    except (TypeError, ValueError, RecursionError):  # sets, mixed key types, NaN, objects
        text = None
    if text is None or (not _floatless(value) and _has_integral_float(text)):
        try:
            text = _ENCODER.encode(normalise(value))
        except (TypeError, ValueError, RecursionError):  # deep, cyclic, a huge int
            text = safe_canonical_text(value)
    return text


def _floatless(value: Any) -> bool:
    """True when a small plain value surely holds no float (then its JSON is canonical as it is).

    Tool arguments are mostly a few strings, ints and flags: a walk over them is cheaper than
    parsing their JSON again to look for floats. ``False`` means "maybe": too big to walk
    cheaply, or holding a float or another type.
    """
    budget = 64
    stack = [value]
    while stack:
        item = stack.pop()
        kind = item.__class__
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        else:
            return False
        budget -= len(item)
        if budget < 0:
            return False
    return True


def canonical_json(value: Any) -> bytes:
    """The canonical JSON encoding of ``value`` (sorted keys, no whitespace, UTF-8)."""
    return _canonical_str(value).encode("utf-8", "surrogatepass")


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
    except (ValueError, RecursionError):  # a text the C encoder wrote at its own depth limit
        return True  # "maybe": the normalising pass decides
    return False


def fingerprint_bytes(data: bytes) -> str:
    """The hex blake3 fingerprint of raw bytes."""
    return blake3(data).hexdigest(length=DIGEST_SIZE)


def fingerprint_text(text: str) -> str:
    """The fingerprint of a canonical text (as :func:`canonical_text` returns it)."""
    return fingerprint_bytes(text.encode("utf-8", "surrogatepass"))


def compact_key(text: str) -> str:
    """An in-memory identity for a canonical text: the text itself when short, else a digest.

    Cheaper than a fingerprint for the short texts most calls and results are, and as exact
    (a digest is marked with ``#``, which no JSON text starts with). Not for storage: use
    :func:`fingerprint`, whose form does not depend on the length.
    """
    if len(text) <= INLINE_KEY_CHARS:
        return text
    return "#" + fingerprint_text(text)


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


def _decode(decoder: json.JSONDecoder, text: str) -> Any:
    try:  # the scanner alone, for a text that is one JSON value and nothing around it
        value, end = decoder.scan_once(text, 0)  # type: ignore[attr-defined]
        if end == len(text):
            return value
    except (StopIteration, ValueError):
        pass
    return decoder.decode(text)  # whitespace around the value, or the error with its position


class UndecodableArguments(ValueError):
    """JSON text agentguard refuses to decode, though it may be JSON: nested deeper than
    :data:`MAX_DEPTH` levels, or holding an integer longer than Python converts (4,300 digits).

    A :class:`ValueError`, so every caller that treats undecodable arguments as invalid does so.
    """


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests containers (mappings, lists, tuples) deeper than ``limit``.

    Iterative and stopping at ``limit + 1`` levels, so a deep or cyclic value costs no
    recursion: a cycle is simply too deep.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _containers_at_most(text: str, limit: int) -> bool:
    """A cheap bound: text opening at most ``limit`` containers cannot nest deeper."""
    return text.count("[") + text.count("{") <= limit


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
        UndecodableArguments: (a ``ValueError``) the text or the mapping nests deeper than
            :data:`MAX_DEPTH` levels, or the text holds an integer over 4,300 digits.
    """
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, (bytes, bytearray)):
        arguments = arguments.decode("utf-8") if arguments else "{}"
    if isinstance(arguments, str):
        try:
            value = _decode(_CANONICAL if canonical else _DECODER, arguments)
        except RecursionError:
            raise UndecodableArguments(_TOO_DEEP) from None
        except json.JSONDecodeError:
            raise
        except ValueError as exc:  # int() refusing a number over sys.get_int_max_str_digits()
            raise UndecodableArguments(
                f"the arguments hold a number too long to read ({exc})"
            ) from None
        if not _containers_at_most(arguments, MAX_DEPTH) and too_deep(value):
            raise UndecodableArguments(_TOO_DEEP)
        return value
    if isinstance(arguments, Mapping):
        if too_deep(arguments):
            raise UndecodableArguments(_TOO_DEEP)
        return dict(arguments)
    return arguments


_TOO_DEEP = f"the arguments nest deeper than {MAX_DEPTH} levels"


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


def canonical_text(value: Any) -> str:
    """The canonical JSON text :func:`fingerprint` hashes; a ``str`` holding JSON is decoded first.

    A string that is not JSON stands for itself (encoded as a JSON string).
    """
    if isinstance(value, (str, bytes, bytearray)):
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value
        head = text[:1]  # a long text is not copied just to look at its first character
        if head.isspace():
            head = text.lstrip()[:1]
        if head in ("{", "[", '"', "t", "f", "n"):
            stripped = text.strip()
            if head in ("{", "[", '"') or stripped in ("true", "false", "null"):
                try:
                    return _CANONICAL_ENCODE(_decode(_CANONICAL, stripped))
                except (ValueError, RecursionError):  # not JSON, or too deep to decode
                    pass
        return _encode_str(text)
    return _canonical_str(value)


def canonical_text_of_decoded(value: Any) -> str:
    """:func:`canonical_text` of a value already in canonical form, skipping the normalising pass.

    For values built from :func:`decode_arguments` with ``canonical=True`` (plus ``str``, ``int``,
    ``bool`` and ``None`` around them).
    """
    try:
        return _CANONICAL_ENCODE(value)
    except (TypeError, ValueError, RecursionError):  # too deep for the C encoder
        return safe_canonical_text(value)


class _Piece(str):
    """Output text on :func:`safe_canonical_text`'s stack (told from values by its class)."""


class _Leave:
    """Marks the end of a container on :func:`safe_canonical_text`'s stack."""

    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key


_CYCLE = _encode_str("<cycle>")
_OPEN_OBJECT, _OPEN_ARRAY = _Piece("{"), _Piece("[")
_CLOSE_OBJECT, _CLOSE_ARRAY, _COMMA = _Piece("}"), _Piece("]"), _Piece(",")


def safe_canonical_text(value: Any) -> str:
    """The canonical text of any value, in linear work and without recursion.

    The same text as :func:`canonical_text` for every value that one can encode; it also takes
    what the C encoder and :func:`normalise` cannot: values nested any depth, cyclic values
    (a container inside itself is written ``"<cycle>"``), integers too long for ``str``
    (written as a hexadecimal string) and objects whose ``str`` fails (their type name).
    """
    out: list[str] = []
    stack: list[Any] = [value]
    path: set[int] = set()  # the containers being written: one met again is a cycle
    push, pop = stack.append, stack.pop
    while stack:
        item = pop()
        kind = item.__class__
        if kind is _Piece or kind is str:
            out.append(item if kind is _Piece else _encode_str(item))
        elif kind is _Leave:
            path.discard(item.key)
        elif kind is dict or kind is list or isinstance(item, _CONTAINERS):
            key = id(item)
            if key in path:
                out.append(_CYCLE)
                continue
            path.add(key)
            push(_Leave(key))
            _push_members(item, push)
        else:
            out.append(_scalar(item))
    return "".join(out)


_CONTAINERS = (Mapping, list, tuple, set, frozenset)


def _push_members(item: Any, push: Callable[[Any], None]) -> None:
    """Push a container's members and punctuation, last first (the stack pops them in order)."""
    if isinstance(item, Mapping):
        if all(k.__class__ is str for k in item):
            entries = sorted(item.items())
        else:  # keys as normalise() writes them (str), the last of equal ones kept
            entries = sorted({_str_of(k): v for k, v in item.items()}.items())
        push(_CLOSE_OBJECT)
        for n in range(len(entries) - 1, -1, -1):
            key, member = entries[n]
            push(member)
            push(_Piece(("," if n else "{") + _encode_str(key) + ":"))
        if not entries:
            push(_OPEN_OBJECT)
        return
    members: list[Any] = list(item)
    if isinstance(item, (set, frozenset)):
        members.sort(key=safe_canonical_text)
    push(_CLOSE_ARRAY)
    for n in range(len(members) - 1, -1, -1):
        push(members[n])
        push(_COMMA if n else _OPEN_ARRAY)
    if not members:
        push(_OPEN_ARRAY)


def _scalar(value: Any) -> str:
    """A scalar's canonical text; any other object is written as its ``str``."""
    if not (value is None or isinstance(value, (bool, str, int, float))):
        return _encode_str(_str_of(value))
    if value is None or value is True or value is False:
        return "null" if value is None else ("true" if value else "false")
    if isinstance(value, str):
        return _encode_str(value)
    if isinstance(value, float):
        normal = normalise(value)
        if isinstance(normal, str):
            return _encode_str(normal)
        return repr(normal) if isinstance(normal, float) else _scalar(normal)
    try:
        return str(int(value))
    except ValueError:  # more digits than str() converts: hexadecimal is exact and unlimited
        return _encode_str(hex(value))


def _str_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:  # an object whose __str__ fails is known by its type
        return f"<{type(value).__name__}>"


def fingerprint(value: Any) -> str:
    """The fingerprint of a JSON-like value; a ``str`` holding JSON is decoded first.

    A string that is not JSON is fingerprinted as that string.
    """
    return fingerprint_text(canonical_text(value))
