"""Fallback overhead against a peer: the LiteLLM Router's fallbacks and agentguard's escalation.

Method. One upstream for everyone: a :class:`~agentguard.testing.ScriptedModel` served over real
loopback HTTP (:meth:`ScriptedModel.serve`), with a ``primary`` model that answers every call
with HTTP 503 and a ``backup`` (and a ``clean``) model that answer. Three stacks call it:

- the floor: the raw openai client (no retries), and for a fallback a hand-written
  ``try``/``except`` that calls ``backup`` after ``primary`` fails — the least any stack can do;
- agentguard: :func:`agentguard.wrap` around the same openai client, two tiers (``primary`` →
  ``backup``), no retries before escalating;
- the peer: ``litellm.Router`` with one deployment per model on the same upstream,
  ``num_retries=0`` and ``fallbacks=[{"primary": ["backup"]}]``.

Each stack is timed against the floor of the same case with :func:`_harness.side_by_side` (CPU
time of this process in alternating rounds; the loopback server's thread is in this process, so
every upstream request costs every stack the same), and the upstream requests per call are
counted. Wall time per call is shown too, for information only (it includes the server and any
waits). Retries are left out on purpose: both stacks wait between retries (the Router's
exponential backoff from 0.5 s, agentguard's :class:`RetryPolicy`), and a wait policy is not
overhead.

litellm is not in the ``bench`` session: ``nox -s bench_peers`` installs it. Without it the
table says so.
"""

from __future__ import annotations

import itertools
import logging
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import agentguard as ag
from _harness import Table, side_by_side, us
from _peers import litellm, missing
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel

_MESSAGES = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Summarise the build log in one line."},
]
_WORDS = [f"{a}{b}" for a in ("build", "test", "log", "step", "job") for b in "abcdefghijklmnop"]


def _wall_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class _Counted:
    """A call and the upstream requests it made, over the scripted model's request log."""

    def __init__(self, model: ScriptedModel, fn: Callable[[], object]) -> None:
        self.model, self.fn = model, fn

    def requests_per_call(self, calls: int = 5) -> float:
        before = len(self.model.requests)
        for _ in range(calls):
            self.fn()
        return (len(self.model.requests) - before) / calls


def run(quick: bool) -> list[Table]:
    """The fallback-overhead table (a one-row note when litellm is not installed)."""
    lite = litellm()
    columns = [
        "case",
        "stack",
        "upstream requests / call",
        "CPU µs / call",
        "× floor (same run)",
        "overhead over floor µs",
        "wall ms / call",
    ]
    title = "Fallback overhead vs the LiteLLM Router (same loopback upstream)"
    if lite is None:
        return [missing(title, "litellm", columns)]
    openai = __import__("openai")
    quiet = logging.getLogger("agentguard")  # litellm's loggers are quieted too (_peers)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return [_table(lite, openai, title, columns, quick)]
    finally:
        quiet.setLevel(level)


def _table(lite: Any, openai: Any, title: str, columns: list[str], quick: bool) -> Table:
    repeat = 3 if quick else 7
    min_time = 0.05 if quick else 0.3
    runs = 5 if quick else 25
    replies = itertools.count()

    def answer(request: Any) -> Reply:  # a different answer every call: repeats are a loop
        words = random.Random(next(replies)).sample(_WORDS, 12)
        return Reply.text(" ".join(words).capitalize() + ".")

    model = ScriptedModel(
        {"primary": [Fault.server_error(503)], "backup": [answer], "clean": [answer]},
        cycle=True,
    )
    rows: list[list[object]] = []
    with model.serve() as url:
        raw = openai.OpenAI(api_key="sk-bench", base_url=url, max_retries=0)

        def deployment(name: str) -> dict[str, Any]:
            params = {"model": f"openai/{name}", "api_base": url, "api_key": "sk-bench"}
            return {"model_name": name, "litellm_params": params}

        router = lite.Router(
            model_list=[deployment(n) for n in ("primary", "backup", "clean")],
            num_retries=0,
            fallbacks=[{"primary": ["backup"]}],
        )
        clock = FakeClock()
        config = ag.GuardConfig.from_dict(
            {
                "tiers": {n: {"model": n} for n in ("primary", "backup", "clean")},
                "escalation": {"chain": ["primary", "backup"], "max_retries_before_escalate": 0},
                "memory_pressure": {"enabled": False},
            },
            env={},
        )
        guarded = ag.wrap(
            openai.OpenAI(api_key="sk-bench", base_url=url, max_retries=0),
            config,
            clock=clock,
            sleep=clock.sleep,
        )
        steady = ag.wrap(openai.OpenAI(api_key="sk-bench", base_url=url, max_retries=0), config)

        def raw_clean() -> None:
            raw.chat.completions.create(model="clean", messages=_MESSAGES)

        def raw_fallback() -> None:
            try:
                raw.chat.completions.create(model="primary", messages=_MESSAGES)
            except openai.APIStatusError:
                raw.chat.completions.create(model="backup", messages=_MESSAGES)

        def guarded_clean() -> None:
            guarded.chat.completions.create(model="clean", messages=_MESSAGES)

        def guarded_fallback() -> None:
            clock.advance(3600)  # the primary's breaker half-opens: every call tries it again
            guarded.chat.completions.create(model="primary", messages=_MESSAGES)

        def guarded_steady() -> None:
            steady.chat.completions.create(model="primary", messages=_MESSAGES)

        def router_clean() -> None:
            router.completion(model="clean", messages=_MESSAGES)

        def router_fallback() -> None:
            router.completion(model="primary", messages=_MESSAGES)

        cases = [
            ("clean call", raw_clean, [("agentguard", guarded_clean), ("Router", router_clean)]),
            (
                "primary 503 → backup, every call tries the primary",
                raw_fallback,
                [("agentguard", guarded_fallback), ("Router", router_fallback)],
            ),
            (
                "primary dead, steady state (agentguard's tier breaker open)",
                raw_fallback,
                [("agentguard", guarded_steady)],
            ),
        ]
        for case, floor, stacks in cases:
            floor_requests = _Counted(model, floor).requests_per_call()
            floor_us: list[float] = []
            for stack, fn in stacks:
                base, mine = map(us, side_by_side(floor, fn, repeat=repeat, min_time=min_time))
                requests = _Counted(model, fn).requests_per_call()  # after the timed calls
                floor_us.append(base)
                rows.append(
                    [
                        case,
                        stack,
                        requests,
                        mine,
                        f"{mine / base:.2f}",
                        mine - base,
                        _wall_ms(fn, runs),
                    ]
                )
            rows.append(
                [
                    case,
                    "floor: raw openai client" + (" + try/except" if floor is raw_fallback else ""),
                    floor_requests,
                    statistics.median(floor_us),
                    "1.00",
                    0.0,
                    _wall_ms(floor, runs),
                ]
            )
    return Table(
        title,
        columns,
        rows,
        description=(
            "One upstream (ScriptedModel over loopback HTTP): `primary` always answers 503, "
            "`backup` and `clean` answer. CPU time in alternating rounds against the floor "
            "of the same case (see the module docstring of "
            "`benchmarks/bench_peers_router.py`); wall time is informational."
        ),
        notes=[
            "Comparable: the calls, the upstream and the number of upstream requests per "
            "call (shown). Both stacks call the upstream through the openai SDK; both "
            "libraries' loggers are set to ERROR, so neither pays for logging. Not "
            "comparable: what else each does per call — agentguard runs its whole pipeline "
            "(loop checks, validation, token ledger, report); the Router translates the "
            "request for the provider, picks a deployment, and runs its callbacks and cost "
            "tracking.",
            "The steady-state row has no Router counterpart: with one deployment per "
            "model the Router tries the dead primary on every call (its cooldown applies to "
            "groups of several deployments), while agentguard's tier breaker opens after "
            "a few failures and later calls go straight to the backup (one request).",
            "Retries are not compared: both stacks sleep between retries (here the Router's "
            "`num_retries=2` on a 503 took seconds of wall time), and a wait policy is not "
            "overhead.",
        ],
    )
