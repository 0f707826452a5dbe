"""The hostile battery's shared parts: hypothesis strategies, a raw-body upstream, and checks.

Everything here drives the public API: the real openai client (over an HTTP mock transport that
answers with whatever bytes a strategy generated), ``agentguard.wrap``, ``Guard``, ``ToolGuard``,
``LoopDetector``, ``ToolCallValidator``, ``GuardConfig`` and the ``agentguard`` CLI.

The properties the battery checks:

1. *Typed failure.* Whatever the raw client does with an input, the guarded client returns an
   answer or raises an :class:`agentguard.AgentGuardError` or the very SDK exception class the raw
   client raised; never another exception (``AttributeError``, ``KeyError``, ``RecursionError``,
   ``UnicodeError``, ``TypeError``, ``ValueError``...).
2. *No hang.* :func:`finishes` runs a call on a thread and fails when it has not returned after a
   generous limit. That is a hang detector, not a performance assertion: every input is sized so
   that a linear implementation takes milliseconds and a quadratic one takes minutes.
3. *No leak.* :data:`CANARY` is configured as a secret (a tier's API key, a Redis password, echoed
   by an upstream error body) and must never appear in logs, events, reports, exception text or
   ``config show``.
4. *Ledger invariants.* Committed totals exact, never negative, ``hard_stop`` never exceeded.

Run time: every hypothesis test uses :func:`cases` (derandomized, no example database, no
deadline), so the battery is deterministic and bounded. ``AGENTGUARD_HOSTILE_SCALE`` multiplies
every example count (e.g. ``0.1`` for a quick local run, ``10`` for a nightly soak).
"""

from __future__ import annotations

import json
import math
import os
import random
import reprlib
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import agentguard as ag
from agentguard.testing import FakeClock

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")

T = TypeVar("T")

#: the secret that must never leave the guard (not ``sk-`` shaped: pattern redaction misses it)
CANARY = "canary-7Q2xKp9ZvW4mRt8L"
#: how long a single call may run before it counts as hung (a hang detector, see module doc)
HANG_SECONDS = 30.0
SCALE = float(os.environ.get("AGENTGUARD_HOSTILE_SCALE", "1"))


def cases(n: int, *, shrink: bool = True) -> settings:
    """Hypothesis settings for ``n`` examples (times ``AGENTGUARD_HOSTILE_SCALE``).

    Derandomized and without a database, so a run is reproducible and CI time is bounded;
    ``shrink=False`` for strict-xfail generative tests, whose failure is expected and whose
    shrinking would only cost time.
    """
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if shrink:
        phases.append(Phase.shrink)
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        derandomize=True,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )


# -- property 2: no hang ----------------------------------------------------------------------


class Hang(Exception):
    """A call had not returned after the hang detector's limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"hang: the call had not returned after {HANG_SECONDS:.0f} s")


def finishes(fn: Callable[[], T], seconds: float = HANG_SECONDS) -> T:
    """Run ``fn()`` and fail the test when it has not returned after ``seconds``.

    A hang detector with a limit hundreds of times above what a linear implementation needs,
    never a timing assertion. On the main thread it is an interval timer (a signal raises
    :class:`Hang` inside the call, between bytecodes); elsewhere the call runs on a daemon thread
    that is abandoned when it hangs.
    """
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        if signal.getitimer(signal.ITIMER_REAL)[0]:  # already under a detector
            return fn()
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        except Hang:
            pytest.fail(f"hang: the call had not returned after {seconds:.0f} s")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="hostile-hang-detector")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"hang: the call had not returned after {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# -- property 1: typed failure ----------------------------------------------------------------


class Outcome:
    """What a call did: returned ``value`` or raised ``error``."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    def __repr__(self) -> str:
        if self.error is None:
            return f"returned {type(self.value).__name__}"
        return f"raised {type(self.error).__name__}: {str(self.error)[:200]}"


def outcome(fn: Callable[[], Any]) -> Outcome:
    """Run ``fn`` under the hang detector and record what it did."""
    try:
        return Outcome(value=finishes(fn))
    except pytest.fail.Exception:
        raise
    except Exception as exc:
        return Outcome(error=exc)


def assert_typed(guarded: Outcome, raw: Outcome | None = None) -> None:
    """Property 1: the guarded side returned, or raised a typed error or the raw side's own."""
    err = guarded.error
    if err is None or isinstance(err, ag.AgentGuardError):
        return
    if raw is not None and raw.error is not None and type(err) is type(raw.error):
        return
    raise AssertionError(f"untyped exception escaped the guard (raw {raw!r})") from err


def assert_only(error: BaseException | None, *allowed: type[BaseException]) -> None:
    """``error`` is ``None`` or one of ``allowed`` (plus ``AgentGuardError``)."""
    if error is None or isinstance(error, (ag.AgentGuardError, *allowed)):
        return
    raise AssertionError(f"untyped exception: {type(error).__name__}") from error


# -- property 3: no leak ----------------------------------------------------------------------


def texts_of(value: Any) -> Iterable[str]:
    """Every string a value shows to the outside: str, repr, and its exception chain."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        yield str(item)
        yield repr(item)
        if isinstance(item, BaseException):
            stack += list(item.args)
            # the chain: the guard's own errors only (an SDK exception passed through or
            # chained is the SDK's text, not something the guard showed)
            chain = (item.__cause__, item.__context__)
            stack += [e for e in chain if isinstance(e, ag.AgentGuardError)]


def assert_no_canary(*values: Any, secret: str = CANARY) -> None:
    """Property 3: ``secret`` appears in none of ``values`` (strings, objects, exceptions)."""
    for value in values:
        for text in texts_of(value):
            assert secret not in text, f"secret leaked: ...{_around(text, secret)}..."


def _around(text: str, secret: str) -> str:
    at = text.index(secret)
    return text[max(0, at - 60) : at + len(secret) + 20]


# -- a raw upstream ---------------------------------------------------------------------------


class RawUpstream:
    """An OpenAI-compatible endpoint answering every request with generated bytes.

    ``answers`` are ``(status, content_type, body)`` triples served in turn (the last one again
    once they run out); ``requests`` records every JSON request body the client sent.
    """

    def __init__(self, answers: Sequence[tuple[int, str, bytes]]) -> None:
        self.answers = list(answers)
        self.requests: list[Any] = []

    def _handle(self, req: Any) -> Any:
        try:
            self.requests.append(json.loads(req.content or b"null"))
        except ValueError:
            self.requests.append(None)
        status, ctype, body = self.answers[min(len(self.requests), len(self.answers)) - 1]
        return http.Response(status, headers={"content-type": ctype}, content=body)

    def transport(self) -> Any:
        return http.MockTransport(self._handle)


BASE_URL = "http://hostile.invalid/v1"
CONFIG = ag.GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}},
        "escalation": {"chain": ["fast"], "max_retries_before_escalate": 1},
        "memory_pressure": {"enabled": False},
    },
    env={},
)


def raw_client(upstream: RawUpstream, *, asynchronous: bool = False) -> Any:
    """The plain openai client over ``upstream`` (its own retries off, like the guard's)."""
    if asynchronous:
        return openai.AsyncOpenAI(
            api_key=CANARY,
            base_url=BASE_URL,
            max_retries=0,
            http_client=http.AsyncClient(transport=upstream.transport()),
        )
    return openai.OpenAI(
        api_key=CANARY,
        base_url=BASE_URL,
        max_retries=0,
        http_client=http.Client(transport=upstream.transport()),
    )


def guarded_client(
    upstream: RawUpstream,
    config: ag.GuardConfig = CONFIG,
    *,
    asynchronous: bool = False,
    **options: Any,
) -> Any:
    """``ag.wrap`` of the real openai client over ``upstream``, with time injected."""
    clock = FakeClock()
    options.setdefault("clock", clock)
    options.setdefault("sleep", clock.asleep if asynchronous else clock.sleep)
    options.setdefault("rng", random.Random(0))
    return ag.wrap(raw_client(upstream, asynchronous=asynchronous), config, **options)


# -- strategies: values -----------------------------------------------------------------------

LONE_SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc80b", "\ud83d"])
hostile_text = st.one_of(
    st.text(max_size=30),
    LONE_SURROGATES,
    st.sampled_from(["", "\x00", "\u202e", "null", "{", "\\", '"', "\n" * 5, "é" * 10]),
)
hostile_number = st.one_of(
    st.integers(-(10**6), 10**6),
    st.sampled_from([-1, -5, 0, 10**20, -(10**20), 2**63, 2**64 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
#: any JSON-ish scalar, including numbers JSON cannot hold (dumped as Infinity / NaN)
hostile_scalar = st.one_of(st.none(), st.booleans(), hostile_number, hostile_text)


#: nesting that every supported Python refuses to recurse through (3.12 and 3.13 decode and
#: encode 1,000 levels, sometimes 2,000, natively): "deep" cases use it, so a case that fails
#: today fails on every version, and passes on every version once handled without recursion
DEEP = 100_000


def nested(depth: int, leaf: Any = 1, kind: str = "list") -> Any:
    """A value nested ``depth`` levels deep (built iteratively: no recursion here)."""
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def deep_json(depth: int, kind: str = "list") -> str:
    """JSON text nested ``depth`` levels (text, so no encoder recursion is needed to build it)."""
    if kind == "list":
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


#: any JSON-ish value; scalars weighted 3:2 against containers so values stay small (a
#: deferred definition: ``st.recursive`` with this extend warns under some suite orders)
hostile_json: st.SearchStrategy[Any] = st.deferred(
    lambda: st.one_of(
        hostile_scalar,
        hostile_scalar,
        hostile_scalar,
        st.lists(hostile_json, max_size=3),
        st.dictionaries(hostile_text, hostile_json, max_size=3),
    )
)


def dumps(value: Any) -> str:
    """JSON text of ``value``, NaN/Infinity kept as the non-standard literals servers send."""
    return json.dumps(value, allow_nan=True)


# -- strategies: chat-completion response bodies ------------------------------------------------

TOOL_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["path"],
}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": TOOL_SCHEMA}}]
MESSAGES = [{"role": "user", "content": "read setup.cfg"}]


def completion(
    *,
    content: Any = "done",
    tool_calls: Any = None,
    message: Any = ...,
    finish: Any = "stop",
    usage: Any = ...,
    choices: Any = ...,
    rid: Any = "chatcmpl-1",
) -> dict[str, Any]:
    """A chat.completion body; every part replaceable by something hostile."""
    if message is ...:
        message = {"role": "assistant", "content": content}
        if tool_calls is not None:
            message["tool_calls"] = tool_calls
    if choices is ...:
        choices = [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}]
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion",
        "created": 1,
        "model": "small",
        "choices": choices,
    }
    if usage is ...:
        usage = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    if usage is not None:
        body["usage"] = usage
    return body


def call(name: Any = "read_file", arguments: Any = '{"path": "a"}', **extra: Any) -> Any:
    """One function tool call."""
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


sane_usage = st.one_of(
    st.none(),
    st.builds(
        lambda p, c: {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
        st.integers(0, 10**6),
        st.integers(0, 10**6),
    ),
)
sane_arguments = st.one_of(
    st.builds(lambda p: json.dumps({"path": p}), st.text(max_size=20)),
    st.builds(lambda p, n: json.dumps({"path": p, "n": n}), st.text(max_size=10), st.integers()),
    st.sampled_from(['{"path": "a"', "{'path': 'a',}", "", "null", "[]", '{"n": 1}', "{}"]),
)
sane_tool_calls = st.lists(
    st.builds(call, st.sampled_from(["read_file", "read_fil", "wipe_disk"]), sane_arguments),
    min_size=1,
    max_size=3,
)
#: bodies the guard handles today: typed fields, odd values
sane_bodies = st.builds(
    completion,
    content=st.one_of(st.none(), st.text(max_size=40)),
    tool_calls=st.one_of(st.none(), sane_tool_calls),
    finish=st.sampled_from(["stop", "tool_calls", "length", None, "content_filter"]),
    usage=sane_usage,
    rid=st.one_of(st.just("chatcmpl-123"), st.text(min_size=1, max_size=10)),
)

hostile_usage = st.one_of(
    hostile_scalar,
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": hostile_number,
            "completion_tokens": hostile_number,
            "total_tokens": hostile_number,
        },
    ),
)
hostile_call = st.one_of(
    st.builds(call, hostile_text, st.one_of(sane_arguments, hostile_text)),
    st.fixed_dictionaries(
        {"id": hostile_text, "type": st.sampled_from(["custom", "function", "x"])},
        optional={"custom": hostile_json, "function": hostile_json},
    ),
    hostile_json,
)
hostile_message = st.one_of(
    st.none(),
    hostile_json,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["assistant", "user", "tool"])},
        optional={
            "content": st.one_of(hostile_text, hostile_json),
            "tool_calls": st.one_of(st.lists(hostile_call, max_size=3), hostile_json),
            "refusal": hostile_text,
        },
    ),
)
#: every shape: what the openai SDK still accepts (it validates almost nothing) and more
hostile_bodies = st.one_of(
    sane_bodies,
    st.builds(completion, usage=hostile_usage),
    st.builds(completion, message=hostile_message),
    st.builds(completion, choices=st.one_of(hostile_json, st.lists(hostile_json, max_size=2))),
    st.builds(completion, tool_calls=st.lists(hostile_call, min_size=1, max_size=3)),
    st.builds(completion, rid=hostile_scalar),
    hostile_json,
)


def encode(body: Any) -> bytes:
    """Bytes of a body: JSON text (surrogates escaped, as servers send them) or raw bytes."""
    if isinstance(body, bytes):
        return body
    return dumps(body).encode()


# -- strategies: SSE streams ------------------------------------------------------------------


def chunk(delta: Any = ..., finish: Any = None, usage: Any = None, **extra: Any) -> dict[str, Any]:
    """One chat.completion.chunk; ``delta=...`` leaves the key out entirely."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta is not ...:
        choice["delta"] = delta
    body: dict[str, Any] = {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "small",
        "choices": [choice],
    }
    if usage is not None:
        body["usage"] = usage
    body.update(extra)
    return body


def sse(chunks: Iterable[Any], *, done: bool = True) -> bytes:
    """An SSE body: one ``data:`` event per chunk (raw strings sent as they are)."""
    parts = [f"data: {c if isinstance(c, str) else dumps(c)}\n\n" for c in chunks]
    if done:
        parts.append("data: [DONE]\n\n")
    return "".join(parts).encode("utf-8", "surrogatepass")


def tool_delta(index: Any = 0, name: Any = None, arguments: Any = None, **extra: Any) -> Any:
    """A delta carrying one tool-call fragment; ``index=...`` leaves the index out."""
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if arguments is not None:
        fn["arguments"] = arguments
    frag: dict[str, Any] = {"function": fn, **extra}
    if index is not ...:
        frag["index"] = index
    return {"tool_calls": [frag]}


sane_chunks = st.lists(
    st.one_of(
        st.builds(lambda t: chunk({"content": t}), st.text(max_size=10)),
        st.just(chunk({"role": "assistant", "content": ""})),
        st.builds(
            lambda a: chunk(tool_delta(0, None, a)),
            st.sampled_from(['{"pa', 'th": "a"}', "", "}"]),
        ),
        st.just(chunk(tool_delta(0, "read_file", "", id="call_1", type="function"))),
        st.builds(lambda f: chunk({}, finish=f), st.sampled_from(["stop", "tool_calls", "length"])),
    ),
    max_size=8,
)
hostile_chunks = st.lists(
    st.one_of(
        sane_chunks.map(lambda cs: cs[0] if cs else chunk({})),
        st.just(chunk()),  # no delta at all
        st.builds(lambda a: chunk(tool_delta(..., "read_file", a)), sane_arguments),
        st.builds(chunk, hostile_json),
        st.builds(lambda u: chunk({}, usage=u), hostile_usage.filter(lambda u: u is not None)),
        st.builds(lambda c: chunk(choices=c), hostile_json),
        st.builds(lambda a: chunk(tool_delta(0, "read_file", a)), hostile_text),
        st.just(chunk(tool_delta(0, "read_file", deep_json(1_000)))),
        hostile_json,
    ),
    max_size=8,
)


# -- strategies: configs ----------------------------------------------------------------------

SECTIONS = [
    "loop_detection",
    "tool_validation",
    "token_budget",
    "storage",
    "memory_pressure",
    "tools",
    "tiers",
    "escalation",
    "fail_mode",
]
config_leaf = st.one_of(
    hostile_scalar,
    st.just(f"redis://:{CANARY}@localhost:6379/0"),
    st.sampled_from(["inf", "-inf", "nan", ".inf", "1e999", "hard_stop", "redis", "memory"]),
)
config_dicts = st.dictionaries(
    st.sampled_from(SECTIONS),
    st.one_of(
        config_leaf,
        st.dictionaries(
            st.sampled_from(
                [
                    "per_session",
                    "per_hour",
                    "max_output_tokens",
                    "policy",
                    "backend",
                    "url",
                    "enabled",
                    "chain",
                    "mode",
                    "fast",
                    "model",
                    "api_key_env",
                    "threshold",
                    "window",
                    "retry",
                    "breaker",
                    "open_seconds",
                    "timeout",
                ]
            ),
            st.one_of(
                config_leaf,
                st.lists(config_leaf, max_size=3),
                st.dictionaries(st.sampled_from(["model", "api_key_env", "x"]), config_leaf),
            ),
            max_size=4,
        ),
    ),
    max_size=4,
)


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A YAML 'billion laughs': ``width ** levels`` leaves from a few hundred bytes."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


config_text = st.one_of(
    st.builds(dumps, config_dicts),
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.sampled_from(
        [
            f"token_budget:\n  per_session: {CANARY}\n  policy: [",
            f"tiers:\n  fast: {{model: m, api_key_env: {CANARY}}}\n",
            f"storage:\n  backend: redis\n  url: redis://:{CANARY}@h:1/0\n  x: [",
            "token_budget: {per_session: .inf, per_hour: .nan}\n",
            "a: &a [*a]\n",
            "!!python/object:os.system {}\n",
            "- 1\n- 2\n",
        ]
    ),
)


# -- strategies: traces for `agentguard scan` ------------------------------------------------

trace_message = st.one_of(
    hostile_message,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool", "system"])},
        optional={
            "content": hostile_text,
            "tool_calls": st.lists(st.one_of(st.builds(call), hostile_call), max_size=2),
            "tool_call_id": hostile_text,
            "name": hostile_text,
        },
    ),
)
trace_record = st.one_of(
    st.fixed_dictionaries(
        {"messages": st.one_of(st.lists(trace_message, max_size=4), hostile_json)},
        optional={"session": hostile_scalar, "tools": hostile_json, "usage": hostile_usage},
    ),
    trace_message,
    hostile_json,
)
trace_lines = st.lists(
    st.one_of(
        st.builds(dumps, trace_record),
        hostile_text,
        st.just("{"),
        st.just("[" * 5_000),
    ),
    max_size=6,
)


# -- strategies: requests ---------------------------------------------------------------------

hostile_request = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("fast"), hostile_scalar),
        "messages": st.one_of(
            st.just(MESSAGES),
            st.just("text"),
            st.just([None]),
            st.lists(hostile_message, max_size=3),
            hostile_json,
        ),
        "max_tokens": st.one_of(st.integers(-10, 10), hostile_number),
        "n": st.integers(-1, 4),
        "tools": st.one_of(st.just(TOOLS), hostile_json),
        "temperature": hostile_number,
    },
)


def finite(x: float) -> bool:
    """Whether ``x`` is a finite number."""
    return isinstance(x, (int, float)) and math.isfinite(x)


# -- property 2, deterministically: work counted, not timed ------------------------------------

_SRC = os.path.join("src", "agentguard") + os.sep


def work(fn: Callable[[], Any]) -> int:
    """Lines of agentguard's own code executed by ``fn()`` (its exceptions swallowed).

    A deterministic measure of work: comprehension and loop iterations count once per pass, so
    an O(n^2) step shows as n^2 lines even where no function is called per step.
    """
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame: Any, event: str, arg: Any) -> Any:
        return local if _SRC in frame.f_code.co_filename else None

    previous = sys.gettrace()
    sys.settrace(global_)
    try:
        fn()
    except Exception:
        pass
    finally:
        sys.settrace(previous)
    return count


def assert_linear(run: Callable[[int], Any], small: int, factor: int = 4) -> None:
    """``run(n)`` does at most about ``factor`` times more work at ``factor * small`` than at
    ``small`` (1.5x slack for fixed costs): linear, not quadratic (which would be factor^2)."""
    base = work(lambda: run(small))
    big = work(lambda: run(small * factor))
    assert big <= 1.5 * factor * base + 1_000, (
        f"work grows faster than linearly: {base} lines at n={small}, "
        f"{big} at n={small * factor} (x{big / max(base, 1):.1f} for x{factor} input)"
    )


# -- bulk generation: many cases per hypothesis example ------------------------------------------
#
# Hypothesis spends about a millisecond per example on its own bookkeeping (several for recursive
# strategies), more than the code under test needs for a case. The bulk tests therefore draw a
# seed from hypothesis and generate a batch of cases from it with the plain generators below:
# the seeds are hypothesis-chosen and reproducible, a failure names the seed and the input.

_SCALARS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    -5,
    1.5,
    10**20,
    -(10**20),
    2**63,
    float("inf"),
    float("-inf"),
    float("nan"),
    "",
    "a",
    "\ud800",
    "a\udc80b",
    "\x00",
    "\u202e",
    "null",
    "{",
    "read_file",
    "chatcmpl-123",
    "<path>",
    "é" * 3,
]


def rand_scalar(rng: random.Random) -> Any:
    """A hostile JSON-ish scalar."""
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(_SCALARS)
    if roll < 0.8:
        return rng.randint(-(10**6), 10**6)
    return "".join(
        chr(rng.choice([rng.randint(32, 126), rng.randint(0, 0x10FFFF)]))
        for _ in range(rng.randint(0, 8))
    )


def rand_json(rng: random.Random, depth: int = 3) -> Any:
    """A hostile JSON-ish value, at most ``depth`` containers deep."""
    roll = rng.random()
    if depth <= 0 or roll < 0.5:
        return rand_scalar(rng)
    size = rng.randint(0, 3)
    if roll < 0.75:
        return [rand_json(rng, depth - 1) for _ in range(size)]
    keys = ["path", "n", "name", "arguments", "function", "role", "content", "", "\ud800"]
    return {rng.choice(keys): rand_json(rng, depth - 1) for _ in range(size)}


def rand_arguments_text(rng: random.Random) -> str:
    """An argument text: valid, repairable, truncated, or garbage (non-ASCII written as is:
    an escaped surrogate pair cut or repaired is a class pinned by explicit tests)."""
    roll = rng.random()
    if roll < 0.3:
        return json.dumps(
            {"path": rand_scalar(rng), "n": rand_scalar(rng)}, allow_nan=True, ensure_ascii=False
        )
    if roll < 0.5:
        text = json.dumps(rand_json(rng), allow_nan=True, ensure_ascii=False)
        return text[: rng.randint(0, len(text))]  # cut anywhere
    if roll < 0.7:
        return json.dumps(rand_json(rng), allow_nan=True, ensure_ascii=False)
    if roll < 0.8:
        return rng.choice(["{'path': 'a',}", '{"path": "a"', "```json\n{}\n```", "", "null"])
    return str(rand_scalar(rng))


def rand_message(rng: random.Random, *, well_shaped: bool = True) -> Any:
    """An assistant message; ``well_shaped``: a dict whose ``tool_calls`` is a list of dicts."""
    if not well_shaped and rng.random() < 0.3:
        return rand_json(rng)
    message: dict[str, Any] = {"role": rng.choice(["assistant", "assistant", "user", "tool"])}
    if rng.random() < 0.8:
        message["content"] = rand_scalar(rng) if rng.random() < 0.7 else rand_json(rng, 2)
    if rng.random() < 0.7:
        calls = []
        for i in range(rng.randint(0, 3)):
            if not well_shaped and rng.random() < 0.2:
                calls.append(rand_json(rng, 2))
                continue
            fn: dict[str, Any] = {}
            if rng.random() < 0.9:
                fn["name"] = rng.choice(["read_file", "read_fil", "wipe", rand_scalar(rng)])
            if rng.random() < 0.9:
                fn["arguments"] = (
                    rand_arguments_text(rng) if rng.random() < 0.7 else rand_json(rng, 2)
                )
            c: dict[str, Any] = {"id": rng.choice([f"call_{i}", None, rand_scalar(rng)])}
            c["type"] = rng.choice(["function", "function", "custom", rand_scalar(rng)])
            c["function"] = fn if rng.random() < 0.95 else None
            calls.append(c)
        message["tool_calls"] = calls if well_shaped or rng.random() < 0.8 else rand_json(rng, 1)
    return message


def bulk(
    seed: int, count: int, make: Callable[[random.Random], T], check: Callable[[T], Any]
) -> None:
    """Generate ``count`` cases from ``seed`` with ``make`` and ``check`` each one; a failure
    names the seed, the case's number and the input."""
    rng = random.Random(seed)
    for i in range(count):
        case = make(rng)
        try:
            check(case)
        except Exception as exc:
            raise AssertionError(f"seed {seed}, case {i}: {reprlib.repr(case)}") from exc


#: the hypothesis strategy of bulk seeds
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def rand_text(rng: random.Random, size: int = 12) -> str:
    """Short text, sometimes odd (surrogates, controls, RTL marks)."""
    value = rand_scalar(rng)
    return (
        value
        if isinstance(value, str)
        else "".join(rng.choice("ab {}\"'\n") for _ in range(rng.randint(0, size)))
    )


def scrub(value: Any) -> Any:
    """``value`` with lone surrogates replaced by ``?`` (a class pinned by explicit tests)."""
    if isinstance(value, str):
        return "".join("?" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    return value


def rand_body(rng: random.Random) -> dict[str, Any]:
    """A chat.completion body with typed fields and odd values (the shapes the guard handles
    today, lone surrogates scrubbed: see ``scrub``)."""
    calls = None
    if rng.random() < 0.6:
        calls = [
            call(
                rng.choice(["read_file", "read_fil", "wipe", rand_text(rng)]),
                rand_arguments_text(rng),
            )
            for _ in range(rng.randint(1, 3))
        ]
    usage: Any = None
    if rng.random() < 0.8:
        p, c = rng.randint(0, 10**6), rng.randint(0, 10**6)
        usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    body = completion(
        content=rng.choice([None, rand_text(rng), '```json\n{"name": "read_file"}\n```']),
        tool_calls=calls,
        finish=rng.choice(["stop", "tool_calls", "length", None]),
        usage=usage,
        rid=rng.choice(["chatcmpl-123", rand_text(rng) or "x"]),
    )
    return scrub(body)  # type: ignore[no-any-return]


def rand_stream(rng: random.Random) -> list[dict[str, Any]]:
    """Well-formed chunks in any order: content, tool-call fragments, finishes, usage (lone
    surrogates scrubbed: see ``scrub``)."""
    chunks: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 8)):
        roll = rng.random()
        if roll < 0.4:
            chunks.append(chunk({"content": rand_text(rng)}))
        elif roll < 0.8:
            index = rng.randint(0, 2)
            text = rand_arguments_text(rng)
            cut = rng.randint(0, len(text))
            name = rng.choice([None, "read_file", "wipe"])
            chunks.append(chunk(tool_delta(index, name, text[:cut], id=f"call_{index}")))
        elif roll < 0.9:
            chunks.append(chunk({}, finish=rng.choice(["stop", "tool_calls", "length"])))
        else:
            p, c = rng.randint(0, 1000), rng.randint(0, 1000)
            usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
            chunks.append(chunk({}, usage=usage))
    return scrub(chunks)  # type: ignore[no-any-return]


class Scratch:
    """A temporary directory made on first use (``scratch / "name"``), removed by ``cleanup``.

    Module-level, so hypothesis tests can use it (function-scoped fixtures reset per test, not
    per example); each module removes its own with a module-scoped autouse fixture.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._path: Path | None = None

    def __truediv__(self, name: str) -> Path:
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix=self.prefix))
        return self._path / name

    def cleanup(self) -> None:
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


#: A guard with a small hard_stop session budget and an output cap, for abandoned-stream tests.
STREAM_CONFIG = ag.GuardConfig.from_dict(
    {
        "tiers": {"fast": {"model": "small"}},
        "escalation": {"chain": ["fast"]},
        "memory_pressure": {"enabled": False},
        "token_budget": {
            "per_session": 1_000,
            "per_hour": None,
            "policy": "hard_stop",
            "max_output_tokens": 300,
        },
    },
    env={},
)
