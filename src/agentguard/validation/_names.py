"""Tool-name matching: exact, then case/separator-insensitive, then fuzzy with synonyms.

A misspelt or hallucinated name is auto-corrected only when the match is *unambiguous* — the
best score is high enough and clearly ahead of the runner-up — and the tool is not
side-effecting (a guess must never send an e-mail). Otherwise the three closest names are
offered in the correction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rapidfuzz import fuzz, process

from ._tools import ToolSpec

__all__ = ["NameMatch", "NameMatcher", "normalise_name"]

_SYNONYMS: tuple[frozenset[str], ...] = (
    frozenset({"execute", "exec", "run", "invoke", "call"}),
    frozenset({"code", "shell", "command", "terminal", "bash", "cmd", "script", "python"}),
    frozenset({"find", "lookup", "search", "query", "locate"}),
    frozenset({"read", "open", "cat", "view", "load", "show"}),
    frozenset({"write", "save", "put", "store"}),
    frozenset({"delete", "remove", "rm", "del", "erase"}),
    frozenset({"list", "ls", "enumerate"}),
    frozenset({"fetch", "get", "retrieve", "download"}),
    frozenset({"file", "document", "doc"}),
    frozenset({"web", "internet", "online", "browser"}),
)
_CANON = {word: sorted(group)[0] for group in _SYNONYMS for word in group}
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def normalise_name(name: str) -> str:
    """Lower-case with separators removed: ``Read-File``, ``readFile`` and ``read_file`` agree."""
    return re.sub(r"[\s_\-.:/]+", "", name).lower()


def _canonical(name: str) -> str:
    words = [w.lower() for w in _WORDS.findall(name)]
    return " ".join(_CANON.get(w, w) for w in words)


@dataclass(frozen=True, slots=True)
class NameMatch:
    """The outcome of matching one name.

    Attributes:
        name: the tool it matches, or ``None``.
        safe: the match may be applied without asking (unambiguous, not side-effecting).
        suggestions: up to three closest tool names.
    """

    name: str | None
    safe: bool
    suggestions: tuple[str, ...] = ()


class NameMatcher:
    """Matches model-written tool names against the declared tools."""

    def __init__(self, specs: Mapping[str, ToolSpec], *, min_score: float, min_gap: float) -> None:
        self._specs = specs
        self._min_score = min_score
        self._min_gap = min_gap
        self._normal: dict[str, list[str]] = {}
        for name in specs:
            self._normal.setdefault(normalise_name(name), []).append(name)
        self._canon = {name: _canonical(name) for name in specs}

    def match(self, name: str) -> NameMatch:
        """Match ``name``: exact, normalised, then fuzzy."""
        if name in self._specs:
            return NameMatch(name, True)
        if not name or not self._specs:
            return NameMatch(None, False, tuple(sorted(self._specs)[:3]))
        same = self._normal.get(normalise_name(name), [])
        if len(same) == 1:
            return NameMatch(same[0], not self._specs[same[0]].side_effecting, (same[0],))
        wanted = _canonical(name)
        scored = sorted(
            (
                (max(fuzz.ratio(wanted, canon), fuzz.token_set_ratio(wanted, canon) - 5), tool)
                for tool, canon in self._canon.items()
            ),
            reverse=True,
        )
        suggestions = tuple(tool for score, tool in scored[:3] if score >= 40)
        best_score, best = scored[0]
        runner_up = scored[1][0] if len(scored) > 1 else 0.0
        if best_score >= self._min_score and best_score - runner_up >= self._min_gap:
            return NameMatch(best, not self._specs[best].side_effecting, suggestions)
        return NameMatch(None, False, suggestions)

    def misspells(self, key: str, candidates: Sequence[str]) -> bool:
        """Whether ``key`` reads as a misspelling of one of ``candidates`` (argument names)."""
        return process.extractOne(key, candidates, scorer=fuzz.ratio, score_cutoff=75) is not None

    def closest(self, key: str, candidates: Sequence[str]) -> tuple[str, ...]:
        """Up to three candidates closest to ``key`` (for argument names)."""
        found = process.extract(key, list(candidates), scorer=fuzz.ratio, limit=3, score_cutoff=50)
        return tuple(str(match[0]) for match in found)
