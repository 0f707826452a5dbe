"""Pydantic AI: :class:`AgentGuard`, a capability guarding an agent's model requests (an
:class:`~agentguard.AsyncGuard` judging each in OpenAI chat form, through :class:`GuardedModel`
around whichever model serves) and its function tools (a :class:`~agentguard.ToolGuard`).

Pydantic AI's own rules stand: a tool's ``ModelRetry`` (and other signals) go through untouched;
the run's ``UsageLimits`` count every upstream request the guard makes. A streamed request is
drained upstream and replayed once judged. See ``docs/integrations/pydantic-ai.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from agentguard.config import GuardConfig
from agentguard.guard import AsyncGuard, GuardReport
from agentguard.telemetry import provider_name
from agentguard.tools import ToolGuard
from agentguard.transport import ModelRequest, ModelResponse, attach_report
from agentguard.types import Tier, Usage

from ._chat import chat_tool_call, finish_reason, function_tool, kept_prefix, tool_names
from ._guards import fail_open
from ._lazy import require
from ._tiers import primary_chain
from ._tools import FrameworkTools

require("pydantic_ai", "pydantic-ai")

from pydantic_ai import exceptions as pe  # noqa: E402 - after the check that names the extra
from pydantic_ai import messages as pm  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.models import (  # noqa: E402
    CompletedStreamedResponse,
    Model,
    StreamedResponse,
    infer_model,
)
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402
from pydantic_ai.usage import RequestUsage  # noqa: E402

__all__ = ["AgentGuard", "GuardedModel"]

# Pydantic AI's own control flow (a tool's ModelRetry, deferral, approval, failure; a run error),
# never a tool failure for the ToolGuard to retry or count.
_SIGNALS = (
    pe.ModelRetry,
    pe.ToolRetryError,
    pe.ToolFailedError,
    pe.CallDeferred,
    pe.ApprovalRequired,
    pe.SkipToolExecution,
    pe.AgentRunError,
    pe.UserError,
)
# The run in progress (set by AgentGuard around each model request): its usage and limits.
_RUN: contextvars.ContextVar[Any] = contextvars.ContextVar("agentguard_pai_run", default=None)
_CALL = "agentguard.pydantic_ai.call"  # the ModelRequest.extensions key of a _Call


@dataclass
class _Call:
    """One guarded request: the agent's own messages and what the transport needs to send."""

    model: GuardedModel
    messages: list[pm.ModelMessage]
    settings: Any
    params: Any
    chat: list[dict[str, Any]]
    owners: list[int]  # chat[i] was translated from messages[owners[i]]
    run: Any = None
    stream: bool = False
    sent: int = 0  # upstream requests made
    usage: RequestUsage = field(default_factory=RequestUsage)
    # Pydantic AI's connection errors by the id of the transport error they wrap (see asend)
    wrapped_errors: dict[int, BaseException] = field(default_factory=dict)


def _chat(messages: Sequence[pm.ModelMessage]) -> tuple[list[dict[str, Any]], list[int]]:
    """The conversation in OpenAI chat form, and which message each chat message came from."""
    chat: list[dict[str, Any]] = []
    owners: list[int] = []
    for i, message in enumerate(messages):
        if isinstance(message, pm.ModelResponse):
            out = [_answer_chat(message)]
        else:
            out = [m for m in map(_part_chat, message.parts) if m is not None]
        chat += out
        owners += [i] * len(out)
    return chat, owners


def _part_chat(part: Any) -> dict[str, Any] | None:
    """A request part as a chat message (``None``: nothing the guard judges)."""
    kind = getattr(part, "part_kind", "")
    if kind in {"system-prompt", "user-prompt"}:
        text = part.content
        if not isinstance(text, str):  # multi-modal: the text items only
            text = "".join(c for c in text if isinstance(c, str))
        return {"role": "system" if kind == "system-prompt" else "user", "content": text}
    if kind not in {"tool-return", "retry-prompt"}:
        return None
    text = part.model_response_str() if kind == "tool-return" else part.model_response()
    if kind == "retry-prompt" and not part.tool_name:  # a rejected answer's feedback
        return {"role": "user", "content": text}
    return {"role": "tool", "tool_call_id": part.tool_call_id, "content": text}


def _shape(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a chat answer the agent acts on: its text and its calls."""
    return message.get("content") or "", [
        (c.get("id"), c.get("function")) for c in message.get("tool_calls") or ()
    ]


def _answer_chat(response: pm.ModelResponse) -> dict[str, Any]:
    """A model response as one chat assistant message (text and tool calls)."""
    text = "".join(p.content for p in response.parts if isinstance(p, pm.TextPart))
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    calls = [p for p in response.parts if isinstance(p, pm.ToolCallPart)]
    if calls:
        message["tool_calls"] = [chat_tool_call(p.tool_call_id, p.tool_name, p.args) for p in calls]
    return message


def _carrying(answer: pm.ModelResponse, message: Mapping[str, Any]) -> list[Any]:
    """``answer``'s parts carrying ``message`` (the guard's repaired or corrected answer).

    Every part keeps its place, its ``id`` and provider fields: a reasoning model's thinking
    part goes back to OpenAI's Responses API followed by the call it was paired with (it answers
    400 otherwise). A call the guard changed is its part with the new name and arguments; one it
    left out goes; the text is the first text part's; the guard's other calls follow.
    """
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    calls = {c.get("id"): c for c in message.get("tool_calls") or () if c.get("id")}
    same_text = text == "".join(p.content for p in answer.parts if isinstance(p, pm.TextPart))
    parts: list[Any] = []
    text_done = False
    for part in answer.parts:
        kept: Any = part
        if isinstance(part, pm.ToolCallPart):
            call = calls.pop(part.tool_call_id, None)
            if call is None:
                continue
            fn = call.get("function") or {}
            if chat_tool_call(part.tool_call_id, part.tool_name, part.args) != call:
                kept = dataclasses.replace(
                    part, tool_name=fn.get("name", ""), args=fn.get("arguments")
                )
        elif isinstance(part, pm.TextPart) and not same_text:
            if text_done or not text:
                continue
            kept, text_done = dataclasses.replace(part, content=text), True
        parts.append(kept)
    if text and not same_text and not text_done:
        parts.append(pm.TextPart(text))
    added = [c for c in message.get("tool_calls") or () if not c.get("id") or c["id"] in calls]
    if added:
        parts += _from_chat([{"role": "assistant", "tool_calls": added}], {})[0].parts
    return parts


def _from_chat(chat: Sequence[Any], names: Mapping[str, str]) -> list[pm.ModelMessage]:
    """Chat messages the guard wrote (a correction, a hint ...) as Pydantic AI messages."""
    out: list[pm.ModelMessage] = []
    parts: list[Any] = []
    for m in chat:
        role, text = m.get("role"), m.get("content") or ""
        if role == "assistant":
            if parts:
                out.append(pm.ModelRequest(parts=parts))
                parts = []
            answer = [pm.TextPart(text)] if text else []
            for c in m.get("tool_calls") or ():
                fn = c.get("function") or {}
                ids = {"tool_call_id": c["id"]} if c.get("id") else {}
                answer.append(pm.ToolCallPart(fn.get("name", ""), fn.get("arguments"), **ids))
            out.append(pm.ModelResponse(parts=answer))
        elif role == "tool":
            call_id = m.get("tool_call_id") or ""
            parts.append(pm.ToolReturnPart(names.get(call_id, ""), text, call_id))
        else:
            parts.append((pm.SystemPromptPart if role == "system" else pm.UserPromptPart)(text))
    if parts:
        out.append(pm.ModelRequest(parts=parts))
    return out


def _messages(request: ModelRequest, call: _Call) -> list[pm.ModelMessage]:
    """What to send: the agent's own messages up to the first the guard changed, then the
    guard's chat messages translated."""
    sent = list(request.messages)
    translate = functools.partial(_from_chat, names=tool_names(sent))
    return kept_prefix(call.messages, call.owners, call.chat, sent, translate)


class _Transport:
    """A tier's transport: one request to the wrapped model (or the tier's own) per send."""

    def __init__(self, tier: Tier) -> None:
        self._tier = tier

    async def asend(self, request: ModelRequest) -> ModelResponse:
        call: _Call = request.extensions[_CALL]
        run, limits = call.run, getattr(call.run, "usage_limits", None)
        if call.sent and limits is not None:  # a further request: the run's limits hold
            projected = run.usage + call.usage
            projected.requests += call.sent
            limits.check_before_request(projected)
        model = self._model(call)
        settings = dict(call.settings or {})
        choice = request.params.get("tool_choice")  # the guard forces an answer, or one tool
        if isinstance(choice, str):
            settings["tool_choice"] = choice
        elif isinstance(choice, Mapping):  # chat form, {"function": {"name": ...}}
            settings["tool_choice"] = [(choice.get("function") or {}).get("name", "")]
        if request.max_output_tokens is not None:
            settings["max_tokens"] = request.max_output_tokens
        messages = _messages(request, call)
        call.sent += 1
        try:
            answer = await _send(model, messages, settings, call)
        except pe.ModelConnectionError as exc:
            # the guard classifies the transport's own error (a timeout, a reset connection);
            # the agent gets Pydantic AI's, should the guard give up (see GuardedModel)
            if not isinstance(exc.__cause__, Exception):
                raise
            call.wrapped_errors[id(exc.__cause__)] = exc
            raise exc.__cause__ from None
        call.usage.incr(answer.usage)
        chat = _answer_chat(answer)
        finish = finish_reason(chat, answer.finish_reason)
        usage = Usage(answer.usage.input_tokens, answer.usage.output_tokens)
        return ModelResponse(chat, finish, usage, model=answer.model_name or "", raw=answer)

    def astream(self, request: ModelRequest) -> AsyncIterator[Any]:
        raise NotImplementedError("the guard judges Pydantic AI answers whole (see asend)")

    def otel_attributes(self, request: ModelRequest) -> dict[str, Any]:
        """The model's provider as Pydantic AI names it (``Model.system``), for telemetry."""
        system = getattr(self._model(request.extensions[_CALL]), "system", None)
        return {"gen_ai.provider.name": provider_name(system)}

    def _model(self, call: _Call) -> Any:
        """The tier's own model, else the one the agent wrapped."""
        return call.model.tiers.get(self._tier.name) or call.model.wrapped


async def _send(model: Any, messages: list[Any], settings: Any, call: _Call) -> Any:
    """One upstream request; a streamed one drained, as the agent asked for a stream."""
    if not call.stream:
        return await model.request(messages, settings, call.params)
    async with model.request_stream(messages, settings, call.params, call.run) as streamed:
        async for _ in streamed:
            pass
    return streamed.get()


class GuardedModel(WrapperModel):
    """A Pydantic AI model whose requests go through an :class:`~agentguard.AsyncGuard`.

    Args:
        wrapped: the model (or a model name Pydantic AI knows, ``"openai:gpt-4o-mini"``).
        config: the guard's configuration (defaults when ``None``).
        tiers: stronger models (or model names) by tier name, for escalation. When ``config``
            defines tiers, each named one is served by its model here (others by ``wrapped``);
            when it defines none, the chain is ``primary`` (``wrapped``), then these in order.
        guard: an :class:`~agentguard.AsyncGuard` to share (what :class:`AgentGuard` does).
        **options: keyword options of :class:`~agentguard.AsyncGuard` (``ledger``, ``hooks``,
            ``clock``, ``sleep``, ``rng``, ``confirm`` ...).
    """

    def __init__(
        self,
        wrapped: Model | str,
        config: GuardConfig | None = None,
        *,
        tiers: Mapping[str, Model | str] | None = None,
        guard: AsyncGuard | None = None,
        **options: Any,
    ) -> None:
        super().__init__(wrapped)
        self.tiers: dict[str, Model] = {n: infer_model(t) for n, t in (tiers or {}).items()}
        models = {n: t.model_name for n, t in self.tiers.items()}
        config, start = primary_chain(config or GuardConfig(), self.wrapped.model_name, models)
        self._start = start or self.wrapped.model_name
        if start is not None:
            self.tiers = {"primary": self.wrapped, **self.tiers}
        self.guard = guard or AsyncGuard(config=config, tier_transport=_Transport, **options)
        self.last_report: GuardReport | None = None

    async def _guarded(
        self, messages: list[pm.ModelMessage], settings: Any, params: Any, stream: bool
    ) -> pm.ModelResponse:
        run = _RUN.get()
        read: tuple[list[dict[str, Any]], list[int]] | None = None
        with fail_open(self.guard, "Pydantic AI", "request"):  # fail-closed raises GuardFailure
            read = _chat(messages)
        if read is None:  # a message the guard cannot read: this request goes unguarded
            unread = _Call(self, messages, settings, params, [], [], run, stream)
            answer: pm.ModelResponse = await _send(self.wrapped, messages, settings, unread)
            return answer
        chat, owners = read
        call = _Call(self, messages, settings, params, chat, owners, run, stream)
        tools = [
            function_tool(t.name, t.parameters_json_schema)
            for t in (*params.function_tools, *params.output_tools)
        ]
        cap = (settings or {}).get("max_tokens")
        request = ModelRequest(
            self._start, chat, tools=tools, max_output_tokens=cap, extensions={_CALL: call}
        )
        try:
            response = await self.guard.acomplete(request)
        except Exception as exc:
            original = call.wrapped_errors.get(id(exc))
            if original is None:
                raise
            raise original from exc
        answer = response.raw
        if _shape(response.message) != _shape(_answer_chat(answer)):  # repaired or corrected
            answer = dataclasses.replace(answer, parts=_carrying(answer, response.message))
        if call.sent > 1:  # every request and token the guard spent counts against the run
            answer = dataclasses.replace(answer, usage=call.usage)
            if run is not None:
                run.usage.requests += call.sent - 1
        self.last_report = response.report
        if response.report is not None:
            attach_report(answer, response.report)
        return answer

    async def request(
        self, messages: list[pm.ModelMessage], model_settings: Any, model_request_parameters: Any
    ) -> pm.ModelResponse:
        """One guarded request (the wrapped model may be asked more than once)."""
        return await self._guarded(messages, model_settings, model_request_parameters, False)

    @contextlib.asynccontextmanager
    async def request_stream(
        self, messages: list[pm.ModelMessage], model_settings: Any, params: Any, run: Any = None
    ) -> AsyncIterator[StreamedResponse]:
        """One guarded streamed request: streamed upstream, replayed once judged."""
        answer = await self._guarded(messages, model_settings, params, True)
        yield CompletedStreamedResponse(answer, model_request_parameters=params, replay_events=True)


@dataclass
class AgentGuard(AbstractCapability[Any]):
    """A capability guarding an agent's model requests and function tool calls.

    Args:
        config: the configuration of the guard and of the default ToolGuard.
        tools: the ToolGuard for tool calls (default: one built from ``config``).
        guard_tools: run function tools through the ToolGuard (``False``: model requests only).
        tool_options: :meth:`ToolGuard.register` options by tool name (``criticality``,
            ``side_effecting``, ``fallbacks``, ``retry`` ...).
        tiers: stronger models by tier name, for escalation (see :class:`GuardedModel`).
        options: keyword options of :class:`~agentguard.AsyncGuard`.
    """

    config: GuardConfig | None = None
    _: KW_ONLY
    tools: ToolGuard | None = None
    guard_tools: bool = True
    tool_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tiers: Mapping[str, Model | str] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = "agentguard"

    def __post_init__(self) -> None:
        # one guard for every model that serves (one ledger, one set of breakers), made on the
        # first request: GuardedModel builds the chain its tiers need
        self.guard: AsyncGuard | None = None
        if self.guard_tools and self.tools is None:
            self.tools = ToolGuard(self.config, hooks=self.options.get("hooks"))
        # registered on first use, replacing a tool of the same name: the agent's runs
        self._tools: FrameworkTools | None = None
        if self.tools is not None:
            self._tools = FrameworkTools(self.tools, self.tool_options, keep_registered=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds live guards: not part of an agent spec

    def get_wrapper_model(self, model: Model) -> Model | None:
        """The serving model, guarded (by this capability's one guard)."""
        if self.guard is not None:
            return GuardedModel(model, self.config, tiers=self.tiers, guard=self.guard)
        guarded = GuardedModel(model, self.config, tiers=self.tiers, **self.options)
        self.guard = guarded.guard
        return guarded

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        """Make the run (its usage and limits) known to the guarded model; a new tool turn."""
        token = _RUN.set(ctx)
        try:
            return await handler(request_context)
        finally:
            _RUN.reset(token)
            if self.tools is not None:
                self.tools.new_turn()

    def _run_of(self, ctx: Any, call: pm.ToolCallPart) -> str | None:
        """The agent run of a tool call, whose loop state judges it (the one capability serves
        every run of the agent): the session of the guarded answer that asked for it, else
        Pydantic AI's own run id (an answer the guard did not hand back)."""
        run = self.guard.run_of_call(call.tool_call_id) if self.guard is not None else None
        if run is None:
            run_id = getattr(ctx, "run_id", None)
            run = f"pydantic-ai-{run_id}" if isinstance(run_id, str) and run_id else None
        return run

    async def wrap_tool_execute(
        self, ctx: Any, *, call: pm.ToolCallPart, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        """Run a function tool through the ToolGuard; Pydantic AI's own signals pass through."""
        if self._tools is None or not self.guard_tools or tool_def.kind != "function":
            return await handler(args)
        name, signals = call.tool_name, []
        self._tools.register(name, takes_key=True)  # (the key goes nowhere)

        async def attempt(_tool: Any, _arguments: dict[str, Any]) -> Any:
            """Through Pydantic AI's own handler (hooks, validation); its signals kept aside."""
            try:
                return await handler(args)
            except _SIGNALS as signal:
                signals.append(signal)  # raised again once the ToolGuard returns
                return "(handled by Pydantic AI)"

        outcome = await self._tools.acall(
            name, call.args_as_dict(), attempt, run=self._run_of(ctx, call)
        )
        if signals:
            raise signals[-1]
        if outcome.ok:
            return outcome.value
        assert outcome.error is not None
        return outcome.error.to_dict()  # the structured error, for the model
