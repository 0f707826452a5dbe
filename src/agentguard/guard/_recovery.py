"""The loop recovery ladder: getting an agent out of a loop, not only stopping it.

When the LoopDetector flags a run, each request that arrives while the loop goes on climbs one
rung of ``loop_detection.recovery.rungs`` (a loop at ``BREAK`` starts at ``force`` at least):

* ``hint`` — the detector's hint, where the model can see it (:func:`add_note`);
* ``summary`` — one recovery turn: what was tried and what came back (:func:`summary`);
* ``prune`` — the looping exchanges left out of what is sent upstream (:func:`prune`), plus
  the recovery turn;
* ``force`` — ``tool_choice: "none"`` with the pruned context and a recovery turn listing the
  results in hand (:func:`force_answer`, reusable by any code that must force an answer);
* ``escalate`` — the next tier, given the pruned context and the summary instead of the loop;
* ``stop`` — :class:`~agentguard.LoopDetected`, the structured reason.

Everything here builds new lists: the caller's messages are never changed, and a message that
is changed loses its :data:`~agentguard.transport.ORIGINAL` marker (it no longer stands for the
wire object it was translated from). Tool calls and their results stay paired: an exchange is
removed as a whole, call and result. The notes go at the end of the conversation — never a user
message between tool results, which strict chat templates reject.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentguard._rungs import TEXT_DETECTORS, climb
from agentguard.config import LoopRecoveryConfig
from agentguard.config._models import RecoveryRung
from agentguard.exceptions import LoopDetected
from agentguard.loops._identity import call_key, content_text, result_key
from agentguard.transport import ORIGINAL, ModelRequest

__all__ = [
    "NOTE_PREFIX",
    "TEXT_DETECTORS",
    "Exchange",
    "add_note",
    "climb",
    "echoes",
    "exchanges",
    "force_answer",
    "provider_refusal",
    "prune",
    "replaced",
    "results_turn",
    "rung_request",
    "shrink",
    "summary",
]

#: What every note the guard adds to a conversation starts with.
NOTE_PREFIX = "[agentguard] "
#: Chat roles; any other role stands for an item the pipeline has no chat form for (a
#: Responses ``reasoning`` item), which belongs to the call after it.
_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

# What providers answer when they refuse a conversation as a loop on their side (an HTTP 400
# after which every later request of the conversation is refused too).
_PROVIDER_LOOP = re.compile(
    r"repetitive (?:tool|function) calls?|(?:tool|function) calls? loop|"
    r"repeated (?:tool|function) calls? detected|loop(?:ing)? detected",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Exchange:
    """One tool call in a conversation and the result that answered it.

    Attributes:
        call_at: the index of the assistant message holding the call.
        position: the call's position among that message's ``tool_calls``.
        result_at: the index of the tool message answering it, ``None`` when unanswered.
        name: the tool name.
        arguments: the arguments as sent (a JSON text, usually).
        result: the result's text (``""`` when unanswered).
    """

    call_at: int
    position: int
    result_at: int | None
    name: str
    arguments: Any
    result: str


def exchanges(messages: Sequence[Mapping[str, Any]]) -> list[Exchange]:
    """The tool calls of ``messages`` with their results, in order.

    A result is matched to the latest call with its ``tool_call_id`` not answered yet (local
    servers reuse one id, ``call_0``, for every call), else to the latest unanswered call.
    """
    calls: list[tuple[int, int, str, str, Any]] = []  # (at, position, id, name, arguments)
    waiting: list[tuple[int, int, str, str, Any]] = []  # the calls not answered yet
    answered: dict[tuple[int, int], tuple[int, str]] = {}
    for at, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            for position, call in enumerate(message.get("tool_calls") or ()):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(fn, Mapping):
                    continue
                entry = (
                    at,
                    position,
                    str(call.get("id") or ""),
                    str(fn.get("name", "")),
                    fn.get("arguments", ""),
                )
                calls.append(entry)
                waiting.append(entry)
        elif role == "tool" and waiting:
            call_id = str(message.get("tool_call_id") or "")
            pick = 0  # no id to go by: results come in the order of the calls
            for i in range(len(waiting) - 1, -1, -1):
                if call_id and waiting[i][2] == call_id:
                    pick = i
                    break
            c = waiting.pop(pick)
            answered[(c[0], c[1])] = (at, content_text(message.get("content")))
    out = []
    for at, position, _, name, arguments in calls:
        result_at, result = answered.get((at, position), (None, ""))
        out.append(Exchange(at, position, result_at, name, arguments, result))
    return out


def _repeats(found: Sequence[Exchange], tool: str | None) -> list[Exchange]:
    """The exchanges that repeat an earlier one: the same call with the same result, or — for
    ``tool``, the tool the loop is on — the same result whatever the arguments."""
    seen_calls: set[tuple[str, str, str]] = set()
    seen_results: set[tuple[str, str]] = set()
    repeats = []
    for ex in found:
        if ex.result_at is None:
            continue
        result = result_key(ex.result)
        call = (ex.name, call_key(ex.name, ex.arguments), result)
        same_result = ex.name == tool and (ex.name, result) in seen_results
        if call in seen_calls or same_result:
            repeats.append(ex)
        seen_calls.add(call)
        seen_results.add((ex.name, result))
    return repeats


def prune(
    messages: Sequence[Mapping[str, Any]], *, tool: str | None = None
) -> list[Mapping[str, Any]]:
    """``messages`` without the exchanges that repeat an earlier one (a new list).

    An exchange repeats when an earlier one made the same call and got the same result (volatile
    fields ignored, as the detector judges them); for ``tool`` — the tool the loop is on — the
    same result is enough, whatever the arguments. The first exchange of each kind is kept, so
    the model still holds every answer it got. A call goes with its result; an assistant message
    whose calls all go keeps its text, or goes too (with an item standing right before it that
    has no chat form, such as a Responses reasoning item).
    """
    repeats = _repeats(exchanges(messages), tool)
    if not repeats:
        return list(messages)
    drop_calls: dict[int, set[int]] = {}
    drop: set[int] = set()
    for ex in repeats:
        drop_calls.setdefault(ex.call_at, set()).add(ex.position)
        if ex.result_at is not None:
            drop.add(ex.result_at)
    out: list[Mapping[str, Any]] = []
    for at, message in enumerate(messages):
        if at in drop:
            continue
        positions = drop_calls.get(at)
        if positions is None:
            out.append(message)
            continue
        calls = [c for i, c in enumerate(message.get("tool_calls") or ()) if i not in positions]
        if calls or message.get("content"):
            kept = {k: v for k, v in message.items() if k not in (ORIGINAL, "tool_calls")}
            if calls:
                kept["tool_calls"] = calls
            out.append(kept)
            continue
        while out and out[-1].get("role") not in _CHAT_ROLES:
            out.pop()  # a reasoning item belongs to the call it preceded
    return out


def shrink(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``messages`` without every exchange whose result repeats an earlier result of its tool,
    whatever the arguments (a new list): what can go when a conversation no longer fits the
    server's context. The first exchange of each result stays, so every distinct answer does;
    pairing and the caller's list are kept as :func:`prune` keeps them."""
    out = list(messages)
    for name in dict.fromkeys(ex.name for ex in exchanges(messages)):
        out = prune(out, tool=name)
    return out


def _digest(value: Any, limit: int) -> str:
    """``value`` as one short line: whitespace collapsed, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else content_text(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary(
    messages: Sequence[Mapping[str, Any]],
    config: LoopRecoveryConfig,
    *,
    reason: str = "",
    forced: bool = False,
) -> str:
    """The recovery turn: what the agent tried and what came back, compactly.

    Lists the distinct calls since the last user message (the most recent
    ``summary_max_items``), each as ``name(arguments) -> result`` cut to ``digest_chars``, with
    how often it was made. ``forced`` says tools are off for this turn.
    """
    lines = _result_lines(messages, config)
    head = NOTE_PREFIX + (reason.strip() + " " if reason.strip() else "")
    head += "You are repeating yourself without progress."
    if lines:
        head += " What you tried and what came back:\n" + "\n".join(lines) + "\n"
    else:
        head += " "
    if forced:
        return head + "Tools are off for this turn: give your final answer now from these results."
    return head + (
        "Do not repeat these calls: answer from these results, or try a clearly different approach."
    )


def results_turn(
    messages: Sequence[Mapping[str, Any]], config: LoopRecoveryConfig, question: str
) -> str:
    """A turn asking for the answer from the results in hand when the model did not repeat
    itself but left them unused (an empty or ungrounded answer): the user's request again, the
    results, and nothing the model could copy back as an answer. Measured on SmolLM2-135M
    after each task's calls: 7 of 10 answers correct, against 3 of 10 with :func:`summary`'s
    text (whose sentences the model copies)."""
    lines = _result_lines(messages, config)
    return f"{question}\nTool results:\n" + "\n".join(lines) + "\nAnswer from these results."


def _result_lines(messages: Sequence[Mapping[str, Any]], config: LoopRecoveryConfig) -> list[str]:
    """``- name(arguments) -> result`` for the distinct calls since the last user message."""
    start = 0
    for at in range(len(messages) - 1, -1, -1):
        if messages[at].get("role") == "user":
            start = at
            break
    found = exchanges(messages)
    recent = [ex for ex in found if ex.call_at > start] or found
    tally: dict[tuple[str, str, str], list[Any]] = {}
    for ex in recent:
        key = (ex.name, call_key(ex.name, ex.arguments), result_key(ex.result))
        entry = tally.pop(key, None)  # re-inserted: the latest occurrence orders the list
        tally[key] = [ex, (entry[1] + 1) if entry else 1]
    limit = config.digest_chars
    lines = []
    for ex, count in list(tally.values())[-config.summary_max_items :]:
        times = f" ({count} times)" if count > 1 else ""
        result = _digest(ex.result, limit) if ex.result_at is not None else "(no result)"
        lines.append(f"- {ex.name}({_digest(ex.arguments, limit)}) -> {result}{times}")
    return lines


def add_note(
    messages: Sequence[Mapping[str, Any]], text: str, placement: str = "auto"
) -> list[Mapping[str, Any]]:
    """``messages`` with ``text`` where the model reads it, at the end (a new list).

    Args:
        messages: the conversation (not changed).
        text: the note.
        placement: ``after_results`` — a user turn after the last message; ``tool_result`` —
            inside the last message when it is a tool result (else as ``after_results``);
            ``auto`` — a user turn, merged into the last message when that is the user's text
            already (two user turns in a row break alternating chat templates).
    """
    last = messages[-1] if messages else None
    if isinstance(last, Mapping):
        role = last.get("role")
        content = last.get("content")
        merge = (placement == "tool_result" and role == "tool") or (
            placement == "auto" and role == "user"
        )
        if merge and (content is None or isinstance(content, (str, list))):
            rest = {k: v for k, v in last.items() if k != ORIGINAL}
            if isinstance(content, list):
                rest["content"] = [*content, {"type": "text", "text": text}]
            else:
                rest["content"] = f"{content}\n\n{text}" if content else text
            return [*messages[:-1], rest]
    return [*messages, {"role": "user", "content": text}]


def force_answer(
    request: ModelRequest,
    messages: Sequence[Mapping[str, Any]] | None = None,
    *,
    config: LoopRecoveryConfig | None = None,
    reason: str = "",
    tool: str | None = None,
    note: str | None = None,
) -> ModelRequest:
    """``request`` made to force an answer from what is known: the forcing rung.

    The conversation (``messages``, else the request's) loses its repeated exchanges
    (:func:`prune`), ends with a recovery turn listing the results in hand (:func:`summary`),
    and goes with ``tool_choice: "none"`` when the request declares tools: the model must
    answer in text. The tools stay declared (a template may need them to read the history).
    Use it wherever the model asks again for something the transcript already answers.

    Args:
        request: the request to force (not changed).
        messages: the conversation to send, when not the request's own.
        config: the recovery settings (defaults when ``None``).
        reason: one sentence saying why, put first in the recovery turn.
        tool: the tool the loop is on, whose identical results are pruned whatever the
            arguments.
        note: the recovery turn's text, instead of :func:`summary`'s.
    """
    cfg = config or LoopRecoveryConfig()
    source = list(request.messages if messages is None else messages)
    kept = prune(source, tool=tool)
    text = note if note is not None else summary(source, cfg, reason=reason, forced=True)
    # without tools declared there is nothing to turn off (and OpenAI refuses a tool_choice
    # without tools): the recovery turn alone asks for the answer
    params = {**request.params, "tool_choice": "none"} if request.tools else request.params
    return replaced(request, messages=add_note(kept, text, cfg.hint_placement), params=params)


#: words in a row an answer must share with the guard's own sentences to be a copy of them
_ECHO_RUN = 4
_ECHO_WORD = re.compile(r"[a-z0-9_]+")


def _runs(text: str) -> set[tuple[str, ...]]:
    words = _ECHO_WORD.findall(text.lower())
    return {tuple(words[i : i + _ECHO_RUN]) for i in range(len(words) - _ECHO_RUN + 1)}


def echoes(answer: str, note: str, *, quoted: str = "") -> bool:
    """Whether ``answer`` copies the recovery turn ``note`` back instead of answering.

    A small model given "tools are off for this turn: give your final answer now" often writes
    that sentence back, reworded a little ("You're repeating yourself without progress ...").
    The test: four words in a row from the guard's own sentences of ``note``. Its lines that
    list results (``- name(...) -> ...``) and ``quoted`` (the user's request it restates) are
    left out: an answer may rightly repeat those.
    """
    own = note.replace(quoted, " ") if quoted else note
    lines = (line for line in own.splitlines() if not line.lstrip().startswith("- "))
    phrases = _runs(" ".join(lines).replace(NOTE_PREFIX.strip(), " "))
    return bool(phrases) and not phrases.isdisjoint(_runs(answer))


def replaced(request: ModelRequest, **changes: Any) -> ModelRequest:
    """``dataclasses.replace(request, **changes)`` keeping the request's output cap as it is.

    ``replace`` runs ``__post_init__`` again, which reads a cap the request holds as ``None``
    from its ``params``: a cap the guard set aside (one that is no token count) would come back.
    """
    out = dataclasses.replace(request, **changes)
    if "max_output_tokens" not in changes:
        object.__setattr__(out, "max_output_tokens", request.max_output_tokens)
    return out


def rung_request(
    rung: RecoveryRung,
    request: ModelRequest,
    config: LoopRecoveryConfig,
    *,
    hint: str,
    tool: str | None,
) -> ModelRequest:
    """``request`` as sent on ``rung`` (the request itself is not changed).

    ``hint``: the request's messages and the hint; ``summary``: and the recovery turn;
    ``prune`` and ``escalate`` (for the next tier): the pruned messages and the recovery turn;
    ``force``: :func:`force_answer`. ``stop`` sends nothing: it is no request.
    """
    if rung == "force":
        return force_answer(request, config=config, reason=hint, tool=tool)
    messages = request.messages
    placement = config.hint_placement
    if rung == "hint":
        sent = add_note(messages, NOTE_PREFIX + hint, placement)
    elif rung == "summary":
        sent = add_note(messages, summary(messages, config, reason=hint), placement)
    elif rung in ("prune", "escalate"):
        text = summary(messages, config, reason=hint)
        sent = add_note(prune(messages, tool=tool), text, placement)
    else:
        raise ValueError(f"the {rung!r} rung sends no request")
    return replaced(request, messages=sent)


def provider_refusal(error: BaseException, *, session: str | None = None) -> LoopDetected | None:
    """The loop verdict an upstream gave by refusing the request (``400 Repetitive tool calls
    detected``), as a :class:`~agentguard.LoopDetected`; ``None`` for any other error."""
    status = getattr(error, "status_code", None) or getattr(error, "status", None)
    if isinstance(status, int) and not 400 <= status < 500:
        return None
    texts = [str(error), str(getattr(error, "message", "") or "")]
    body = getattr(error, "body", None)
    if body is not None:
        texts.append(str(body))
    if not any(_PROVIDER_LOOP.search(text[:2000]) for text in texts):
        return None
    return LoopDetected(
        "The provider refused the conversation as a loop of repeated tool calls.",
        detector="provider_refusal",
        count=1,
        session=session,
    )
