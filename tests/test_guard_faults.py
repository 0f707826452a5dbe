"""Long, generated fault sequences through the guard: it never crashes, never overspends, and
always ends a call in a valid answer or a typed error."""

from __future__ import annotations

import json
import random
from typing import Any

import anyio
import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentguard import AgentGuardError, GuardConfig, TokenLedger
from agentguard.guard import AsyncGuard, Guard
from agentguard.storage import MemoryStore
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel
from agentguard.transport import ModelRequest

SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": SCHEMA}}]
PER_SESSION = 1_500

steps = st.one_of(
    st.builds(Reply.text, st.sampled_from(["done", "Here is the answer.", "ok " * 30])),
    st.builds(lambda q: Reply.call("search", {"query": q}), st.text(min_size=1, max_size=20)),
    st.just(Reply.call("search", '{"query": "x", "limit": ')),  # truncated JSON
    st.just(Reply.call("search", "{'query': 'x',}")),  # repairable JSON
    st.just(Reply.call("serach", {"query": "x"})),  # near-miss name
    st.just(Reply.call("delete_everything", {"force": True})),  # hallucinated tool
    st.just(Reply.call("search", {"limit": 3})),  # missing required
    st.just(Reply.call("search", {"query": "<query>"})),  # placeholder
    st.just(Reply.embedded("search", {"query": "x"}, style="hermes")),
    st.just(Reply.embedded("search", {"query": "x"}, style="bare")),
    st.just(Reply.degenerate("try again", times=60)),
    st.just(Reply(content="no usage reported", usage=None)),
    st.builds(Fault.rate_limit, st.sampled_from([0.5, 2.0, 3600.0])),
    st.builds(Fault.server_error, st.sampled_from([500, 502, 503])),
    st.just(Fault.timeout()),
    st.just(Fault.context_length()),
)
scripts = st.lists(steps, min_size=1, max_size=12)


def _config(mode: str, policy: str) -> GuardConfig:
    return GuardConfig.from_dict(
        {
            "tiers": {
                "fast": {"model": "small"},
                "standard": {"model": "medium"},
                "premium": {"model": "big"},
            },
            "escalation": {
                "mode": mode,
                "chain": ["fast", "standard", "premium"],
                "max_retries_before_escalate": 2,
            },
            "token_budget": {
                "per_session": PER_SESSION,
                "policy": policy,
                "max_output_tokens": 256,
            },
            "memory_pressure": {"enabled": False},
        },
        env={},
    )


def _valid(answer: Any) -> None:
    """A returned answer's tool calls name a real tool and satisfy its schema."""
    for call in answer.message.get("tool_calls") or ():
        fn = call["function"]
        assert fn["name"] == "search"
        jsonschema.validate(json.loads(fn["arguments"]), SCHEMA)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    small=scripts,
    medium=scripts,
    big=scripts,
    turns=st.integers(min_value=1, max_value=8),
    mode=st.sampled_from(["auto", "off"]),
    policy=st.sampled_from(["hard_stop", "warn_and_continue"]),
    seed=st.integers(0, 2**16),
    asynchronous=st.booleans(),
)
def test_generated_fault_sequences_end_in_an_answer_or_a_typed_error(
    *,
    small: list[Any],
    medium: list[Any],
    big: list[Any],
    turns: int,
    mode: str,
    policy: str,
    seed: int,
    asynchronous: bool,
) -> None:
    """Any mix of faults over several turns: valid answers or AgentGuardErrors, bounded work."""
    config = _config(mode, policy)
    model = ScriptedModel({"small": small, "medium": medium, "big": big}, cycle=True)
    clock = FakeClock()
    ledger = TokenLedger(config, store=MemoryStore(), clock=clock)
    opts: dict[str, Any] = {"ledger": ledger, "clock": clock, "rng": random.Random(seed)}
    if asynchronous:  # the same plan through the async driver
        aguard = AsyncGuard(model, config, sleep=clock.asleep, **opts)

        def complete(request: ModelRequest, session: str) -> Any:
            return anyio.run(lambda: aguard.acomplete(request, session=session))
    else:
        complete = Guard(model, config, sleep=clock.sleep, **opts).complete
    messages: list[dict[str, Any]] = [{"role": "user", "content": "find the install guide"}]
    for _ in range(turns):
        before = len(model.requests)
        request = ModelRequest(model="fast", messages=list(messages), params={"tools": TOOLS})
        try:
            answer = complete(request, session="s")
        except AgentGuardError:
            answer = None
        # every call is bounded: retries x corrections x tiers, never an endless loop
        assert len(model.requests) - before <= 3 * (3 + 4)
        if answer is not None:
            _valid(answer)
            messages.append(dict(answer.message))
            for call in answer.message.get("tool_calls") or ():
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "[]"})
        else:
            messages.append({"role": "user", "content": "please continue"})
        if policy == "hard_stop":
            assert ledger.usage("s").session_tokens <= PER_SESSION
