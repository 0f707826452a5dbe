"""Grounding: whether a call's values and a final answer's facts come from the conversation.

A small model fills arguments with values from nowhere (a made-up file path, a city copied from
the prompt's examples, ``LHR`` for "London") and, given the results, writes a final answer that
ignores them ("I'm sorry for your loss" after a flight search), or answers a request that names
two cities after looking up one. None of that is *invalid*, so validation passes it. These checks
compare the answer with **the current request**: the user's messages since the last final answer
(an assistant message without calls) and the calls and results since.

- :func:`ungrounded_arguments`: short string arguments whose value the request never states,
  when the request names values of its own (``ungrounded_argument`` errors);
- :func:`ignored_results`: the calls whose results a final answer shares no value with — beyond
  what the call itself said (its arguments) and what the user wrote;
- :func:`invented_numbers`: the numbers a final answer states that neither the user, a call's
  arguments nor a result stated (``Lindsfest 2018: 1234`` for flight ``LH 1234``);
- :func:`uncovered_values`: the values the request names that no call and no result covered.

All are opt-in (``tool_validation.ungrounded_arguments``, ``ungrounded_answers`` for the two
answer checks, ``uncovered_values``): on healthy traffic a model may rightly derive a value (a
search query in its own words, ``LHR`` for Heathrow, a sum) or answer "Done." from
``{"status": "ok"}``. They suit a small local model, where a value from nowhere is almost
always wrong (see ``docs/local-models.md``, the small-model profile).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentguard._fingerprint import decode_arguments
from agentguard.types import ToolCall

from ._reask import _STOP, _as_number
from ._report import FEEDBACK_MARK, ToolCallError, short
from ._tools import ToolSpec

__all__ = [
    "Request",
    "current_request",
    "ignored_results",
    "invented_numbers",
    "salient_values",
    "uncovered_values",
    "ungrounded_arguments",
]

#: string arguments longer than this are written, not looked up (a message, code): not checked
_MAX_VALUE_CHARS = 160
_MAX_VALUE_WORDS = 4
#: a value the user names: a quoted string, a file name or path, a code with digits, a
#: capitalised word (or run of them) that does not open a sentence, an all-caps word
_QUOTED = re.compile(r"\"([^\"\n]{1,64})\"|'([^'\n]{1,64})'|`([^`\n]{1,64})`")
_TOKEN = re.compile(r"[/~]?[A-Za-z0-9_][\w./:\-]*\w|[A-Za-z0-9]")
_NUMBER = re.compile(r"-?\d+(?:[.,:]\d+)*")
_CHAR_REF = re.compile(r"&(?:#\d{1,6}|#x[0-9a-fA-F]{1,6}|quot|amp|lt|gt|apos);")
_WORD = re.compile(r"[a-z0-9][a-z0-9.:\-]*[a-z0-9]|[a-z0-9]", re.IGNORECASE)
#: words a result shares with any answer: they ground nothing
_COMMON = _STOP | {"was", "its", "this", "that", "with", "by", "as", "not", "no", "yes", "ok"}
_COMMON |= {"true", "false", "null", "none", "error", "result", "results", "status"}


@dataclass(frozen=True, slots=True)
class Request:
    """The current request of a conversation.

    Attributes:
        text: the user's messages since the last final answer, joined.
        calls: each call made since, with its decoded arguments and its result (``None``: not
            answered yet).
        values: the values the user's text names (see :func:`salient_values`), in order.
        numbers: the numbers the user's text states (see :func:`stated_numbers`), in order.
    """

    text: str
    calls: tuple[tuple[str, Mapping[str, Any], str | None], ...] = ()
    values: tuple[str, ...] = field(default_factory=tuple)
    numbers: tuple[str, ...] = field(default_factory=tuple)

    def grounds(self, value: str) -> bool:
        """Whether ``value`` occurs in what the user wrote or in a result (any case)."""
        low = value.strip().lower()
        if not low or low in self.text.lower():
            return True
        return any(result is not None and low in result.lower() for *_, result in self.calls)

    def grounds_number(self, value: float) -> bool:
        """Whether the number ``value`` is one the user's text or a result states (in any
        spelling: ``100``, ``100.0``, ``1,000``)."""
        try:
            key = repr(float(value))
        except OverflowError:  # an integer past a float's range: no text states it
            return False
        texts = [self.text, *(result for *_, result in self.calls if result is not None)]
        return any(key == _as_number(n) for text in texts for n in stated_numbers(text))


def current_request(messages: Sequence[Mapping[str, Any]], window: int = 40) -> Request:
    """The current request of ``messages`` (at most ``window`` messages from the end are read,
    so the cost does not grow with the run)."""
    texts: list[str] = []
    results: dict[str, str] = {}
    calls: list[tuple[str, Mapping[str, Any], str | None]] = []
    pending: list[tuple[str, str, Mapping[str, Any]]] = []
    for message in reversed(messages[-window:] if window else ()):
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) else _text_of(content)
        if role == "assistant":
            raw = message.get("tool_calls")
            if not raw:
                if text.strip():
                    break  # a final answer: the request before it is another one
                continue
            for i, c in enumerate(raw if isinstance(raw, (list, tuple)) else ()):
                fn = c.get("function") if isinstance(c, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    continue
                try:
                    args = decode_arguments(fn.get("arguments"))
                except (TypeError, ValueError):
                    args = {}
                call_id = c.get("id") if isinstance(c.get("id"), str) else f"call_{i}"
                pending.append((call_id, fn["name"], args if isinstance(args, Mapping) else {}))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str):
                results[call_id] = text
        elif role == "user" and FEEDBACK_MARK not in text:
            texts.append(text)
    for call_id, name, args in reversed(pending):
        calls.append((name, args, results.get(call_id)))
    joined = "\n".join(reversed(texts))
    return Request(
        joined, tuple(calls), tuple(salient_values(joined)), tuple(stated_numbers(joined))
    )


#: a number standing alone (not part of a word or code such as ``todo2.txt``, ``LH1234``)
_STATED_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:[.,]\d+)*(?![\w]|\.\w)")


def stated_numbers(text: str) -> list[str]:
    """The numbers ``text`` states, in order, each once (``1,000`` and ``1000`` are one)."""
    out: list[str] = []
    seen: set[str] = set()
    for match in _STATED_NUMBER.finditer(text):
        token = match.group(0)
        key = _as_number(token)
        if key is not None and key not in seen:
            seen.add(key)
            out.append(token)
    return out


def _text_of(content: Any) -> str:
    """The text parts of a content list (``[{"type": "text", "text": ...}]``)."""
    if isinstance(content, (list, tuple)):
        return " ".join(
            str(p.get("text")) for p in content if isinstance(p, Mapping) and p.get("text")
        )
    return ""


def salient_values(text: str) -> list[str]:
    """The values a user's text names, in order, each once: quoted strings, file names and
    paths, codes with digits, capitalised words that do not open a sentence (runs of them as
    one: ``New York``), all-caps words; numbers are left out (a count is rarely an argument
    value a model can get wrong in a way a list of choices mends)."""
    found: list[str] = []
    for match in _QUOTED.finditer(text):
        found.append(next(g for g in match.groups() if g))
    starts = True  # the next word opens a sentence
    run: list[str] = []
    for match in _TOKEN.finditer(text):
        token = match.group(0).rstrip(".:")
        before = text[max(0, match.start() - 3) : match.start()].rstrip(" ")
        if before and before[-1] in ".!?:\n":
            starts = True
            if run:  # a sentence ended the run
                found.append(" ".join(run))
                run = []
        named = (
            ("." in token or "/" in token or "_" in token) and not _NUMBER.fullmatch(token)
        ) or (any(ch.isdigit() for ch in token) and any(ch.isalpha() for ch in token))
        capital = token[:1].isupper() and not starts and len(token) > 1
        if token.isupper() and len(token) > 1 and token.isalpha():
            capital = True
        if capital and not named:
            gap = text[match.start() - 1 : match.start()] if match.start() else ""
            if run and gap != " ":
                found.append(" ".join(run))
                run = []
            run.append(token)
        else:
            if run:
                found.append(" ".join(run))
                run = []
            if named:
                found.append(token)
        starts = False
    if run:
        found.append(" ".join(run))
    seen: set[str] = set()
    out = []
    for value in found:
        key = value.lower()
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


def ungrounded_arguments(
    calls: Iterable[ToolCall], request: Request, specs: Mapping[str, ToolSpec]
) -> list[ToolCallError]:
    """An ``ungrounded_argument`` error for each short string argument whose value neither the
    user's text nor a result of the request holds, when the user's text names values of its own
    (their list is the error's suggestions). An argument whose schema has an ``enum`` came from
    the schema, and is not checked; nor is one longer than a looked-up value (a message, code).
    A number argument is checked the same way against the numbers the request states, when it
    states some (measured on SmolLM2-135M: ``10`` for "50 EUR", ``10.9`` for "100 USD")."""
    if not request.values and not request.numbers:
        return []
    errors: list[ToolCallError] = []
    for call in calls:
        spec = specs.get(call.name)
        try:
            args = decode_arguments(call.arguments)
        except (TypeError, ValueError):
            continue
        if spec is None or not isinstance(args, Mapping):
            continue
        for key, value in args.items():
            schema = spec.properties.get(key)
            if not isinstance(schema, Mapping) or "enum" in schema:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not request.numbers or request.grounds_number(value):
                    continue
                values = request.numbers
            elif isinstance(value, str) and request.values:
                written = len(value) > _MAX_VALUE_CHARS or len(value.split()) > _MAX_VALUE_WORDS
                if written and not _debris(value, request):
                    continue
                if request.grounds(value):
                    continue
                values = request.values
            else:
                continue
            message = (
                f"the value of {key} is not in the request: use one the user gave "
                f"({', '.join(values[:6])})"
            )
            errors.append(
                ToolCallError(
                    "ungrounded_argument",
                    call.id,
                    call.name,
                    f"$.{key}",
                    message,
                    short(value),
                    values[:8],
                )
            )
    return errors


def _debris(value: str, request: Request) -> bool:
    """Whether a long string argument is markup debris rather than text the model wrote: it
    holds HTML character references (``&#34;``, ``&quot;``) that the request does not. Measured
    on SmolLM2-135M in llama.cpp's grammar function-calling mode, pinned to ``get_weather``:
    ``"city": "./data.jsonp?key=1&#34;name&#34;: &#34;Cairo&#34;, ..."``."""
    return any(ref not in request.text for ref in _CHAR_REF.findall(value))


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _COMMON}


def _leaves(value: Any, out: list[str]) -> None:
    """The scalar values of a decoded JSON result (keys left out: they name, not state)."""
    if isinstance(value, Mapping):
        for item in value.values():
            _leaves(item, out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _leaves(item, out)
    elif value is not None and not isinstance(value, bool):
        out.append(str(value))


def _facts(result: str) -> set[str] | None:
    """The words a result states, or ``None`` for an error result (it grounds nothing)."""
    try:
        decoded = json.loads(result)
    except ValueError:
        decoded = result
    if isinstance(decoded, Mapping) and "error" in decoded and len(decoded) <= 3:
        return None
    leaves: list[str] = []
    _leaves(decoded, leaves)
    words: set[str] = set()
    for leaf in leaves:
        words |= _words(leaf)
        number = _as_number(leaf)
        if number is not None:
            words.add(number)
    return words


def _answer_words(text: str) -> set[str]:
    words = _words(text)
    for token in _NUMBER.findall(text):
        number = _as_number(token)
        if number is not None:
            words.add(number)
    return words


def ignored_results(answer: str, request: Request) -> list[str]:
    """The tools whose results ``answer`` (a final text) shares no value with, beyond the
    call's own arguments and the user's words; results that are errors, or that state nothing
    else, are not counted. Empty: the answer uses every result (or there is none)."""
    said = _answer_words(answer)
    asked = _words(request.text)
    ignored: list[str] = []
    for name, args, result in request.calls:
        if result is None:
            continue
        facts = _facts(result)
        if facts is None:
            continue
        own: set[str] = set()
        for value in args.values():
            own |= _words(str(value))
        facts -= own | asked
        if facts and not facts & said and name not in ignored:
            ignored.append(name)
    return ignored


#: numbers any answer may state unprompted: a list's marks, a small count ("2 flights")
_SMALL_NUMBER = 10


def invented_numbers(answer: str, request: Request) -> list[str]:
    """The numbers ``answer`` (a final text) states, each once, that neither the user's text, a
    call's arguments nor a result of the request states (in any spelling: ``92`` for ``92.0``),
    past the small counts and list marks (0 to 10) any answer may hold. Empty when no call of
    the request was answered with something other than an error: without results in hand
    there is nothing the answer should have taken its numbers from.

    A derived number (a sum, a conversion the model did itself) is one too: a strong model's
    healthy answer can hold one, which is why the check is opt-in, with the small-model
    profile's other grounding checks (``ungrounded_answers``)."""
    if not any(result is not None and _facts(result) is not None for *_, result in request.calls):
        return []
    known = {_as_number(n) for n in request.numbers}
    for _, args, result in request.calls:
        known.update(_as_number(n) for n in stated_numbers(json.dumps(dict(args), default=str)))
        if result is not None:
            known.update(_as_number(n) for n in stated_numbers(result))
    out: list[str] = []
    for token in stated_numbers(answer):
        key = _as_number(token)
        if key is None or key in known:
            continue
        if abs(float(key)) <= _SMALL_NUMBER:
            continue
        out.append(token)
    return out


def uncovered_values(request: Request) -> list[str]:
    """The values the user's text names that no call's arguments and no result hold — when
    the request's calls look values up (some argument is one of them). Empty otherwise."""
    if not request.calls:
        return []
    used = " ".join(
        json.dumps(dict(args), ensure_ascii=False) + " " + (result or "")
        for _, args, result in request.calls
    ).lower()
    looked_up = [v for v in request.values if v.lower() in used]
    if not looked_up:
        return []
    return [v for v in request.values if v.lower() not in used]
