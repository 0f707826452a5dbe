"""Quality degradation you can see: a server that keeps answering while its answers get worse.

Memory pressure (:mod:`agentguard.pressure`) is one cause of a local model silently getting
worse; this module watches the answers themselves, per tier, for the signs that show on the wire:

- ``prompt_truncated``: the server reports far fewer prompt tokens than the guard estimates it
  sent (Ollama drops the start of a prompt longer than its context and answers 200);
- ``stopped_parsing``: answers that passed validation, then ``parse_failures`` in a row that fail;
- ``context_overflow``: an HTTP 400 saying the context length was exceeded;
- ``runaway``: far more completion tokens than the requested cap (``runaway_factor`` times), what
  a server does when its cap fails, whatever ``finish_reason`` it reports: the answer is treated
  as cut off (see :func:`runaway`).

Each signal is a :class:`~agentguard.events.QualityDegraded` event and a warning in the report.
When a tier's recent window holds ``sustained_count`` signals, degradation is sustained and
complex requests start one tier up (escalation trigger ``quality_degraded``). A component: pure
decisions, no I/O.
"""

from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import Callable, Iterable

from agentguard.config import GuardConfig, QualityConfig
from agentguard.events import Emitter, Hook, QualityDegraded
from agentguard.resilience import classify
from agentguard.types import Usage

__all__ = ["QualityMonitor", "context_overflow", "runaway"]

# Tiers whose recent answers are kept (see QualityMonitor._tier).
_TIERS_KEPT = 1024

_CONTEXT_OVERFLOW = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|too many tokens|exceeds? the (context|max)",
    re.IGNORECASE,
)


def context_overflow(error: BaseException) -> bool:
    """Whether ``error`` is an HTTP 400 saying the prompt exceeds the server's context length."""
    return classify(error).status_code == 400 and bool(_CONTEXT_OVERFLOW.search(str(error)))


def runaway(completion_tokens: int | None, cap: int | None, factor: float) -> bool:
    """Whether an answer ran far past its cap (``factor`` times): truncation, whatever the server
    says. Without a cap or a count there is nothing to judge."""
    if cap is None or completion_tokens is None or cap <= 0:
        return False
    return completion_tokens > factor * cap


class _Tier:
    __slots__ = ("failures", "passed", "recent")

    def __init__(self, window: int) -> None:
        self.recent: collections.deque[bool] = collections.deque(maxlen=window)  # True: a signal
        self.passed = 0  # answers that passed validation
        self.failures = 0  # consecutive answers that failed it


class QualityMonitor:
    """Watches each tier's answers for quality signals.

    Args:
        config: a :class:`GuardConfig` (its ``quality`` section), the section, or ``None``.
        hooks: event hooks.
    """

    def __init__(
        self,
        config: GuardConfig | QualityConfig | None = None,
        *,
        hooks: Iterable[Hook] | None = None,
    ) -> None:
        if isinstance(config, QualityConfig):
            self.config = config
        else:
            self.config = (config or GuardConfig()).quality
        self._emitter = Emitter(hooks)
        # by tier, least recently judged first (a model name no tier has is a tier of its own,
        # and names are the caller's to choose: the oldest go past _TIERS_KEPT)
        self._tiers: collections.OrderedDict[str, _Tier] = collections.OrderedDict()

    def _tier(self, name: str) -> _Tier:
        tiers = self._tiers
        state = tiers.get(name)
        if state is None:
            state = tiers[name] = _Tier(self.config.window)
            while len(tiers) > _TIERS_KEPT:
                tiers.popitem(last=False)
        else:
            with contextlib.suppress(KeyError):  # (dropped by another thread meanwhile)
                tiers.move_to_end(name)
        return state

    def sustained(self, tier: str) -> bool:
        """Whether ``tier``'s recent answers hold ``sustained_count`` signals."""
        state = self._tiers.get(tier)
        return state is not None and sum(state.recent) >= self.config.sustained_count

    def answered(
        self,
        tier: str,
        *,
        usage: Usage | None,
        sent_prompt_tokens: int,
        parsed: bool | None,
        ran_away: bool = False,
        session: str | None = None,
        text_prompt_tokens: Callable[[], int] | None = None,
    ) -> list[str]:
        """Judge one answer of ``tier``; returns a warning for each signal it shows.

        Args:
            tier: the tier that answered.
            usage: the usage the server reported (``None``: it reported none).
            sent_prompt_tokens: the guard's estimate of the prompt it sent.
            text_prompt_tokens: the estimate of its text alone (images and audio counting
                nothing), asked for only when the prompt looks truncated: servers count images
                too differently for an estimate of them to show a truncation.
            parsed: whether the answer passed validation (``None``: nothing to validate).
            ran_away: the answer ran past its cap (see :func:`runaway`).
            session: for the events.
        """
        cfg = self.config
        if not cfg.enabled:
            return []
        state = self._tier(tier)
        signals: list[tuple[str, str]] = []
        if ran_away:
            done = usage.completion_tokens if usage is not None else "?"
            signals.append(("runaway", f"{done} completion tokens, far past the cap"))
        if (
            usage is not None
            and not usage.estimated
            and sent_prompt_tokens >= cfg.truncation_min_prompt_tokens
            and 0 < usage.prompt_tokens < cfg.truncation_ratio * sent_prompt_tokens
            and (
                text_prompt_tokens is None
                or usage.prompt_tokens < cfg.truncation_ratio * text_prompt_tokens()
            )
        ):
            signals.append(
                (
                    "prompt_truncated",
                    f"the server counted {usage.prompt_tokens} prompt tokens of about "
                    f"{sent_prompt_tokens} sent: it dropped part of the prompt",
                )
            )
        if parsed is True:
            state.passed += 1
            state.failures = 0
        elif parsed is False:
            state.failures += 1
            if state.passed and state.failures == cfg.parse_failures:
                signals.append(
                    (
                        "stopped_parsing",
                        f"{state.failures} answers in a row failed validation after "
                        f"{state.passed} passed",
                    )
                )
        return self._record(state, tier, signals, session)

    def failed(self, tier: str, error: BaseException, *, session: str | None = None) -> list[str]:
        """Judge an error ``tier`` answered with: a context-length 400 is a signal."""
        if not self.config.enabled:
            return []
        if not context_overflow(error):
            return []
        detail = "HTTP 400: the prompt exceeds the server's context length"
        return self._record(self._tier(tier), tier, [("context_overflow", detail)], session)

    def _record(
        self, state: _Tier, tier: str, signals: list[tuple[str, str]], session: str | None
    ) -> list[str]:
        state.recent.append(bool(signals))
        sustained = sum(state.recent) >= self.config.sustained_count
        warnings = []
        for signal, detail in signals:
            self._emitter.emit(
                QualityDegraded(
                    session=session, tier=tier, signal=signal, detail=detail, sustained=sustained
                )
            )
            warnings.append(f"quality: {signal} on tier {tier}: {detail}")
        return warnings
