"""Keeping secrets out of logs, events, reports and exception text.

:func:`redact` is the one gate text passes on its way out of the guard (events and the logs made
from them, reports, exception messages, error classifications, ``config show``). It removes
secrets two ways:

* **by value**: every secret the guard knows is registered with :func:`register_secret` (a
  tier's API key read from the variable its ``api_key_env`` names, the wrapped client's key, a
  storage URL's password, the value of a credential header of a request the guard sends) and
  removed wherever it appears, whatever it looks like. An upstream that echoes a key in an error
  body cannot make the guard repeat it;
* **by pattern**: secrets the guard was never told about but that look like one (``sk-...``
  provider keys, bearer credentials, the password of a URL, ``?password=`` query values).

The registry is process-wide and copy-on-write: registering swaps one immutable snapshot (its
values and one compiled alternation) under a lock, and :func:`redact` reads the snapshot
without one. Values shorter than :data:`MIN_SECRET_LENGTH` are not registered (they would
redact common words); the registry keeps the :data:`MAX_SECRETS` most recently registered
values, so a proxy that sees a new key per request costs bounded memory.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_SECRETS",
    "MIN_SECRET_LENGTH",
    "REDACTED",
    "is_secret_key",
    "redact",
    "redact_data",
    "register_credentials",
    "register_secret",
]

REDACTED = "***"
#: Shorter values are not registered: redacting them would mangle ordinary words.
MIN_SECRET_LENGTH = 8
#: Longer values are not registered (no credential is that long; it bounds the regex).
MAX_SECRET_LENGTH = 4096
#: How many values the registry keeps (the oldest registered is forgotten first).
MAX_SECRETS = 256

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
# The user-info of a URL (``redis://user:password@host``): searched from the literal "://" and
# one run of characters, so a long text without "@" costs linear time.
_URL_USERINFO = re.compile(r"://([^\s/@]+)@")
# Credentials in a query string (``?password=...``, ``&api_key=...``).
_QUERY_SECRET = re.compile(
    r"([?&;](?:password|passwd|pwd|pass|secret|token|access_token|api[_-]?key|key)=)[^&;#\s]+",
    re.IGNORECASE,
)


def _mask_userinfo(match: re.Match[str]) -> str:
    # keep the user name (who), hide the password (``user:pw`` -> ``user:***``); user-info
    # without a colon is often a token on its own (``https://TOKEN@host``): hidden whole
    user, colon, _ = match.group(1).partition(":")
    return f"://{user}:{REDACTED}@" if colon else f"://{REDACTED}@"


class _Known:
    """One immutable snapshot of the registered values and the pattern that finds them.

    The pattern is compiled on first use, not on registration: compiling an alternation of
    hundreds of values takes milliseconds, and a proxy registering a new caller's key on the
    request path should not pay it (several new keys between two redactions cost one compile).
    """

    __slots__ = ("_pattern", "members", "values")

    def __init__(self, values: tuple[str, ...]) -> None:
        self.values = values  # in registration order: the oldest is forgotten first
        self.members = frozenset(values)
        self._pattern: re.Pattern[str] | None = None

    def pattern(self) -> re.Pattern[str] | None:
        """The alternation of every value, longest first (where one secret contains another,
        the whole of it goes); ``None`` when there is none."""
        if self._pattern is None and self.values:
            # two threads may both compile it: the same pattern, either assignment wins
            ordered = sorted(self.values, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered)))
        return self._pattern


_lock = threading.Lock()
_known = _Known(())


def register_secret(value: object) -> None:
    """Remember a secret's value: from now on :func:`redact` removes it wherever it appears.

    Anything that is not a string of :data:`MIN_SECRET_LENGTH` to :data:`MAX_SECRET_LENGTH`
    characters is ignored, so callers pass what they have (``None``, an unset variable ...).
    Registering a known value again costs one set lookup.
    """
    global _known  # noqa: PLW0603 - a copy-on-write snapshot, swapped atomically
    if not isinstance(value, str) or not MIN_SECRET_LENGTH <= len(value) <= MAX_SECRET_LENGTH:
        return
    if value in _known.members:
        return
    with _lock:
        values = _known.values
        if value in _known.members:
            return
        values = (*values, value)[-MAX_SECRETS:]
        _known = _Known(values)


def register_credentials(headers: Mapping[str, Any] | None) -> None:
    """Register the values of the credential headers in ``headers`` (``Authorization``,
    ``api-key``, ``x-api-key`` ...), and the token of an ``Authorization: <scheme> <token>``."""
    if not headers:
        return
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or not is_secret_key(name):
            continue
        register_secret(value)
        _, space, token = value.strip().rpartition(" ")
        if space:
            register_secret(token)


def is_secret_key(key: str) -> bool:
    """Whether a key name (``api_key``, ``Authorization`` ...) holds a secret value."""
    # ``api_key_env`` names an environment variable, it is not the secret itself.
    return bool(_SECRET_KEY.search(key)) and not key.lower().endswith("_env")


def redact(text: str) -> str:
    """``text`` without the registered secrets and without secret-looking values (``***``)."""
    pattern = _known.pattern()
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    text = _SECRET_VALUE.sub(REDACTED, text)
    if "://" in text:
        text = _URL_USERINFO.sub(_mask_userinfo, text)
    if "=" in text:
        text = _QUERY_SECRET.sub(rf"\1{REDACTED}", text)
    return text


def redact_data(value: Any) -> Any:
    """Plain data (mappings, lists, strings) with every string passed through :func:`redact`.

    For data the guard shows whole (``agentguard config show``); mappings and lists are copied,
    other values returned as they are.
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_data(v) for v in value]
    return value
