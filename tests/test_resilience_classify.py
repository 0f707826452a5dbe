"""Error classification over real exception classes (httpx, httpx2, openai) and plain ones."""

from __future__ import annotations

import asyncio
from importlib import import_module
from typing import Any

import pytest

from agentguard.exceptions import ModelError, ModelTimeout
from agentguard.resilience import Classification, ErrorClass, classify, retry_after_of
from agentguard.resilience._classify import unanswered


def _lib(name: str) -> Any:
    return pytest.importorskip(name)


@pytest.mark.parametrize("lib", ["httpx", "httpx2"])
def test_http_library_errors(lib: str) -> None:
    """Timeouts, connection errors and status errors of httpx and httpx2 are classified."""
    http = _lib(lib)
    request = http.Request("POST", "http://model.invalid/v1/chat/completions")
    assert classify(http.ReadTimeout("slow", request=request)).error_class == ErrorClass.TIMEOUT
    assert classify(http.ConnectTimeout("slow", request=request)).error_class == ErrorClass.TIMEOUT
    refused = http.ConnectError("refused", request=request)
    assert classify(refused).error_class == ErrorClass.TRANSIENT
    response = http.Response(429, headers={"Retry-After": "3"}, request=request)
    status = http.HTTPStatusError("429", request=request, response=response)
    result = classify(status)
    assert result.error_class == ErrorClass.RATE_LIMITED
    assert (result.retry_after, result.status_code) == (3.0, 429)


def _openai_status(openai: Any, http: Any, status: int, headers: Any = None) -> Any:
    request = http.Request("POST", "http://model.invalid/v1/chat/completions")
    body = {"error": {"message": "x"}}
    response = http.Response(status, headers=headers or {}, request=request, json=body)
    cls = {
        429: openai.RateLimitError,
        500: openai.InternalServerError,
        401: openai.AuthenticationError,
        404: openai.NotFoundError,
        400: openai.BadRequestError,
    }[status]
    return cls("x", response=response, body=None)


def test_openai_errors() -> None:
    """openai's own exceptions, with their real responses, map to the right classes."""
    openai = _lib("openai")
    http = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
    limited = classify(_openai_status(openai, http, 429, {"retry-after-ms": "1500"}))
    assert (limited.error_class, limited.retry_after) == (ErrorClass.RATE_LIMITED, 1.5)
    assert classify(_openai_status(openai, http, 500)).error_class == ErrorClass.TRANSIENT
    for status in (400, 401, 404):
        result = classify(_openai_status(openai, http, status))
        assert result.error_class == ErrorClass.CLIENT_ERROR
        assert not result.retryable
    request = http.Request("POST", "http://model.invalid/v1")
    assert classify(openai.APITimeoutError(request=request)).error_class == ErrorClass.TIMEOUT
    assert classify(openai.APIConnectionError(request=request)).error_class == ErrorClass.TRANSIENT


@pytest.mark.parametrize(
    ("error", "expected", "status"),
    [
        ({"message": "Provider returned error", "code": 502}, ErrorClass.TRANSIENT, 502),
        ({"message": "slow", "code": "504"}, ErrorClass.TIMEOUT, 504),
        ({"message": "limited", "code": 429}, ErrorClass.RATE_LIMITED, 429),
        ({"type": "overloaded_error", "message": "Overloaded"}, ErrorClass.TRANSIENT, None),
        ({"type": "server_error", "code": None, "message": "x"}, ErrorClass.TRANSIENT, None),
        (
            {"type": "tokens", "code": "rate_limit_exceeded", "message": "x"},
            ErrorClass.RATE_LIMITED,
            None,
        ),
        ({"type": "invalid_request_error", "code": "bad"}, ErrorClass.PERMANENT, None),
        ({"message": "no code"}, ErrorClass.PERMANENT, None),
        ({"message": "hostile", "code": "9" * 5000}, ErrorClass.PERMANENT, None),
    ],
)
def test_an_error_reported_inside_a_200_answer(
    error: dict[str, Any], expected: ErrorClass, status: int | None
) -> None:
    """A stream's error event, as the openai client raises it (``APIError`` with the event's
    error object as ``body``, no status): classified by the object's code or type."""
    openai = _lib("openai")
    http = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
    request = http.Request("POST", "http://model.invalid/v1/chat/completions")
    result = classify(openai.APIError(str(error.get("message")), request, body=error))
    assert (result.error_class, result.status_code) == (expected, status)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TimeoutError(), ErrorClass.TIMEOUT),
        (asyncio.TimeoutError(), ErrorClass.TIMEOUT),
        (ConnectionResetError(), ErrorClass.TRANSIENT),
        (OSError("disk"), ErrorClass.TRANSIENT),
        (ValueError("bad"), ErrorClass.PERMANENT),
        (asyncio.CancelledError(), ErrorClass.CANCELLED),
        (KeyboardInterrupt(), ErrorClass.CANCELLED),
        (ModelTimeout("slow"), ErrorClass.TIMEOUT),
        (ModelError("x", status_code=503), ErrorClass.TRANSIENT),
        (ModelError("x", status_code=504), ErrorClass.TIMEOUT),
        (ModelError("x", status_code=408), ErrorClass.TIMEOUT),
        (ModelError("x", status_code=422), ErrorClass.CLIENT_ERROR),
        # an answer that is none (a redirect, a 2xx the guard cannot read): the request's
        (ModelError("x", status_code=301), ErrorClass.CLIENT_ERROR),
        (ModelError("x", status_code=200), ErrorClass.CLIENT_ERROR),
    ],
)
def test_plain_exceptions(exc: BaseException, expected: ErrorClass) -> None:
    """Standard and agentguard exceptions are classified without any SDK."""
    assert classify(exc).error_class == expected


def test_conflict_is_configurable() -> None:
    """409 is a client error unless the caller says it means "try again"."""
    exc = ModelError("busy", status_code=409)
    assert classify(exc).error_class == ErrorClass.CLIENT_ERROR
    assert classify(exc, retry_conflict=True).error_class == ErrorClass.TRANSIENT


def test_status_on_response_attribute() -> None:
    """A status on exc.response.status_code is found too."""

    class Resp:
        status_code = 502

        def __init__(self) -> None:
            self.headers = {"retry-after": "2"}

    class Custom(Exception):
        response = Resp()

    result = classify(Custom())
    assert (result.error_class, result.retry_after) == (ErrorClass.TRANSIENT, 2.0)


def test_retry_after_http_date() -> None:
    """An HTTP-date Retry-After becomes a delay relative to now."""
    exc = ModelError("x", status_code=429, headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert retry_after_of(exc, now=1445412470.0) == pytest.approx(10.0)
    assert retry_after_of(exc) is None  # no clock, no guess
    bad = ModelError("x", status_code=429, headers={"retry-after": "soon"})
    assert retry_after_of(bad) is None


@pytest.mark.parametrize(
    ("status", "header", "kind", "retryable"),
    [
        (500, "false", ErrorClass.TRANSIENT, False),
        (503, " False ", ErrorClass.TRANSIENT, False),
        (429, "false", ErrorClass.RATE_LIMITED, False),
        (400, "true", ErrorClass.CLIENT_ERROR, True),
        (409, "true", ErrorClass.CLIENT_ERROR, True),
        (500, "true", ErrorClass.TRANSIENT, True),
        (500, "maybe", ErrorClass.TRANSIENT, True),  # neither word: the status decides
        (400, "", ErrorClass.CLIENT_ERROR, False),
    ],
)
def test_x_should_retry_decides_retrying_and_keeps_the_class(
    status: int, header: str, kind: ErrorClass, retryable: bool
) -> None:
    """The server's (or its proxy's) ``x-should-retry`` wins over the status, as in the openai
    SDK: ``false`` once a proxy spent its own retries; the class stays, so the error still
    escalates and counts against the tier as before."""
    result = classify(ModelError("x", status_code=status, headers={"x-should-retry": header}))
    assert (result.error_class, result.retryable, result.status_code) == (kind, retryable, status)


def test_x_should_retry_on_the_response_and_of_litellm_errors() -> None:
    """Read from ``exc.response.headers`` (the openai and httpx errors), and from the upstream
    headers litellm keeps; a user's classifier still decides first."""

    class Resp:
        status_code = 502

        def __init__(self) -> None:
            self.headers = {"X-Should-Retry": "false"}

    class Proxied(Exception):
        response = Resp()

    class LiteLLMError(Exception):
        status_code = 500

        def __init__(self) -> None:
            self.litellm_response_headers = {"x-should-retry": "false"}

    assert not classify(Proxied()).retryable
    assert not classify(LiteLLMError()).retryable
    mine = Classification.of(ErrorClass.TRANSIENT, reason="mine")
    assert classify(Proxied(), classifiers=(lambda exc: mine,)).retryable


def test_retry_after_of_litellm_errors() -> None:
    """litellm's exceptions keep the upstream's headers in `litellm_response_headers` (their
    `response` is a stand-in): read when the response's own headers ask for no wait."""

    class Resp:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = headers

    class LiteLLMError(Exception):
        def __init__(self, own: dict[str, str], upstream: dict[str, str]) -> None:
            self.response = Resp(own)
            self.litellm_response_headers = upstream

    assert retry_after_of(LiteLLMError({}, {"retry-after": "7"})) == 7.0
    assert retry_after_of(LiteLLMError({}, {"retry-after-ms": "1500"})) == 1.5
    assert retry_after_of(LiteLLMError({"retry-after": "2"}, {"retry-after": "7"})) == 2.0
    assert retry_after_of(LiteLLMError({}, {})) is None


def test_user_classifier_goes_first_and_may_fall_through() -> None:
    """Custom classifiers decide first; None lets the built-in rules decide."""

    def quota(exc: BaseException) -> Classification | None:
        if "quota" in str(exc):
            return Classification.of(ErrorClass.PERMANENT, reason="quota exhausted")
        return None

    quota_hit = classify(ModelError("quota", status_code=429), classifiers=(quota,))
    assert quota_hit.error_class == ErrorClass.PERMANENT
    other = classify(ModelError("x", status_code=429), classifiers=(quota,))
    assert other.error_class == ErrorClass.RATE_LIMITED


def test_reason_is_redacted() -> None:
    """A secret in an exception message never reaches the classification."""
    result = classify(ValueError("bad key sk-abcdefghijklmnop1234"))
    assert "sk-abcdefghijklmnop1234" not in result.reason


@pytest.mark.parametrize("lib", ["httpx", "httpx2"])
def test_unanswered_tells_a_request_sent_from_one_never_sent(lib: str) -> None:
    """``unanswered``: the request reached the upstream and no answer came back (what the
    budget charges a failed call for), read through the openai client's wrapping."""
    http = _lib(lib)
    openai = pytest.importorskip("openai")
    request = http.Request("POST", "http://model.invalid/v1/chat/completions")

    def wrapped(cause: BaseException, kind: Any) -> BaseException:
        try:
            try:
                raise cause
            except Exception as exc:
                raise kind(request=request) from exc
        except Exception as outer:
            return outer

    sent = [
        http.ReadTimeout("slow", request=request),
        http.RemoteProtocolError("Server disconnected", request=request),
        http.ReadError("reset", request=request),
        TimeoutError(),
        asyncio.TimeoutError(),
        ConnectionResetError(),
        wrapped(http.ReadTimeout("slow", request=request), openai.APITimeoutError),
    ]
    never = [
        http.ConnectError("refused", request=request),
        http.ConnectTimeout("slow", request=request),
        http.PoolTimeout("busy", request=request),
        ConnectionRefusedError(),
        wrapped(http.ConnectTimeout("slow", request=request), openai.APITimeoutError),
        _openai_status(openai, http, 500),
        _openai_status(openai, http, 400),
        ValueError("not a transport failure"),
    ]
    assert [unanswered(exc) for exc in sent] == [True] * len(sent)
    assert [unanswered(exc) for exc in never] == [False] * len(never)
