"""Identities of tool calls and results: canonical fingerprints without volatile noise."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from agentguard._fingerprint import (
    MAX_DEPTH,
    _containers_at_most,
    _decode,
    _parse_constant,
    _parse_float,
    canonical_text,
    canonical_text_of_decoded,
    compact_key,
    decode_arguments,
    fingerprint_text,
    safe_canonical_text,
)

from ._text import forget_degeneration

__all__ = [
    "DEFAULT_VOLATILE_FIELDS",
    "StandIns",
    "ToolLoopPolicy",
    "call_fingerprint",
    "call_key",
    "content_text",
    "decoded",
    "is_error_result",
    "result_fingerprint",
    "result_key",
    "says_unknown_tool",
]

#: Result fields that change on every call without meaning progress (compared case- and
#: separator-insensitively: ``requestId``, ``request-id`` and ``request_id`` are one field).
DEFAULT_VOLATILE_FIELDS: frozenset[str] = frozenset(
    {
        "id", "uuid", "requestid", "runid", "messageid", "traceid", "spanid", "correlationid",
        "timestamp", "ts", "time", "date", "created", "createdat", "updatedat", "modifiedat",
        "checkedat", "fetchedat", "servertime", "pid", "duration", "durationms", "elapsed",
        "elapsedms", "latency", "latencyms", "took", "tookms", "etag",
    }
)  # fmt: skip

# Timestamps and identifiers inside free text results. Every alternative starts with four hex
# digits: the look-ahead lets the scan skip other positions at once, and spelling the cases out
# instead of re.I keeps the character classes cheap (together about 7x faster on prose).
_HEX = "[0-9a-fA-F]"
_TEXT_NOISE = re.compile(
    rf"(?={_HEX}{{4}})(?:"
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:[Zz]|[+-]\d{2}:?\d{2})?"
    rf"|\b{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}\b"
    rf"|\b{_HEX}{{24,}}\b)"
)
# Every byte of a hex digit to "h", any other byte to ".": a text whose image has no "hhhh"
# holds no noise, found by two C passes where the regex would step through every position.
_HEX_IMAGE = bytes(ord("h") if chr(b) in "0123456789abcdefABCDEF" else ord(".") for b in range(256))
# In the image of an ASCII text (a byte per character), where a match of each alternative can
# start: a timestamp's ``dddd-dd-dd``, a UUID's ``8-4-``, 24 hex digits. Line numbers, years,
# prices and sizes have four digits but none of these shapes: they are not tried.
_NOISE_START = re.compile(rb"hhhh(?:\.hh\.hh|hhhh\.hhhh\.|h{20})")
_PREFILTER_CHARS = 32  # below this the regex is as quick as the prefilter


#: The shortest noise: a timestamp to the minute (``2024-05-01T12:00``; ids are 24 and more).
_NOISE_MIN_CHARS = 16


#: A labelled line at the head of a text result (``Wall time: 0.1087 seconds``, ``Chunk ID:
#: 06cbf7``): command runners (the Codex CLI's ``exec_command``, CI logs) print such a header
#: before the output, and its values change on every run of the same command.
_LABEL_LINE = re.compile(r"(?m)^([ \t]*([A-Za-z][A-Za-z _-]{0,24}?)[ \t]*[:=][ \t]*)[^\n]*")
#: How far into a text the header is looked for: headers come first, and the bound keeps the
#: cost per result constant however long the output.
_HEADER_CHARS = 512
#: Labels of such lines whose values are noise: the volatile fields, and runners' own labels.
_VOLATILE_LABELS = DEFAULT_VOLATILE_FIELDS | {"walltime", "cputime", "chunkid", "exitedafter"}


def _unlabelled(text: str) -> str:
    """``text`` with the values of volatile labelled lines in its head replaced by ``<v>``."""
    head = text[:_HEADER_CHARS]
    if ":" not in head and "=" not in head:
        return text

    def value(match: re.Match[str]) -> str:
        label = _field(match.group(2).replace(" ", ""))
        return match.group(1) + "<v>" if label in _VOLATILE_LABELS else match.group(0)

    cleaned = _LABEL_LINE.sub(value, head)
    return text if cleaned == head else cleaned + text[_HEADER_CHARS:]


def _denoise(text: str) -> str:
    """``text`` with timestamps and ids replaced by ``<v>``, and the values of volatile labelled
    lines at its head (``Wall time: ...``)."""
    if len(text) < _NOISE_MIN_CHARS:
        return text  # too short to hold any noise: no regex call for the many short values
    if "\n" in text:
        text = _unlabelled(text)  # a header is lines: one-line values skip the regex
    if len(text) > _PREFILTER_CHARS:
        image = text.encode("utf-8", "surrogatepass").translate(_HEX_IMAGE)
        if text.isascii():  # (a byte of the image per character)
            return _denoised_from(text, image)
        if image.find(b"hhhh") < 0:
            return text  # every noise pattern starts with four hex digits
    return _TEXT_NOISE.sub("<v>", text)


#: Places where noise may start that :func:`_denoised_from` tries before it leaves the text to
#: the regex's own scan.
_TRIED = 16


def _denoised_from(text: str, image: bytes) -> str:
    """``_TEXT_NOISE.sub("<v>", text)`` for an ASCII ``text`` whose hex image is ``image`` (one
    byte per character): the regex is tried only where the image has the shape a match starts
    with (:data:`_NOISE_START`, found by a C search), instead of stepping through every
    character (a word boundary before a place is judged on the text before it, as the scan
    judges it)."""
    start = _NOISE_START.search(image)
    if start is None:
        return text  # the usual case: no place where noise can start
    parts: list[str] = []
    done = 0
    for _ in range(_TRIED):
        at = start.start()
        match = _TEXT_NOISE.match(text, at)
        if match is None:
            start = _NOISE_START.search(image, at + 1)
        else:
            parts += (text[done:at], "<v>")
            done = match.end()
            start = _NOISE_START.search(image, done)
        if start is None:
            return "".join((*parts, text[done:])) if parts else text
    return _TEXT_NOISE.sub("<v>", text)  # many places: the scan is as quick


@functools.lru_cache(maxsize=4096)  # results repeat their field names on every call
def _field(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


@dataclass(frozen=True, slots=True)
class ToolLoopPolicy:
    """How the LoopDetector judges one tool.

    Attributes:
        name: the tool name.
        volatile_arguments: argument fields ignored in the call's identity (e.g. a ``nonce``).
        volatile_results: result fields ignored when comparing results, on top of
            :data:`DEFAULT_VOLATILE_FIELDS`.
        polling: the tool is meant to be called repeatedly with the same arguments (a job status);
            identical calls are then judged only by their results, never by count alone.
        fingerprint: maps a result to the part that signals progress (e.g. ``lambda r:
            r["state"]``); its return value is fingerprinted instead of the whole result.
    """

    name: str
    volatile_arguments: frozenset[str] = frozenset()
    volatile_results: frozenset[str] = frozenset()
    polling: bool = False
    fingerprint: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        # Field names are compared case- and separator-insensitively, like the defaults.
        for attr in ("volatile_arguments", "volatile_results"):
            object.__setattr__(self, attr, frozenset(map(_field, getattr(self, attr))))


def decoded(value: Any, *, canonical: bool = False) -> Any:
    """``value`` decoded when it is a JSON object or array text, else ``value`` as it is.

    Identities are lenient: text that is not JSON is judged as that text.
    """
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        head = value[:1]  # a long result is not copied just to look at its first character
        if head.isspace():
            head = value.lstrip()[:1]
        if head in ("{", "["):
            try:
                return decode_arguments(value.strip(), canonical=canonical)
            except (ValueError, RecursionError):
                return value
    return value


#: Leaves a decoded JSON value holds besides text: nothing to strip.
_SCALARS = frozenset({int, float, bool, type(None)})


def _strip(value: Any, volatile: frozenset[str]) -> Any:
    cls = value.__class__  # decoded JSON's own types first: isinstance(.., Mapping) is slow
    if cls is str:
        return _denoise(value)
    if cls in _SCALARS:
        return value
    if cls is dict or (cls is not list and isinstance(value, Mapping)):
        return {k: _strip(v, volatile) for k, v in value.items() if _field(str(k)) not in volatile}
    if cls is list or isinstance(value, (list, tuple)):
        return [_strip(v, volatile) for v in value]
    if isinstance(value, str):
        return _denoise(value)
    return value


#: :func:`_stripped_json` leaves the text to the general path.
_UNDECIDED: Any = object()
#: :func:`_stripped_json` found the text is no JSON value.
_NOT_JSON: Any = object()


#: Keys whose verdict (volatile or not) a stripping decoder remembers.
_KEYS_REMEMBERED = 4096


@functools.lru_cache(maxsize=16)  # one per set of volatile fields: the default, per policy
def _stripping_decoder(volatile: frozenset[str]) -> tuple[json.JSONDecoder, Callable[[Any], Any]]:
    """A canonical JSON decoder that strips while it decodes, as :func:`_strip` after decoding.

    The decoder builds every object bottom-up through its hook, which drops the volatile fields
    and denoises the object's strings, so each object is handled once and no walk over the
    decoded value remains. Strings in arrays are denoised by the list cleaner: by the hook for
    an object's arrays, by the caller for a top-level array.
    """

    # (strings shorter than any noise are kept without a call: most values are short)
    short = _NOISE_MIN_CHARS

    def clean_list(items: list[Any]) -> list[Any]:
        out = []
        for raw in items:  # an object in the array was cleaned when it was built
            cls = raw.__class__
            if cls is str:
                out.append(raw if len(raw) < short else _denoise(raw))
            else:
                out.append(clean_list(raw) if cls is list else raw)
        return out

    # whether a key is a volatile field, per key met: results repeat their keys in every object
    # and on every call, and a dict lookup is cheaper than a call to the cached _field
    drops: dict[str, bool] = {}

    def clean_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = {}
        for key, raw in pairs:  # a repeated key keeps its last value, as dict() does
            drop = drops.get(key)
            if drop is None:
                drop = _field(key) in volatile
                if len(drops) < _KEYS_REMEMBERED:
                    drops[key] = drop
            if drop:
                continue
            cls = raw.__class__
            if cls is str:
                out[key] = raw if len(raw) < short else _denoise(raw)
            else:
                out[key] = clean_list(raw) if cls is list else raw
        return out

    decoder = json.JSONDecoder(
        parse_float=_parse_float, parse_constant=_parse_constant, object_pairs_hook=clean_object
    )
    return decoder, clean_list


def _stripped_json(text: str, volatile: frozenset[str]) -> Any:
    """:func:`_strip` of the canonically decoded JSON ``text`` (an object or array text), in one
    pass; :data:`_NOT_JSON` when it is not JSON, :data:`_UNDECIDED` when the general path must
    judge it (a text nesting deeper than :data:`MAX_DEPTH`: whether it is too deep to decode is
    the general path's to say, on the value before volatile fields are dropped)."""
    if not _containers_at_most(text, MAX_DEPTH) and _nesting(text) > MAX_DEPTH:
        return _UNDECIDED
    decoder, clean_list = _stripping_decoder(volatile)
    try:
        value = _decode(decoder, text)
    except ValueError:  # the canonical decoder would refuse it too
        return _NOT_JSON
    except RecursionError:  # a text that is no JSON, its nesting misjudged: as the general path
        return _UNDECIDED
    return clean_list(value) if value.__class__ is list else value


#: A JSON string literal (in JSON text, every quote outside one opens one). One left open runs
#: to the end of the text, and so does one ending in a lone backslash: every quote the scan
#: starts from then matches, so no start fails after reading to the end and the scan is linear
#: (``"`` followed by ``\\"`` a million times would otherwise be read again from each quote).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\(?:.|\Z)[^"\\]*)*(?:"|\Z)', re.S)
_BRACKET = re.compile(r"[\[\]{}]")
_NESTING_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting(text: str) -> int:
    """How many levels the containers of the JSON ``text`` nest, counted from its brackets
    outside strings (exact for JSON text; for other text only a guess, which decoding refutes).

    Large results open more containers than :data:`MAX_DEPTH` (a list of records) while nesting
    a few levels: counting levels in C passes spares them the general path's walks over the
    decoded value (its depth check, then stripping)."""
    brackets = _BRACKET.findall(_JSON_STRING.sub("", text))
    return max(accumulate(map(_NESTING_STEP.__getitem__, brackets)), default=0)


def _call_text(name: str, arguments: Any, policy: ToolLoopPolicy | None) -> str:
    try:
        return _call_text_of(name, arguments, policy)
    except RecursionError:  # arguments too deep (or cyclic) to walk: the safe form, unstripped
        return safe_canonical_text([name, arguments])


def _call_text_of(name: str, arguments: Any, policy: ToolLoopPolicy | None) -> str:
    args = decoded(arguments, canonical=True)
    # decoded from JSON text: canonical already, no normalising pass needed
    canonical = args is not arguments and isinstance(arguments, (str, bytes, bytearray))
    if policy is not None and policy.volatile_arguments and isinstance(args, Mapping):
        args = {k: v for k, v in args.items() if _field(str(k)) not in policy.volatile_arguments}
    if canonical:
        return canonical_text_of_decoded([name, args])
    return canonical_text([name, args])


def _result_text(result: Any, policy: ToolLoopPolicy | None) -> str:
    try:
        return _result_text_of(result, policy)
    except RecursionError:  # a result too deep (or cyclic) to walk: the safe form, unstripped
        return safe_canonical_text(result)


def _result_text_of(result: Any, policy: ToolLoopPolicy | None) -> str:
    if policy is not None and policy.fingerprint is not None:
        return canonical_text(policy.fingerprint(decoded(result)))
    volatile = DEFAULT_VOLATILE_FIELDS
    if policy is not None and policy.volatile_results:
        volatile = volatile | policy.volatile_results
    if result.__class__ is str and result[:1] in ("{", "["):
        stripped = _stripped_json(result.rstrip(), volatile)
        if stripped is _NOT_JSON:  # as below, without decoding it again: judged as that text
            return canonical_text(_denoise(result))
        if stripped is not _UNDECIDED:
            return canonical_text_of_decoded(stripped)
    value = decoded(result, canonical=True)
    if value is not result and isinstance(result, (str, bytes, bytearray)):
        return canonical_text_of_decoded(_strip(value, volatile))
    return canonical_text(_strip(value, volatile))


def call_fingerprint(name: str, arguments: Any, policy: ToolLoopPolicy | None = None) -> str:
    """The identity of a call: tool name plus canonical arguments (dict or JSON text alike)."""
    return fingerprint_text(_call_text(name, arguments, policy))


def result_fingerprint(result: Any, policy: ToolLoopPolicy | None = None) -> str:
    """The identity of a result with volatile fields, timestamps and ids removed."""
    return fingerprint_text(_result_text(result, policy))


def call_key(name: str, arguments: Any, policy: ToolLoopPolicy | None = None) -> str:
    """:func:`call_fingerprint`'s identity as a compact in-memory key (not for storage)."""
    return compact_key(_call_text(name, arguments, policy))


def result_key(result: Any, policy: ToolLoopPolicy | None = None) -> str:
    """:func:`result_fingerprint`'s identity as a compact in-memory key (not for storage)."""
    return compact_key(_result_text(result, policy))


#: Identities of texts (and whether a result reports a failure), shared by every LoopDetector in
#: the process. The sessions of one agent
#: call the same tools on the same data (a file read again, a record looked up by another run of
#: the task, a poll's unchanged answer), so most argument and result texts are met again, in this
#: session or another; a detector's own memo only spans its last few events. An identity is a
#: pure function of the text and the policy's volatile fields, so sharing it changes no verdict.
#: Two tiers bound what the memos keep alive: texts of up to ``_SHORT_TEXT`` characters, at most
#: ``_SHORT_KEPT`` of them, and longer ones up to ``_LONG_TEXT``, at most ``_LONG_KEPT`` (about 3
#: million characters in all per memo); a full tier is emptied (a dict's clear is atomic, so
#: threads sharing the memo need no lock).
_SHORT_TEXT, _SHORT_KEPT = 1_024, 1_024
_LONG_TEXT, _LONG_KEPT = 65_536, 32
_NO_FIELDS: frozenset[str] = frozenset()
_RESULT_MEMOS: tuple[dict[tuple[str, frozenset[str]], str], ...] = ({}, {})
_CALL_MEMOS: tuple[dict[tuple[str, str, frozenset[str]], str], ...] = ({}, {})
_FAILURE_MEMOS: tuple[dict[str, bool], ...] = ({}, {})  # is_error_result, by text


def text_result_key(text: str, policy: ToolLoopPolicy | None = None) -> str:
    """:func:`result_key` of a text result, remembered process-wide (see ``_RESULT_MEMOS``)."""
    size = len(text)
    if size > _LONG_TEXT or (policy is not None and policy.fingerprint is not None):
        return result_key(text, policy)
    memo = _RESULT_MEMOS[size > _SHORT_TEXT]
    key = (text, _NO_FIELDS if policy is None else policy.volatile_results)
    found = memo.get(key)
    if found is None:
        found = result_key(text, policy)
        if len(memo) >= (_LONG_KEPT if size > _SHORT_TEXT else _SHORT_KEPT):
            memo.clear()
        memo[key] = found
    return found


def text_call_key(name: str, arguments: str, policy: ToolLoopPolicy | None = None) -> str:
    """:func:`call_key` of JSON-text arguments, remembered process-wide (see ``_RESULT_MEMOS``)."""
    size = len(arguments)
    if size > _LONG_TEXT:
        return call_key(name, arguments, policy)
    memo = _CALL_MEMOS[size > _SHORT_TEXT]
    key = (name, arguments, _NO_FIELDS if policy is None else policy.volatile_arguments)
    found = memo.get(key)
    if found is None:
        found = call_key(name, arguments, policy)
        if len(memo) >= (_LONG_KEPT if size > _SHORT_TEXT else _SHORT_KEPT):
            memo.clear()
        memo[key] = found
    return found


def forget_texts() -> None:
    """Empty the process-wide memos of texts, identities and degeneration alike (a benchmark's
    replay starts cold with it)."""
    for memo in _RESULT_MEMOS:
        memo.clear()
    for calls in _CALL_MEMOS:
        calls.clear()
    for failures in _FAILURE_MEMOS:
        failures.clear()
    forget_degeneration()


#: Tools remembered with a text standing in for an identity (see :class:`StandIns`), and those
#: texts' characters in all; the others' identities are keyed at once.
_STAND_INS, _STAND_IN_CHARS = 256, 262_144
_KEYED: tuple[None, None, None] = (None, None, None)  # (see StandIns)
_KeyOf = Callable[[str, Any, "ToolLoopPolicy | None"], str]


class StandIns:
    """Identities of the results (or the calls) of each tool of one run, keyed only when needed.

    An identity is equal for two calls of a tool exactly when their keys (``key``) are, but the
    key is computed only to tell two different texts of one tool apart. A tool's first text
    stands in for its class: its identity is the text marked (``\\x01``, the tool's name: no
    key starts so) and the same text again is that identity at once; the keys of the stand-in
    and of the other text are computed when the tool meets another text, to tell whether that
    is the same after all. Most tools of a run are called once, or with one set of arguments,
    or return one answer, and are never keyed.

    The key function is given on each call, not kept: a detector's own method would make a
    reference cycle, which only the garbage collector frees.
    """

    __slots__ = ("_chars", "_entries")

    def __init__(self) -> None:
        # per tool: the text standing in for a class, the class's identity, and the stand-in's
        # key once computed; _KEYED for a tool whose identities are keys at once
        self._entries: dict[str, tuple[str | None, str | None, str | None]] = {}
        self._chars = 0

    def identity(self, name: str, value: Any, policy: ToolLoopPolicy | None, key_of: _KeyOf) -> str:
        """The identity of ``value`` (a call's arguments or a result) of tool ``name``, whose key
        is ``key_of(name, value, policy)``."""
        entry = self._entries.get(name)
        if entry is None:  # the tool's first (or too many tools to remember)
            if len(self._entries) >= _STAND_INS:
                return key_of(name, value, policy)
            if (
                value.__class__ is str
                and (policy is None or policy.fingerprint is None)  # (a function of the user's)
                and self._chars + len(value) <= _STAND_IN_CHARS
            ):
                self._chars += len(value)
                marked = f"\x01{len(name)}:{name}{value}"
                self._entries[name] = (value, marked, None)
                return marked
            self._entries[name] = _KEYED
            return key_of(name, value, policy)
        text, stand_in, key = entry
        if (
            text is not None
            and stand_in is not None
            and (value is text or (value.__class__ is str and value == text))
        ):
            return stand_in
        found = key_of(name, value, policy)
        if stand_in is None:  # the tool's identities are keys
            return found
        if key is None and text is not None:  # the stand-in's key, computed once
            key = key_of(name, text, policy)
            self._entries[name] = (text, stand_in, key)
        return stand_in if found == key else found

    def declared(self, name: str, old: ToolLoopPolicy | None, key_of: _KeyOf) -> None:
        """Tool ``name`` gets a new policy (it had ``old``): its stand-in's key is the one under
        ``old``, and the same text again is no longer known to be the same."""
        entry = self._entries.get(name)
        if entry is not None and entry[0] is not None:
            key = entry[2] if entry[2] is not None else key_of(name, entry[0], old)
            self._entries[name] = (None, entry[1], key)


def policies_from(
    tools: Iterable[Any] | Mapping[str, Any] | None,
) -> tuple[dict[str, ToolLoopPolicy], frozenset[str] | None]:
    """Split ``tools`` into per-tool policies and, when OpenAI tool schemas are given, known names.

    ``tools`` may be a mapping of name to :class:`ToolLoopPolicy`, or an iterable mixing
    policies and OpenAI-format tool schemas (``{"type": "function", "function": {"name": ...}}``).
    """
    policies: dict[str, ToolLoopPolicy] = {}
    known: set[str] | None = None
    items: Iterable[Any] = tools.values() if isinstance(tools, Mapping) else (tools or ())
    for item in items:
        if isinstance(item, ToolLoopPolicy):
            policies[item.name] = item
        elif isinstance(item, Mapping):
            fn = item.get("function", item)
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str):
                raise TypeError(f"tool schema without a function name: {sorted(item)!r}")
            known = (known or set()) | {name}
        else:
            raise TypeError(f"expected ToolLoopPolicy or an OpenAI tool schema, got {type(item)!r}")
    return policies, (frozenset(known) if known is not None else None)


def content_text(content: Any) -> str:
    """The text of a message ``content`` (a string or a list of OpenAI content parts)."""
    if content.__class__ is str:
        return content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content)


_FAILED = re.compile(r"^\s*(error\b|exception\b|traceback\b|failed\b|fatal\b)", re.I)


def _may_report_failure(text: str) -> bool:
    """Whether a JSON text may hold an ``error``, ``ok`` or ``success`` key: only a key written
    out as such (or spelled with ``\\u`` escapes) can. Most results hold none, and then are not
    decoded just to find that out."""
    return '"error"' in text or '"ok"' in text or '"success"' in text or "\\u" in text


def is_error_result(content: Any) -> bool:
    """Does a tool result report a failure? The one rule of the live guard and ``agentguard scan``.

    A failure is text that opens with the word ``Error``, ``Exception``, ``Traceback``,
    ``Failed`` or ``Fatal`` (any case; ``Errors: 0`` is not one), or a JSON object with a
    non-empty ``error``, or with ``ok`` or ``success`` false.

    Args:
        content: a tool message's ``content``: a string or a list of OpenAI content parts.
    """
    if content.__class__ is str and len(content) <= _LONG_TEXT:
        # results come back, in this session or another: the verdict is remembered per text
        memo = _FAILURE_MEMOS[len(content) > _SHORT_TEXT]
        failed = memo.get(content)
        if failed is None:
            failed = _reports_failure(content)
            if len(memo) >= (_LONG_KEPT if len(content) > _SHORT_TEXT else _SHORT_KEPT):
                memo.clear()
            memo[content] = failed
        return failed
    return _reports_failure(content_text(content))


def _reports_failure(text: str) -> bool:
    """:func:`is_error_result` of a text."""
    if _FAILED.match(text):
        return True
    # a long result is not copied just to look at its first character
    stripped = text.lstrip() if text[:1].isspace() else text
    if stripped.startswith("{") and _may_report_failure(stripped):
        data = decoded(stripped)
        if isinstance(data, Mapping):
            if data.get("error") not in (None, "", False):
                return True
            return data.get("ok") is False or data.get("success") is False
    return False


_UNKNOWN_TOOL = re.compile(
    r"(unknown|invalid|unrecognized|undefined|unsupported|no such)\s+(tool|function)"
    r"|(tool|function)\s+\S+\s+(not found|does not exist|is not available|is not defined"
    r"|is not registered)"
    r"|FunctionCallNotExists",
    re.I,
)


def says_unknown_tool(content: Any) -> bool:
    """Does a tool result say the called name is no tool ("unknown tool", "Tool x is not
    registered")? A business error ("seat taken", "no such file") says the tool ran."""
    text = content_text(content)
    # Every phrase names a tool or a function: a text naming neither is not searched (one C
    # pass where the pattern's scan tries its alternatives at every position). Lower-casing
    # finds what the pattern's IGNORECASE finds: no character but these letters' two ASCII
    # cases matches them (tested over all of Unicode).
    lowered = text.lower()
    if "tool" not in lowered and "funct" not in lowered:
        return False
    return bool(_UNKNOWN_TOOL.search(text))
