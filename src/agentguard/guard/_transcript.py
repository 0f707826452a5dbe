"""Which line of conversation a request continues, and what of it the guard has not judged.

A conversation is a tree of turns. A *run* is one path through it: the loop detector that judged
it and a bounded memory of its messages (by :func:`message_key`). :class:`Runs` finds, for each
request, the run it continues:

- a request whose history carries a run's latest message (the answer the guard returned) after
  which it only adds messages continues that run: only the added messages are new, so the loop
  check and the prompt estimate cost O(new messages) (also when the history was trimmed or
  edited before that point: older messages are taken as seen, never judged twice); so does a
  request that ends with the run's latest answer and adds nothing (two answers in a row);
- a request that ends at a point some run has already passed — the same history re-sent (a
  retry, a regeneration, another sample) or a history edited back to an earlier turn — is a
  *fork*: a new run judged from its own transcript, so nothing that was not executed counts as
  a loop step twice;
- anything else (a new conversation, or one the guard has forgotten) is a new run, judged from
  its transcript (at most as far back as a run remembers).

Runs live in a *namespace*: an explicit session, or — without one — the caller's scope (a key,
a ``user``) and the conversation's opening. Strangers never share a run: two conversations that
share only their opening part ways at their first differing message, and an identical re-send is
a fork, not a continuation. A request whose opening changed (trimmed away, or edited: a system
prompt carrying the time) continues the caller's run whose latest answer it carries, when that
answer is the latest of that run alone.

A request whose history the upstream keeps (the Responses API's ``previous_response_id`` or
``conversation``) carries only what is new: it names the *thread* it follows instead
(:func:`thread_of`). It continues the run whose answer that thread names, every message it
carries new; following an answer the run has since gone past is a fork (a new run), as for a
re-sent history. A thread the guard does not know (forgotten, or answered by another process)
starts a new run in the caller's realm, never one shared with strangers.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from agentguard._fingerprint import fingerprint, fingerprint_bytes
from agentguard.budget import estimate_tokens
from agentguard.budget._estimate import REPLY_PRIMING
from agentguard.loops import LoopDetector
from agentguard.transport import ORIGINAL
from agentguard.types import Tier

__all__ = ["New", "Run", "Runs", "message_key", "message_tokens", "thread_of"]


class Run:
    """One run: its loop detector and the messages it has seen (bounded).

    Attributes:
        id: the run's id (a session id for the ledger and the report).
        namespace: the namespace it lives in.
        detector: the loop detector that judged its messages.
        forced_tier: a tier the budget policy moved the run to, kept for its later calls.
        rung: the loop recovery rung its current loop reached (an index into
            ``loop_detection.recovery.rungs``; -1 while it is not looping).
        last: its latest message: (index, key, tokens of the conversation up to it).
        answered: its latest message is the answer the guard returned, and no request has yet
            asked to go on from it (see :meth:`Runs.locate`).
    """

    __slots__ = (
        "answered",
        "before",
        "detector",
        "forced_tier",
        "id",
        "last",
        "marks",
        "media",
        "memory",
        "namespace",
        "realm",
        "rung",
    )

    def __init__(self, run_id: str, namespace: str, detector: LoopDetector, memory: int) -> None:
        self.id = run_id
        self.namespace = namespace
        #: the caller's realm of a run found without a named session (see Runs.locate)
        self.realm: str | None = None
        self.detector = detector
        #: message key -> (its index in the conversation, tokens of the conversation up to it),
        #: least recently seen first
        self.marks: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()
        self.memory = memory
        self.forced_tier: Tier | None = None
        self.rung = -1
        self.last: tuple[int, str, int] | None = None
        #: the key of the message just before its latest one
        self.before: str | None = None
        self.answered = False
        #: an image or audio part was among its messages (their token counts are a guess)
        self.media = False


#: A message not seen before: its index, key, the history's tokens up to it, the message.
New = tuple[int, str, int, Mapping[str, Any]]


class Runs:
    """Every run a guard follows (the least recently used are forgotten past ``max_runs``).

    Args:
        detector: makes the loop detector of a new run.
        memory: messages each run remembers.
        max_runs: runs remembered at once.
    """

    def __init__(self, detector: Callable[[], LoopDetector], *, memory: int, max_runs: int) -> None:
        self._detector = detector
        self._memory = memory
        self._max_runs = max_runs
        self._runs: collections.OrderedDict[int, Run] = collections.OrderedDict()
        #: (namespace, message key) -> the run that saw it most recently
        self._seen: dict[tuple[str, str], Run] = {}
        #: (namespace, key of a run's latest message) -> the runs whose latest message it is
        self._tips: dict[tuple[str, str], list[Run]] = {}
        #: (realm, key of the answer a run ended on) -> those runs, of every opening: a
        #: conversation whose opening was trimmed away is found by its latest answer
        self._answers: dict[tuple[str, str], list[Run]] = {}
        #: (realm, thread) -> the run that answered it, the index of that answer, and the tier
        #: that gave it
        self._threads: collections.OrderedDict[tuple[str, str], tuple[Run, int, Tier | None]] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(list(self._runs.values()))

    def locate(
        self,
        namespace: str,
        messages: Sequence[Mapping[str, Any]],
        new_id: Callable[[], str],
        *,
        realm: str | None = None,
    ) -> tuple[Run, list[New], int]:
        """The run a request continues (or a new one), its unseen messages, and the estimated
        tokens of the whole history.

        Args:
            namespace: where the request's runs live.
            messages: the request's history.
            new_id: gives the id of a new run.
            realm: the caller's realm, when the namespace is made of it and the conversation's
                opening (no session named): a request that continues none of the namespace's
                runs continues the realm's run whose latest message is the answer the guard
                returned it, when that answer is in the request and is the latest of that run
                alone (an agent that trims its history drops the opening too, or edits it: a
                system prompt carrying the time).
        """
        end = len(messages)
        floor = max(0, end - self._memory)
        keys: list[str] = []  # of the messages after the match, last first
        run: Run | None = None
        parent: Run | None = None
        answered: tuple[Run, int] | None = None  # the realm's run ending on an answer here
        start = end
        while start > floor:
            key = message_key(messages[start - 1])
            waiting = self._tips.get((namespace, key))
            if waiting:
                run = _continued(waiting, start - 1, messages)
                if run is not None:
                    break
            if realm is not None and answered is None:
                ending = self._answers.get((realm, key))
                if ending is not None and len(ending) == 1:  # (two runs on one answer: neither)
                    answered = (ending[0], start - 1)
            if parent is None:
                parent = self._seen.get((namespace, key))
            keys.append(key)
            start -= 1
        if run is None and answered is not None:
            run = _continued([answered[0]], answered[1], messages)
            if run is not None:
                start = answered[1] + 1
                keys = keys[: end - start]
        base: int | None = None
        if run is None:
            # A new run (or a fork of ``parent``): a fresh detector judges the whole transcript,
            # as far back as a run remembers.
            run = Run(new_id(), namespace, self._detector(), self._memory)
            run.realm = realm
            if parent is not None:
                run.forced_tier = parent.forced_tier
            self._add(run)
        else:
            mark = run.last
            if mark is not None and mark[0] == start - 1:  # its tokens up to here are known
                base = mark[2]
            self._runs.move_to_end(id(run))
        tokens = base if base is not None else sum(message_tokens(m) for m in messages[:start])
        new: list[New] = []
        for offset, key in enumerate(reversed(keys)):
            message = messages[start + offset]
            tokens += message_tokens(message)
            new.append((start + offset, key, tokens, message))
        return run, new, tokens

    def follow(
        self,
        realm: str,
        thread: str,
        namespace: str,
        messages: Sequence[Mapping[str, Any]],
        new_id: Callable[[], str],
    ) -> tuple[Run, list[New], int]:
        """As :meth:`locate`, for a request that names the ``thread`` it follows (see
        :func:`thread_of`): its history is kept upstream, so every message it carries is new.

        Args:
            realm: who may continue the thread (the caller's scope, or a named session).
            thread: the answer (or conversation) the request follows.
            namespace: where a new run lives.
            messages: what the request carries.
            new_id: gives the id of a new run.
        """
        found = self._threads.get((realm, thread))
        parent, at = found[:2] if found is not None else (None, -1)
        if parent is not None and self._runs.get(id(parent)) is not parent:
            parent = None  # forgotten since
        last = parent.last if parent is not None else None
        # a conversation goes on from wherever it is; an answer only from itself (an answer the
        # run has gone past is followed again: a retry or another sample, a fork)
        going_on = last is not None and (last[0] == at or thread.startswith("conversation:"))
        if parent is not None and last is not None and going_on:
            self._runs.move_to_end(id(parent))
            return parent, *_news(messages, last[0] + 1, last[2])
        run = Run(new_id(), namespace, self._detector(), self._memory)
        if parent is not None:
            run.forced_tier = parent.forced_tier
        self._add(run)
        return run, *_news(messages, 0, 0)

    def answered(self, run: Run, realm: str, thread: str, tier: Tier | None = None) -> None:
        """``run``'s latest message (its answer), given by ``tier``, is what ``thread`` names
        from now on."""
        if run.last is None:
            return
        key = (realm, thread)
        self._threads[key] = (run, run.last[0], tier)
        self._threads.move_to_end(key)
        while len(self._threads) > 4 * self._max_runs:
            self._threads.popitem(last=False)

    def held_by(self, realm: str, thread: str) -> Tier | None:
        """The tier whose answer ``thread`` names (where the upstream keeps that conversation),
        when the guard gave it and still remembers."""
        found = self._threads.get((realm, thread))
        return found[2] if found is not None else None

    def restart(self, run: Run, messages: Sequence[Mapping[str, Any]]) -> list[New]:
        """``run`` to be judged afresh from ``messages``: a new detector, and every message (as
        far back as a run remembers) unseen. For a run another process has moved on (a fleet of
        servers sharing sessions): what this one remembers of it is out of date."""
        self._forget(run)
        run.marks.clear()
        run.last = run.before = None
        run.detector = self._detector()
        floor = max(0, len(messages) - self._memory)
        tokens = sum(message_tokens(m) for m in messages[:floor])
        new: list[New] = []
        for index in range(floor, len(messages)):
            message = messages[index]
            tokens += message_tokens(message)
            new.append((index, message_key(message), tokens, message))
        return new

    def remember(
        self, run: Run, key: str, index: int, tokens: int, *, answer: bool = False
    ) -> None:
        """``run`` has seen the message ``key`` at ``index``; it is now its latest.

        ``answer``: the message is the answer the guard returned (not one of a request's).
        """
        namespace = run.namespace
        self._untip(run)
        run.before = run.last[1] if run.last is not None else None
        run.last = (index, key, tokens)
        run.answered = answer
        self._tips.setdefault((namespace, key), []).append(run)
        if answer and run.realm is not None:
            self._answers.setdefault((run.realm, key), []).append(run)
        run.marks[key] = (index, tokens)
        run.marks.move_to_end(key)
        self._seen[(namespace, key)] = run
        if len(run.marks) > run.memory:
            old, _ = run.marks.popitem(last=False)
            if self._seen.get((namespace, old)) is run:
                del self._seen[(namespace, old)]

    def _add(self, run: Run) -> None:
        self._runs[id(run)] = run
        while len(self._runs) > self._max_runs:
            _, old = self._runs.popitem(last=False)
            self._forget(old)

    def _forget(self, run: Run) -> None:
        namespace = run.namespace
        for key in run.marks:
            if self._seen.get((namespace, key)) is run:
                del self._seen[(namespace, key)]
        self._untip(run)

    def _untip(self, run: Run) -> None:
        """``run`` no longer waits at its latest message (it moves on, or is forgotten)."""
        if run.last is None:
            return
        _drop(self._tips, (run.namespace, run.last[1]), run)
        if run.realm is not None:
            _drop(self._answers, (run.realm, run.last[1]), run)


def _drop(tips: dict[tuple[str, str], list[Run]], at: tuple[str, str], run: Run) -> None:
    """``run`` no longer among the runs waiting at ``at``."""
    tip = tips.get(at)
    if tip is not None and run in tip:
        tip.remove(run)
        if not tip:
            del tips[at]


def _continued(waiting: list[Run], index: int, messages: Sequence[Mapping[str, Any]]) -> Run | None:
    """Which of the runs whose latest message sits at ``index`` of a request it continues.

    A request that adds nothing after that message continues a run only when the message is
    the answer the guard returned that run: the agent asks the model to go on after its own
    answer (two answers in a row, as sub-agents reporting back in turn do), and only the first
    such request continues (a second one before its answer is another sample, a fork).
    Otherwise a request that adds nothing is the same request again (a concurrent or a repeated
    one), never a continuation. A run whose latest message is at the same index continues (the
    usual, append-only case); a run that had it further on continues too when the history was
    trimmed before it — unless the request ends exactly where that run's latest answer would
    follow: then it is that run's previous request again (a retry, a regeneration, another
    sample), a fork.
    """
    if index == len(messages) - 1:
        for run in waiting:
            last = run.last
            if run.answered and last is not None and last[0] == index:
                run.answered = False
                return run
        return None
    later: Run | None = None
    for run in waiting:
        last = run.last
        if last is None:
            continue
        if last[0] == index:
            return run
        if later is None and not (
            len(messages) == last[0] and run.before == message_key(messages[-1])
        ):
            later = run
    return later


def _news(messages: Sequence[Mapping[str, Any]], start: int, tokens: int) -> tuple[list[New], int]:
    """``messages`` as unseen ones from index ``start``, after ``tokens`` of history, and the
    tokens of the history with them."""
    new: list[New] = []
    for offset, message in enumerate(messages):
        tokens += message_tokens(message)
        new.append((start + offset, message_key(message), tokens, message))
    return new, tokens


def thread_of(params: Mapping[str, Any]) -> str | None:
    """The thread a request follows when its history is kept upstream: the Responses API's
    ``conversation`` (an id, or an object with one) or ``previous_response_id``; else ``None``."""
    conversation = params.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    if isinstance(conversation, str) and conversation:
        return "conversation:" + conversation
    previous = params.get("previous_response_id")
    if isinstance(previous, str) and previous:
        return "response:" + previous
    return None


def message_key(message: Mapping[str, Any]) -> str:
    """What identifies a message across calls: role, text, calls, call id — not the SDK's extra
    null fields (``refusal``, ``audio`` ...) an agent adds when it echoes an answer back, nor
    the spacing of re-serialised call arguments."""
    role, content = message.get("role"), message.get("content") or ""
    call_id, item = message.get("tool_call_id"), message.get(ORIGINAL)
    calls = message.get("tool_calls") or ()
    if (
        isinstance(role, str)
        and isinstance(content, str)
        and (call_id is None or isinstance(call_id, str))
        and item is None
    ):
        # The usual message, encoded without a JSON pass: every field length-prefixed, so no
        # two different messages share an encoding.
        parts = [role, content, call_id or ""]
        for call in calls:
            fn = call.get("function") or {}
            parts += [str(call.get("id")), str(fn.get("name")), _arguments_key(fn.get("arguments"))]
        text = "".join(f"{len(part)}:{part}" for part in parts)
        return fingerprint_bytes(text.encode("utf-8", "surrogatepass"))
    described = [
        role,
        content,
        call_id,
        [
            (c.get("id"), fn.get("name"), fingerprint(fn.get("arguments") or ""))
            for c in calls
            for fn in (c.get("function") or {},)
        ],
        item,
    ]
    return "j" + fingerprint_bytes(
        json.dumps(described, default=str).encode("utf-8", "surrogatepass")
    )


#: fingerprints of argument texts seen lately: an answer's arguments are keyed when it is given
#: and again when the next request carries it back
_ARGUMENT_KEYS: dict[str, str] = {}


def _arguments_key(arguments: Any) -> str:
    """The arguments' fingerprint, spacing and key order aside (memoised for texts)."""
    if not isinstance(arguments, str):
        return fingerprint(arguments or "")
    key = _ARGUMENT_KEYS.get(arguments)
    if key is None:
        key = fingerprint(arguments)
        if len(_ARGUMENT_KEYS) >= 4096:  # bounded: start over rather than track recency
            _ARGUMENT_KEYS.clear()
        _ARGUMENT_KEYS[arguments] = key
    return key


def message_tokens(message: Mapping[str, Any]) -> int:
    return estimate_tokens([message]) - REPLY_PRIMING
