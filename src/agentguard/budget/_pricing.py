"""Prices: turning tokens into money."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agentguard.config import ModelPrice
from agentguard.storage._base import NANOS

__all__ = ["Price", "PriceTable"]


@dataclass(frozen=True, slots=True)
class Price:
    """The price of one model per million tokens.

    Attributes:
        input: per million input (prompt) tokens.
        output: per million output (completion) tokens.
    """

    input: float
    output: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The price of ``prompt_tokens`` in and ``completion_tokens`` out."""
        return (prompt_tokens * self.input + completion_tokens * self.output) / 1_000_000

    def nanos(self, prompt_tokens: int, completion_tokens: int) -> int:
        """:meth:`cost` in integer nano-units, as stores count money (exact when summed)."""
        # price per million tokens x 1e9 nano-units / 1e6 tokens = price x 1000 per token
        return round((prompt_tokens * self.input + completion_tokens * self.output) * 1000)


class PriceTable:
    """Model names to prices, with prefix matching.

    A model is looked up by its exact name, then by the longest configured name it starts with
    (``"gpt-4o"`` prices ``"gpt-4o-2024-08-06"``), then by ``"*"``; a model matching none of
    them costs nothing (its tokens still count against the budgets).

    Args:
        prices: model name (or prefix, or ``"*"``) to a :class:`Price`, a config
            :class:`~agentguard.config.ModelPrice`, or an ``(input, output)`` pair.
    """

    __slots__ = ("_cache", "_prices")

    def __init__(
        self, prices: Mapping[str, Price | ModelPrice | tuple[float, float]] | None = None
    ) -> None:
        self._prices: dict[str, Price] = {}
        for name, value in (prices or {}).items():
            if isinstance(value, Price):
                price = value
            elif isinstance(value, ModelPrice):
                price = Price(value.input, value.output)
            else:
                price = Price(float(value[0]), float(value[1]))
            if price.input < 0 or price.output < 0:
                raise ValueError(f"price of {name!r} must not be negative")
            self._prices[name] = price
        self._cache: dict[str | None, Price | None] = {}

    def price(self, model: str | None) -> Price | None:
        """The price that applies to ``model`` (see the class docstring), or ``None``."""
        try:
            return self._cache[model]
        except KeyError:
            pass
        found = self._prices.get(model) if model is not None else None
        if found is None and model is not None:
            prefixes = [n for n in self._prices if n != "*" and model.startswith(n)]
            if prefixes:
                found = self._prices[max(prefixes, key=len)]
        if found is None:
            found = self._prices.get("*")
        if len(self._cache) < 1024:  # model names are few; never let odd input grow it
            self._cache[model] = found
        return found

    def cost(self, model: str | None, prompt_tokens: int, completion_tokens: int) -> float:
        """The price of a call to ``model`` (0.0 for an unpriced model)."""
        return self.nanos(model, prompt_tokens, completion_tokens) / NANOS

    def nanos(self, model: str | None, prompt_tokens: int, completion_tokens: int) -> int:
        """:meth:`cost` in integer nano-units."""
        price = self.price(model)
        return 0 if price is None else price.nanos(prompt_tokens, completion_tokens)

    def __bool__(self) -> bool:
        return bool(self._prices)

    def __repr__(self) -> str:
        return f"PriceTable({self._prices!r})"
