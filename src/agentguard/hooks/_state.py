"""Loop state of a coding-agent session, shared by every hook process through a store.

A command hook is a new process per event, and several processes (or ``agentguard serve``
workers) may handle one session's events. So the session's tool events are kept as a log of
small records in the store (one record per event, under the session's namespace, keys in time
order), and each judgement replays the log into a :class:`~agentguard.LoopDetector`: the same
detector, fed the same calls and results, in the same order, as an embedded guard would feed
it. The log keeps the last :func:`replay_window` events; a process keeps its detector between
events and replays only what other processes added.

What a record holds is the *replay form* of an event, not the event: arguments keep their short
texts (the words the near-duplicate and rewording detectors compare) with every secret-looking
value redacted; long texts and results are replaced by digests that keep their identity (two
equal results have equal digests, volatile noise such as timestamps aside), so no file content
or command output is stored. The live event is judged in the same form as the replayed ones.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from agentguard._redact import REDACTED, is_secret_key, redact
from agentguard.config import LoopDetectionConfig
from agentguard.loops import LoopDetector, Verdict, is_error_result, result_fingerprint
from agentguard.storage import Store

__all__ = ["SessionLoops", "argument_form", "replay_window", "result_form"]

#: Argument texts longer than this are digested (a query is short; a file's content is not).
_SHORT_TEXT = 200
#: Results at most this long (printed) are kept as they are (``"ok"``, ``"No matches"``).
_SHORT_RESULT = 64
#: Error texts are kept up to this length (the detectors compare failures by their text).
_ERROR_TEXT = 500
_DEPTH = 32
# Digests are spelled with the letters g-v: never hex, so the detectors' noise filter (which
# removes ids and hashes from results) cannot mistake one for volatile noise.
_LETTERS = str.maketrans("0123456789abcdef", "ghijklmnopqrstuv")


def _digest(kind: str, text: str) -> str:
    raw = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"agentguard-{kind}:{raw.translate(_LETTERS)}"


def argument_form(value: Any, depth: int = 0) -> Any:
    """The replay form of tool arguments: short texts redacted, long ones digested.

    Equal arguments have equal forms; the words of short texts survive for fuzzy comparison.
    """
    if isinstance(value, str):
        text = redact(value)
        return _digest("text", text) if len(text) > _SHORT_TEXT else text
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= _DEPTH:
        return _digest("text", repr(type(value)))
    if isinstance(value, Mapping):
        return _keyed(value, lambda v: argument_form(v, depth + 1))
    if isinstance(value, (list, tuple)):
        return [argument_form(v, depth + 1) for v in value]
    return argument_form(str(value), depth + 1)


def _keyed(value: Mapping[Any, Any], form: Callable[[Any], Any]) -> dict[str, Any]:
    """A mapping's form: the value of a secret-looking key redacted, any other in ``form``."""
    return {str(k): REDACTED if is_secret_key(str(k)) else form(v) for k, v in value.items()}


def _secret_keys_redacted(value: Any, depth: int = 0) -> Any:
    """``value`` with the values of its secret-looking keys (at any depth) redacted."""
    if depth >= _DEPTH:
        return value
    if isinstance(value, Mapping):
        return _keyed(value, lambda v: _secret_keys_redacted(v, depth + 1))
    if isinstance(value, (list, tuple)):
        return [_secret_keys_redacted(v, depth + 1) for v in value]
    return value


def _printed(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(type(value))


def _size(value: Any) -> int:
    """How long the detectors find a result (its text, or how it prints)."""
    if isinstance(value, str):
        return len(value)
    try:
        return len(str(value))
    except (ValueError, RecursionError):
        return len(_printed(value))


def result_form(result: Any, failed: bool, min_chars: int) -> Any:
    """The replay form of a tool result (or of a failure's error text).

    A failure keeps its redacted text (failures are told apart by it); a short result is kept
    when there is nothing in it to redact (secret-looking texts, or values of secret-looking keys
    as in :func:`argument_form`). Any other result becomes a digest of its fingerprint (volatile
    fields, ids and timestamps removed), padded so that it is as "informative" to the
    near-duplicate detector as the result was (at least ``min_chars`` long exactly when the
    result was).
    """
    if failed:
        return redact(_printed(_secret_keys_redacted(result)))[:_ERROR_TEXT]
    text = _printed(result)
    if (
        len(text) <= _SHORT_RESULT
        and redact(text) == text
        and _secret_keys_redacted(result) == result
    ):
        return result
    tag = _digest("result", result_fingerprint(result))
    size = _size(result)
    if size < min_chars <= len(tag):  # not informative, yet the whole tag would be
        return tag[: max(size, min(min_chars - 1, 26))]  # 26: the prefix and 8 letters
    return tag.ljust(min(size, max(min_chars, len(tag))))


def replay_window(config: LoopDetectionConfig) -> int:
    """How many events of a session the log keeps: enough for every ladder to reach BREAK."""
    longest = max(
        config.tool_window,
        config.break_at,
        config.no_progress_break_at,
        config.error_break_at,
        config.unknown_tool_break_at,
        config.global_break_at,
        config.cycle_break_at * config.cycle_max_period,
    )
    return 4 * longest  # a call and a result per tool use, twice over


class _Replay:
    """A detector and the log keys it has seen, newest last."""

    __slots__ = ("detector", "keys", "seen")

    def __init__(self, detector: LoopDetector) -> None:
        self.detector = detector
        self.keys: list[str] = []
        self.seen: set[str] = set()

    def add(self, key: str) -> None:
        self.keys.append(key)
        self.seen.add(key)


class SessionLoops:
    """The loop judgements of coding-agent sessions, with their state in a shared store.

    Args:
        store: where the sessions' event logs live (shared by every hook process).
        config: the loop-detection settings.
        clock: wall-clock seconds (log keys and expiry).
        ttl: seconds a session's log is kept after its last event.
        cache: sessions whose detectors this process keeps between events.
    """

    def __init__(
        self,
        store: Store,
        config: LoopDetectionConfig,
        *,
        clock: Callable[[], float],
        ttl: float = 86_400.0,
        cache: int = 64,
    ) -> None:
        self.store = store
        self.config = config
        self.window = replay_window(config)
        self._clock = clock
        self._ttl = ttl
        self._cache: dict[str, _Replay] = {}
        self._cache_size = cache
        self._tag = secrets.token_hex(3)  # keeps keys of processes written at one instant apart
        self._seq = 0

    def call(self, session: str, tool: str, arguments: Any) -> Verdict:
        """Judge a tool call before it runs (``BREAK``: refuse it)."""
        return self._judge(session, {"k": "call", "n": tool, "a": argument_form(arguments)})

    def result(self, session: str, tool: str, arguments: Any, result: Any, failed: bool) -> Verdict:
        """Record what a call returned; the verdict on repeating it."""
        failed = failed or is_error_result(result if isinstance(result, str) else None)
        form = result_form(result, failed, self.config.near_duplicate_min_result_chars)
        record = {"k": "result", "n": tool, "a": argument_form(arguments), "r": form, "e": failed}
        return self._judge(session, record)

    def news(self, session: str) -> None:
        """A user message: new information (runs of unchanged results start again)."""
        self._judge(session, {"k": "news"})

    # -- the log ---------------------------------------------------------------------------

    def _judge(self, session: str, record: dict[str, Any]) -> Verdict:
        namespace = f"hooks:loops:{session}"
        now = self._clock()
        entries = self.store.items(namespace, now)
        replay = self._replay_of(session, entries)
        verdict = _apply(replay.detector, record)
        self._seq += 1
        key = f"{int(now * 1e6):017d}-{self._tag}-{self._seq:06d}"
        self.store.put(namespace, key, json.dumps(record, separators=(",", ":")), now, self._ttl)
        replay.add(key)
        extra = len(entries) + 1 - self.window
        for old, _ in entries[: max(extra, 0)]:
            self.store.delete(namespace, old, now)
        if len(replay.keys) > 2 * self.window:  # what the store dropped, this process forgets
            del replay.keys[: self.window]
            replay.seen = set(replay.keys)
        return verdict

    def _replay_of(self, session: str, entries: list[tuple[str, str]]) -> _Replay:
        """This session's detector, brought up to date with the log ``entries``.

        The cached detector is kept when every entry up to the last one it saw is one it saw
        (other processes only appended); otherwise the log is replayed from its start.
        """
        replay = self._cache.get(session)
        start = 0
        if replay is not None and replay.keys:
            last = replay.keys[-1]
            position = next(
                (i for i in range(len(entries) - 1, -1, -1) if entries[i][0] <= last), -1
            )
            if all(key in replay.seen for key, _ in entries[: position + 1]):
                start = position + 1
            else:
                replay = None
        if replay is None:
            replay = _Replay(LoopDetector(self.config, hooks=(), _process_hooks=False))
            self._cache.pop(session, None)
            if len(self._cache) >= self._cache_size:
                del self._cache[next(iter(self._cache))]
            self._cache[session] = replay
        else:
            del self._cache[session]  # most recently used last
            self._cache[session] = replay
        for key, value in entries[start:]:
            replay.add(key)
            try:
                record = json.loads(value)
            except ValueError:
                continue  # a damaged record is skipped, never fatal
            if isinstance(record, dict):
                _apply(replay.detector, record)
        return replay


def _apply(detector: LoopDetector, record: Mapping[str, Any]) -> Verdict:
    kind, name = record.get("k"), str(record.get("n", ""))
    if kind == "call":
        return detector.check_tool_call(name, record.get("a"))
    if kind == "result":
        return detector.record_tool_result(
            name, record.get("a"), record.get("r"), bool(record.get("e"))
        )
    if kind == "news":
        detector.observe({"role": "user", "content": ""})
    return Verdict()
