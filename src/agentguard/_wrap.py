"""``agentguard.wrap``: the drop-in guard for an openai client."""

from __future__ import annotations

from typing import Any, TypeVar

from agentguard._exports import publish

from .config import GuardConfig

__all__ = ["wrap"]

C = TypeVar("C")


def wrap(client: C, config: GuardConfig | None = None, **options: Any) -> C:
    """Put the whole guard in front of an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client.

    Returns a copy of ``client`` — still an instance of its class — whose
    ``chat.completions.create`` (also with ``stream=True``) runs through the pipeline: loop
    checks, validation with repair and corrective re-asks, budgets, the one retry layer (the
    client's own ``max_retries`` is forced to 0) and escalation across ``config.tiers``. Copies
    made with ``with_options()`` / ``copy()`` stay guarded; everything else passes through.
    ``agentguard.report_of(response)`` tells what the guard did.

    Args:
        client: an openai 2.x or 3.x client, sync or async.
        config: the configuration (defaults when ``None``).
        **options: passed to :class:`~agentguard.Guard` / :class:`~agentguard.AsyncGuard`
            (``ledger``, ``probe``, ``confirm``, ``clock``, ``sleep``, ``rng``, ``hooks``).

    Raises:
        ImportError: the openai package is not installed (``pip install "agentguard[openai]"``).
    """
    from .integrations.openai import wrap as wrap_openai  # noqa: PLC0415 - the SDK is optional

    wrapped: C = wrap_openai(client, config, **options)
    return wrapped


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
