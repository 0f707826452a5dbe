"""Guarded vs raw openai client, side by side, over the same in-process HTTP mock."""

from __future__ import annotations

import itertools
import statistics
import time
from importlib import import_module
from typing import Any

import agentguard as ag
from _harness import Table, side_by_side, us, verdict
from agentguard.testing import Reply, ScriptedModel
from agentguard.types import Usage


def _tools(n: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["path"],
                },
            },
        }
        for i in range(n)
    ]


def _history(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for i in range((n - 1) // 2):
        messages.append({"role": "user", "content": f"step {i}: read file number {i}"})
        messages.append({"role": "assistant", "content": f"Read file {i}; it has {i * 7} lines."})
    return messages[:n]


def run(quick: bool) -> list[Table]:
    openai = import_module("openai")
    http = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
    repeat = 3 if quick else 7
    min_time = 0.05 if quick else 0.3
    tools = _tools(10)
    counter = itertools.count()

    def reply(request: Any) -> Reply:  # a new file each call: a healthy agent, not a loop
        return Reply.call("tool_3", {"path": f"/srv/{next(counter)}.txt", "limit": 5})

    config = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})

    def client(model: ScriptedModel) -> Any:
        return openai.OpenAI(
            api_key="sk-bench",
            base_url="http://bench.invalid/v1",
            max_retries=0,
            http_client=http.Client(transport=model.mock_transport(http)),
        )

    rows = []
    for size in [30, 300] if quick else [30, 300, 1000, 3000]:
        model = ScriptedModel([reply], cycle=True)
        raw = client(model)
        guarded = ag.wrap(raw, config)
        messages = _history(size)

        def call_raw(raw: Any = raw, messages: list[Any] = messages) -> None:
            raw.chat.completions.create(model="m", messages=messages, tools=tools)

        def call_guarded(guarded: Any = guarded, messages: list[Any] = messages) -> None:
            guarded.chat.completions.create(model="m", messages=messages, tools=tools)

        call_guarded()  # the session's history is seen once; later calls are incremental
        base, mine = map(us, side_by_side(call_raw, call_guarded, repeat=repeat, min_time=min_time))
        rows.append([f"{size} messages", base, mine, f"{mine / base:.3f}", mine - base])
    ratios = {row[0]: float(row[3]) for row in rows[:2]}  # 30 and 300 messages
    clean = Table(
        "Guarded vs raw openai client: clean call, 10 tools",
        ["history", "raw µs/call", "guarded µs/call", "ratio", "overhead µs"],
        rows,
        description=(
            "Real openai client, same in-process HTTP mock (ScriptedModel), same run, CPU time "
            "in alternating rounds; the guarded client runs the whole pipeline (loop check, "
            "validation, ledger, report)."
        ),
        notes=[
            "Goal: overhead ≤ 2 % of the raw client's own cost at 30 and 300 messages: "
            + "; ".join(f"{k} {verdict(r, 1.02)} ({r:.3f}×)" for k, r in ratios.items())
            + ".",
            "At long histories the raw client's own cost (serialising the history) dwarfs the "
            "guard's; the next table isolates the guard's own cost.",
        ],
    )

    def fixed_usage(request: Any) -> Reply:  # usage given: the transport's cost is flat too
        return Reply.call(
            "tool_3", {"path": f"/srv/{next(counter)}.txt", "limit": 5}, usage=Usage(900, 20)
        )

    pipeline = _pipeline_table(config, tools, fixed_usage, repeat, min_time)
    return [clean, pipeline, _ttft_table(openai, client, config, quick)]


def _ttft_table(openai: Any, client: Any, config: Any, quick: bool) -> Table:
    n = itertools.count()

    def answer(request: Any) -> Reply:  # varied prose: degenerate text would be cut off
        i = next(n)
        return Reply.text(
            " ".join(f"Step {i}.{k}: checked module {k * 7 + i} of the build." for k in range(12))
        )

    model = ScriptedModel([answer], cycle=True, chunk_size=8)
    raw = client(model)
    guarded = ag.wrap(raw, config)
    history = _history(30)

    def ttft(client: Any, session: str) -> float:
        start = time.process_time()
        stream = client.chat.completions.create(
            model="m",
            messages=history,
            stream=True,
            extra_headers={"x-agentguard-session": session},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        spent = time.process_time() - start
        for _chunk in stream:
            pass
        return spent

    rows = []
    runs = 40 if quick else 300
    for label, fresh in (("first call of a session", True), ("later call in a session", False)):
        times: tuple[list[float], list[float]] = ([], [])
        for i in range(runs):  # alternating, so machine load shifts both alike
            session = f"ttft-{i}" if fresh else "ttft-steady"
            times[0].append(ttft(raw, session))
            times[1].append(ttft(guarded, session))
        raw_t, guarded_t = (us(statistics.median(t)) for t in times)
        rows.append([label, raw_t, guarded_t, f"{guarded_t / raw_t:.3f}"])
    steady = float(rows[1][3])
    first = float(rows[0][3])
    return Table(
        "Streaming: time to first content token (30-message history)",
        ["call", "raw µs", "guarded µs", "ratio"],
        rows,
        description=(
            "CPU time from create() to the first content delta, median of alternating runs. The "
            "first call of a session judges its whole transcript once; later calls only what "
            "is new."
        ),
        notes=[
            f"Goal ≤ 1.05×: later calls {verdict(steady, 1.05)} ({steady:.3f}×); "
            f"first call of a session {verdict(first, 1.05)} ({first:.3f}×)."
        ],
    )


def _pipeline_table(config: Any, tools: Any, reply: Any, repeat: int, min_time: float) -> Table:
    pipeline_rows = []
    own: dict[int, float] = {}
    for size in [30, 300, 1000, 3000]:
        model = ScriptedModel([reply], cycle=True)
        guard = ag.Guard(model, config)
        request = ag.transport.ModelRequest(
            model="m", messages=_history(size), params={"tools": tools}
        )
        guard.complete(request)  # the history is seen once; later calls are incremental
        bare, full = map(
            us,
            side_by_side(
                lambda model=model, request=request: model.send(request),
                lambda guard=guard, request=request: guard.complete(request),
                repeat=repeat,
                min_time=min_time,
            ),
        )
        own[size] = full - bare
        pipeline_rows.append([f"{size} messages", bare, full, full - bare])
    flat = own[3000] / own[30]
    at_1000 = own[1000] / own[30]

    def draw(ax: Any) -> None:
        sizes = sorted(own)
        ax.plot(sizes, [own[n] for n in sizes], marker="o", label="guard's own cost")
        ax.set_xscale("log")
        ax.set_ylim(0, max(own.values()) * 1.5)
        ax.set_xlabel("messages in the history")
        ax.set_ylabel("µs per call")
        ax.set_title("The pipeline's own cost stays flat as the history grows")
        ax.legend(fontsize=8)

    return Table(
        "The pipeline's own cost vs history length (Guard over the scripted transport, no HTTP)",
        ["history", "transport alone µs", "guarded µs", "guard overhead µs"],
        pipeline_rows,
        description=(
            "The scripted transport reports usage itself here, so its own cost does not grow "
            "with the history either and the difference is the guard's alone."
        ),
        figure=("overhead_vs_history.png", draw),
        notes=[
            f"Overhead at 1,000 messages vs 30: {at_1000:.2f}× (goal ≤ 1.2×: "
            f"{verdict(at_1000, 1.2)}); at 3,000: {flat:.2f}×. A session's messages are judged "
            "and estimated once: a call costs O(new messages), whatever the history's length."
        ],
    )
