"""``agentguard.wrap``: the drop-in guard for an openai client."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

from agentguard._exports import publish

from .config import GuardConfig

__all__ = ["wrap"]

C = TypeVar("C")


def wrap(
    client: C,
    config: GuardConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    **options: Any,
) -> C:
    """Put the whole guard in front of an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client.

    Returns a copy of ``client`` — still an instance of its class — whose
    ``chat.completions.create`` (also with ``stream=True``) runs through the pipeline: loop
    checks, validation with repair and corrective re-asks, budgets, the one retry layer (the
    client's own ``max_retries`` is forced to 0) and escalation across ``config.tiers``. Copies
    made with ``with_options()`` / ``copy()`` stay guarded; everything else passes through.
    ``agentguard.report_of(response)`` tells what the guard did.

    Args:
        client: an openai 2.x or 3.x client, sync or async (subclasses such as
            ``AzureOpenAI`` included).
        config: a :class:`GuardConfig` (used as it is), a dict (the ``reliability:`` block, with
            or without that key) or the path of a YAML/TOML/JSON file. ``None`` reads the file
            named by ``AGENTGUARD_CONFIG``, else the defaults. Dicts, files and ``None`` get the
            ``AGENTGUARD_*`` environment overrides — exactly as the LiteLLM proxy handler does
            (both call :meth:`GuardConfig.load`).
        **options: passed to :class:`~agentguard.Guard` / :class:`~agentguard.AsyncGuard`
            (``ledger``, ``probe``, ``confirm``, ``clock``, ``sleep``, ``rng``, ``hooks``).

    Raises:
        ImportError: the openai package is not installed (``pip install "agentguard[openai]"``).
        TypeError: ``client`` is not an openai client, or ``config`` is none of the above.
        ConfigError: the configuration is invalid.
    """
    from .integrations._lazy import require  # noqa: PLC0415 - the SDK is optional
    from .integrations.openai import wrap as wrap_openai  # noqa: PLC0415

    openai = require("openai", "openai")
    if not isinstance(client, (openai.OpenAI, openai.AsyncOpenAI)):
        kind = type(client)
        raise TypeError(
            "agentguard.wrap() takes an openai.OpenAI or openai.AsyncOpenAI client, not "
            f"{kind.__module__}.{kind.__qualname__}; for LiteLLM use "
            "agentguard.integrations.litellm.register(), for other frameworks see "
            "docs/integrations/, and for any other model API build an agentguard.Guard over "
            "a transport"
        )
    wrapped: C = wrap_openai(client, GuardConfig.load(config), **options)
    return wrapped


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
