"""Text detectors: response_repeat across turns and degenerate_text inside one output."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz import fuzz

from agentguard.config import LoopDetectionConfig
from agentguard.loops import LoopDetector
from agentguard.loops import _text as _text_module
from agentguard.loops._text import ResponseWindow, degenerate_repeats, normalise_text
from agentguard.types import Severity


def test_exact_repeat_after_normalisation_reaches_the_threshold() -> None:
    """The third copy of a response (case and whitespace aside) is a response_repeat."""
    det = LoopDetector()
    texts = ["Let me check the build.", "let me  check the build.", "LET ME CHECK THE BUILD."]
    verdicts = [det.check_text(t) for t in texts]
    assert [v.severity for v in verdicts] == [Severity.OK, Severity.OK, Severity.WARNING]
    assert verdicts[-1].detector == "response_repeat"


def test_near_duplicate_responses_at_the_similarity_threshold() -> None:
    """Responses differing by a word or two count as repeats at similarity 0.95."""
    det = LoopDetector()
    base = (
        "I could not find the cause of the failure yet, so I will check the build logs again now."
    )
    variants = [base, base.replace("again now", "again"), base.replace("yet,", "yet;")]
    assert det.check_text(variants[0]).ok
    assert det.check_text(variants[1]).ok
    assert det.check_text(variants[2]).severity is Severity.WARNING


def test_distinct_responses_are_not_repeats() -> None:
    """Different answers never trip response_repeat."""
    det = LoopDetector()
    answers = [
        "The build failed in the test stage.",
        "The failing test is test_partial_refund_rounding in tests/test_refunds.py.",
        "It expects Decimal('10.05') but the service computes Decimal('10.04').",
        "The refund is truncated instead of rounded half-up to cents.",
        "I changed refunds.py to quantize with ROUND_HALF_UP and the test passes.",
        "Shall I open a pull request with the fix?",
    ]
    for text in answers * 2:  # each answer twice stays below duplicate_threshold 3
        assert det.check_text(text).ok


def test_repeats_escalate_and_stay_while_they_continue() -> None:
    """WARNING, then CRITICAL, then BREAK as the same response keeps coming."""
    det = LoopDetector()
    severities = [det.check_text("Checking again.").severity for _ in range(7)]
    assert severities == sorted(severities)
    assert severities[-1] is Severity.BREAK


def test_window_size_bounds_memory_of_responses() -> None:
    """A response older than window_size responses is forgotten."""
    det = LoopDetector(LoopDetectionConfig(window_size=3, duplicate_threshold=2))
    assert det.check_text("the same").ok
    for i in range(3):
        det.check_text(f"something else entirely, number {i}")
    assert det.check_text("the same").ok


@given(st.text(min_size=1, max_size=200))
def test_window_counts_itself(text: str) -> None:
    """A fresh window reports a count of 1 for any first response."""
    assert ResponseWindow(5, 0.95).add(text) == 1


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(min_value=1, max_value=6),
    texts=st.lists(st.sampled_from(["a", "b", "c", "ok then"]), max_size=20),
)
def test_window_counts_like_a_bounded_queue_of_the_last_responses(
    size: int, texts: list[str]
) -> None:
    """Each count is 1 plus the matches among the ``size`` responses before it: the window
    keeps exactly the last ``size`` (its tuple of pairs replaces a deque; a model checks it)."""
    window = ResponseWindow(size, 1.0)  # exact matches only: the model needs no fuzz
    model: deque[str] = deque(maxlen=size)
    for text in texts:
        assert window.add(text) == 1 + model.count(text)
        model.append(text)


def test_normalise_text_collapses_case_and_whitespace() -> None:
    """Case and whitespace runs do not matter."""
    assert normalise_text("  Hello \n\t World ") == "hello world"


def test_repeated_lines_inside_one_output_are_degenerate() -> None:
    """A line repeating many times in one output is degenerate_text."""
    det = LoopDetector()
    text = "Here is the plan:\n" + "I will check the build status.\n" * 12
    v = det.check_text(text)
    assert (v.detector, v.severity) == ("degenerate_text", Severity.CRITICAL)


def test_repeated_sentences_on_one_line_are_degenerate() -> None:
    """Sentences repeating inside a single paragraph are degenerate."""
    assert degenerate_repeats("The answer is 42. " * 6) == 6


def test_token_run_without_punctuation_is_degenerate() -> None:
    """A stuttering run of one word is caught too."""
    assert degenerate_repeats("and then " + "the " * 40 + "end") >= 20


def test_code_blocks_are_not_degeneration() -> None:
    """Repeated lines inside a fenced code block are content."""
    code = (
        "```python\n" + "assert f(x) == 1\n" * 20 + "```\nAll assertions are the same on purpose."
    )
    assert degenerate_repeats(code) <= 1
    assert LoopDetector().check_text(code).ok


def test_tables_are_not_degeneration() -> None:
    """Markdown table rows that repeat are data, not degeneration."""
    table = "| name | status |\n|---|---|\n" + "| build | failed |\n" * 10
    assert LoopDetector().check_text(table).ok


def test_healthy_prose_is_not_degenerate() -> None:
    """Ordinary multi-paragraph prose scores at most 1."""
    text = (
        "The build failed in the test stage.\n\nThe failing test is test_partial_refund_rounding.\n"
        "It expects 10.05 and gets 10.04.\n\nThe fix is to quantize with ROUND_HALF_UP."
    )
    assert degenerate_repeats(text) <= 1


def test_tool_call_narration_is_not_a_response_repeat() -> None:
    """Short narration that accompanies tool calls may repeat; only degeneration is checked."""
    det = LoopDetector()
    assert all(det.check_text("Checking the job.", narration=True).ok for _ in range(10))


def test_empty_text_is_ok() -> None:
    """Empty and whitespace-only outputs are never findings."""
    det = LoopDetector()
    assert all(det.check_text(t).ok for t in ["", "  ", None, "", ""])


# -- the run search's periodicity gate: it never hides a run the regex finds -------------------

_UNIT = st.text(alphabet="ab c\u00e9\u0101\U0001f600-", min_size=2, max_size=12)


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="ab c\n\u00e9.", max_size=40),
    _UNIT,
    st.lists(st.sampled_from(["", " ", "\n", "\u2003"]), min_size=5, max_size=12),
    st.text(alphabet="ab c\n\u0101x", max_size=40),
)
def test_the_periodicity_gate_never_hides_a_run(
    head: str, unit: str, gaps: list[str], tail: str
) -> None:
    """Whatever the unit and the whitespace between its copies, text where the run regex finds
    a match always passes the cheap gate (so the gate changes no count)."""
    text = head + unit + "".join(gap + unit for gap in gaps) + tail
    prose = "\n".join(_text_module._prose_lines(text))
    if _text_module._RUN.search(prose) is not None:
        assert _text_module._periodic("".join(prose.split()))


@given(st.text(max_size=300))
def test_the_periodicity_gate_agrees_with_the_regex_on_any_text(text: str) -> None:
    prose = "\n".join(_text_module._prose_lines(text))
    if _text_module._RUN.search(prose) is not None:
        assert _text_module._periodic("".join(prose.split()))


def _periodic_by_definition(text: str) -> bool:
    """The gate's rule, position by position: a stretch of ``8 * p`` characters whose code
    points' low bytes repeat with period ``p`` (1 <= p <= 80)."""
    low = [ord(c) & 0xFF for c in text]
    for p in range(1, min(80, len(low) // 8) + 1):
        streak = 0
        for k in range(p, len(low)):
            streak = streak + 1 if low[k] == low[k - p] else 0
            if streak >= 7 * p:
                return True
    return False


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab\x00\u0100\u0200\u0161 .", max_size=48),
    st.text(alphabet="abcd\x00\u0100\u0200", min_size=1, max_size=30),
    st.integers(0, 9),
    st.text(alphabet="ab\x00\u0100", max_size=48),
)
def test_the_periodicity_gate_is_its_definition(
    head: str, unit: str, copies: int, tail: str
) -> None:
    """The shifted-XOR scan finds exactly the periodic stretches, whatever the characters
    before one (a low byte of zero among them included), and where the earliest starts
    (periods of five and more are searched only where a block of the text recurs within a
    period of itself)."""
    text = head + unit * copies + tail
    assert _text_module._periodic(text) is _periodic_by_definition(text)
    assert _text_module._first_periodic(text) == _earliest_by_definition(text)


def test_the_periodicity_gate_on_known_texts() -> None:
    assert _text_module._periodic("ab" * 8)
    assert not _text_module._periodic("ab" * 7 + "a")
    assert _text_module._periodic("x" + "the cat sat".replace(" ", "") * 8)
    assert not _text_module._periodic("Thequickbrownfoxjumpsoverthelazydog" * 2)
    assert not _text_module._periodic("")
    # equal low bytes of different characters pass the gate (the regex then decides)
    assert _text_module._periodic("\u0101\u0201" * 8)
    # the scan's first bytes are the text's own, never taken for equal characters
    assert not _text_module._periodic("\x00" * 7 + "a")
    assert not _text_module._periodic("\u0100" * 7 + "b" * 7)
    # a short text is told by its repeated bytes first: 7 are needed, a byte 8 times
    assert _text_module._periodic("a" * 8)
    assert not _text_module._periodic("a" * 7 + "b")
    assert not _text_module._periodic("run12failsintest3.")


_PIECES = st.sampled_from(
    [
        "ab", "ab ", "abc", "abc. ", "Same line.\n", "x" * 17, "the ", "\n", "? ", "!", " ",
        "```\n", "| a | b |\n", "\u2003", "\r\n", "\x1c", "\u00c9t\u00e9. ", "ab ab ab ab ",
    ]
)  # fmt: skip


@given(st.lists(_PIECES, max_size=40).map("".join), st.integers(min_value=2, max_value=12))
def test_the_cheap_bound_never_hides_degeneration(text: str, limit: int) -> None:
    """``repeats_below`` says "below the limit" only when the full analysis agrees (it lets
    DegenerateText skip the analysis for most outputs)."""
    from agentguard.loops._text import repeats_below

    if repeats_below(text, limit):
        assert _full_search(text) < limit


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_normalise_text_is_the_regex_collapse(text: str) -> None:
    """Whitespace is collapsed by ``str.split`` as the ``\\s+`` regex collapsed it."""
    import re

    assert normalise_text(text) == re.sub(r"\s+", " ", text).strip().lower()


def test_the_cheap_bound_passes_only_short_prose() -> None:
    from agentguard.loops._text import repeats_below

    assert repeats_below("Let me look at the file.", 5)
    assert not repeats_below("A. B. C. D. E.", 5)  # five sentences: the analysis decides
    assert not repeats_below("see " * 8, 5)  # a word eight times: the run search decides
    assert not repeats_below("abab abab abab abab", 5)  # "ab" eight times, no word eight times
    assert not repeats_below("x" * 16, 5)  # a long token: the run search decides


@given(
    size=st.integers(1, 6),
    similarity=st.sampled_from([0.3, 0.8, 0.95, 1.0]),
    long=st.booleans(),
    texts=st.lists(
        st.lists(st.sampled_from(["run", "the", "Build", "  failed", "3", "."])), max_size=14
    ),
)
@settings(max_examples=150)
def test_window_counts_as_comparing_each_recent_response(
    size: int, similarity: float, long: bool, texts: list[list[str]]
) -> None:
    """The count is 1 plus the recent responses equal to this one (normalised) or near it (the
    heads' ratio at the similarity), the pairwise rule, however the window tells them: the
    matches found in one call over the heads, equal long responses by a digest of the whole."""
    window = ResponseWindow(size, similarity)
    recent: deque[str] = deque(maxlen=size)
    pad = "x" * (2_000 if long else 0)  # past the compared head: only the tails differ
    for words in texts:
        norm = normalise_text(pad + " ".join(words))
        expected = 1 + sum(
            other == norm
            or (
                similarity < 1.0
                and fuzz.ratio(norm[:2_000], other[:2_000], score_cutoff=similarity * 100) > 0
            )
            for other in recent
        )
        assert window.add(pad + " ".join(words)) == expected
        recent.append(norm)


def _stretch_starts(text: str) -> list[int]:
    """Where every stretch of the gate's rule starts (each ``8 * p`` window of period ``p``)."""
    low = [ord(c) & 0xFF for c in text]
    starts = []
    for p in range(1, min(80, len(low) // 8) + 1):
        streak = 0
        for k in range(p, len(low)):
            streak = streak + 1 if low[k] == low[k - p] else 0
            if streak >= 7 * p:
                starts.append(k - 8 * p + 1)
    return starts


def _earliest_by_definition(text: str) -> int:
    """Where the earliest stretch of the gate's rule starts, ``-1`` when none does."""
    return min(_stretch_starts(text), default=-1)


@given(
    st.tuples(
        st.text(alphabet="ab\x00\u0100\u0200\u0161", max_size=24),
        st.text(alphabet="ab\x00\u0100\u0200", min_size=1, max_size=6),
        st.integers(0, 9),
        st.text(alphabet="ab\x00\u0100", max_size=24),
        st.text(alphabet="ab", max_size=4),
        st.integers(0, 10),
    )
)
def test_the_earliest_periodic_stretch_is_its_definition(
    parts: tuple[str, str, int, str, str, int],
) -> None:
    """The shifted-XOR scan finds where the earliest periodic stretch starts, of any period
    (a later stretch of a shorter period included)."""
    head, unit, copies, tail, late, late_copies = parts
    text = head + unit * copies + tail + late * late_copies
    assert _text_module._first_periodic(text) == _earliest_by_definition(text)
    assert _text_module._last_periodic(text) == _latest_by_definition(text)


def _latest_by_definition(text: str) -> int:
    """Where the latest stretch of the gate's rule starts (the last ``8 * p`` characters of
    period ``p`` in a longer stretch), ``-1`` when none does."""
    return max(_stretch_starts(text), default=-1)


def test_a_run_is_found_between_the_earliest_and_the_latest_stretch() -> None:
    """The run regex is tried only from the earliest to the latest periodic stretch: a hex
    constant (a stretch, no run) before prose costs a few places, not a scan of the rest; a
    run after it, or two stretches far apart, are still found."""
    hexed = "The mask is 0xffffffffffff. We will now connect to the server and read its banner."
    filler = " ".join(f"step{i}" for i in range(60))  # (no stretch: every word differs)
    assert degenerate_repeats(hexed) <= 1
    assert degenerate_repeats(hexed + " retry" * 9) == 9
    assert degenerate_repeats(f"{hexed} {filler} {'ok ' * 16}") == 16


def _full_search(text: str) -> int:
    """:func:`degenerate_repeats` without a shortcut: the line and sentence analysis, and the
    run regex searching the whole prose (no gate before it)."""
    lines = _text_module._prose_lines(text[-_text_module._SCAN_CHARS :])
    if not lines:
        return 0
    units = lines if len(lines) > 1 else _text_module._SENTENCE.split(lines[0])
    best = _text_module._looping(units)
    prose = "\n".join(lines)
    match = _text_module._RUN.search(prose)
    if match is not None:
        unit = match.group(1)
        best = max(best, len(re.findall(re.escape(unit), match.group(0))))
    return best


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab c\n\u00e9.\u2003", max_size=60),
    _UNIT,
    st.lists(st.sampled_from(["", " ", "\n", "\u2003", " \n "]), min_size=0, max_size=12),
    st.text(alphabet="ab c\n\u0101x0f", max_size=60),
)
def test_the_run_search_starting_at_the_earliest_stretch_finds_the_same_run(
    head: str, unit: str, gaps: list[str], tail: str
) -> None:
    """The run regex starts where the earliest periodic stretch allows: the count is the one
    a search of the whole prose gives."""
    text = head + unit + "".join(gap + unit for gap in gaps) + tail
    assert degenerate_repeats(text) == _full_search(text)


def test_a_short_unit_repeating_inside_words_is_degenerate() -> None:
    """A run counts the copies of its unit, however whitespace splits them into words: no word
    need come back eight times, nor be long (small models stutter like this)."""
    assert degenerate_repeats("abab abab abab abab") == 8
    assert degenerate_repeats("nananana nananana") == 8
    # the unit straddles the words: "dabc" only seven times
    assert degenerate_repeats("abc d" + "abc d" * 7) == 8
    # the copies on either side of a fence or a horizontal rule are one run of the prose
    assert degenerate_repeats("abababab\n```\nxyz\n```\nabababab") == 8
    assert degenerate_repeats("abababab\n---\nabababab") == 8
    v = LoopDetector().check_text("The status is: okokokok okokokok okokokok")
    assert (v.detector, v.severity, v.count) == ("degenerate_text", Severity.CRITICAL, 12)
    v = LoopDetector().check_text("abababab\n---\nabababab", narration=True)
    assert (v.detector, v.severity) == ("degenerate_text", Severity.WARNING)


_TEXT_PIECES = st.sampled_from(
    [
        "a", "b", "ab", "ba", "abc", " ", "  ", "\n", "\r\n", "\u2003", "\x1c", ".", "! ", "? ",
        "```\n", "~~~", "---\n", "| a | b |\n", "\u03a3", "\u03c3", "A", "\u0101", "\u0201",
        "the ", "x" * 9,
    ]
)  # fmt: skip


_TEXTS = st.lists(_TEXT_PIECES, max_size=30).map("".join)


@st.composite
def _texts_with_runs(draw: st.DrawFn) -> str:
    """Any text, most often around copies of a short unit, whatever whitespace, fences and
    rules split them into words and lines."""
    around = st.lists(_TEXT_PIECES, max_size=6).map("".join)
    unit = draw(st.lists(_TEXT_PIECES, min_size=1, max_size=2).map("".join))
    gap = st.sampled_from(["", " ", "", " ", "\n", "\u2003 ", "\n---\n", "\n```\n"])
    gaps = draw(st.lists(gap, min_size=5, max_size=16))
    return draw(around) + unit + "".join(gap + unit for gap in gaps) + draw(around)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_TEXTS, _texts_with_runs()), st.integers(min_value=1, max_value=12))
def test_the_shortcuts_never_change_a_verdict_of_the_full_search(text: str, limit: int) -> None:
    """Every shortcut is sound: ``degenerate_repeats`` (the periodicity gate, the run regex
    starting at the earliest stretch) counts what the full search counts, and ``repeats_below``
    says "below" only when the full search is below the limit, for any text."""
    from agentguard.loops._text import repeats_below

    full = _full_search(text)
    assert degenerate_repeats(text) == full
    if repeats_below(text, limit):
        assert full < limit


@settings(max_examples=200, deadline=None)
@given(st.one_of(_TEXTS, _texts_with_runs()), st.integers(min_value=1, max_value=12))
def test_remembered_degeneration_is_the_analysis_of_the_text(text: str, limit: int) -> None:
    """``degeneration`` gives the count of the analysis (-1 only when it is below the limit),
    the first time and when the text comes back (remembered), whatever limit came before."""
    from agentguard.loops._text import degeneration, forget_degeneration, repeats_below

    forget_degeneration()
    expected = -1 if repeats_below(text, limit) else degenerate_repeats(text)
    assert degeneration(text, limit + 1, remember=True) in (-1, degenerate_repeats(text))
    for remember in (True, True, False):
        assert degeneration(text, limit, remember=remember) == expected


#: one-line texts where lower-casing depends on context (a final sigma, case-ignorable marks)
_CASED = st.text(
    st.sampled_from(
        ["\u03a3", "A", "a", " ", "\u2003", "\xa0", "\t", "\u0301", "'", ".", "\u0130"]
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_TEXTS, _texts_with_runs(), _CASED), st.integers(min_value=1, max_value=12))
def test_a_normalised_text_handed_over_changes_no_count(text: str, limit: int) -> None:
    """The degeneration check given the response window's normalised text counts what it
    counts from the text alone (one line's prose, whitespace removed, is either)."""
    from agentguard.loops._text import degeneration, repeats_below

    norm = normalise_text(text)
    assert repeats_below(text, limit, norm) == repeats_below(text, limit)
    assert degeneration(text, limit, normalised=norm) == degeneration(text, limit)


def test_the_text_detectors_share_one_normalised_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer is normalised once for both text detectors: the response window compares it,
    the degeneration gate is handed it; a narration (not compared) is not normalised."""
    from agentguard.loops import _detector, _detectors

    made: list[str] = []
    handed: list[str | None] = []
    repeats_below, degeneration = _detectors.repeats_below, _detectors.degeneration

    def normalise(text: str) -> str:
        made.append(text)
        return normalise_text(text)

    def gate(text: str, limit: int, normalised: str | None = None) -> bool:
        handed.append(normalised)
        return repeats_below(text, limit, normalised)

    def remembered(text: str, limit: int, **options: Any) -> int:
        handed.append(options.get("normalised"))
        return degeneration(text, limit, **options)

    # (an answer's normalised text is made by check_text, a narration's count asked of the
    # remembering degeneration(): both spied on wherever they are called from)
    for module in (_detector, _detectors, _text_module):
        monkeypatch.setattr(module, "normalise_text", normalise)
    monkeypatch.setattr(_detectors, "repeats_below", gate)
    monkeypatch.setattr(_detectors, "degeneration", remembered)
    detector = LoopDetector()
    detector.check_text("Run 5 fails  in Test 3.")
    assert made == ["Run 5 fails  in Test 3."]
    assert handed == ["run 5 fails in test 3."]
    detector.check_text("Checking the build.", narration=True)
    assert made == ["Run 5 fails  in Test 3."]
    assert handed[1:] == [None]
