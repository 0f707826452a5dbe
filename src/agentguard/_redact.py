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
values, so a proxy that sees a new key per request costs bounded memory. Values registered as
``configured`` (a tier's key, a storage password: what the configuration names, read once) are
kept apart and never forgotten for newer ones; there are as many as the configuration has
(at most :data:`MAX_CONFIGURED_SECRETS`).

Besides values and shapes, :func:`redact` masks the value given to a secret-looking *name* in
free text: ``OPENAI_API_KEY=...``, ``export GITHUB_TOKEN=...``, ``X-Api-Key: ...``,
``"password": "..."``, ``--token ...``, ``aws_secret_access_key ...`` (see :func:`_mask_named`
for what counts). :func:`redact_content` does the same for structured content (message
content, tool arguments and results): the values under secret-looking keys, also inside a
string that holds a JSON object.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_JSON_CHARS",
    "MAX_SECRETS",
    "MIN_SECRET_LENGTH",
    "REDACTED",
    "is_secret_key",
    "redact",
    "redact_content",
    "redact_data",
    "redact_exception",
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
#: How many configured values the registry keeps (tier keys, storage passwords): a bound a
#: configuration never reaches, which only a caller registering per-request values as
#: configured could.
MAX_CONFIGURED_SECRETS = 4096

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
# A parameter whose name ends in a secret word (``subscription-key``, ``auth_token``,
# ``code``, ``sig`` ...): the name is one run of name characters, so each start scans its own
# run once.
_QUERY_SECRET = re.compile(
    r"([?&;][\w.\-]*(?:key|token|secret|password|passwd|pwd|pass|sig|signature|code)=)[^&;#\s]+",
    re.IGNORECASE,
)
# A secret-looking name in free text ends in one of these words (lower case). Names are found
# by plain substring search for :data:`_NAME_HINTS` (most text has none: one ``lower()`` and a
# few ``find`` calls), then checked whole.
_NAME_END = re.compile(
    r"(?:api[_-]?key|(?:secret|private|access|auth|subscription|client|signing|master|account)"
    r"[_-]?key|token|secret|password|passwd|passphrase|credentials?)\Z"
)
# (the test at the start of :func:`_mask_named` spells them out: a tuple loop costs as much as
# the rest of it)
_NAME_HINTS = ("key", "token", "secret", "passw", "passphrase", "credential")
#: A name is at most this long (a longer run of name characters is no name).
_NAME_CHARS_MAX = 128
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
# What follows such a name: a closing quote (a JSON or quoted key), the separator (``=``,
# ``:``, spaces), an opening quote, then the value (to its closing quote, escapes included, or
# one run of characters that are no space, quote or delimiter).
_NAMED_VALUE = re.compile(
    r"""(?P<close>["']?)(?P<sep>[ \t]*[=:][ \t]*|[ \t]+)(?:
        "(?P<dq>(?:[^"\\\n]|\\.){1,1024})"
        | '(?P<sq>[^'\n]{1,1024})'
        | (?P<bare>[^\s'"&;,(){}\[\]<>]+)
    )""",
    re.VERBOSE,
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_RUN = re.compile(r"[A-Za-z0-9_-]*")  # the rest of a run of name characters (always matches)


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

    __slots__ = ("_pattern", "configured", "members", "values")

    def __init__(self, values: tuple[str, ...], configured: tuple[str, ...] = ()) -> None:
        self.values = values  # in registration order: the oldest is forgotten first
        self.configured = configured  # never forgotten for newer values
        self.members = frozenset(values) | frozenset(configured)
        self._pattern: re.Pattern[str] | None = None

    def pattern(self) -> re.Pattern[str] | None:
        """The alternation of every value, longest first (where one secret contains another,
        the whole of it goes); ``None`` when there is none."""
        if self._pattern is None and self.members:
            # two threads may both compile it: the same pattern, either assignment wins
            ordered = sorted(self.members, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered)))
        return self._pattern


_lock = threading.Lock()
_known = _Known(())


def register_secret(value: object, *, configured: bool = False) -> None:
    """Remember a secret's value: from now on :func:`redact` removes it wherever it appears.

    Anything that is not a string of :data:`MIN_SECRET_LENGTH` to :data:`MAX_SECRET_LENGTH`
    characters is ignored, so callers pass what they have (``None``, an unset variable ...).
    Registering a known value again costs one set lookup.

    Args:
        value: the secret.
        configured: a value the configuration names (a tier's key, a storage password), kept
            for as long as the process runs; other values (a caller's key, seen per request)
            are the :data:`MAX_SECRETS` most recent ones.
    """
    global _known  # noqa: PLW0603 - a copy-on-write snapshot, swapped atomically
    if not isinstance(value, str) or not MIN_SECRET_LENGTH <= len(value) <= MAX_SECRET_LENGTH:
        return
    known = _known
    if value in (known.configured if configured else known.members):
        return
    with _lock:
        values, pinned = _known.values, _known.configured
        if configured:
            if value in pinned:
                return
            values = tuple(v for v in values if v != value)
            pinned = (*pinned, value)[-MAX_CONFIGURED_SECRETS:]
        else:
            if value in _known.members:
                return
            values = (*values, value)[-MAX_SECRETS:]
        _known = _Known(values, pinned)


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


def _credential_like(value: str) -> bool:
    """Whether an unquoted value after ``name:`` or ``name value`` looks like a credential, not
    a word of prose or a name in code (``password: Required``, ``token = get_token()``): with
    a digit, or very long."""
    return len(value) >= 20 or (len(value) >= 8 and any(c.isdigit() for c in value))


def _mask_named(text: str) -> str:
    """``text`` with the value given to each secret-looking name masked.

    A name is one run of letters, digits, ``_`` and ``-`` that ends in a secret word
    (``OPENAI_API_KEY``, ``X-Api-Key``, ``client_secret``, ``--token``; not ``tokens``,
    ``ACCESS_KEY_ID``, ``token_budget``). Its value is masked when it is

    * quoted (``"password": "..."``, ``TOKEN='...'``), or given with ``=`` (``API_KEY=...``,
      ``--token=...``): any value;
    * given after ``:`` or `` = `` unquoted (``X-Api-Key: ...``): a credential-like one (see
      :func:`_credential_like`);
    * given after spaces alone, to a compound name (``aws_secret_access_key ...``,
      ``--password ...``; never a bare ``password`` of prose): a credential-like one.

    Each match of the name's last word reads back over its name once and forward over its
    value once: linear in ``text``; the same text is always masked the same way.
    """
    low = text.lower()
    if not (
        "key" in low
        or "token" in low
        or "secret" in low
        or "passw" in low
        or "passphrase" in low
        or "credential" in low
    ):
        return text
    if len(low) != len(text):  # a letter whose lower case is longer (``İ``): ASCII's only
        low = text.translate(_ASCII_LOWER)
    out: list[str] = []
    done = 0
    for start, end in _names(low):
        if start < done or _NAME_END.search(low, start, end) is None:
            continue
        found = _NAMED_VALUE.match(text, end)
        if found is None:
            continue
        group = "dq" if found["dq"] is not None else "sq" if found["sq"] is not None else "bare"
        value = found[group]
        if value == REDACTED:
            continue
        if group == "bare":
            sep = found["sep"]
            spaced = "=" not in sep and ":" not in sep
            if spaced and not ("_" in low[start:end] or "-" in low[start:end]):
                continue
            if (sep != "=" or found["close"]) and not _credential_like(value):
                continue
        out += (text[done : found.start(group)], REDACTED)
        done = found.end(group)
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _names(low: str) -> list[tuple[int, int]]:
    """The spans of the runs of name characters of ``low`` that hold a hint word, in order.

    Each hint is searched once over the text, and each run read forward once per hint (the
    search goes on from its end) and back no further than :data:`_NAME_CHARS_MAX`: linear in
    ``low``."""
    spans: set[tuple[int, int]] = set()
    for hint in _NAME_HINTS:
        at = low.find(hint)
        while at != -1:
            end = _RUN.match(low, at + len(hint)).end()  # type: ignore[union-attr]
            start = at
            while start > 0 and at - start <= _NAME_CHARS_MAX and low[start - 1] in _NAME_CHARS:
                start -= 1
            if end - start <= _NAME_CHARS_MAX:
                spans.add((start, end))
            at = low.find(hint, end)
    return sorted(spans)


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
    return _mask_named(text)


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


#: A string is read as JSON (for the keys of its object) up to this many characters; a longer
#: one is redacted as text.
MAX_JSON_CHARS = 65_536
_DEPTH = 32


def redact_content(value: Any, depth: int = 0) -> Any:
    """Message content, tool arguments or results with their secrets masked: every string
    through :func:`redact`, the value under a secret-looking key (``password``, ``api_key``,
    ``client_secret``: see :func:`is_secret_key`) replaced by ``***`` whole, and the same
    inside a string that holds a JSON object or array (a tool call's ``arguments``, a tool
    result), which is then written again (``json.dumps``) only where a key was masked.

    Mappings and lists are copied, other values returned as they are; each string is parsed at
    most once (none longer than :data:`MAX_JSON_CHARS`): linear in the content's size.
    """
    if isinstance(value, str):
        return _redact_json_text(value, depth)
    if depth >= _DEPTH:
        return redact_data(value)
    if isinstance(value, Mapping):
        return {
            k: REDACTED if is_secret_key(str(k)) else redact_content(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_content(v, depth + 1) for v in value]
    return value


def _redact_json_text(text: str, depth: int) -> str:
    head = text.lstrip()[:1]
    if head in ("{", "[") and len(text) <= MAX_JSON_CHARS and depth < _DEPTH:
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, (dict, list)):
            masked = _keys_masked(parsed, depth)
            if masked != parsed:
                return redact(json.dumps(masked, ensure_ascii=False))
    return redact(text)


def _keys_masked(value: Any, depth: int) -> Any:
    """``value`` (parsed JSON) with the values under secret-looking keys masked."""
    if depth >= _DEPTH:
        return value
    if isinstance(value, dict):
        return {
            k: REDACTED if is_secret_key(str(k)) else _keys_masked(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_keys_masked(v, depth + 1) for v in value]
    return value


def redact_exception(exc: BaseException) -> None:
    """Redact, in place, the text of ``exc`` and of the errors chained to it (``__cause__``,
    ``__context__``, a few links): the string ``args`` a traceback prints, and a ``message``
    attribute (the openai SDK's). An upstream error's message is the upstream's body, which may
    echo the key the guard sent (a tier's key): chained to the guard's own error, every
    ``logger.exception`` and error tracker would print it. Type, status, response and body
    stay as they are (what code reads from the error)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 8 and not any(current is s for s in seen):
        seen.append(current)
        args = tuple(redact(a) if isinstance(a, str) else a for a in current.args)
        if args != current.args:
            current.args = args
        message = getattr(current, "message", None)
        if isinstance(message, str):
            shown = redact(message)
            if shown != message:
                with contextlib.suppress(AttributeError, TypeError):
                    current.message = shown  # type: ignore[attr-defined]
        current = current.__cause__ or current.__context__
