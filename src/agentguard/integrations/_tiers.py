"""What adapters share about tiers: reading a tier's key from the environment it names, and a
chain of the framework's own model objects as configured tiers."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from agentguard.config import GuardConfig
from agentguard.exceptions import ConfigError
from agentguard.transport import register_secret
from agentguard.types import Tier


def tier_api_key(tier: Tier) -> str | None:
    """The key of ``tier`` from its ``api_key_env``; ``None`` when it names none.

    Raises:
        ConfigError: the variable it names is unset or empty (the key itself is never shown).
    """
    if not tier.api_key_env:
        return None
    value = os.environ.get(tier.api_key_env)
    if not value:
        raise ConfigError(
            [
                {
                    "path": f"reliability.tiers.{tier.name}.api_key_env",
                    "value": tier.api_key_env,
                    "allowed": "the name of a set environment variable holding the tier's API key",
                }
            ]
        )
    register_secret(value, configured=True)  # sent upstream: an error echoing it is redacted
    return value


#: The key a tier at another origin is sent when it names none of its own: the client's key was
#: given for the client's endpoint, never for another (servers that need no key ignore it).
NO_KEY = "agentguard-tier-without-key"


def origin(url: object) -> tuple[str, str, int | None]:
    """Where a URL's requests go (a string or an ``httpx.URL``): scheme, host and port, the
    default port spelled out. A tier at another origin than the caller's endpoint never gets the
    caller's credentials."""
    parts = urlsplit(str(url))
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # not a port: no origin to share
        port = -1
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def with_tier_chain(config: GuardConfig, models: Mapping[str, str]) -> GuardConfig:
    """``config`` with ``models`` (tier name -> model name, weakest first) as its tiers and its
    escalation chain: for adapters given model objects by tier rather than configured tiers."""
    data = config.model_dump()
    data["tiers"] = {name: {"model": model} for name, model in models.items()}
    data["escalation"]["chain"] = list(models)
    return GuardConfig.model_validate(data)


def primary_chain(
    config: GuardConfig, primary: str, models: Mapping[str, str]
) -> tuple[GuardConfig, str | None]:
    """For an adapter given stronger models by tier name: with ``models`` and no tiers in
    ``config``, ``config`` whose chain is ``primary`` (the model name of the framework's own
    model) then ``models``, and the first tier's name (``"primary"``); else ``(config, None)``."""
    if not models or config.tiers:
        return config, None
    return with_tier_chain(config, {"primary": primary, **models}), "primary"
