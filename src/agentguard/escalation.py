"""EscalationPolicy: which model tier serves a request, and where to go when it fails.

Tiers are named models (``fast``, ``standard``, ``longctx``, ``premium`` ...), ordered by the
``escalation.chain`` from cheapest to strongest; the last one may be any OpenAI-compatible cloud
endpoint. The policy is a pure component: given the current tier and what went wrong, it returns
an :class:`EscalationDecision`. The pipeline carries it out, asking the user first in ``confirm``
mode (the decision's action is then ``"confirm"``, with an :class:`EscalationPrompt`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from agentguard._exports import publish

from .config import EscalationConfig, GuardConfig
from .types import Attempt, Choice, EscalationPrompt, Tier

__all__ = [
    "Attempt",
    "Choice",
    "EscalationDecision",
    "EscalationPolicy",
    "EscalationPrompt",
    "Tier",
]


@dataclass(frozen=True, slots=True)
class EscalationDecision:
    """The policy's answer.

    Attributes:
        action: ``stay`` (keep the tier), ``escalate`` (move to ``target``), ``confirm`` (ask
            the user before moving to ``target``), or ``stop`` (no tier to move to, or moving
            is switched off: surface the failure).
        target: the tier to move to, for ``escalate`` and ``confirm``.
        reason: the trigger.
        message: why, in words.
    """

    action: Literal["stay", "escalate", "confirm", "stop"]
    target: Tier | None
    reason: str
    message: str


class EscalationPolicy:
    """Chooses the starting tier and the next tier on failure.

    Args:
        config: a :class:`GuardConfig` (its ``tiers`` and ``escalation`` sections), an
            :class:`EscalationConfig` alone (no tiers: every request stays on its own model),
            or ``None`` for the defaults.
    """

    def __init__(self, config: GuardConfig | EscalationConfig | None = None) -> None:
        if isinstance(config, EscalationConfig):
            self._config, tiers = config, {}
        else:
            cfg = config or GuardConfig()
            self._config, tiers = cfg.escalation, cfg.tiers
        self._chain = tuple(
            Tier.from_config(name, tiers[name]) for name in self._config.chain if name in tiers
        )
        self._by_name = {t.name: t for t in self._chain}
        self._by_model: dict[str, Tier] = {}
        for t in self._chain:  # the first (cheapest) tier wins when two share a model
            self._by_model.setdefault(t.model, t)

    @property
    def config(self) -> EscalationConfig:
        """The escalation section in force."""
        return self._config

    @property
    def chain(self) -> tuple[Tier, ...]:
        """The configured tiers, cheapest first (empty when no tiers are configured)."""
        return self._chain

    def tier_for(self, model: str) -> Tier:
        """The tier a request for ``model`` starts at: by tier name, then by model name.

        A model that matches no tier gets an implicit tier of its own (named after the model),
        from which there is nowhere to escalate.
        """
        return self._by_name.get(model) or self._by_model.get(model) or Tier(model, model)

    def triggers(self, trigger: str) -> bool:
        """Whether ``trigger`` may move a request to another tier under this configuration."""
        cfg = self._config
        return cfg.enabled and cfg.mode != "off" and trigger in cfg.escalate_on

    def is_complex(
        self, *, has_tools: bool, prompt_tokens: int, max_output_tokens: int | None
    ) -> bool:
        """Whether a request is complex: it has tools, a long context or a large output cap."""
        cfg = self._config
        return (
            has_tools
            or prompt_tokens >= cfg.complex_prompt_tokens
            or (max_output_tokens is not None and max_output_tokens >= cfg.complex_output_tokens)
        )

    def start(
        self,
        model: str,
        *,
        pressure_sustained: bool = False,
        complex_request: bool = False,
        degraded: Collection[str] = (),
    ) -> EscalationDecision:
        """Where a request starts.

        The tier of ``model``, unless the host has been under sustained memory pressure and the
        request is complex: then the next tier up (asked first in confirm mode). Degraded tiers
        (open breakers) are skipped.

        Returns:
            ``stay`` with the starting tier as ``target``, or ``escalate`` / ``confirm`` with
            the tier to start at instead.
        """
        tier = self.tier_for(model)
        if pressure_sustained and complex_request and self.triggers("memory_pressure"):
            up = self._step(tier, +1, degraded)
            if up is not None:
                return self._move(up, "memory_pressure", "sustained memory pressure on this host")
        if tier.name in degraded:
            up = self._step(tier, +1, degraded)
            if up is not None and self.triggers("server_error"):
                return self._move(up, "server_error", f"tier {tier.name} is degraded")
        return EscalationDecision("stay", tier, "", "")

    def on_failure(
        self, current: Tier, trigger: str, *, degraded: Collection[str] = ()
    ) -> EscalationDecision:
        """Where to go after ``current`` failed with ``trigger``.

        ``budget`` moves *down* the chain, to a cheaper tier; every other trigger moves up.
        Degraded tiers are skipped.
        """
        if not self.triggers(trigger):
            return EscalationDecision(
                "stop", None, trigger, f"escalation on {trigger} is not enabled"
            )
        direction = -1 if trigger == "budget" else +1
        target = self._step(current, direction, degraded)
        if target is None:
            where = "cheaper" if direction < 0 else "stronger"
            return EscalationDecision(
                "stop", None, trigger, f"no {where} tier left after {current.name}"
            )
        return self._move(target, trigger, f"{current.name} failed: {trigger}")

    def prompt(
        self,
        decision: EscalationDecision,
        current: Tier,
        *,
        message: str,
        tokens_spent: int = 0,
        cost_spent: float | None = None,
        attempts: int = 0,
        estimated_tokens: int = 0,
        retry_cost: float | None = None,
        backup_cost: float | None = None,
    ) -> EscalationPrompt:
        """The question confirm mode puts to the user for ``decision``.

        ``estimated_tokens`` is what one more attempt is expected to spend, priced on the
        current tier (``retry_cost``) and on the proposed one (``backup_cost``); see
        :class:`EscalationPrompt`.
        """
        options: tuple[Choice, ...] = (Choice.RETRY, Choice.USE_BACKUP, Choice.CANCEL)
        if decision.target is None:
            options = (Choice.RETRY, Choice.CANCEL)
        return EscalationPrompt(
            reason=decision.reason,
            message=message,
            current=current,
            proposed=decision.target,
            options=options,
            tokens_spent=tokens_spent,
            cost_spent=cost_spent,
            attempts=attempts,
            estimated_tokens=estimated_tokens,
            retry_cost=retry_cost,
            backup_cost=backup_cost if decision.target is not None else None,
        )

    @staticmethod
    def read_answer(prompt: EscalationPrompt, answer: object) -> Choice | None:
        """The option of ``prompt`` that ``answer`` (what a confirm callback returned) picks.

        An answer picks an option on offer (in ``prompt.options``) by being it (a
        :class:`Choice`), by its value or name in any case (``"use_backup"``, ``"CANCEL"``),
        or by the number :meth:`EscalationPrompt.render` shows for it (``3`` or ``"3"``).
        Anything else -- ``None``, ``"no"``, an option not on offer -- picks none: ``None``,
        which the guard takes as *cancel*, never as consent to move.
        """
        options = prompt.options
        if isinstance(answer, Choice):
            return answer if answer in options else None
        if isinstance(answer, str):
            text = answer.strip()
            for option in options:
                if text.lower() in (option.value, option.name.lower()):
                    return option
            # (a short one: int() refuses thousands of digits, and no prompt has that many)
            if not (text.isascii() and text.isdigit() and len(text) < 4):
                return None
            number = int(text)
        elif isinstance(answer, int) and not isinstance(answer, bool):
            number = answer
        else:
            return None
        return options[number - 1] if 1 <= number <= len(options) else None

    def _move(self, target: Tier, trigger: str, message: str) -> EscalationDecision:
        action: Literal["escalate", "confirm"] = (
            "confirm" if self._config.mode == "confirm" else "escalate"
        )
        return EscalationDecision(action, target, trigger, message)

    def _step(self, current: Tier, direction: int, degraded: Collection[str]) -> Tier | None:
        if current.name not in self._by_name:
            return None
        i = self._chain.index(self._by_name[current.name]) + direction
        while 0 <= i < len(self._chain):
            if self._chain[i].name not in degraded:
                return self._chain[i]
            i += direction
        return None


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
