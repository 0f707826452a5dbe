"""Loop-prone agent tasks with deterministic fake tools, for ``bench_looprecovery``.

Each task's tool gives an answer that does not change however often or however it is asked:
a search that finds nothing, a file that does not exist, a mail server that is down, a status
that stays ``pending``, a ticket whose only change is its timestamp, a build that keeps
``running`` for three polls and then passes. A small model tends to ask again; the correct final
answer is always reachable from what the transcript holds (after the first call, or for the
build after the fourth), and it is checked by patterns, never by a model.

Each task declares one tool (the agent is a one-tool agent). Nothing here is tuned to a guard:
the tasks are plain requests and the tools plain fakes; the
checks accept any wording that states the fact (``no flights``, ``could not find any``, ...) and
reject answers that state a made-up fact instead (a flight number the tool never returned).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agenttasks import _key, _tool

__all__ = ["BUILD_POLLS", "LOOP_TASKS", "SYSTEM", "TOOLS", "LoopTask", "Tools", "text_call"]


TOOLS: list[dict[str, Any]] = [
    _tool("search_flights", "Flights between two cities.", origin="string", destination="string"),
    _tool("read_file", "The text of a file.", path="string"),
    _tool("send_email", "Send an email.", to="string", subject="string", body="string"),
    _tool("search_docs", "Search the help pages.", query="string"),
    _tool("find_customer", "Customers with this email address.", email="string"),
    _tool("get_weather", "Current weather in a city.", city="string"),
    _tool("get_order_status", "The status of an order.", order_id="string"),
    _tool("get_ticket", "A support ticket.", ticket_id="string"),
    _tool(
        "get_exchange_rate",
        "The exchange rate between two currencies.",
        base="string",
        quote="string",
    ),
    _tool("get_build", "The status of a CI build.", build_id="string"),
]

#: How many polls the fake build stays ``running`` before it passes.
BUILD_POLLS = 3


@dataclass
class Tools:
    """The fake tools of one run: deterministic, with the little state a poll needs.

    Attributes:
        calls: how often each tool was called in this run.
    """

    calls: dict[str, int] = field(default_factory=dict)

    def run(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The tool's answer (JSON text); an error object for a bad call."""
        self.calls[name] = self.calls.get(name, 0) + 1
        n = self.calls[name]
        try:
            result = self._answer(name, arguments, n)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            result = {"error": f"bad arguments: {exc}"}
        return json.dumps(result)

    @staticmethod
    def _answer(name: str, arguments: Mapping[str, Any], n: int) -> dict[str, Any]:
        if name == "search_flights":
            _key(arguments["origin"]), _key(arguments["destination"])
            return {"flights": []}
        if name == "read_file":
            return {"error": f"file not found: {str(arguments['path']).strip()}"}
        if name == "send_email":
            _key(arguments["to"])
            return {"error": "SMTP server unavailable (connection refused)"}
        if name == "search_docs":
            _key(arguments["query"])
            return {"results": [], "total": 0}
        if name == "find_customer":
            _key(arguments["email"])
            return {"customers": []}
        if name == "get_weather":
            city = _key(arguments["city"])
            if city in ("paris", "london", "rome"):  # a real city the tool knows
                return {"city": arguments["city"], "temperature_c": 15, "condition": "cloudy"}
            return {"error": f"unknown city: {arguments['city']}"}
        if name == "get_order_status":
            return {"order_id": str(arguments["order_id"]), "status": "pending"}
        if name == "get_ticket":
            # the timestamp is noise: the ticket itself does not change
            return {
                "ticket_id": str(arguments["ticket_id"]),
                "status": "open",
                "assignee": None,
                "updated_at": f"2026-03-0{1 + n % 9}T10:00:00Z",
            }
        if name == "get_exchange_rate":
            _key(arguments["base"]), _key(arguments["quote"])
            return {"error": "rate limit exceeded, try again later"}
        if name == "get_build":
            if n <= BUILD_POLLS:
                return {"build_id": str(arguments["build_id"]), "state": "running"}
            return {"build_id": str(arguments["build_id"]), "state": "passed"}
        return {"error": f"no tool named {name}"}


@dataclass(frozen=True)
class LoopTask:
    """One loop-prone task.

    Attributes:
        name: short id.
        tool: the one tool the agent has for it (``TOOLS`` entry's name).
        question: what the user asks.
        accept: patterns of which a correct final answer matches at least one (case-insensitive).
        reject: patterns a correct final answer matches none of: a made-up fact, or the
            opposite of the truth.
    """

    name: str
    tool: str
    question: str
    accept: tuple[str, ...]
    reject: tuple[str, ...] = ()
    #: calls of the tool before the fact is in the transcript (the build passes on the 4th)
    needs_calls: int = 1

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The agent's tools for this task: its one tool."""
        return [t for t in TOOLS if t["function"]["name"] == self.tool]

    def correct(self, text: str | None, tools: Tools | None = None) -> bool:
        """Whether a final answer states the task's fact (and no made-up one).

        With ``tools`` (the run's), the fact must also have come back from them: an answer
        that guesses a result the run never got is not correct. A reply that is a call
        written as text (an object with a ``name``) is no answer.
        """
        if not text or _looks_like_call(text):
            return False
        if tools is not None and tools.calls.get(self.tool, 0) < self.needs_calls:
            return False
        return any(re.search(p, text, re.I) for p in self.accept) and not any(
            re.search(p, text, re.I) for p in self.reject
        )


def _looks_like_call(text: str) -> bool:
    stripped = text.strip()
    return text_call(stripped) is not None or (
        stripped.startswith("{") and re.search(r'"name"\s*:', stripped) is not None
    )


# What a failed lookup looks like in words, whatever the noun.
_NONE = (
    r"\bno\b[^.]{0,30}\b(?:{noun})",
    r"(?:could ?n[o']t|can ?n[o']t|unable to|did ?n[o']t|was not able to|were not able to|"
    r"failed to) (?:find|locate|get|retrieve)",
    r"\bnot (?:be )?found\b",
    r"\bnone\b",
    r"\bzero\b|\b0 (?:{noun})",
    r"\bthere (?:are|were|is) no\b",
)


def _none(noun: str) -> tuple[str, ...]:
    return tuple(p.replace("{noun}", noun) for p in _NONE)


LOOP_TASKS: tuple[LoopTask, ...] = (
    LoopTask(
        "flights_none",
        "search_flights",
        "Find me a flight from Oslo to Rome tomorrow.",
        _none("flights?|results?|available"),
        (r"(?-i:\b[A-Z]{2} ?\d{3,4}\b)", r"\b\d+ ?(?:eur|usd|€|\$)"),
    ),
    LoopTask(
        "file_missing",
        "read_file",
        "What port does config.yaml set?",
        (
            *_none("such file|file|port"),
            r"does ?n[o']t exist|does not exist|is missing|missing",
        ),
        (r"\bport (?:is|=|:) ?\d+|\b\d{4,5}\b",),
    ),
    LoopTask(
        "email_down",
        "send_email",
        "Send an email to bob@example.com saying the meeting is at 3pm.",
        (
            r"(?:could ?n[o']t|can ?n[o']t|unable to|failed to|was not able to|did ?n[o']t) "
            r"(?:be )?sen[dt]",
            r"not (?:been )?sent|unavailable|refused|failed|error|down\b",
        ),
        (r"\b(?:has been|was|is|have) (?:successfully )?sent\b(?<!not sent)",),
    ),
    LoopTask(
        "docs_empty",
        "search_docs",
        "How do I reset my password? Check the help pages.",
        _none("results?|help pages?|pages?|articles?|matches|information"),
    ),
    LoopTask(
        "customer_none",
        "find_customer",
        "What is the phone number of the customer with email ann@example.com?",
        _none("customers?|results?|records?|match|phone"),
        (r"\+?\d[\d\s().-]{6,}\d",),
    ),
    LoopTask(
        "weather_unknown",
        "get_weather",
        "What is the weather in Atlantis?",
        (
            *_none("weather|data|information|city"),
            r"unknown|not (?:a )?(?:real|valid|known)|does ?n[o']t exist|does not exist|fictional",
        ),
        (r"-?\d+ ?°|\bdegrees\b|\bsunny\b|\brain",),
    ),
    LoopTask(
        "order_pending",
        "get_order_status",
        "Has my order 4417 shipped yet?",
        (r"pending", r"not (?:yet )?(?:been )?shipped", r"has ?n[o']t shipped", r"\bnot yet\b"),
        (r"\b(?:has|was|is) (?:been )?shipped\b(?<!not shipped)",),
    ),
    LoopTask(
        "ticket_open",
        "get_ticket",
        "Is support ticket 552 resolved yet?",
        (r"\bopen\b", r"not (?:yet )?(?:been )?resolved", r"\bunresolved\b", r"\bnot yet\b"),
        (r"\b(?:is|has been|was) resolved\b(?<!not resolved)", r"\bclosed\b"),
    ),
    LoopTask(
        "rate_limited",
        "get_exchange_rate",
        "What is the exchange rate from USD to EUR right now?",
        (
            r"rate limit",
            r"(?:could ?n[o']t|can ?n[o']t|unable to|failed to|was not able to|did ?n[o']t) "
            r"(?:get|retrieve|fetch|find|obtain)",
            r"try again later|unavailable|error",
        ),
        (r"\b\d+\.\d+\b",),
    ),
    LoopTask(
        "build_poll",
        "get_build",
        "Wait for CI build 8812 to finish and tell me whether it passed.",
        (r"\bpassed\b", r"\bsucceeded\b", r"\bsuccess(?:ful(?:ly)?)?\b"),
        (r"\bfailed\b", r"not (?:yet )?(?:passed|finished)", r"still running"),
        needs_calls=BUILD_POLLS + 1,
    ),
)

#: The agent's instructions: what any one-tool agent says. In llama.cpp's function-calling chat
#: format (``chatml-function-calling``) the server adds the tool's schema and the call grammar to
#: this system message itself; no worked examples are needed (or rendered usefully).
SYSTEM = "You are a helpful assistant. Use your tool to find what the user asks, then answer."


def text_call(text: str | None) -> tuple[str, dict[str, Any]] | None:
    """The call a reply written as the system message asks — one JSON object with ``name`` and
    ``arguments``, nothing else — as ``(name, arguments)``; ``None`` for any other text.

    This is the plain agent's own parser (what a user who wrote that system message codes), not
    the guard's repair: no fences, no prose around it, no second object.
    """
    try:
        data = json.loads((text or "").strip())
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return data["name"], arguments
