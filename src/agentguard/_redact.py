"""Keeping secrets out of logs, events, reports and exception text."""

from __future__ import annotations

import re

__all__ = ["REDACTED", "is_secret_key", "redact"]

REDACTED = "***"

# Key names whose values are secrets, wherever they appear (config keys, headers, kwargs).
_SECRET_KEY = re.compile(
    r"(api[_-]?key|secret|token(?!s)|password|passwd|authorization|auth[_-]?header|credential|bearer)",
    re.IGNORECASE,
)
# Secret-looking values: provider keys and bearer credentials.
_SECRET_VALUE = re.compile(
    r"""
    (?:\b(?:sk|pk|rk|ak)-[A-Za-z0-9_\-]{8,})       # sk-..., sk-proj-..., OpenRouter sk-or-...
    | (?:\bBearer\s+[A-Za-z0-9._~+/\-]{8,}=*)        # Authorization: Bearer ...
    | (?:\b(?:ghp|gho|ghs|github_pat|xox[abp])_[A-Za-z0-9_]{10,})
    | (?:\bAIza[0-9A-Za-z_\-]{20,})                  # Google API keys
    """,
    re.VERBOSE,
)


def is_secret_key(key: str) -> bool:
    """Whether a key name (``api_key``, ``Authorization`` ...) holds a secret value."""
    # ``api_key_env`` names an environment variable, it is not the secret itself.
    return bool(_SECRET_KEY.search(key)) and not key.lower().endswith("_env")


def redact(text: str) -> str:
    """``text`` with every secret-looking value replaced by ``***``."""
    return _SECRET_VALUE.sub(REDACTED, text)
