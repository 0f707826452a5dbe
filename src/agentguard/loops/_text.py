"""Text detectors: repeated responses across turns and degenerate repetition inside one output."""

from __future__ import annotations

import re
from collections import Counter, deque

from rapidfuzz import fuzz

from agentguard._fingerprint import fingerprint_bytes

__all__ = ["ResponseWindow", "degenerate_repeats", "normalise_text"]

_SPACE = re.compile(r"\s+")
_FENCE = re.compile(r"^\s*(```|~~~)")
_TABLE = re.compile(r"^\s*\|.*\|\s*$|^\s*[-:| ]{3,}\s*$")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# A short chunk repeated back to back many times ("the the the ...", "abcabcabc...").
_RUN = re.compile(r"(.{2,80}?)(?:\s*\1){7,}", re.S)
#: Only the head of a long text is compared for near-duplicates (rapidfuzz is O(n*m/64)).
_COMPARE_CHARS = 2000
#: Degeneration is searched in at most this many trailing characters of one output.
_SCAN_CHARS = 20_000


def normalise_text(text: str) -> str:
    """``text`` lower-cased with runs of whitespace collapsed, for exact and fuzzy comparison."""
    return _SPACE.sub(" ", text).strip().lower()


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
    best = max(Counter(u for u in units if len(u) >= 3).values(), default=0)
    prose = "\n".join(lines)
    match = _RUN.search(prose)
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

    __slots__ = ("_items", "_similarity")

    def __init__(self, size: int, similarity: float) -> None:
        self._items: deque[tuple[str, str]] = deque(maxlen=size)
        self._similarity = similarity * 100.0

    def add(self, text: str) -> int:
        """Remember ``text``; return how many responses in the window (itself included) match it."""
        norm = normalise_text(text)
        digest = fingerprint_bytes(norm.encode("utf-8", "surrogatepass"))
        head = norm[:_COMPARE_CHARS]
        count = 1
        for other_digest, other_head in self._items:
            if other_digest == digest or (
                self._similarity < 100.0
                and fuzz.ratio(head, other_head, score_cutoff=self._similarity) > 0
            ):
                count += 1
        self._items.append((digest, head))
        return count
