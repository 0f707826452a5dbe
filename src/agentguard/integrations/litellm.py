"""LiteLLM: agentguard as the ``agentguard`` custom provider, for the SDK and the proxy.

``model="agentguard/<model>"`` runs any litellm chat call — sync, async, streaming — through the
whole guard; ``<model>`` names a tier of the configuration (or is a plain litellm model, with no
tier to escalate to), and every model call the guard makes goes through ``litellm.completion`` /
``litellm.acompletion`` to the real model, with litellm's own retries off. The call's
parameters reach that model as passed, and litellm checks and maps them for its provider, as
without the guard (see :class:`_AsPassed`).

In code::

    from agentguard.integrations.litellm import register
    register(ag.GuardConfig.from_file("agentguard.yaml"))
    litellm.completion(model="agentguard/fast", messages=..., tools=...)

In a litellm proxy ``config.yaml`` (the guard reads the file named by ``AGENTGUARD_CONFIG``;
the callback puts each answer's report in ``x-agentguard-*`` response headers)::

    model_list:
      - {model_name: agent, litellm_params: {model: agentguard/fast}}
    litellm_settings:
      custom_provider_map:
        - {provider: agentguard, custom_handler: agentguard.integrations.litellm.proxy_handler}
      callbacks: agentguard.integrations.litellm.proxy_headers

Errors of the guard itself reach litellm (and the proxy's clients) as litellm exceptions with
a fitting status: a refused loop 400, tool calls still invalid 502, an hourly budget spent 429
with ``Retry-After``, a session budget spent for good 403 (no ``Retry-After``: clients must not
retry it), every tier failed 503; upstream errors pass through as litellm raised them. Through
the proxy, the ``proxy_headers`` callback answers these errors with the ``x-agentguard-*``
headers too.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, NoReturn

from agentguard.budget import TokenLedger, caller_config
from agentguard.config import GuardConfig
from agentguard.exceptions import AgentGuardError, ConfigError
from agentguard.guard import AsyncGuard, Guard, GuardReport
from agentguard.telemetry import provider_name
from agentguard.transport import (
    SCOPE,
    SESSION_HEADER,
    TRACE_PARENT,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    attach_report,
    caller_key,
    caller_scope,
    register_secret,
    report_of,
    split_session_header,
)
from agentguard.types import Tier

from ._chat import changed
from ._http import error_answer, headers_of
from ._lazy import require
from ._replay import bare
from ._tiers import tier_api_key

__all__ = ["PROVIDER", "GuardedLLM", "LiteLLMTransport", "register", "report_headers"]

#: The provider prefix: ``model="agentguard/<model>"``.
PROVIDER = "agentguard"
#: The environment variable naming the guard's configuration file for :data:`proxy_handler`.
CONFIG_ENV = "AGENTGUARD_CONFIG"  # read by GuardConfig.load()
_PROVIDER_PREFIX = "llm_provider-"
#: The request extension where a guarded stream's transport sets aside the upstream's chunks
#: that go out as they came though the guard yields nothing of them (see :func:`_aside`).
_ASIDE = "agentguard.litellm.aside"
#: The request extension where a guarded stream's transport keeps the chunks that open each
#: attempt's stream (see :class:`_Opening`).
_OPENING = "agentguard.litellm.opening"


def _litellm() -> Any:
    return require("litellm", "litellm")


class _Secret(str):
    """A key passed along in request params: usable as a string, never shown by ``repr``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'<redacted>'"


class LiteLLMTransport:
    """A sync and async transport over ``litellm.completion`` / ``litellm.acompletion``.

    Args:
        tier: the tier served; its ``base_url`` and ``api_key_env`` win over the ``api_base`` /
            ``api_key`` of the request. ``None`` sends requests as they are.
    """

    def __init__(self, tier: Tier | None = None) -> None:
        self._tier = tier

    def _kwargs(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        if request.model.startswith(f"{PROVIDER}/"):
            allowed = "a litellm model of a real provider, not agentguard/ itself"
            raise ConfigError(
                [{"path": "tiers.*.model", "value": request.model, "allowed": allowed}]
            )
        kwargs = request.to_body(stream=stream)
        # agentguard's retry layer is the only one: retries never multiply
        kwargs.update(num_retries=0, max_retries=0)
        if self._tier is not None and self._tier.base_url:
            kwargs["api_base"] = self._tier.base_url
        key = tier_api_key(self._tier) if self._tier is not None else None
        if key:
            kwargs["api_key"] = key
        if request.headers:
            kwargs["extra_headers"] = dict(request.headers)
        if request.timeout is not None:
            kwargs["timeout"] = request.timeout
        return kwargs

    def otel_attributes(self, request: ModelRequest) -> dict[str, Any]:
        """The provider litellm routes ``request`` to, for telemetry (``gen_ai.provider.name``)."""
        try:
            provider = _litellm().get_llm_provider(request.model)[1]
        except Exception:  # a model litellm does not know: it is sent and fails there
            return {}
        return {"gen_ai.provider.name": provider_name(provider)}

    def send(self, request: ModelRequest) -> ModelResponse:
        """One ``litellm.completion`` call."""
        raw = _litellm().completion(**self._kwargs(request, stream=False))
        return ModelResponse.from_body(raw.model_dump(), raw=raw)

    def stream(self, request: ModelRequest) -> Iterator[StreamChunk]:
        """One streamed ``litellm.completion`` call, chunk by chunk."""
        _Opening.restart(request)
        for chunk in _litellm().completion(**self._kwargs(request, stream=True)):
            yield _read(chunk, request)

    async def asend(self, request: ModelRequest) -> ModelResponse:
        """One ``litellm.acompletion`` call."""
        raw = await _litellm().acompletion(**self._kwargs(request, stream=False))
        return ModelResponse.from_body(raw.model_dump(), raw=raw)

    async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """One streamed ``litellm.acompletion`` call, chunk by chunk."""
        _Opening.restart(request)
        async for chunk in await _litellm().acompletion(**self._kwargs(request, stream=True)):
            yield _read(chunk, request)


def _read(raw: Any, request: ModelRequest) -> StreamChunk:
    """A litellm stream chunk in neutral form; set aside for the caller of ``request`` (see
    :data:`_ASIDE`) when it carries what the guard passes on only as it came."""
    chunk = StreamChunk.from_body(raw.model_dump(), raw=raw)
    aside = request.extensions.get(_ASIDE)
    if aside is not None and _aside(chunk):
        aside.append(raw)
    opening = request.extensions.get(_OPENING)
    if isinstance(opening, _Opening):
        opening.read(raw, chunk)
    return chunk


class _Opening:
    """The upstream's chunks that open an attempt's stream carrying nothing the guard passes on
    or judges (its ``role`` chunk): what the raw litellm stream yields before an error in the
    body. The guard names the role on its first chunk out instead; when the stream ends on the
    upstream's error before any, these go out before it, as from raw litellm."""

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self._open = True

    @staticmethod
    def restart(request: ModelRequest) -> None:
        """A new attempt of ``request``: its own opening."""
        opening = request.extensions.get(_OPENING)
        if isinstance(opening, _Opening):
            opening.chunks, opening._open = [], True

    def read(self, raw: Any, chunk: StreamChunk) -> None:
        if self._open and bare(chunk) and not _aside(chunk) and not chunk.finish_reason:
            self.chunks.append(raw)
        else:
            self._open = False


def _request(kwargs: Mapping[str, Any]) -> tuple[ModelRequest, str | None]:
    """The neutral request of a custom-provider call, and its explicit session.

    An ``x-agentguard-session`` header (the call's own, or the proxy client's) stays in the
    request's headers, where the guard reads it (and never sends it upstream); litellm's
    ``litellm_session_id`` is the explicit session of calls without one.
    """
    params = dict(kwargs.get("optional_params") or {})
    if params.get("stream") is not False:  # an explicit stream=False goes upstream as sent
        params.pop("stream", None)
    litellm_params = kwargs.get("litellm_params") or {}
    # through the proxy, the client's own headers are in the proxy request, not in `headers`
    client_headers = (litellm_params.get("proxy_server_request") or {}).get("headers") or {}
    header, headers = split_session_header(
        {str(k): str(v) for k, v in (kwargs.get("headers") or {}).items()}
    )
    header = header or split_session_header(client_headers)[0]
    session = None
    if header:
        headers = {**headers, SESSION_HEADER: header}
    else:
        session = litellm_params.get("litellm_session_id")
    if kwargs.get("api_base"):
        params["api_base"] = kwargs["api_base"]
    if kwargs.get("api_key"):
        params["api_key"] = _Secret(kwargs["api_key"])
        register_secret(kwargs["api_key"])
    timeout = kwargs.get("timeout")
    caller = _caller(litellm_params, client_headers)
    extensions: dict[str, Any] = {SCOPE: caller} if caller else {}
    parent = _trace_parent(litellm_params, client_headers)
    if parent is not None:
        extensions[TRACE_PARENT] = parent
    return (
        ModelRequest(
            model=str(kwargs["model"]),
            messages=list(kwargs.get("messages") or []),
            params=params,
            headers=headers,
            timeout=float(timeout) if isinstance(timeout, (int, float)) else None,
            extensions=extensions,
        ),
        str(session) if session else None,
    )


class _AsPassed:
    """litellm's ``get_optional_params``, but for calls to a provider served by a
    :class:`GuardedLLM`: those keep the caller's parameters as the caller passed them.

    litellm checks and maps a call's parameters for the provider it routes the call to, before
    it calls a custom provider too; for ``agentguard`` it took the generic list of an
    OpenAI-compatible server — refusing what that lacks (``reasoning_effort``, ``verbosity``,
    ``thinking``) and renaming ``max_completion_tokens`` to ``max_tokens`` — though the guard
    sends the parameters on to the real model with ``litellm.completion``, where litellm checks
    and maps them for that model's provider. Passed as they came, they are checked and mapped
    once, for the provider of the model that answers: the upstream gets what plain litellm
    sends it, and ``drop_params``, ``additional_drop_params`` and ``allowed_openai_params`` act
    there as they do without the guard. litellm offers no per-provider hook for this: the list
    and mapping of custom providers are the generic ones.
    """

    def __init__(self, original: Any) -> None:
        self.original = original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args or not _guarded(kwargs.get("custom_llm_provider")):
            return self.original(*args, **kwargs)
        # the model and provider it maps for, and the messages, are no parameters of the call
        routing = ("model", "custom_llm_provider", "messages")
        return {k: v for k, v in kwargs.items() if v is not None and k not in routing}


def _guarded(provider: Any) -> bool:
    """Whether litellm calls a :class:`GuardedLLM` for ``provider`` (the last entry of its
    ``custom_provider_map`` naming it, as litellm picks)."""
    handler = None
    try:
        for item in _litellm().custom_provider_map:
            if item.get("provider") == provider:
                handler = item.get("custom_handler")
    except Exception:  # litellm changed its map: its own mapping, as before
        return False
    return isinstance(handler, GuardedLLM)


_as_passed_lock = threading.Lock()


def _take_params_as_passed() -> None:
    """Make litellm hand guarded providers their calls' parameters as passed (see
    :class:`_AsPassed`); once per process."""
    main: Any = require("litellm.main", "litellm")
    with _as_passed_lock:
        current = getattr(main, "get_optional_params", None)
        if current is not None and not isinstance(current, _AsPassed):
            main.get_optional_params = _AsPassed(current)


def _trace_parent(litellm_params: Mapping[str, Any], client_headers: Mapping[str, Any]) -> Any:
    """Where the guarded call's spans belong in the proxy (see ``TRACE_PARENT``): under the
    proxy's own request span when its OpenTelemetry callback made one (litellm parents its
    spans there too), else in the client's trace when it sent ``traceparent``."""
    for name in ("metadata", "litellm_metadata"):
        metadata = litellm_params.get(name)
        if isinstance(metadata, Mapping) and metadata.get("litellm_parent_otel_span") is not None:
            return metadata["litellm_parent_otel_span"]
    carrier = {str(k).lower(): v for k, v in client_headers.items()}
    return {k: carrier[k] for k in ("traceparent", "tracestate") if k in carrier} or None


def _caller(litellm_params: Mapping[str, Any], client_headers: Mapping[str, Any]) -> str | None:
    """Who called the proxy, as a fingerprint (never the key itself): the virtual key's hash the
    proxy logs, else the client's ``Authorization`` header. Each caller has guards of its own
    (see :meth:`GuardedLLM.guards_for`), and conversations found without a named session are
    never matched across callers."""
    for name in ("metadata", "litellm_metadata"):
        metadata = litellm_params.get(name)
        if isinstance(metadata, Mapping):
            key = metadata.get("user_api_key_hash") or metadata.get("user_api_key")
            if isinstance(key, str) and key:
                return caller_scope(key)
    for name, value in client_headers.items():
        if str(name).lower() == "authorization" and value:
            # the key, however the header spells its scheme: one caller, as in agentguard serve
            return caller_scope(caller_key(str(value)))
    return None


def _result(response: ModelResponse, report: GuardReport | None) -> Any:
    """The litellm ``ModelResponse`` to hand back; its hidden headers carry the report.

    An answer from litellm (every tier is reached through it) is handed back as litellm
    returned it while the guard changed nothing — every choice, ``logprobs``,
    ``system_fingerprint``, ``service_tier`` and the usage details included — and otherwise
    rebuilt from it with the guard's message in the first choice; the usage is the report's
    (every attempt's) when the call took more than one attempt.
    """
    litellm = _litellm()
    raw = response.raw
    if isinstance(raw, litellm.ModelResponse):
        out = _upstream_answer(litellm, raw, response, report)
    else:
        usage = report.usage if report is not None else response.usage
        out = litellm.ModelResponse(
            id=response.id or getattr(raw, "id", None),
            created=getattr(raw, "created", None),
            model=response.model or getattr(raw, "model", None),
            choices=[
                {
                    "index": 0,
                    "message": dict(response.message),
                    "finish_reason": response.finish_reason,
                }
            ],
            usage=_usage(usage) if usage is not None else None,
        )
    if report is not None:
        hidden = out._hidden_params
        hidden["additional_headers"] = {
            **(hidden.get("additional_headers") or {}),
            **headers_of(report),
        }
        attach_report(out, report)
    return out


def _upstream_answer(
    litellm: Any, raw: Any, response: ModelResponse, report: GuardReport | None
) -> Any:
    """litellm's own answer ``raw``, or a copy of it carrying what the guard changed: the first
    choice's message and finish reason, and the usage of every attempt."""
    data = raw.model_dump()
    original = ModelResponse.from_body(data)
    same = original.finish_reason == response.finish_reason and not changed(
        original.message, response.message
    )
    usage = report.usage if report is not None else None
    billed = usage is None or (
        original.usage is not None and original.usage.total_tokens == usage.total_tokens
    )
    if same and billed:
        return raw
    if not same:
        first = data["choices"][0]
        data["choices"] = [
            {**first, "message": dict(response.message), "finish_reason": response.finish_reason},
            *data["choices"][1:],  # the other choices (n > 1) pass through unchanged
        ]
    if not billed and usage is not None:
        data["usage"] = _usage(usage)
    out = litellm.ModelResponse(**data)
    out._hidden_params = dict(getattr(raw, "_hidden_params", None) or {})
    return out


def _usage(usage: Any) -> dict[str, int]:
    return {k: getattr(usage, k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _generic(chunk: StreamChunk, *, opening: bool) -> Iterator[Any]:
    """A guarded chunk as litellm takes it from a provider: the upstream's own chunk (litellm's
    ``ModelResponseStream``) where the guard passes it on unchanged — its text, reasoning,
    ``refusal`` or audio, the other answers' deltas when ``n`` > 1, and its
    ``reasoning_content``, ``logprobs`` and ``system_fingerprint`` with them — else
    ``GenericStreamingChunk`` dicts (one per tool call), which carry text and calls only.

    ``opening``: nothing went out before it. The upstream's opening ``role`` chunk carries nothing
    the guard passes on, and litellm names the role of a provider's chunk only in the dicts: the
    first chunk out names it (a copy, when it is the upstream's)."""
    raw = chunk.raw
    passed_on = (chunk.content or chunk.reasoning) and not chunk.tool_calls
    if passed_on and isinstance(raw, _litellm().ModelResponseStream):
        yield _named(raw) if opening else raw
        return
    base = {"is_finished": False, "finish_reason": "", "usage": None, "index": 0}
    if chunk.content:
        yield {**base, "text": chunk.content, "tool_use": None}
    for call in chunk.tool_calls:
        yield {**base, "text": "", "tool_use": {"type": "function", **call}}


def _named(raw: Any) -> Any:
    """The upstream's chunk as the first out: naming the role (a copy, when it does not)."""
    if raw.choices and raw.choices[0].delta.role is None:
        raw = raw.model_copy(deep=True)
        raw.choices[0].delta.role = "assistant"
    return raw


def _aside(chunk: StreamChunk) -> bool:
    """Whether an upstream chunk goes out as it came though the guard passes nothing of it on:
    it carries nothing the guard judges (see :func:`bare`), but a refusal, an audio delta or
    another answer's delta (``n`` > 1)."""
    if not bare(chunk) or chunk.raw is None:
        return False
    if chunk.refusal or chunk.other_output:
        return True
    return any(getattr(choice, "index", 0) != 0 for choice in chunk.raw.choices or ())


def _with_aside(chunk: StreamChunk, aside: list[Any], *, opening: bool) -> Iterator[Any]:
    """What goes out for one guarded chunk: the upstream's chunks set aside since the last one
    (see :func:`_aside`), then the chunk itself (see :func:`_generic`)."""
    while aside:
        yield _named(aside.pop(0)) if opening else aside.pop(0)
        opening = False
    yield from _generic(chunk, opening=opening)


def _last(finish: str | None, report: GuardReport | None) -> dict[str, Any]:
    """The closing chunk: finish reason, the usage of every attempt, the report's headers."""
    last: dict[str, Any] = {"text": "", "tool_use": None, "is_finished": True, "index": 0}
    last.update(finish_reason=finish or "stop", usage=None, provider_specific_fields=None)
    if report is not None:  # litellm sets these fields on the chunk: the proxy sends them along
        last.update(
            usage=_usage(report.usage), provider_specific_fields={"agentguard": headers_of(report)}
        )
    return last


def _reraise(exc: Exception) -> NoReturn:
    """Raise an upstream error the guarded stream raised from the handler's stream: litellm
    wraps what a provider's stream raises in a ``MidStreamFallbackError`` (a 5xx, a rate limit),
    as raw litellm's stream did the upstream's error already; the error it wraps is raised in
    its stead, so that the caller gets one ``MidStreamFallbackError`` around it, as from raw
    litellm (not one around the other)."""
    inner = getattr(exc, "original_exception", None)
    if type(exc).__name__ == "MidStreamFallbackError" and isinstance(inner, Exception):
        raise inner from None
    raise exc


def _translate(exc: AgentGuardError) -> Exception:
    """A guard decision as the litellm exception its status maps to, carrying its headers."""
    error = require("litellm.llms.custom_llm", "litellm").CustomLLMError
    status, kind, headers = error_answer(exc)
    translated: Exception = error(status_code=status, message=f"agentguard {kind}: {exc}")
    # read back by the proxy callback, which answers with them (see _headers_hook)
    translated.agentguard_error = (status, kind, headers)  # type: ignore[attr-defined]
    return translated


def _guard_error(exc: BaseException | None) -> tuple[int, str, dict[str, str], str] | None:
    """The guard's answer somewhere in the chain of ``exc`` (litellm wraps what it maps)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:  # breadth first: litellm chains both by __cause__ and by __context__
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        found = getattr(current, "agentguard_error", None)
        if found is not None:
            return (*found, str(getattr(current, "message", current)))
        todo += [
            current.__cause__,
            current.__context__,
            getattr(current, "original_exception", None),
        ]
    return None


class GuardedLLM:
    """The ``agentguard`` custom provider: a litellm ``CustomLLM`` handler.

    Plain duck typing (litellm only calls these four methods), so importing this module does not
    import litellm. Sync and async calls share one pipeline: sessions, loop state, budgets and
    breakers are the same whichever way a call comes in.

    Each caller (a proxy key, see :func:`_caller`) has guards of its own, as in ``agentguard
    serve``: loop state, named sessions and budgets (``token_budget.scope`` gets the caller's
    fingerprint) are never shared across keys, so two keys sending the same session name have
    two sessions; the tier breakers and the budgets' store are every caller's.

    Args:
        config: the configuration, read by :meth:`GuardConfig.load` (so, exactly as
            ``agentguard.wrap``: a ``GuardConfig``, a dict, a file path, or ``None`` for the
            file named by ``AGENTGUARD_CONFIG`` and the ``AGENTGUARD_*`` overrides); its
            ``tiers`` are litellm models.
        sleep: how the sync driver waits between retries (injected in tests).
        asleep: how the async driver waits (injected in tests).
        max_callers: callers whose guards are kept at once (the least recently seen go).
        **options: passed to :class:`~agentguard.Guard` (``ledger``, ``probe``, ``clock``,
            ``rng``, ``hooks``).
    """

    def __init__(
        self,
        config: GuardConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        sleep: Any = None,
        asleep: Any = None,
        max_callers: int = 1024,
        **options: Any,
    ) -> None:
        self._config = GuardConfig.load(config)
        self._sleep, self._asleep, self._options = sleep, asleep, options
        #: The guards of calls that name no caller (sync and async, one pipeline).
        self.guard, self.aguard = self._pair(self._config, options)
        self._callers: collections.OrderedDict[str, tuple[Guard, AsyncGuard]] = (
            collections.OrderedDict()
        )
        self._max_callers = max(1, max_callers)
        self._lock = threading.Lock()
        if sys.modules.get("litellm") is not None:  # else register() does it (no litellm import)
            _take_params_as_passed()

    def _pair(self, config: GuardConfig, options: Mapping[str, Any]) -> tuple[Guard, AsyncGuard]:
        guard = Guard(config=config, tier_transport=LiteLLMTransport, sleep=self._sleep, **options)
        aguard = AsyncGuard(
            config=config, tier_transport=LiteLLMTransport, sleep=self._asleep, **options
        )
        aguard.pipeline = guard.pipeline  # one pipeline, two drivers
        return guard, aguard

    def guards_for(self, request: ModelRequest) -> tuple[Guard, AsyncGuard]:
        """The sync and async guards of the caller of ``request`` (made on first use), or
        :attr:`guard` and :attr:`aguard` when it names none."""
        caller = request.extensions.get(SCOPE)
        if not isinstance(caller, str) or not caller:
            return self.guard, self.aguard
        with self._lock:  # sync calls may come from many threads
            pair = self._callers.get(caller)
            if pair is not None:
                self._callers.move_to_end(caller)
                return pair
            base = self.guard.pipeline
            config = caller_config(self._config, caller)
            options = dict(self._options)
            if base.ledger is not None:  # the caller's budgets, in the same store
                options["ledger"] = TokenLedger(
                    config, store=base.ledger.store, hooks=base.emitter.hooks
                )
            if base.probe is not None:
                options["probe"] = base.probe
            pair = self._pair(config, options)
            pipeline = pair[0].pipeline
            # one breaker per tier, for every caller
            pipeline.breakers, pipeline.breaker_store = base.breakers, base.breaker_store
            pipeline.session_store = base.session_store
            self._callers[caller] = pair
            if len(self._callers) > self._max_callers:
                self._callers.popitem(last=False)
            return pair

    def completion(self, **kwargs: Any) -> Any:
        """litellm's sync entry point."""
        request, session = _request(kwargs)
        try:
            response = self.guards_for(request)[0].complete(request, session=session)
        except AgentGuardError as exc:
            raise _translate(exc) from exc
        return _result(response, response.report)

    async def acompletion(self, **kwargs: Any) -> Any:
        """litellm's async entry point."""
        request, session = _request(kwargs)
        try:
            response = await self.guards_for(request)[1].acomplete(request, session=session)
        except AgentGuardError as exc:
            raise _translate(exc) from exc
        return _result(response, response.report)

    def streaming(self, **kwargs: Any) -> Iterator[Any]:
        """litellm's sync streaming entry point: content flows, tool calls once valid."""
        request, session = _request(kwargs)
        aside: list[Any] = []
        opened = _Opening()
        extensions = {**request.extensions, _ASIDE: aside, _OPENING: opened}
        request = dataclasses.replace(request, extensions=extensions)
        stream = self.guards_for(request)[0].stream(request, session=session)
        finish = None
        opening = True
        try:
            for chunk in stream:
                finish = chunk.finish_reason or finish
                for out in _with_aside(chunk, aside, opening=opening):
                    opening = False
                    yield out
        except AgentGuardError as exc:
            raise _translate(exc) from exc
        except Exception as exc:  # the upstream's error, as litellm raised it
            for out in opened.chunks if opening else ():
                yield out  # what raw litellm yields before it
            _reraise(exc)
        for out in _with_aside(StreamChunk(), aside, opening=opening):  # the ones left
            yield out
        yield _last(finish, stream.report)

    async def astreaming(self, **kwargs: Any) -> AsyncIterator[Any]:
        """litellm's async streaming entry point."""
        request, session = _request(kwargs)
        aside: list[Any] = []
        opened = _Opening()
        extensions = {**request.extensions, _ASIDE: aside, _OPENING: opened}
        request = dataclasses.replace(request, extensions=extensions)
        stream = self.guards_for(request)[1].astream(request, session=session)
        finish = None
        opening = True
        try:
            async for chunk in stream:
                finish = chunk.finish_reason or finish
                for out in _with_aside(chunk, aside, opening=opening):
                    opening = False
                    yield out
        except AgentGuardError as exc:
            raise _translate(exc) from exc
        except Exception as exc:  # the upstream's error, as litellm raised it
            for out in opened.chunks if opening else ():
                yield out  # what raw litellm yields before it
            _reraise(exc)
        for out in _with_aside(StreamChunk(), aside, opening=opening):  # the ones left
            yield out
        yield _last(finish, stream.report)


def register(
    config: GuardConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    **options: Any,
) -> GuardedLLM:
    """Make ``model="agentguard/<model>"`` run through a guard in this process.

    Replaces an ``agentguard`` provider registered before.

    Args:
        config: the configuration, as for :class:`GuardedLLM`.
        **options: passed to :class:`GuardedLLM`.

    Returns:
        the handler (its ``guard`` / ``aguard`` attributes are the guards in use).

    Raises:
        ImportError: litellm is not installed (``pip install "agentguard[litellm]"``).
    """
    litellm = _litellm()
    _take_params_as_passed()
    handler = GuardedLLM(config, **options)
    others = [p for p in litellm.custom_provider_map if p.get("provider") != PROVIDER]
    litellm.custom_provider_map = [*others, {"provider": PROVIDER, "custom_handler": handler}]
    return handler


def report_headers(response: Any) -> dict[str, str] | None:
    """The ``x-agentguard-*`` headers of a guarded litellm response or stream chunk, or ``None``.

    From the attached report, from the response's hidden headers, where litellm files them as
    ``llm_provider-x-agentguard-*`` (it prefixes every provider header), or, for a stream, from
    the chunk that carries the report (``chunk.agentguard``: the chunk that ends the answer,
    just before litellm's closing finish-reason chunk).
    """
    report = report_of(response)
    if report is not None:
        return headers_of(report)
    carried = getattr(response, "agentguard", None)
    if isinstance(carried, Mapping):
        return {str(k): str(v) for k, v in carried.items()}
    hidden = getattr(response, "_hidden_params", None) or {}
    extra = hidden.get("additional_headers") or {}
    found = {
        k[len(_PROVIDER_PREFIX) :]: str(v)
        for k, v in extra.items()
        if k.startswith(f"{_PROVIDER_PREFIX}x-agentguard-")
    }
    return found or None


def _headers_hook() -> Any:
    base = require("litellm.integrations.custom_logger", "litellm").CustomLogger

    class AgentGuardHeaders(base):  # type: ignore[misc, valid-type]  # litellm ships no types
        """Proxy callback: each guarded answer's report as ``x-agentguard-*`` headers, and the
        guard's errors answered with their status, ``Retry-After`` and headers."""

        async def async_post_call_failure_hook(
            self,
            request_data: dict[str, Any],
            original_exception: Exception,
            user_api_key_dict: Any,
            traceback_str: str | None = None,
        ) -> Any:
            found = _guard_error(original_exception)
            if found is None:
                return None  # not the guard's: litellm answers as usual
            status, kind, headers, message = found
            http_exception = require("fastapi", "litellm").HTTPException
            error = http_exception(status_code=status, detail=message, headers=headers)
            error.type = kind  # the proxy's error body says "type": "<kind>"
            return error

        async def async_post_call_response_headers_hook(
            self,
            data: dict[str, Any],
            user_api_key_dict: Any,
            response: Any,
            request_headers: dict[str, str] | None = None,
            litellm_call_info: dict[str, object] | None = None,
        ) -> dict[str, str] | None:
            return report_headers(response)

    return AgentGuardHeaders()


_proxy: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """What a proxy ``config.yaml`` names, built on first use (so litellm loads lazily).

    ``proxy_handler``: the ``agentguard`` provider, configured from the file named by
    ``AGENTGUARD_CONFIG`` (the defaults when unset) with the usual ``AGENTGUARD_*`` overrides.
    ``proxy_headers``: the callback that turns each report into ``x-agentguard-*`` headers.
    """
    if name not in ("proxy_handler", "proxy_headers"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _proxy:
        if name == "proxy_headers":
            _proxy[name] = _headers_hook()
        else:
            _proxy[name] = GuardedLLM()  # AGENTGUARD_CONFIG and overrides, as agentguard.wrap
    return _proxy[name]
