"""Text detectors: repeated responses across turns and degenerate repetition inside one output."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from itertools import accumulate, pairwise
from typing import Any

from rapidfuzz import fuzz, process

from agentguard._fingerprint import fingerprint_bytes

__all__ = [
    "ResponseWindow",
    "degenerate_repeats",
    "degeneration",
    "forget_degeneration",
    "normalise_text",
    "repeats_below",
]

_FENCE = re.compile(r"^\s*(```|~~~)")
_TABLE = re.compile(r"^\s*\|.*\|\s*$|^\s*[-:| ]{3,}\s*$")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# A short chunk repeated back to back many times ("the the the ...", "abcabcabc...").
_RUN = re.compile(r"(.{2,80}?)(?:\s*\1){7,}", re.S)
#: Only the head of a long text is compared for near-duplicates (rapidfuzz is O(n*m/64)).
_COMPARE_CHARS = 2000
#: Degeneration is searched in at most this many trailing characters of one output.
_SCAN_CHARS = 20_000
#: The most repeated units whose copies are compared (each costs one pass over the lines).
_CANDIDATES = 8


def normalise_text(text: str) -> str:
    """``text`` lower-cased with runs of whitespace collapsed, for exact and fuzzy comparison."""
    # str.split() splits at the whitespace the regex \s matches: one C pass, no regex
    return " ".join(text.split()).lower()


def _prose_lines(text: str) -> list[str]:
    """Lines outside fenced code blocks and tables, normalised, empty lines dropped."""
    out: list[str] = []
    in_code = False
    for raw in text.splitlines():
        if _FENCE.match(raw):
            in_code = not in_code
            continue
        if in_code or _TABLE.match(raw):
            continue
        line = normalise_text(raw)
        if line:
            out.append(line)
    return out


def _looping(units: list[str]) -> int:
    """How often the most repeated unit comes back *with the same text between its copies*.

    A list of records in one layout ("- **Price:** ..." under every option) repeats its labels
    with different values between them: content, not degeneration. A loop repeats the unit with
    nothing new in between, so only copies separated by identical stretches count.
    """
    if len(set(units)) == len(units):  # the usual case: no unit comes back at all
        return 1 if any(len(u) >= 3 for u in units) else 0
    counts = Counter(u for u in units if len(u) >= 3)
    best = 0
    for unit, n in counts.most_common(_CANDIDATES):
        if n <= best:
            break  # most_common is ordered: no later unit can do better
        at = [i for i, u in enumerate(units) if u == unit]
        gaps = Counter(tuple(units[p + 1 : q]) for p, q in pairwise(at))
        best = max(best, 1 + max(gaps.values(), default=0))
    return best


def _periodic(text: str) -> bool:
    r"""Whether ``text`` (the prose with its whitespace removed) has a stretch of period ``p``
    (1 <= p <= 80) at least ``8 * p`` characters long: a necessary condition for :data:`_RUN`.

    A run of eight copies of a unit separated by whitespace only is, whitespace removed, eight
    back-to-back copies of the unit without its whitespace (``\s`` is exactly what
    ``str.split`` removes). Each period is tested by comparing the text with itself shifted,
    as one big-integer XOR on a byte per character (the low byte of its code point: equal
    characters give equal bytes), so the scan is a few C passes per period where the regex
    steps through every position and unit length.
    """
    return _first_periodic(text, first_found=True) >= 0


def _image(text: str) -> tuple[int, int, int]:
    """``text`` as a big integer of a byte per character (the low byte of its code point), its
    length, and the longest period a stretch of it may have."""
    codes = text.encode() if text.isascii() else text.encode("utf-32-le", "surrogatepass")[::4]
    n = len(codes)
    if n <= _SHORT and n - len(set(codes)) < 7:
        # a stretch of period p, 8 * p long, holds its first byte 8 times: a short text (most
        # answers of a few words) with fewer than 7 repeated bytes has none (one C pass)
        return 0, n, 0
    top = n // 8
    if top > _SMALL_PERIODS:
        top = min(top, _MAX_PERIOD)
        if not _blocks_recur(codes, top):
            top = _SMALL_PERIODS  # no longer period can have a stretch
    return int.from_bytes(codes, "big"), n, top


def _first_periodic(text: str, *, first_found: bool = False) -> int:
    """Where the earliest stretch :func:`_periodic` looks for starts in ``text``, ``-1`` when
    there is none (with ``first_found``: where the first one found starts, for the yes/no)."""
    whole, n, top = _image(text)
    earliest = -1
    for period in range(1, top + 1):
        # byte k >= period of the XOR compares character k with character k - period; the
        # bytes before are the text's own and not searched (no mask to cut them off). A zero
        # streak at k is a stretch from k - period: once one is found, only an earlier one
        # matters, so the search ends where such a streak would have to begin.
        same = (whole ^ (whole >> (8 * period))).to_bytes(n, "big")
        end = n if earliest < 0 else earliest + 8 * period - 1
        at = same.find(_STREAKS[period], period, end)
        if at >= 0:
            earliest = at - period
            if first_found or earliest == 0:
                break
    return earliest


def _last_periodic(text: str) -> int:
    """Where the latest stretch :func:`_periodic` looks for starts in ``text`` (a stretch being
    ``8 * p`` characters of period ``p``: the last such window of a longer one), ``-1`` when
    there is none."""
    whole, n, top = _image(text)
    latest = -1
    for period in range(1, top + 1):
        # (only a streak starting after the latest stretch found so far matters)
        same = (whole ^ (whole >> (8 * period))).to_bytes(n, "big")
        at = same.rfind(_STREAKS[period], max(period, latest + period + 1))
        if at >= 0:
            latest = at - period
    return latest


#: Where a run may start, :func:`_run` tries the regex place by place up to this many places;
#: beyond, the regex's own scan (it tries them all in C).
_RUN_PLACES = 64


def _run(prose: str, first: int, last: int) -> re.Match[str] | None:
    """``_RUN.search(prose, first)`` when no match can start after ``last``: a run's text is
    met with its stretch, so the search stops where the latest stretch starts instead of
    trying every later place (each an O(80) attempt) to the end of the text."""
    if last - first > _RUN_PLACES:
        return _RUN.search(prose, first)
    for at in range(first, last + 1):
        match = _RUN.match(prose, at)
        if match is not None:
            return match
    return None


#: Texts up to this long are first told to have no stretch by their repeated bytes (longer
#: ones have repeated bytes as a rule: the test would cost more than it saves).
_SHORT = 32
#: Periods up to this are always tested; a longer one only when :func:`_blocks_recur`.
_SMALL_PERIODS = 4
#: The longest period (the unit of :data:`_RUN` is at most 80 characters).
_MAX_PERIOD = 80
#: The zero streak of each period's stretch, made once (a text's few periods are tested per
#: output: making and slicing them there cost about as much as the tests of a short text)
_STREAKS = tuple(bytes(7 * period) for period in range(_MAX_PERIOD + 1))
_BLOCK = 16


def _blocks_recur(codes: bytes, top: int) -> bool:
    """False when no stretch of a period from 5 to ``top`` (at least ``8 * period`` bytes long)
    can be in ``codes``: a few C searches instead of a pass per period.

    Such a stretch, starting at ``j``, holds the aligned block of :data:`_BLOCK` bytes that
    starts at the first multiple of 16 from ``j`` (at most ``j + 15``), and holds it again
    ``period`` bytes later, since ``j + 15 + 16 + period <= j + 8 * period`` once the period is 5
    or more. So some aligned block recurs 5 to ``top`` bytes after itself.
    """
    for at in range(0, len(codes) - _BLOCK + 1, _BLOCK):
        if codes.find(codes[at : at + _BLOCK], at + 5, at + top + _BLOCK) >= 0:
            return True
    return False


def repeats_below(text: str, limit: int, normalised: str | None = None) -> bool:
    """True when :func:`degenerate_repeats` of ``text`` is surely below ``limit``, told by a few
    C passes instead of the line and sentence analysis (most outputs, narration above all, are
    a sentence or two).

    Sure because each bound is one of the analysis's own: the units compared are lines, or the
    sentences of the one line, so there are at most as many as line breaks and sentence ends
    plus one; and the run search, which could count more, only runs when the prose, whitespace
    removed, has a periodic stretch (:func:`_periodic`), which it cannot when the text's one
    line has none (a text of several lines is cut to its prose first: a fence or a table row
    between two halves of a run must not hide it).

    ``normalised``: :func:`normalise_text` of ``text``, when the caller made it already.
    """
    if len(text) > _SCAN_CHARS:
        return False
    lines = text.splitlines()
    if len(lines) + text.count(".") + text.count("!") + text.count("?") >= limit:
        return False
    # One line's prose is the line normalised (or nothing: a fence, a table row); whitespace
    # removed, that is the line lower-cased (whitespace is neither cased nor case-ignorable, so
    # collapsing it changes no final sigma), or the line normalised with its spaces removed (no
    # other whitespace is left in it: lower-casing makes none).
    if len(lines) > 1:
        bare = "".join("".join(_prose_lines(text)).split())
    elif normalised is not None:
        bare = normalised.replace(" ", "")
    else:
        bare = "".join(text.lower().split())
    return _first_periodic(bare, first_found=True) < 0  # (not _periodic)


#: :func:`degeneration` of recent narrations, shared by every detector in the process: a loop
#: says its narration again turn after turn ("Checking the build again."), and the sessions of
#: one agent share their phrasing. Texts of up to ``_REMEMBERED_CHARS`` characters, at most
#: ``_REMEMBERED`` of them; a full memo is emptied (atomic: threads need no lock).
_REMEMBERED_CHARS, _REMEMBERED = 1_024, 1_024
_DEGENERATION: dict[tuple[str, int], int] = {}


def degeneration(
    text: str, limit: int, *, remember: bool = False, normalised: str | None = None
) -> int:
    """:func:`degenerate_repeats` of ``text``, or ``-1`` when :func:`repeats_below` tells that
    it is below ``limit`` without the analysis.

    Args:
        text: the output.
        limit: the count from which the caller cares.
        remember: the text is likely to come back (narration): the answer is remembered per
            text (a pure function of it). Other texts (answers) are mostly new: remembering
            them would cost more than it saves.
        normalised: :func:`normalise_text` of ``text``, when the caller made it already.
    """
    if not remember:
        return -1 if repeats_below(text, limit, normalised) else degenerate_repeats(text)
    key = (text, limit)
    found = _DEGENERATION.get(key)
    if found is None:
        found = -1 if repeats_below(text, limit, normalised) else degenerate_repeats(text)
        if len(text) <= _REMEMBERED_CHARS:
            if len(_DEGENERATION) >= _REMEMBERED:
                _DEGENERATION.clear()
            _DEGENERATION[key] = found
    return found


def forget_degeneration() -> None:
    """Empty :func:`degeneration`'s memo (a benchmark's replay starts cold with it)."""
    _DEGENERATION.clear()


def degenerate_repeats(text: str) -> int:
    """How often the most repeated line, sentence or chunk occurs inside ``text``.

    Code blocks and Markdown tables are skipped: repeated structure there is content, not
    degeneration. Returns 0 or 1 for healthy text.
    """
    if len(text) > _SCAN_CHARS:
        text = text[-_SCAN_CHARS:]
    lines = _prose_lines(text)
    if not lines:
        return 0
    units = lines if len(lines) > 1 else _SENTENCE.split(lines[0])
    best = _looping(units)
    prose = "\n".join(lines)
    words = prose.split()
    bare = "".join(words)
    start = _first_periodic(bare)
    if start < 0:
        return best
    # A run, whitespace removed, is such a stretch: none starts before the earliest one or
    # after the latest one. A character of the bare text has one whitespace before it in the
    # prose per word before it (lines are normalised; the run may open with the whitespace
    # just before it). The regex, O(len * 80) per place, is tried between the two.
    ends = list(accumulate(map(len, words)))
    last = _last_periodic(bare)
    match = _run(
        prose, max(0, start + bisect_right(ends, start) - 1), last + bisect_right(ends, last)
    )
    if match is not None:
        unit = match.group(1)
        best = max(best, len(re.findall(re.escape(unit), match.group(0))))
    return best


class ResponseWindow:
    """The last ``size`` assistant responses of a session, for exact and near-duplicate matching.

    Args:
        size: responses remembered.
        similarity: 0-1 ratio at which two normalised responses are near-duplicates.
    """

    __slots__ = ("_items", "_keep", "_similarity")

    def __init__(self, size: int, similarity: float) -> None:
        # A tuple of strings (or 1-tuples of a digest), replaced on each add: it holds only
        # strings, so the garbage collector stops tracking it (a deque it would walk in every
        # full collection, once per session the guard remembers).
        self._items: tuple[Any, ...] = ()
        self._keep = max(0, size - 1)  # the responses kept besides the newest
        self._similarity = similarity * 100.0

    def add(self, text: str, normalised: str | None = None) -> int:
        """Remember ``text``; return how many responses in the window (itself included) match it.
        ``normalised``: :func:`normalise_text` of ``text``, when the caller made it already."""
        norm = normalise_text(text) if normalised is None else normalised
        items = self._items
        if self._similarity < 100.0:
            # Near-duplicates: an equal response scores 100, so the heads alone tell every match
            # (no digest of the whole), counted by one call over the window.
            item: Any = norm[:_COMPARE_CHARS]
            found = process.extract(
                item, items, scorer=fuzz.ratio, score_cutoff=self._similarity, limit=None
            )
            count = 1 + len(found)
        else:
            # Equal responses only: a short one is its own key, a long one its digest (a 1-tuple,
            # never equal to a text)
            item = (
                norm
                if len(norm) <= _COMPARE_CHARS
                else (fingerprint_bytes(norm.encode("utf-8", "surrogatepass")),)
            )
            count = 1 + items.count(item)
        self._items = (*items[max(0, len(items) - self._keep) :], item)
        return count
