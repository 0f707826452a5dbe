"""Corrective re-asks that change something: a ladder instead of the same request again.

At temperature 0 a model given the same request gives the same answer. A re-ask whose
correction is the one just sent, after an answer that repeats the one it corrects, costs a call
and changes nothing (measured: three identical re-asks for one hallucinated tool name, 4,800
tokens, then ``ToolValidationFailed``). :class:`CorrectionLadder` decides each re-ask of one
guarded call:

1. ``correction``: the failed answer and a message naming every error (the classic re-ask);
   a call begun but left without arguments (``functions.NAME:``) pins its tool;
2. ``narrowed``: when the answer repeats the one it corrects, only the tools the correction
   points to are offered (the closest names of an unknown tool, or the tool the call named);
3. ``pinned``: then ``tool_choice`` names the one most likely tool;
4. ``asked``: when neither the errors nor the question point to any tool (an empty answer to
   "Is it raining in Tokyo?" shares no word with ``get_weather``), the model is asked which of
   the tools the request needs, through the one tool :data:`CHOOSE_TOOL`, pinned, whose
   argument is an ``enum`` of the tool names; the tool it chooses is then pinned, as in rung 3.
   The guard's pipeline takes this rung only when no tier above could answer instead
   (measured on SmolLM2-135M in llama.cpp's grammar function-calling mode, which answered such
   prompts with nothing twice: asked in words it wrote prose naming no tool; asked through the
   chooser it chose ``get_weather`` each time, right for the rain in Tokyo, wrong for "50 EUR
   in JPY" and "Open notes.txt");

and, for a call whose arguments hold values the request never states (``ungrounded_argument``,
opt-in), ``choices``: the tool pinned and each such argument narrowed to the request's values (a
JSON Schema ``enum``: a server with grammar-constrained tool calls can then only write one of
them; measured on SmolLM2-135M, a correction in words changed none of 7 such values, the
choices mended 5);

and it never hands out a request it has already sent: when no rung is left, it says so
(``None``) and the guard moves on (escalation, or the error).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentguard._fingerprint import decode_arguments, fingerprint_text
from agentguard.transport import ModelRequest

from ._report import ValidationReport, json_text

__all__ = ["CHOOSE_TOOL", "CorrectionLadder", "Reask", "Rework", "Rung"]

Rung = Literal["correction", "narrowed", "pinned", "choices", "covering", "asked"]
_RUNGS: tuple[Rung, ...] = ("correction", "narrowed", "pinned")


@dataclass(frozen=True, slots=True)
class Reask:
    """One corrective re-ask.

    Attributes:
        rung: which rung of the ladder it is.
        messages: what to append to the request's own messages.
        tools: the tools to offer instead of the request's (``None``: the request's own).
        tool_choice: the ``tool_choice`` to send instead of the request's (``None``: its own).
    """

    rung: Rung
    messages: list[dict[str, Any]]
    tools: list[Mapping[str, Any]] | None = None
    tool_choice: Any = None

    def params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The request's body parameters with this re-ask's ``tool_choice``."""
        if self.tool_choice is None:
            return dict(params)
        return {**params, "tool_choice": self.tool_choice}


@dataclass
class CorrectionLadder:
    """The re-asks of one guarded call (a new ladder for each tier).

    Args:
        tools: the tools the request offered (OpenAI ``tools`` entries).
        question: the user's latest message: when the errors name no tool (an empty answer),
            the tools whose names and descriptions share most words with it are the ones
            narrowed to and pinned.
    """

    tools: Sequence[Mapping[str, Any]]
    question: str = ""
    _rung: int = 0
    _last_answer: str | None = None
    _sent: set[str] = field(default_factory=set)
    _said: set[str] = field(default_factory=set)  # the lines of the last correction sent
    #: per tool, the arguments narrowed to the request's values so far (they stay narrowed)
    _choices: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    #: the failed answer's report the last re-ask corrected
    last: ValidationReport | None = None
    #: the ``asked`` rung: sent (once), its answer awaited, and the tool that answer named
    _asked: bool = False
    _asking: bool = False
    _picked: str | None = None

    def echoed(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` (a text answer to a correction) copies the correction back: a
        small model's way of answering one, and no answer."""
        content = message.get("content")
        if message.get("tool_calls") or not isinstance(content, str):
            return False
        return self.copies(content)

    def copies(self, text: str) -> bool:
        """Whether ``text`` holds a line of the last correction sent: the guard's words, which
        a small model writes back (beside a call too)."""
        return any(line in text for line in self._said)

    def next(self, report: ValidationReport, *, ask: bool = True) -> Reask | None:
        """The re-ask for the failed answer ``report`` judged; ``None``: no new one is left.
        ``ask``: whether the ``asked`` rung may be taken (not when a tier above could answer)."""
        answer = _answer_key(report.message)
        if self._rung == 0 and _wandered(report):
            self._rung = 1  # re-sending a runaway text in a correction invites a copy of it
        if answer == self._last_answer:
            self._rung += 1  # the correction changed nothing: change the correction
        self._last_answer = answer
        choices = self._narrowed_values(report)
        if choices is not None and self._fresh(choices, report):
            return choices
        while self._rung < len(_RUNGS):
            reask = self._build(_RUNGS[self._rung], report)
            if reask is not None and self._fresh(reask, report):
                return reask
            self._rung += 1
        return self._ask(report) if ask else None

    def _ask(self, report: ValidationReport) -> Reask | None:
        """The ``asked`` rung: which tool the request needs, through the chooser; once, only when no
        rung could name one (``None`` otherwise)."""
        names = _tool_names(self.tools)
        if self._asked or len(names) < 2 or _candidates(report, self.tools):
            return None
        if _asked_for(self.question, self.tools):
            return None
        self._asked = True
        question = (
            "[agentguard] Which one of these tools does the request above need: "
            f"{', '.join(names)}? Choose it with {CHOOSE_TOOL}."
        )
        ask = [{"role": "user", "content": question}]
        reask = Reask("asked", ask, [_chooser(self.tools, names)], _choice(CHOOSE_TOOL))
        if not self._fresh(reask, report):
            return None
        self._asking = True
        return reask

    def picked(self, message: Mapping[str, Any]) -> tuple[ValidationReport, str | None] | None:
        """The answer to the ``asked`` question (``None`` when none was awaited): the failed
        answer the question was asked for, to be re-asked, and the tool ``message`` names
        (``None`` when it names none, or more than one: then no rung is left)."""
        if not self._asking or self.last is None:
            return None
        self._asking = False
        names = _tool_names(self.tools)
        name = _chosen(message, names)
        if name is not None:
            self._picked = name
            self._rung = _RUNGS.index("pinned")
            self._last_answer = None  # the pinned re-ask's answer is a new one
        return self.last, name

    def owes(self, report: ValidationReport) -> bool:
        """Whether ``report`` doubts an argument (``ungrounded_argument``) of the tool a
        ``choices`` re-ask would pin that no such re-ask offered the request's values for yet
        (then the next one does: each adds an argument, so they are bounded)."""
        doubted = [e for e in report.errors if e.kind == "ungrounded_argument" and e.suggestions]
        if not doubted:
            return False
        offered = self._choices.get(doubted[0].tool_name, {})
        return any(
            e.path.removeprefix("$.") not in offered
            for e in doubted
            if e.tool_name == doubted[0].tool_name
        )

    def _fresh(self, reask: Reask, report: ValidationReport) -> bool:
        """Whether ``reask`` was never sent (then it is taken as sent, for ``report``)."""
        key = _request_key(reask)
        if key in self._sent:
            return False
        self._sent.add(key)
        self._said = _lines_of(reask.messages[1:])
        self.last = report
        return True

    def _narrowed_values(self, report: ValidationReport) -> Reask | None:
        """The ``choices`` re-ask for arguments holding values the request never states: the
        tool pinned, those arguments (and the ones narrowed before) an ``enum`` of the
        request's values; ``None`` when no error is of that kind."""
        ungrounded = [e for e in report.errors if e.kind == "ungrounded_argument" and e.suggestions]
        if not ungrounded:
            return None
        name = ungrounded[0].tool_name
        tool = next((t for t in self.tools if _name_of(t) == name), None)
        if tool is None:
            return None
        narrowed = self._choices.setdefault(name, {})
        offered = [e.suggestions for e in ungrounded if e.tool_name == name]
        for e in ungrounded:
            if e.tool_name == name:
                narrowed[e.path.removeprefix("$.")] = e.suggestions
        # an argument that took one of the request's values is narrowed to them too: pinning
        # the doubted argument alone frees the others (measured on SmolLM2-135M: "50 EUR in
        # JPY", to_currency narrowed, the answer then wrote from_currency USD and amount 10)
        call = next((c for c in report.tool_calls if c.name == name), None)
        for key, value in _arguments(call.arguments if call is not None else None).items():
            found = next((v for v in offered if any(_same(value, x) for x in v)), None)
            if found is not None and key not in narrowed:
                narrowed[key] = found
        _distinct(narrowed, tool)
        pinned = _with_choices(tool, narrowed)
        return Reask(
            "choices", _spelled(report.corrective_messages(), pinned), [pinned], _choice(name)
        )

    def _build(self, rung: Rung, report: ValidationReport) -> Reask | None:
        messages = report.corrective_messages()
        pin = _pinned(report, self.tools)
        if rung == "correction":
            return Reask(rung, messages, None, _choice(pin) if pin else None)
        asked = _asked_for(self.question, self.tools)
        picked = [self._picked] if self._picked is not None else []
        candidates = _candidates(report, self.tools) or asked or picked
        if not candidates:
            return None
        # the tool the question asks for first, among those the errors point to
        candidates.sort(key=lambda name: name not in asked[:1])
        narrowed = [t for t in self.tools if _name_of(t) in candidates]
        if rung == "narrowed" and len(narrowed) == len(self.tools):
            return None  # nothing left out: the same request
        if rung == "narrowed":
            only = candidates[0] if len(candidates) == 1 else None
            if only is not None:
                messages = _spelled(messages, narrowed[0])
            return Reask(rung, messages, narrowed, _choice(only) if only else None)
        best = pin or candidates[0]
        pinned = [t for t in narrowed if _name_of(t) == best]
        return Reask(rung, _spelled(messages, pinned[0]), pinned, _choice(best))


def _wandered(report: ValidationReport) -> bool:
    """A text the output cap cut off, with no call in it (``cut_off_text_is_failure``)."""
    return bool(report.errors) and all(
        e.kind == "truncated" and not e.tool_name for e in report.errors
    )


def _spelled(
    messages: list[dict[str, Any]], tool: Mapping[str, Any], *, lead: str = ""
) -> list[dict[str, Any]]:
    """The correction said in a few words, the call spelled out: the error list in full is what
    a small model copies back as its answer, and a server that shows the model no ``tools`` (a
    model's own chat template) ignores ``tool_choice``; the shape of the call is what it
    imitates."""
    fn = tool.get("function")
    spec = fn if isinstance(fn, Mapping) else tool
    name = _name_of(tool)
    params = spec.get("parameters")
    props = params.get("properties") if isinstance(params, Mapping) else None
    args = ", ".join(f"{json.dumps(k)}: ..." for k in (props if isinstance(props, Mapping) else {}))
    text = (
        f"{lead + ' ' if lead else ''}Use the tool {name}. Reply with only one JSON object: "
        f'{{"name": {json.dumps(name)}, "arguments": {{{args}}}}}'
    )
    if messages and messages[-1].get("role") == "user":
        return [*messages[:-1], {"role": "user", "content": text}]
    return [*messages, {"role": "user", "content": text}]


def _distinct(choices: dict[str, tuple[str, ...]], tool: Mapping[str, Any]) -> None:
    """Several arguments narrowed to the same values (``origin`` and ``destination`` to
    ``London, Paris``) take them in the order the request names them: each later argument,
    in the schema's order, loses the values named before its turn (a small model given the
    same choices twice writes the first one twice). Nothing changes when there are fewer
    values than arguments."""
    fn = tool.get("function")
    params = (fn if isinstance(fn, Mapping) else tool).get("parameters")
    props = params.get("properties") if isinstance(params, Mapping) else None
    order = [k for k in (props if isinstance(props, Mapping) else {}) if k in choices]
    groups: dict[tuple[str, ...], list[str]] = {}
    for key in order:
        groups.setdefault(choices[key], []).append(key)
    for values, keys in groups.items():
        if len(keys) < 2 or len(values) < len(keys):
            continue
        for i, key in enumerate(keys):
            choices[key] = values[i:]


def _with_choices(
    tool: Mapping[str, Any], choices: Mapping[str, tuple[str, ...]]
) -> dict[str, Any]:
    """A copy of ``tool`` whose arguments named in ``choices`` take only those values."""
    fn = tool.get("function")
    spec = dict(fn if isinstance(fn, Mapping) else tool)
    params = dict(spec.get("parameters") or {})
    props = dict(params.get("properties") or {})
    for key, values in choices.items():
        schema = props.get(key)
        schema = schema if isinstance(schema, Mapping) else {}
        enum = _typed(values, schema)
        if enum:
            props[key] = {**schema, "enum": enum}
    params["properties"] = props
    spec["parameters"] = params
    return {**tool, "function": spec} if isinstance(fn, Mapping) else spec


def _typed(values: Sequence[str], schema: Mapping[str, Any]) -> list[Any]:
    """``values`` as the ``enum`` of an argument with ``schema``: numbers for a number (the
    values that are not one left out), else the texts."""
    kind = schema.get("type")
    if kind not in ("number", "integer"):
        return list(values)
    out: list[Any] = []
    for value in values:
        number = _as_number(value)
        if number is None:
            continue
        f = float(number)
        if f.is_integer() and abs(f) < 2**53:
            out.append(int(f))
        elif kind == "number":
            out.append(f)
    return out


def _as_number(text: str) -> str | None:
    """A number in one spelling (``189.50``, ``189.5`` and ``1,000``/``1000`` are one), or
    ``None`` for a text that is no number."""
    try:
        number = float(text.replace(",", ""))
    except ValueError:
        return None
    return repr(number) if math.isfinite(number) else None


def _same(value: Any, text: str) -> bool:
    """Whether the argument ``value`` is the request's value ``text`` (a number in any
    spelling, a text in any case)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        try:
            return repr(float(value)) == _as_number(text)
        except OverflowError:
            return False
    return isinstance(value, str) and value.strip().lower() == text.strip().lower()


def _arguments(arguments: str | None) -> Mapping[str, Any]:
    """A call's decoded arguments (empty when they are not a JSON object)."""
    try:
        decoded = decode_arguments(arguments)
    except (TypeError, ValueError):
        return {}
    return decoded if isinstance(decoded, Mapping) else {}


def _name_of(tool: Mapping[str, Any]) -> str | None:
    fn = tool.get("function")
    name = (fn if isinstance(fn, Mapping) else tool).get("name")
    return name if isinstance(name, str) else None


def _tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of ``tools``, in order (entries without one left out)."""
    return [n for n in (_name_of(t) for t in tools) if n is not None]


def _choice(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def _pinned(report: ValidationReport, tools: Sequence[Mapping[str, Any]]) -> str | None:
    """The tool an answer began to call without finishing it, when it is offered."""
    offered = {_name_of(t) for t in tools}
    for e in report.errors:
        if e.kind == "incomplete_call" and e.tool_name in offered:
            return e.tool_name
    return None


def _candidates(report: ValidationReport, tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The offered tools the errors point to, most likely first."""
    offered = _tool_names(tools)
    found: list[str] = []
    for e in report.errors:
        # an unknown name, a call to a tool tool_choice did not name, text where it asked for a
        # call: the tools meant are the suggested ones
        guessed = e.kind in ("unknown_tool", "not_chosen", "call_required")
        names = e.suggestions if guessed else (e.tool_name,)
        found += [n for n in names if n in offered and n not in found]
    if not found and len(offered) == 1:
        found = offered  # one tool on offer: the answer can only have meant it
    return found


_WORD = re.compile(r"[a-z0-9]+")
#: words that say nothing about which tool is meant
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "and",
        "or",
        "is",
        "are",
        "be",
        "me",
        "my",
        "i",
        "you",
        "your",
        "it",
        "what",
        "whats",
        "how",
        "much",
        "many",
        "please",
        "tell",
        "show",
        "give",
        "get",
        "find",
    ]
)


def _words(text: str) -> set[str]:
    words = set()
    for word in _WORD.findall(text.lower()):
        if word not in _STOP and len(word) > 1:
            words.add(word.rstrip("s") if len(word) > 3 else word)  # flights ~ flight
    return words


def _asked_for(question: str, tools: Sequence[Mapping[str, Any]], limit: int = 3) -> list[str]:
    """The offered tools whose names and descriptions share words with ``question``, most
    shared first, a word of the name counting twice (at most ``limit``; none when no tool
    shares a word)."""
    asked = _words(question)
    if not asked:
        return []
    scored = []
    for i, tool in enumerate(tools):
        name = _name_of(tool)
        if name is None:
            continue
        fn = tool.get("function")
        described = (fn if isinstance(fn, Mapping) else tool).get("description")
        described = described if isinstance(described, str) else ""
        # a word of the name counts twice: "time" names get_time, "current" only describes
        shared = 2 * len(asked & _words(name.replace("_", " "))) + len(asked & _words(described))
        if shared:
            scored.append((-shared, i, name))
    return [name for _, _, name in sorted(scored)[:limit]]


#: The one tool the ``asked`` rung offers: its argument is an ``enum`` of the request's tool
#: names (a server with grammar-constrained calls can only write one of them).
CHOOSE_TOOL = "agentguard_choose_tool"


def _chooser(tools: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """The ``asked`` rung's tool: choose one of ``names`` (their descriptions listed)."""
    described = []
    for tool in tools:
        fn = tool.get("function")
        info = fn if isinstance(fn, Mapping) else tool
        text = info.get("description")
        if isinstance(info.get("name"), str) and isinstance(text, str) and text:
            described.append(f"{info['name']}: {text}")
    tool_schema: dict[str, Any] = {"type": "string", "enum": list(names)}
    if described:
        tool_schema["description"] = "; ".join(described)[:2_000]
    return {
        "type": "function",
        "function": {
            "name": CHOOSE_TOOL,
            "description": "Choose the tool the request needs.",
            "parameters": {
                "type": "object",
                "properties": {"tool": tool_schema},
                "required": ["tool"],
            },
        },
    }


def _chosen(message: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """The tool an answer to the ``asked`` rung chose: the chooser's argument, a call of the
    tool itself, or the one name its text holds."""
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            continue
        if fn.get("name") in names:
            return str(fn["name"])
        if fn.get("name") == CHOOSE_TOOL:
            value = _arguments(fn.get("arguments")).get("tool")
            if isinstance(value, str):
                return _named(value, names)
    content = message.get("content")
    return _named(content, names) if isinstance(content, str) else None


def _named(text: str, names: Sequence[str]) -> str | None:
    """The one tool of ``names`` a short answer names: by its name (``get_weather``), or by its
    words (``get weather``); ``None`` when it names none or several."""
    low = text.lower()
    found = {n for n in names if n.lower() in low}
    if not found:
        spaced = re.sub(r"[\s\-]+", " ", low)
        found = {n for n in names if n.lower().replace("_", " ") in spaced}
    return found.pop() if len(found) == 1 else None


def _answer_key(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    calls = []
    for c in message.get("tool_calls") or ():
        fn = c.get("function") if isinstance(c, Mapping) else None
        if isinstance(fn, Mapping):
            calls.append((fn.get("name"), fn.get("arguments")))
    return fingerprint_text(json_text([content if isinstance(content, str) else "", calls]))


def _request_key(reask: Reask) -> str:
    return fingerprint_text(
        json.dumps([reask.messages, reask.tools, reask.tool_choice], sort_keys=True, default=str)
    )


@dataclass
class Rework:
    """What the guard changed in one call's request to get a usable answer (a re-ask, a
    recovery turn), kept while the call runs on one tier.

    Attributes:
        ladder: the call's correction ladder (made on its first failure).
        params: ``tool_choice`` and other body parameters to send instead of the request's.
        tools: the tools to offer instead of the request's (``None``: its own).
        recovered: a recovery turn (the answer from the results in hand) was sent.
        note: the text of the recovery turns sent (the guard's words a model may copy back).
        restated: the recovery turn that restates the request and its results was sent.
        quoted: the user's words that turn restates (not the guard's own).
        covered: the call for values the request names and no call covered was asked for.
        cap: the output cap the last attempt was sent with.
    """

    ladder: CorrectionLadder | None = None
    params: dict[str, Any] | None = None
    tools: list[Mapping[str, Any]] | None = None
    recovered: bool = False
    note: str = ""
    restated: bool = False
    quoted: str = ""
    covered: bool = False
    cap: int | None = None

    def request(self, request: ModelRequest, cap: int | None) -> ModelRequest:
        """``request`` as this rework sends it, with output cap ``cap`` (kept: an answer far
        past it ran away); the same object when nothing changed."""
        self.cap = cap
        if self.params is None and self.tools is None:
            return request
        return dataclasses.replace(
            request,
            params=self.params if self.params is not None else request.params,
            tools=self.tools if self.tools is not None else request.tools,
        )

    def owes(self, report: ValidationReport) -> bool:
        """Whether ``report`` doubts an argument the request's values were not offered for
        yet (see :meth:`CorrectionLadder.owes`); no ladder yet: whether it doubts any."""
        if self.ladder is None:
            return any(e.kind == "ungrounded_argument" and e.suggestions for e in report.errors)
        return self.ladder.owes(report)

    def reask(
        self, report: ValidationReport, request: ModelRequest, *, ask: bool = True
    ) -> Reask | None:
        """The next corrective re-ask for ``report`` (see :class:`CorrectionLadder`; ``ask``:
        whether its ``asked`` rung may be taken), applied to this rework; ``None`` when no
        re-ask that changes something is left."""
        if self.ladder is None:
            self.ladder = CorrectionLadder(list(request.tools), _question(request.messages))
        reask = self.ladder.next(report, ask=ask)
        if reask is not None:
            self.tools = reask.tools
            self.params = reask.params(request.params) if reask.tool_choice else None
        return reask

    def picked(self, message: Mapping[str, Any]) -> tuple[ValidationReport, str | None] | None:
        """The answer to the ``asked`` re-ask, when it was the last (see
        :meth:`CorrectionLadder.picked`); ``None`` otherwise."""
        return None if self.ladder is None else self.ladder.picked(message)

    def echoed(self, message: Mapping[str, Any]) -> ValidationReport | None:
        """The report of the failed answer a correction was sent for, when ``message`` only
        copies that correction back (then the answer failed again, see
        :meth:`CorrectionLadder.echoed`)."""
        ladder = self.ladder
        if ladder is None or ladder.last is None or not ladder.echoed(message):
            return None
        return ladder.last

    def cover(
        self,
        request: ModelRequest,
        missing: Sequence[str],
        named: Sequence[str],
        called: Sequence[tuple[str, Mapping[str, Any]]],
        answer: Mapping[str, Any],
    ) -> Reask | None:
        """The re-ask for the call a final ``answer`` left out: the request names ``missing``
        values no call covered (``called``: the request's calls so far). The tool is the one
        the request asks for that was not called yet; else the tool called for another of the
        values the request names (``named``), its argument narrowed to the missing values.
        Asked once per call; ``None`` when no tool fits."""
        if self.covered:
            return None
        self.covered = True
        tools = list(request.tools)
        question = _question(request.messages)
        done = {name for name, _ in called}
        fresh = [n for n in _asked_for(question, tools) if n not in done]
        tool: Mapping[str, Any] | None = None
        if fresh:
            tool = next(t for t in tools if _name_of(t) == fresh[0])
            text = f"You have not called {fresh[0]} yet; the request needs it."
        else:
            low = {v.lower() for v in named}
            for name, args in reversed(called):
                keys = [k for k, v in args.items() if isinstance(v, str) and v.lower() in low]
                found = next((t for t in tools if _name_of(t) == name), None)
                if keys and found is not None:
                    tool = _with_choices(found, {keys[0]: tuple(missing)})
                    break
            text = f"You have not looked up {', '.join(missing)} yet; the request names it."
        if tool is None:
            return None
        assistant = {"role": "assistant", "content": answer.get("content") or ""}
        reask = Reask(
            "covering",
            _spelled([assistant, {"role": "user", "content": text}], tool, lead=text),
            [tool],
            _choice(str(_name_of(tool))),
        )
        self.tools = reask.tools
        self.params = reask.params(request.params)
        return reask

    def force(self, params: Mapping[str, Any], note: str = "") -> None:
        """Send the next attempt with ``params`` (``tool_choice: "none"``): an answer, not a
        call, from the results in hand, asked for by the recovery turn ``note``."""
        self.recovered = True
        if note:  # every turn sent counts: a model may copy an earlier one back
            self.note = f"{self.note}\n{note}" if self.note else note
        self.tools = None
        self.params = dict(params)


def _lines_of(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    """The lines of the guard's own text in ``messages`` long enough to be telling."""
    lines: set[str] = set()
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            lines.update(line.strip() for line in content.splitlines() if len(line.strip()) >= 24)
    return lines


def _question(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the latest user message (the request the tools should serve)."""
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""
