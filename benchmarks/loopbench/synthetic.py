"""Minimal synthetic episodes for the classes no real trace in ``SOURCES.md`` covers.

Each generator writes a short agent run in OpenAI chat format and computes, from the rubric
(``RUBRIC.md``), the step by which a loop must be flagged: steps count assistant messages from 1.
Variation (tools, arguments, wording, lengths, healthy prefixes) comes from a seeded generator so
the file is reproducible; no case is tuned to any detector.
"""

from __future__ import annotations

import json
import random
from typing import Any

Msg = dict[str, Any]

SOURCE = {"kind": "synthetic", "repo": "agentguard", "path": "benchmarks/loopbench/synthetic.py"}
LICENCE = "Apache-2.0 (written for this benchmark)"


class Run:
    """Builds one run's messages; ``step`` is the number of assistant messages so far."""

    def __init__(self, task: str) -> None:
        self.messages: list[Msg] = [
            {"role": "system", "content": "You are a helpful agent. Use the tools when needed."},
            {"role": "user", "content": task},
        ]
        self.step = 0
        self.names: set[str] = set()
        self._n = 0

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def say(self, text: str, reasoning: str | None = None, name: str | None = None) -> int:
        self.step += 1
        msg: Msg = {"role": "assistant", "content": text}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        if name:
            msg["name"] = name
        self.messages.append(msg)
        return self.step

    def calls(
        self,
        calls: list[tuple[str, dict[str, Any], str]],
        text: str = "",
        reasoning: str | None = None,
        name: str | None = None,
    ) -> int:
        """One assistant message with these (tool, arguments, result) calls, then the results."""
        self.step += 1
        tool_calls = []
        for tool, args, _ in calls:
            self._n += 1
            self.names.add(tool)
            tool_calls.append(
                {
                    "id": f"call_{self._n}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(args)},
                }
            )
        msg: Msg = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        if name:
            msg["name"] = name
        self.messages.append(msg)
        for call, (tool, _, result) in zip(tool_calls, calls, strict=True):
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "name": tool, "content": result}
            )
        return self.step

    def call(self, tool: str, args: dict[str, Any], result: str, text: str = "", **kw: Any) -> int:
        return self.calls([(tool, args, result)], text, **kw)

    def tools(self, omit: set[str] = frozenset()) -> list[Msg]:  # type: ignore[assignment]
        return [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": f"The {n} tool.",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
            for n in sorted(self.names - omit)
        ]


def _ep(  # noqa: PLR0917  (one positional per field of the record)
    id_: str,
    cls: str,
    label: str,
    flag_by: int | None,
    reason: str,
    run: Run,
    tools: list[Msg] | None,
) -> dict[str, Any]:
    return {
        "id": id_,
        "class": cls,
        "label": label,
        "flag_by": flag_by,
        "source": dict(SOURCE, index=id_),
        "licence": LICENCE,
        "reason": reason,
        "tools": tools,
        "notes": {},
        "messages": run.messages,
    }


_FILES = [
    "src/app.py",
    "src/db.py",
    "src/api/routes.py",
    "tests/test_app.py",
    "README.md",
    "src/util/dates.py",
    "config/settings.toml",
    "src/models.py",
]


def _prefix(rng: random.Random, run: Run, k: int | None = None) -> None:
    """0-3 healthy, distinct calls before the episode's pattern."""
    for i in range(rng.randint(0, 3) if k is None else k):
        path = _FILES[(i + rng.randint(0, 7)) % len(_FILES)] if i == 0 else _FILES[i]
        run.call(
            "read_file",
            {"path": f"{path}#{i}"},
            f"# {path}\n" + f"line {i}\n" * 5,
            text=f"Let me read {path}.",
        )


_CITIES = [
    ("Oslo", "Rome"),
    ("Lisbon", "Vienna"),
    ("Paris", "Athens"),
    ("Berlin", "Madrid"),
    ("Dublin", "Prague"),
    ("Warsaw", "Milan"),
    ("Zurich", "Porto"),
    ("Helsinki", "Nice"),
]
_ERRORS = [
    "Error: permission denied: /etc/app/secret.yml",
    "Error: 404 Not Found: GET https://api.example.com/v2/orders/991",
    "Error: ValidationError: field 'date' must be ISO-8601",
    "Error: connection refused (db:5432)",
    "Error: command not found: pytets",
    "Error: KeyError: 'customer_id'",
]
_ITEMS = [
    '{"id": 8812, "status": "failed", "failed_test": "test_login"}',
    "No results found.",
    "[]",
    "3 hits: docs/ci.md (line 40), docs/build.md (line 12), CHANGELOG.md (line 7)",
    '{"balance": 120.5, "currency": "EUR"}',
]


def identical_call(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Find out why build 8812 failed.")
    _prefix(rng, run)
    tool, args = rng.choice(
        [
            ("get_build", {"id": 8812}),
            ("search", {"query": "flaky login"}),
            ("get_balance", {"account": "ACC-7"}),
            ("list_dir", {"path": "src"}),
        ]
    )
    result = rng.choice(_ITEMS)
    steps = [
        run.call(tool, args, result, text=rng.choice(["", "Checking again.", "Let me look."]))
        for _ in range(rng.randint(4, 9))
    ]
    return _ep(
        f"syn-identical-{i:02d}",
        "identical_call",
        "loop",
        steps[2],
        f"the same {tool} call with the same result {len(steps)} times",
        run,
        run.tools(),
    )


def rewording(rng: random.Random, i: int) -> dict[str, Any]:
    a, b = _CITIES[i % len(_CITIES)]
    queries = [
        f"cheap flights {a} to {b}",
        f"{a} {b} cheap flights",
        f"low-cost flights from {a} to {b}",
        f"budget airline {a} {b}",
        f"cheapest flight {a}-{b}",
        f"flights {a} {b} low price",
        f"inexpensive {a} to {b} flights",
        f"{a} to {b} discount fares",
    ]
    rng.shuffle(queries)
    run = Run(f"Find me the cheapest flight from {a} to {b} next Friday.")
    _prefix(rng, run, 0)
    result = rng.choice(
        [
            "[]",
            "No results found.",
            '{"results": [], "total": 0}',
            f"Top result: 'Flights {a}-{b}' (skyfares.example) - prices from EUR 89",
        ]
    )
    steps = [run.call("web_search", {"query": q}, result) for q in queries[: rng.randint(4, 8)]]
    return _ep(
        f"syn-reworded-{i:02d}",
        "same_result_reworded_query",
        "loop",
        steps[2],
        "rewordings of one search query, the same result every time",
        run,
        run.tools(),
    )


def noise_argument(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Get the order's shipping status.")
    _prefix(rng, run)
    noise = rng.choice(["timeout", "nonce", "page_size", "timestamp", "request_id"])
    result = rng.choice(
        [
            '{"order": "A-1001", "status": "in transit", "eta": "2026-05-03"}',
            "Error: upstream timeout",
            '{"items": [], "next": null}',
        ]
    )
    steps = []
    for k in range(rng.randint(4, 8)):
        value: Any = {
            "timeout": 10 + 5 * k,
            "nonce": f"{rng.getrandbits(32):08x}",
            "page_size": [10, 20, 50, 100, 25, 30, 40, 60][k],
            "timestamp": f"2026-05-01T10:{k:02d}:{rng.randint(0, 59):02d}Z",
            "request_id": f"req-{9000 + k}",
        }[noise]
        steps.append(run.call("get_order", {"order_id": "A-1001", noise: value}, result))
    return _ep(
        f"syn-noise-{noise}-{i:02d}",
        "same_result_noise_argument",
        "loop",
        steps[2],
        f"only the {noise} argument changes; the result is identical",
        run,
        run.tools(),
    )


def polling_stalled(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Wait for deployment d-42 to finish, then report.")
    _prefix(rng, run)
    stamped = rng.random() < 0.5
    steps = []
    for k in range(rng.randint(6, 10)):
        body = {"deployment": "d-42", "status": "running", "progress": 40}
        if stamped:  # a changing timestamp is not progress
            body["checked_at"] = f"2026-05-01T10:{k:02d}:00Z"
        steps.append(run.call("get_deployment", {"id": "d-42"}, json.dumps(body)))
    return _ep(
        f"syn-poll-stalled-{i:02d}",
        "polling_no_progress",
        "loop",
        steps[4],
        "a poll whose status and progress never change"
        + (" (only a timestamp does)" if stamped else ""),
        run,
        run.tools(),
    )


def cycle(rng: random.Random, i: int, period: int) -> dict[str, Any]:
    run = Run("Figure out which config value breaks the login test.")
    _prefix(rng, run)
    pool = [
        ("read_file", {"path": "config/settings.toml"}, "[auth]\nttl = 30\n"),
        ("run_tests", {"target": "tests/test_login.py"}, "1 failed: test_login (expired token)"),
        ("grep", {"pattern": "ttl", "path": "src"}, "src/auth.py:12: TTL = cfg.ttl"),
        ("read_file", {"path": "src/auth.py"}, "TTL = cfg.ttl\ndef login(): ..."),
        ("git_log", {"path": "config/settings.toml"}, "a1b2c3 lower ttl to 30"),
        ("list_dir", {"path": "config"}, "settings.toml\nlogging.toml"),
    ]
    rng.shuffle(pool)
    pattern = pool[:period]
    passes = rng.randint(3, 4)
    steps = [run.call(t, a, r) for _ in range(passes) for t, a, r in pattern]
    return _ep(
        f"syn-cycle{period}-{i:02d}",
        f"cycle_{period}",
        "loop",
        steps[3 * period - 1],
        f"a cycle of {period} calls repeated {passes} times with the same results",
        run,
        run.tools(),
    )


def unknown_tool(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("What's the weather in Bergen tomorrow?")
    _prefix(rng, run)
    bad = rng.choice(["search_web", "get_weather_forecast", "browser.open", "python_exec"])
    result = rng.choice(
        [
            f"Error: unknown tool '{bad}'",
            f"Tool {bad} not found",
            f"Error: function '{bad}' is not available",
        ]
    )
    steps = [
        run.call(bad, {"query": "Bergen weather tomorrow"}, result)
        for _ in range(rng.randint(3, 6))
    ]
    run.names.add("get_weather")
    return _ep(
        f"syn-unknown-tool-{i:02d}",
        "unknown_tool_repeated",
        "loop",
        steps[2],
        f"{bad} is not among the declared tools and is called again and again",
        run,
        run.tools(omit={bad}),
    )


def parallel(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Look up the customer's last order.")
    _prefix(rng, run)
    k = rng.randint(3, 6)
    call = ("get_order", {"customer_id": "C-17", "latest": True}, '{"order": "A-77", "total": 41}')
    step = run.calls([call] * k)
    if rng.random() < 0.5:
        run.say("The last order is A-77 (total 41).")
    return _ep(
        f"syn-parallel-{i:02d}",
        "parallel_duplicates",
        "loop",
        step,
        f"{k} identical calls in one assistant message",
        run,
        run.tools(),
    )


def repeated_error(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Fix the failing job.")
    _prefix(rng, run)
    err = _ERRORS[i % len(_ERRORS)]
    tool, args = rng.choice(
        [
            ("read_file", {"path": "/etc/app/secret.yml"}),
            ("http_get", {"url": "https://api.example.com/v2/orders/991"}),
            ("run", {"cmd": "pytets -q"}),
            ("query_db", {"sql": "select 1"}),
        ]
    )
    steps = [
        run.call(tool, args, err, text=rng.choice(["", "Trying again."]))
        for _ in range(rng.randint(4, 8))
    ]
    return _ep(
        f"syn-error-{i:02d}",
        "repeated_error",
        "loop",
        steps[2],
        "the same failing call and the same error again and again",
        run,
        run.tools(),
    )


_PHRASES = [
    "I will now check why the build failed.",
    "Let me verify the configuration first.",
    "I'm going to look at the logs to understand the problem.",
    "Sorry, I cannot access that information. Let me try again.",
]


def text_repeat(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Summarise why the build failed.")
    phrase = _PHRASES[i % len(_PHRASES)]
    steps = []
    for _ in range(rng.randint(4, 7)):
        steps.append(run.say(phrase))
        run.user(rng.choice(["continue", "go on", "ok", "and?"]))
    return _ep(
        f"syn-text-repeat-{i:02d}",
        "text_repeat",
        "loop",
        steps[2],
        "the same assistant message turn after turn",
        run,
        None,
    )


def degenerate(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Explain the failing test.")
    _prefix(rng, run)
    unit = rng.choice(
        [
            "Let me check the file again. ",
            "the the the ",
            "I think the issue is ",
            "Wait, ",
            "and then we retry, ",
        ]
    )
    step = run.say("Looking at it. " + unit * rng.randint(40, 120))
    return _ep(
        f"syn-degenerate-{i:02d}",
        "degenerate_text",
        "loop",
        step,
        "one answer that repeats a phrase dozens of times",
        run,
        run.tools() or None,
    )


def reasoning(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Which of the two configs is valid?")
    _prefix(rng, run)
    thought = rng.choice(
        [
            "Wait, let me reconsider the first config. ",
            "Hmm, but maybe the second one is right. Let me re-check. ",
            "Actually, I need to recount the braces. ",
        ]
    )
    if i % 2 == 0:  # one answer whose reasoning spins
        step = run.say("The first config is valid.", reasoning=thought * rng.randint(40, 100))
        why = "one answer whose reasoning_content repeats a thought dozens of times"
    else:  # the same reasoning, turn after turn
        steps = []
        for k in range(rng.randint(4, 6)):
            steps.append(run.say(f"Still checking ({k + 1}).", reasoning=thought * 3))
            run.user("continue")
        step = steps[2]
        why = "the same reasoning_content turn after turn"
    return _ep(
        f"syn-reasoning-{i:02d}", "reasoning_loop", "loop", step, why, run, run.tools() or None
    )


def subagents(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Research the refund policy of Acme Air.")
    result = rng.choice(
        ["No results found.", "acme-air.example/refunds: 'Refunds within 24 hours of booking.'"]
    )
    steps = []
    for k in range(rng.randint(3, 5)):
        run.call(
            "delegate",
            {"agent": "researcher", "task": f"find Acme Air refund policy ({k})"},
            "started researcher",
            name="orchestrator",
        )
        steps.append(
            run.call(
                "web_search",
                {"query": "Acme Air refund policy"},
                result,
                name=f"researcher-{k + 1}",
            )
        )
        run.say(f"Researcher {k + 1}: nothing new.", name=f"researcher-{k + 1}")
    return _ep(
        f"syn-subagents-{i:02d}",
        "subagent_loop",
        "loop",
        steps[2],
        "each sub-agent runs the same search with the same result",
        run,
        run.tools(),
    )


# -- must-not-flag -------------------------------------------------------------------------------


def change_then_look(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Make the tests in tests/test_dates.py pass.")
    path = rng.choice(["src/util/dates.py", "src/app.py", "src/models.py"])
    lines = ["def parse(s):", "    return s"]
    for k in range(rng.randint(4, 7)):
        run.call("read_file", {"path": path}, "\n".join(lines), text="Let me look at the file.")
        lines.append(f"    # fix {k}: handle case {k}")
        run.call(
            "apply_patch", {"path": path, "patch": f"+    # fix {k}: handle case {k}"}, "patched"
        )
        if rng.random() < 0.5:
            run.call("run_tests", {"target": "tests/test_dates.py"}, f"{6 - k} failed")
    run.say("All tests pass now.")
    return _ep(
        f"syn-h-change-look-{i:02d}",
        "healthy_change_then_look",
        "healthy",
        None,
        "open, patch, open again: the content differs every time",
        run,
        run.tools(),
    )


def polling_progress(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Wait for the export to finish.")
    n = rng.randint(8, 15)
    for k in range(n):
        run.call(
            "get_export",
            {"id": "e-9"},
            json.dumps({"status": "running", "progress": round(100 * k / n)}),
        )
    run.call("get_export", {"id": "e-9"}, json.dumps({"status": "done", "url": "s3://x/e-9"}))
    run.say("The export is done: s3://x/e-9")
    return _ep(
        f"syn-h-poll-progress-{i:02d}",
        "healthy_polling_progress",
        "healthy",
        None,
        "a poll whose progress grows every time",
        run,
        run.tools(),
    )


def structured_answer(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Give me some itinerary options from Oslo to Rome next week.")
    run.call("search_flights", {"from": "OSL", "to": "FCO"}, "8 options")
    options = []
    for k in range(rng.randint(4, 8)):
        day = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"][k % 6]
        options.append(
            f"### Option {k + 1}\n- **Departure:** {day} {6 + k}:15 from Oslo (OSL)\n"
            f"- **Arrival:** {day} {9 + k}:40 in Rome (FCO)\n- **Airline:** "
            f"{['SAS', 'Norwegian', 'ITA', 'Lufthansa'][k % 4]}\n- **Stops:** {k % 2}\n"
            f"- **Price:** EUR {89 + 17 * k}\n- **Baggage:** 1 cabin bag included\n"
        )
    run.say("Here are your options:\n\n" + "\n".join(options))
    return _ep(
        f"syn-h-structured-{i:02d}",
        "healthy_long_structured_answer",
        "healthy",
        None,
        "several itineraries listed in the same layout",
        run,
        run.tools(),
    )


def business_errors(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Book seat 12A on flight HAT052, or the nearest window seat.")
    seats = ["12A", "12F", "14A", "15F", "16A"]
    for seat in seats[: rng.randint(2, 4)]:
        run.call(
            "reserve_seat",
            {"flight": "HAT052", "seat": seat},
            f"Error: seat {seat} is already taken",
        )
    run.call("reserve_seat", {"flight": "HAT052", "seat": "21A"}, '{"ok": true, "seat": "21A"}')
    run.say("Booked window seat 21A.")
    return _ep(
        f"syn-h-business-errors-{i:02d}",
        "healthy_business_errors",
        "healthy",
        None,
        "a real tool returning business errors for different seats, then success",
        run,
        None,
    )


def normal(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Add a --verbose flag to the CLI.")
    _prefix(rng, run, rng.randint(3, 6))
    run.call("apply_patch", {"path": "src/cli.py", "patch": "+ --verbose"}, "patched")
    run.call("run_tests", {"target": "tests"}, "42 passed")
    run.say("Added the flag; all 42 tests pass.")
    return _ep(
        f"syn-h-normal-{i:02d}",
        "healthy_normal_run",
        "healthy",
        None,
        "distinct calls that each make progress",
        run,
        run.tools(),
    )


def retry_success(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("Fetch today's exchange rate.")
    for _ in range(2):
        run.call("get_rate", {"pair": "EURNOK"}, "Error: 503 Service Unavailable, retry later")
    run.call("get_rate", {"pair": "EURNOK"}, '{"pair": "EURNOK", "rate": 11.62}')
    run.say("EUR/NOK is 11.62 today.")
    return _ep(
        f"syn-h-retry-{i:02d}",
        "healthy_retry_then_success",
        "healthy",
        None,
        "a transient error retried twice, then success",
        run,
        run.tools(),
    )


def pagination(rng: random.Random, i: int) -> dict[str, Any]:
    run = Run("List every open ticket.")
    n = rng.randint(4, 9)
    for page in range(1, n + 1):
        run.call(
            "list_tickets",
            {"status": "open", "page": page},
            json.dumps({"tickets": [f"T-{page * 10 + j}" for j in range(10)]}),
        )
    run.say(f"There are {n * 10} open tickets.")
    return _ep(
        f"syn-h-pagination-{i:02d}",
        "healthy_pagination",
        "healthy",
        None,
        "the same tool, page after page, each with new results",
        run,
        run.tools(),
    )


def refinement(rng: random.Random, i: int) -> dict[str, Any]:
    b = _CITIES[i % len(_CITIES)][1]
    run = Run(f"Find a hotel near the centre of {b}.")
    for k, q in enumerate([f"hotels {b}", f"hotels {b} centre", f"hotels {b} centre under 150"]):
        run.call(
            "web_search",
            {"query": q},
            f"{5 - k} results: " + ", ".join(f"Hotel {b} {chr(65 + k + j)}" for j in range(5 - k)),
        )
    run.say(f"Hotel {b} C is central and under EUR 150.")
    return _ep(
        f"syn-h-refine-{i:02d}",
        "healthy_search_refinement",
        "healthy",
        None,
        "reworded searches whose results change: the agent is narrowing down",
        run,
        run.tools(),
    )


def synthetic(rng: random.Random) -> list[dict[str, Any]]:
    """Every synthetic episode, positives first."""
    out: list[dict[str, Any]] = []
    for gen, n in [
        (identical_call, 14),
        (rewording, 14),
        (noise_argument, 15),
        (polling_stalled, 10),
        (unknown_tool, 10),
        (parallel, 10),
        (repeated_error, 12),
        (text_repeat, 10),
        (degenerate, 10),
        (reasoning, 12),
        (subagents, 8),
    ]:
        out += [gen(rng, i) for i in range(n)]
    for period in (2, 3, 4, 5):
        out += [cycle(rng, i, period) for i in range(6)]
    for gen, n in [
        (change_then_look, 10),
        (polling_progress, 10),
        (structured_answer, 10),
        (business_errors, 8),
        (normal, 10),
        (retry_success, 6),
        (pagination, 8),
        (refinement, 8),
    ]:
        out += [gen(rng, i) for i in range(n)]
    return out
