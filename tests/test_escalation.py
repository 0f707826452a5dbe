"""EscalationPolicy: starting tier, moving up and down the chain, confirm mode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentguard import ConfigError, GuardConfig
from agentguard.config import EscalationConfig
from agentguard.escalation import Attempt, Choice, EscalationPolicy, Tier
from agentguard.exceptions import EscalationRequired, TiersExhausted

TIERS = {
    "fast": {"model": "qwen2.5-0.5b"},
    "standard": {"model": "qwen2.5-7b"},
    "longctx": {"model": "qwen2.5-7b-1m"},
    "premium": {
        "model": "anthropic/claude-sonnet-4-6",
        "base_url": "https://openrouter.example/api/v1",
        "api_key_env": "OPENROUTER_API_KEY",
    },
}


def _policy(**escalation: object) -> EscalationPolicy:
    return EscalationPolicy(
        GuardConfig.from_dict({"tiers": TIERS, "escalation": escalation}, env={})
    )


def test_chain_follows_config_order() -> None:
    """Tiers come cheapest first, in chain order, with their endpoint settings."""
    policy = _policy()
    assert [t.name for t in policy.chain] == ["fast", "standard", "longctx", "premium"]
    assert policy.chain[-1].api_key_env == "OPENROUTER_API_KEY"


def test_request_starts_at_the_tier_matching_its_model() -> None:
    """A request's model selects its tier, by tier name or by model name."""
    policy = _policy()
    assert policy.tier_for("standard").name == "standard"
    assert policy.tier_for("qwen2.5-7b").name == "standard"
    assert policy.start("qwen2.5-0.5b").target == Tier("fast", "qwen2.5-0.5b")


def test_unknown_model_gets_an_implicit_tier_with_nowhere_to_go() -> None:
    """A model outside the chain is served as-is, and failure stops rather than guessing."""
    policy = _policy()
    tier = policy.tier_for("gpt-4o-mini")
    assert tier == Tier("gpt-4o-mini", "gpt-4o-mini")
    assert policy.on_failure(tier, "server_error").action == "stop"


def test_failure_escalates_upward_from_the_starting_tier() -> None:
    """Escalation walks the chain upward from where the request started."""
    policy = _policy()
    decision = policy.on_failure(policy.tier_for("standard"), "tool_validation_failure")
    assert decision.action == "escalate"
    assert decision.target is not None
    assert decision.target.name == "longctx"
    assert decision.reason == "tool_validation_failure"


def test_degraded_tiers_are_skipped() -> None:
    """A tier whose breaker is open is skipped on the way up."""
    policy = _policy()
    decision = policy.on_failure(policy.tier_for("fast"), "timeout", degraded={"standard"})
    assert decision.target is not None
    assert decision.target.name == "longctx"


def test_top_of_chain_stops() -> None:
    """There is nothing above the last tier."""
    policy = _policy()
    decision = policy.on_failure(policy.tier_for("premium"), "server_error")
    assert decision.action == "stop"
    assert "no stronger tier" in decision.message


def test_budget_moves_down_to_a_cheaper_tier() -> None:
    """The budget trigger moves toward the cheap end of the chain."""
    policy = _policy()
    decision = policy.on_failure(policy.tier_for("premium"), "budget")
    assert decision.target is not None
    assert decision.target.name == "longctx"
    assert policy.on_failure(policy.tier_for("fast"), "budget").action == "stop"


def test_triggers_not_listed_do_not_escalate() -> None:
    """Only the configured escalate_on triggers move a request."""
    policy = _policy(escalate_on=["timeout"])
    assert policy.on_failure(policy.tier_for("fast"), "server_error").action == "stop"
    assert policy.on_failure(policy.tier_for("fast"), "timeout").action == "escalate"


@pytest.mark.parametrize("settings", [{"mode": "off"}, {"enabled": False}])
def test_off_never_moves(settings: dict[str, object]) -> None:
    """mode off (or escalation disabled) never changes tier."""
    policy = _policy(**settings)
    assert policy.on_failure(policy.tier_for("fast"), "timeout").action == "stop"
    assert policy.start("fast", pressure_sustained=True, complex_request=True).action == "stay"


def test_confirm_mode_asks_instead_of_moving() -> None:
    """confirm mode turns every move into a question: no silent failover."""
    policy = _policy(mode="confirm")
    decision = policy.on_failure(policy.tier_for("fast"), "timeout")
    assert decision.action == "confirm"
    assert decision.target is not None
    prompt = policy.prompt(
        decision,
        policy.tier_for("fast"),
        message="timed out after 5 s",
        tokens_spent=1247,
        cost_spent=0.02,
        attempts=2,
    )
    assert prompt.options == (Choice.RETRY, Choice.USE_BACKUP, Choice.CANCEL)
    text = prompt.render()
    assert "1,247 tokens" in text
    assert "$0.0200" in text
    assert "Use backup: standard (qwen2.5-7b)" in text
    assert "[3] Cancel" in text


def test_prompt_without_a_backup_offers_retry_and_cancel() -> None:
    """When no tier is left, the user can only retry or cancel."""
    policy = _policy(mode="confirm")
    top = policy.tier_for("premium")
    decision = policy.on_failure(top, "timeout")
    prompt = policy.prompt(decision, top, message="timed out")
    assert prompt.options == (Choice.RETRY, Choice.CANCEL)


@pytest.mark.parametrize(
    ("answer", "three", "two"),
    [
        (Choice.USE_BACKUP, Choice.USE_BACKUP, None),  # not on offer without a backup
        ("use_backup", Choice.USE_BACKUP, None),
        ("USE_BACKUP", Choice.USE_BACKUP, None),
        (" Cancel\n", Choice.CANCEL, Choice.CANCEL),
        ("1", Choice.RETRY, Choice.RETRY),
        (3, Choice.CANCEL, None),  # the number render() shows, as a number or text
        ("2", Choice.USE_BACKUP, Choice.CANCEL),
        (None, None, None),
        (True, None, None),  # a flag, not the number 1
        (0, None, None),
        ("no", None, None),
        ("9" * 5000, None, None),  # more digits than int() reads
        (["retry"], None, None),
    ],
)
def test_read_answer_picks_an_option_on_offer_or_none(
    answer: object, three: Choice | None, two: Choice | None
) -> None:
    """A confirm callback's answer picks an option on offer by itself, its value or name, or
    its number in render(); anything else picks none."""
    policy = _policy(mode="confirm")
    fast, top = policy.tier_for("fast"), policy.tier_for("premium")
    with_backup = policy.prompt(policy.on_failure(fast, "timeout"), fast, message="timed out")
    without = policy.prompt(policy.on_failure(top, "timeout"), top, message="timed out")
    assert policy.read_answer(with_backup, answer) == three
    assert policy.read_answer(without, answer) == two


def test_escalation_required_carries_the_prompt() -> None:
    """The exception raised without a callback shows and carries the prompt."""
    policy = _policy(mode="confirm")
    fast = policy.tier_for("fast")
    prompt = policy.prompt(policy.on_failure(fast, "timeout"), fast, message="timed out")
    error = EscalationRequired(prompt)
    assert error.prompt is prompt
    assert "Options:" in str(error)


def test_sustained_memory_pressure_moves_complex_requests_up() -> None:
    """Under sustained pressure a complex request starts one tier up; a simple one does not."""
    policy = _policy()
    moved = policy.start("fast", pressure_sustained=True, complex_request=True)
    assert moved.action == "escalate"
    assert moved.target is not None
    assert moved.target.name == "standard"
    assert moved.reason == "memory_pressure"
    assert policy.start("fast", pressure_sustained=True, complex_request=False).action == "stay"
    assert policy.start("fast", pressure_sustained=False, complex_request=True).action == "stay"


def test_degraded_starting_tier_is_skipped_at_start() -> None:
    """A request does not start on a tier whose breaker is open."""
    decision = _policy().start("fast", degraded={"fast"})
    assert decision.target is not None
    assert decision.target.name == "standard"


def test_complexity_rule() -> None:
    """Complex means tools, a long context, or a large output cap."""
    policy = _policy(complex_prompt_tokens=1000, complex_output_tokens=2000)
    assert policy.is_complex(has_tools=True, prompt_tokens=0, max_output_tokens=None)
    assert policy.is_complex(has_tools=False, prompt_tokens=1000, max_output_tokens=None)
    assert policy.is_complex(has_tools=False, prompt_tokens=10, max_output_tokens=2000)
    assert not policy.is_complex(has_tools=False, prompt_tokens=10, max_output_tokens=100)


def test_no_tiers_configured_means_every_model_is_its_own_tier() -> None:
    """Without tiers the policy never moves a request."""
    policy = EscalationPolicy(EscalationConfig())
    assert policy.chain == ()
    assert policy.on_failure(policy.tier_for("m"), "timeout").action == "stop"


def test_chain_naming_undefined_tiers_is_a_warning_listing_what_is_defined() -> None:
    """A chain naming an undefined tier loads (the seed's own block does: its local tiers are
    defined elsewhere), and ``check()`` warns, listing what is defined; the tier is skipped."""
    cfg = GuardConfig.from_dict(
        {"tiers": {"fast": {"model": "a"}}, "escalation": {"chain": ["fast", "premium"]}},
        env={},
    )
    assert any("not defined: premium (defined: fast)" in note for note in cfg.check())
    assert [t.name for t in EscalationPolicy(cfg).chain] == ["fast"]


def test_api_key_env_must_be_a_variable_name() -> None:
    """api_key_env names a variable; a pasted key is rejected without being echoed."""
    with pytest.raises(ConfigError) as info:
        GuardConfig.from_dict(
            {
                "tiers": {"p": {"model": "m", "api_key_env": "sk-live-abcdefgh12345"}},
                "escalation": {"chain": ["p"]},
            },
            env={},
        )
    assert "sk-live-abcdefgh12345" not in str(info.value)


def test_tiers_exhausted_lists_attempts() -> None:
    """The last-resort error carries and shows the whole attempt history."""
    error = TiersExhausted(
        [Attempt("fast", "a", "server_error"), Attempt("premium", "b", "timeout")], "timeout"
    )
    assert len(error.attempts) == 2
    assert "fast (server_error)" in str(error)
    assert "premium (timeout)" in str(error)


@given(
    start=st.sampled_from(list(TIERS)),
    trigger=st.sampled_from(["timeout", "server_error", "loop_detected", "budget"]),
    degraded=st.sets(st.sampled_from(list(TIERS))),
)
def test_moves_are_monotonic_and_never_to_degraded_tiers(
    start: str, trigger: str, degraded: set[str]
) -> None:
    """A move goes strictly up (down for budget) and never lands on a degraded tier."""
    policy = _policy()
    names = [t.name for t in policy.chain]
    decision = policy.on_failure(policy.tier_for(start), trigger, degraded=degraded)
    if decision.action == "stop":
        return
    assert decision.target is not None
    assert decision.target.name not in degraded
    moved_up = names.index(decision.target.name) > names.index(start)
    assert moved_up is (trigger != "budget")
