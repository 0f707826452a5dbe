"""Token budgets: the ``TokenLedger``, its values, prices and usage estimation.

See ``docs/budgets.md`` for the budget model, the window semantics and the policies.
"""

from __future__ import annotations

from agentguard._exports import publish

from ._estimate import estimate_tokens, estimate_usage
from ._ledger import InvalidTokenCount, TokenLedger, caller_config, clamp_output_tokens
from ._pricing import Price, PriceTable
from ._values import Decision, Quote, Reservation, Settlement, UsageSnapshot

__all__ = [
    "Decision",
    "InvalidTokenCount",
    "Price",
    "PriceTable",
    "Quote",
    "Reservation",
    "Settlement",
    "TokenLedger",
    "UsageSnapshot",
    "caller_config",
    "clamp_output_tokens",
    "estimate_tokens",
    "estimate_usage",
]

publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
