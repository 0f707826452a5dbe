"""Error classification: what kind of failure an exception is, and whether retrying can help.

Understands, without importing any of them: ``TimeoutError`` / ``asyncio.TimeoutError``,
``ConnectionError`` / ``OSError``, httpx and httpx2 exceptions, openai's exceptions, and anything
with a ``status_code`` or ``response.status_code`` attribute. ``Retry-After`` (seconds or an
HTTP date) and ``retry-after-ms`` are read from ``exc.response.headers``, and so is
``x-should-retry``: a server (or a proxy that spent its own retries) saying ``false`` makes an
error status not retryable, ``true`` makes it retryable, its class kept either way (the openai
and Anthropic SDKs obey it the same way).

An error the upstream reported *inside* a 200 answer — a stream's error event after its head
went out, which the openai client raises as ``APIError`` with the event's ``error`` object as
``body`` — has no status: it is classified by that object's ``code`` when it is an HTTP status
(OpenRouter's ``{"code": 502}``), else by its ``type`` or ``code`` name (OpenAI's
``server_error``, Anthropic's ``overloaded_error``, ``rate_limit_error``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentguard._redact import redact

__all__ = [
    "Classification",
    "Classifier",
    "ErrorClass",
    "classify",
    "inband_status",
    "retry_after_of",
    "unanswered",
]


class ErrorClass(str, enum.Enum):
    """The kinds of failure, each with its own recovery."""

    TRANSIENT = "transient"  # 5xx, connection reset: retry with backoff
    RATE_LIMITED = "rate_limited"  # 429: retry after Retry-After
    TIMEOUT = "timeout"  # no answer in time: retry, then move on
    CLIENT_ERROR = "client_error"  # 4xx (or no answer: a redirect): the request's; never retried
    SCHEMA = "schema"  # the answer does not match what was expected
    PERMANENT = "permanent"  # anything else: not retried
    CANCELLED = "cancelled"  # cancellation / interrupt: never swallowed, never counted


_RETRYABLE = {ErrorClass.TRANSIENT, ErrorClass.RATE_LIMITED, ErrorClass.TIMEOUT}


@dataclass(frozen=True, slots=True)
class Classification:
    """What an exception means.

    Attributes:
        error_class: the kind of failure.
        retryable: whether trying again can help.
        retry_after: seconds the server asked to wait, or ``None``.
        status_code: the HTTP status, when there was one.
        reason: a short, redacted description.
    """

    error_class: ErrorClass
    retryable: bool
    retry_after: float | None = None
    status_code: int | None = None
    reason: str = ""

    @classmethod
    def of(
        cls,
        error_class: ErrorClass,
        *,
        retry_after: float | None = None,
        status_code: int | None = None,
        reason: str = "",
    ) -> Classification:
        """A classification whose ``retryable`` follows from its class."""
        return cls(error_class, error_class in _RETRYABLE, retry_after, status_code, reason)


#: A classifier returns a Classification, or None to let the next one decide.
Classifier = Callable[[BaseException], "Classification | None"]

_TIMEOUT_NAMES = {
    "TimeoutError",  # also asyncio.TimeoutError, a separate class before Python 3.11
    "TimeoutException",
    "ConnectTimeout",
    "ReadTimeout",
    "WriteTimeout",
    "PoolTimeout",
    "APITimeoutError",
    "Timeout",
}
_CONNECTION_NAMES = {
    "ConnectError",
    "RemoteProtocolError",
    "ReadError",
    "WriteError",
    "NetworkError",
    "APIConnectionError",
    "ProtocolError",
}

#: Failures that say the request never reached the upstream: no connection was made (refused,
#: no route, a name that does not resolve, TLS refused), none was free, or the URL was unusable.
_NEVER_SENT_NAMES = {
    "ConnectError",
    "ConnectTimeout",
    "PoolTimeout",
    "ConnectionRefusedError",
    "gaierror",
    "UnsupportedProtocol",
    "InvalidURL",
    "ProxyError",
    "SSLError",
    "SSLCertVerificationError",
}


#: In-band error names (an error object's ``type`` or ``code``) and what they are.
_INBAND = {
    "server_error": ErrorClass.TRANSIENT,
    "internal_error": ErrorClass.TRANSIENT,
    "internal_server_error": ErrorClass.TRANSIENT,
    "api_error": ErrorClass.TRANSIENT,
    "overloaded_error": ErrorClass.TRANSIENT,
    "service_unavailable": ErrorClass.TRANSIENT,
    "service_unavailable_error": ErrorClass.TRANSIENT,
    "rate_limit_error": ErrorClass.RATE_LIMITED,
    "rate_limit_exceeded": ErrorClass.RATE_LIMITED,
    "timeout": ErrorClass.TIMEOUT,
    "timeout_error": ErrorClass.TIMEOUT,
    "vector_store_timeout": ErrorClass.TIMEOUT,  # a failed Responses answer's code
}


def _inband(exc: BaseException) -> tuple[int | None, ErrorClass | None]:
    """The HTTP status an in-band error object (``exc.body``) names by its ``code``, or what
    its name says."""
    body = getattr(exc, "body", None)
    return _inband_error(body) if isinstance(body, Mapping) else (None, None)


def _inband_error(error: Mapping[str, Any]) -> tuple[int | None, ErrorClass | None]:
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, str) and len(code) == 3 and code.isdigit():  # "502", never 5,000 digits
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code, None
    for name in (kind, code):
        if isinstance(name, str) and name.lower() in _INBAND:
            return None, _INBAND[name.lower()]
    return None, None


#: The status that stands for an in-band error known by its name.
_STATUS_OF_CLASS = {
    ErrorClass.TRANSIENT: 502,
    ErrorClass.RATE_LIMITED: 429,
    ErrorClass.TIMEOUT: 504,
}


def inband_status(error: Mapping[str, Any]) -> int:
    """The HTTP status that answers an error an upstream reported inside a 200 answer (its
    ``error`` object): the status its ``code`` names, else the one its name stands for (a rate
    limit 429, a timeout 504), else 502 (the upstream failed)."""
    status, named = _inband_error(error)
    if status is not None:
        return status
    return _STATUS_OF_CLASS.get(named, 502) if named is not None else 502


def _status_of(exc: BaseException) -> int | None:
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def retry_after_of(exc: BaseException, *, now: float | None = None) -> float | None:
    """Seconds to wait that the server asked for (``retry-after-ms``, then ``Retry-After``).

    Args:
        exc: the exception; the headers of its ``response`` are read, else (when they ask for
            no wait) the upstream's headers litellm keeps in ``litellm_response_headers`` (its
            exceptions' ``response`` is a stand-in that may have none).
        now: wall-clock seconds, needed only to turn an HTTP-date ``Retry-After`` into a delay.
    """
    for headers in (
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "litellm_response_headers", None),
    ):
        readable = isinstance(headers, Mapping) or hasattr(headers, "get")
        if readable and any(_header(headers, name) is not None for name in _RETRY_HEADERS):
            return _retry_after(headers, now)
    return None


_RETRY_HEADERS = ("retry-after-ms", "retry-after")


def _retry_after(headers: Any, now: float | None) -> float | None:
    """The wait ``headers`` ask for (see :func:`retry_after_of`)."""
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = _header(headers, "retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if now is None:
        return None
    return max(0.0, when.timestamp() - now)


def _should_retry(exc: BaseException) -> bool | None:
    """What the error's ``x-should-retry`` header says (``None``: it says nothing)."""
    for headers in (
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "litellm_response_headers", None),
    ):
        if headers is None:
            continue
        value = _header(headers, "x-should-retry")
        if value is not None:
            answer = value.strip().lower()
            return True if answer == "true" else (False if answer == "false" else None)
    return None


def _header(headers: Any, name: str) -> str | None:
    try:
        value = headers.get(name)
        if value is None:
            value = headers.get(name.title())
    except Exception:  # exotic header containers
        return None
    return None if value is None else str(value)


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def classify(
    exc: BaseException,
    *,
    classifiers: tuple[Classifier, ...] = (),
    retry_conflict: bool = False,
    now: float | None = None,
) -> Classification:
    """Classify ``exc``; user ``classifiers`` are asked first, the built-in rules last.

    Args:
        exc: the exception.
        classifiers: functions returning a Classification, or ``None`` to fall through.
        retry_conflict: treat HTTP 409 as transient (some APIs use it for "try again").
        now: wall-clock seconds, to read HTTP-date ``Retry-After`` headers (without it, such a
            header asks for no wait).
    """
    for classifier in classifiers:
        result = classifier(exc)
        if result is not None:
            # a caller's classifier may quote the upstream's text: it leaves the guard (attempt
            # history, events) redacted like the built-in reasons
            if result.reason:
                result = dataclasses.replace(result, reason=redact(result.reason))
            return result
    reason = redact(f"{type(exc).__name__}: {exc}")[:200]
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)):
        return Classification.of(ErrorClass.CANCELLED, reason=type(exc).__name__)
    names = _names(exc)
    status = _status_of(exc)
    retry_after = retry_after_of(exc, now=now)
    if status is None:
        status, named = _inband(exc)
        if named is not None:
            return Classification.of(named, reason=reason)
    if status is not None:
        if status == 429:
            cls = ErrorClass.RATE_LIMITED
        elif status in (408, 425) or status >= 500 or (status == 409 and retry_conflict):
            cls = ErrorClass.TIMEOUT if status in (408, 504) else ErrorClass.TRANSIENT
        elif status < 500:
            # a 4xx, or an answer that is none (a redirect, a 2xx the guard cannot read: an
            # endpoint misconfigured, a server ignoring "stream"): the request's, never retried
            # and never held against the tier's breaker
            cls = ErrorClass.CLIENT_ERROR
        else:
            cls = ErrorClass.PERMANENT
        found = Classification.of(cls, retry_after=retry_after, status_code=status, reason=reason)
        # the server's word on retrying wins, as in the SDKs whose retries the guard replaces: a
        # proxy that spent its own retries says "false" so that clients do not multiply them
        obey = _should_retry(exc)
        if obey is not None and obey != found.retryable:
            found = dataclasses.replace(found, retryable=obey)
        return found
    if isinstance(exc, TimeoutError) or names & _TIMEOUT_NAMES:
        return Classification.of(ErrorClass.TIMEOUT, reason=reason)
    if isinstance(exc, ConnectionError) or names & _CONNECTION_NAMES:
        return Classification.of(ErrorClass.TRANSIENT, reason=reason)
    if isinstance(exc, OSError):
        return Classification.of(ErrorClass.TRANSIENT, reason=reason)
    if "ValidationError" in names or "SchemaError" in names:
        return Classification.of(ErrorClass.SCHEMA, reason=reason)
    return Classification.of(ErrorClass.PERMANENT, reason=reason)


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` says the request reached its upstream and no answer came back: a read
    timed out, or the connection was lost after the request went out (``ReadTimeout``,
    ``RemoteProtocolError``, ``ReadError``, a bare ``TimeoutError`` or ``ConnectionError``) —
    not an error status (the upstream answered), nor a connection never made (``ConnectError``,
    ``ConnectTimeout``, ``PoolTimeout``), anywhere in the exception's chain.

    The upstream may have read the prompt and gone on writing the answer, and bills it: the
    guard charges such a call what it held for it (see ``docs/budgets.md``).
    """
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 8 and not any(current is s for s in seen):
        seen.append(current)
        if _status_of(current) is not None or _inband(current) != (None, None):
            return False  # the upstream answered (an error status, an error in its body)
        if _names(current) & _NEVER_SENT_NAMES:
            return False
        current = current.__cause__ or current.__context__
    names: set[str] = set()
    for link in seen:
        names |= _names(link)
    return bool(
        any(isinstance(link, (TimeoutError, ConnectionError)) for link in seen)
        or names & (_TIMEOUT_NAMES | _CONNECTION_NAMES)
    )
