"""LangChain v1: :class:`AgentGuardMiddleware`, the guard as an ``AgentMiddleware`` for
``create_agent``: each model call through a :class:`~agentguard.Guard` (in OpenAI chat form,
LangChain's own handler making every attempt), each tool call through a
:class:`~agentguard.ToolGuard`, sync and async. See ``docs/integrations/langchain.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from agentguard.config import GuardConfig
from agentguard.telemetry import provider_name
from agentguard.tools import ToolGuard, ToolOutcome
from agentguard.transport import (
    ModelRequest,
    ModelResponse,
    attach_report,
    tool_arguments,
    usage_from_body,
)
from agentguard.types import Tier

from ._chat import ChatForms, changed, chat_tool_call, finish_reason, function_tool, kept
from ._guards import KeepsReports, fail_open, twin_guards
from ._lazy import require
from ._tiers import primary_chain
from ._tools import FrameworkTools, PassThrough, attempt_with

require("langchain.agents", "langchain")

from langchain.agents.middleware import AgentMiddleware  # noqa: E402 - after the check
from langchain.agents.structured_output import (  # noqa: E402
    AutoStrategy,
    OutputToolBinding,
    ToolStrategy,
)
from langchain_core.messages import AIMessage, ToolMessage, convert_to_messages  # noqa: E402
from langchain_core.messages import convert_to_openai_messages as _to_chat  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from langgraph.errors import GraphBubbleUp  # noqa: E402

__all__ = ["AgentGuardMiddleware"]

# The ModelRequest.extensions key of the LangChain call in progress (a _ModelCall).
_CALL = "agentguard.langchain.call"


def _chat(message: Any) -> dict[str, Any]:
    """A LangChain message in OpenAI chat form, its unparsable tool calls (raw text) included."""
    chat = cast("dict[str, Any]", _to_chat(message))
    content = chat.get("content")
    if isinstance(message, AIMessage) and isinstance(content, list):
        # an answer kept as content blocks (ChatOpenAI over the Responses API): the guard
        # judges its text (a call written in it, a loop); the blocks stay the message's
        text = [b.get("text") for b in content if isinstance(b, Mapping)]
        chat["content"] = "".join(t for t in text if isinstance(t, str)) or None
    # LangChain's translation takes a Responses answer's calls from its content blocks, the
    # unparsable ones included: those are in already
    ids = {c.get("id") for c in chat.get("tool_calls") or ()}
    for c in getattr(message, "invalid_tool_calls", None) or ():
        if c.get("id") is not None and c.get("id") in ids:
            continue
        call = chat_tool_call(c.get("id"), c.get("name") or "", c.get("args") or "")
        chat.setdefault("tool_calls", []).append(call)
    return chat


#: Every middleware's translations, shared: a message is the same whoever translates it.
_chat_form = ChatForms(lambda message: _chat(message))  # noqa: PLW0108 - looked up per call


def _from_chat(message: Mapping[str, Any]) -> Any:
    """A chat message as LangChain's; a tool call whose arguments are no JSON object (a failed
    answer the guard sends back with its correction) as an invalid tool call."""
    if message.get("role") != "assistant" or not message.get("tool_calls"):
        return convert_to_messages([dict(message)])[0]
    calls, broken = [], []
    for c in message["tool_calls"]:
        fn = c.get("function") or {}
        call = {"name": fn.get("name") or "", "id": c.get("id")}
        try:
            calls.append({**call, "args": tool_arguments(fn.get("arguments")), "type": "tool_call"})
        except (TypeError, ValueError):
            broken.append({**call, "args": fn.get("arguments"), "type": "invalid_tool_call"})
    text = message.get("content") or ""
    return AIMessage(content=text, tool_calls=calls, invalid_tool_calls=broken)


def _structured(request: Any) -> Any:
    """The request's response format as a ``ToolStrategy`` (the form whose schemas may come back
    as tool calls), or ``None`` (none, or a provider strategy: a text answer)."""
    fmt = request.response_format
    if fmt is None or isinstance(fmt, ToolStrategy):
        return fmt
    if getattr(fmt, "schema_spec", None) is not None:  # a provider strategy
        return None
    return ToolStrategy(fmt.schema if isinstance(fmt, AutoStrategy) else fmt)


def _tool_specs(request: Any, structured: Any) -> list[dict[str, Any]]:
    """The request's function tools, and its structured-output tools, in chat ``tools`` form."""
    tools = [
        dict(t) if isinstance(t, Mapping) else convert_to_openai_tool(t) for t in request.tools
    ]
    for spec in structured.schema_specs if structured is not None else ():
        tools.append(function_tool(spec.name, spec.json_schema))
    return [t for t in tools if t.get("type") == "function"]


@dataclasses.dataclass(frozen=True, slots=True)
class _ModelCall:
    """One LangChain model call: its request, its handler, and the guard's view of it."""

    request: Any
    handler: Callable[[Any], Any]
    chat: Sequence[Mapping[str, Any]]
    cap: int | None  # the output cap the chat model is configured with
    structured: Any  # the response format's ToolStrategy, if any

    def lc_request(self, request: ModelRequest, model: Any) -> Any:
        """``request`` (the guard's, perhaps changed) as LangChain's: a message the guard left as
        it was is LangChain's own object; ``model`` serves another tier (``None``: the agent's)."""
        lc = self.request
        originals = [*([lc.system_message] if lc.system_message else []), *lc.messages]
        messages = kept(originals, self.chat, request.messages, _from_chat)
        system = messages.pop(0) if messages and messages[0].type == "system" else None
        settings = dict(lc.model_settings)
        if request.max_output_tokens not in (None, self.cap):  # a cap the budget lowered
            settings["max_tokens"] = request.max_output_tokens
        return lc.override(
            messages=messages,
            system_message=system,
            tool_choice=request.params.get("tool_choice"),
            model_settings=settings,
            model=lc.model if model is None else model,
        )


def _neutral(result: Any) -> ModelResponse:
    """LangChain's ``ModelResponse`` as the guard's (the LangChain one is its ``raw``)."""
    ai = next(m for m in result.result if isinstance(m, AIMessage))
    message = _chat_form(ai)
    meta = ai.response_metadata or {}
    # providers name a cut-off answer differently; the guard only needs this one reason
    length = meta.get("finish_reason") == "length" or meta.get("stop_reason") == "max_tokens"
    finish = finish_reason(message, "length" if length else None)
    usage = usage_from_body(ai.usage_metadata)
    return ModelResponse(message, finish, usage, id=ai.id, raw=result)


class _Transport:
    """LangChain's model handler as the guard's transport, for one tier (sync and async; no
    streaming: the middleware guards each call whole)."""

    def __init__(self, tier: Tier, models: Mapping[str, Any]) -> None:
        self._model = models.get(tier.name)

    def send(self, request: ModelRequest) -> ModelResponse:
        call: _ModelCall = request.extensions[_CALL]
        return _neutral(call.handler(call.lc_request(request, self._model)))

    async def asend(self, request: ModelRequest) -> ModelResponse:
        call: _ModelCall = request.extensions[_CALL]
        return _neutral(await call.handler(call.lc_request(request, self._model)))

    def otel_attributes(self, request: ModelRequest) -> dict[str, Any]:
        """The chat model's provider as LangChain names it for tracing (``ls_provider``)."""
        call: _ModelCall = request.extensions[_CALL]
        model = call.request.model if self._model is None else self._model
        provider = model._get_ls_params().get("ls_provider")  # what LangSmith traces show
        return {"gen_ai.provider.name": provider_name(provider)}


def _answer(response: ModelResponse, structured: Any) -> Any:
    """The LangChain response to hand back: the model's own, rebuilt only if the guard changed
    its answer (then a structured-output call is parsed as LangChain would have); the report
    attached to its AI message (``agentguard.report_of(message)``)."""
    raw = response.raw
    index, ai = next((i, m) for i, m in enumerate(raw.result) if isinstance(m, AIMessage))
    before, after = _chat_form(ai), response.message
    if changed(before, after):
        fixed = _from_chat({**after, "role": "assistant"})
        content = ai.content
        if isinstance(content, list):  # content blocks: each keeps its place and ids
            text = fixed.content if changed(before, after, "content") else None
            content = _blocks(content, before, after, fixed, text)
        elif changed(before, after, "content"):
            content = fixed.content
        update = {
            "content": content,
            "tool_calls": fixed.tool_calls,
            "invalid_tool_calls": fixed.invalid_tool_calls,
            "additional_kwargs": {
                k: v for k, v in ai.additional_kwargs.items() if k != "tool_calls"
            },
        }
        ai = ai.model_copy(update=update)
        raw = dataclasses.replace(raw, result=[*raw.result[:index], ai, *raw.result[index + 1 :]])
        if structured is not None and raw.structured_response is None:
            raw = _parsed(raw, fixed.tool_calls, structured)
    if response.report is not None:
        attach_report(ai, response.report)
    return raw


#: The text blocks of a message's content (LangChain's, and the Responses API's own).
_TEXT_BLOCKS = ("text", "output_text")
#: LangChain's call blocks (``output_version="v1"``; a streamed call's that did not parse stays
#: a chunk's)
_CALL_BLOCKS = ("tool_call", "invalid_tool_call", "tool_call_chunk")


def _blocks(content: list[Any], before: Any, after: Any, fixed: Any, text: Any) -> list[Any]:
    """A message's content blocks carrying the guard's calls (those of ``after``, the guard's
    answer, and ``fixed``, it as LangChain's message, where they differ from ``before``, the
    model's) and ``text``, when not ``None``.

    ChatOpenAI over the Responses API keeps the answer's items as blocks (``function_call`` in
    ``output_version="responses/v1"``, ``tool_call`` / ``invalid_tool_call`` in ``"v1"``) and
    sends them back from there, ids and reasoning items included: a call block the guard
    repaired carries the repaired call in its place, with its ids (OpenAI wants a reasoning item
    followed by the very item it was paired with); one the guard left out goes; the first text
    block carries the text.
    """
    by_id = {c["id"]: ("tool_call", c) for c in fixed.tool_calls if c.get("id")}
    by_id.update((c["id"], ("invalid_tool_call", c)) for c in fixed.invalid_tool_calls if c["id"])
    texts = {c.get("id"): c.get("function") for c in after.get("tool_calls") or ()}
    unchanged = {c.get("id"): c.get("function") for c in before.get("tool_calls") or ()}
    out: list[Any] = []
    text_done = False
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        carried = block
        if kind == "function_call" or kind in _CALL_BLOCKS:
            found = by_id.get(block.get("call_id" if kind == "function_call" else "id"))
            if found is None:
                continue
            state, call = found
            if texts.get(call["id"]) == unchanged.get(call["id"]):
                pass  # as the model sent it
            elif kind == "function_call":  # the guard's own arguments text
                fn = texts.get(call["id"]) or {}
                carried = {**block, "name": fn.get("name"), "arguments": fn.get("arguments")}
            else:
                extras = {k: v for k, v in block.items() if k not in ("args", "error", "type")}
                carried = {**extras, "type": state, "name": call["name"], "args": call["args"]}
        elif kind in _TEXT_BLOCKS and text is not None:
            if text_done or not text:
                continue
            carried, text_done = {**block, "text": text}, True
        out.append(carried)
    if text and not text_done:
        out.append({"type": "text", "text": text})
    return out


def _parsed(raw: Any, calls: list[Any], structured: Any) -> Any:
    """``raw`` with the structured response of its one structured-output call (repaired by the
    guard after LangChain found none), and the tool message LangChain answers it with."""
    specs = {spec.name: spec for spec in structured.schema_specs}
    found = [c for c in calls if c["name"] in specs]
    if len(found) != 1:
        return raw  # none, or several: LangChain's own handling asks again
    call = found[0]
    try:
        value = OutputToolBinding.from_schema_spec(specs[call["name"]]).parse(call["args"])
    except Exception:  # as LangChain found it: no structured response
        return raw
    text = structured.tool_message_content or f"Returning structured response: {value}"
    message = ToolMessage(content=text, tool_call_id=call["id"], name=call["name"])
    return dataclasses.replace(raw, result=[*raw.result, message], structured_response=value)


@dataclasses.dataclass(slots=True)
class _ToolCall:
    """One LangChain tool call in progress: how the ToolGuard's runner makes an attempt."""

    request: Any
    handler: Callable[[Any], Any]
    is_async: bool
    result: Any = None

    async def run(self, tool: Any, arguments: dict[str, Any]) -> Any:
        call = {**self.request.tool_call, "name": tool.name, "args": arguments}
        request = self.request.override(tool_call=call, tool=tool)
        try:
            result = await attempt_with(self.handler, request, self.is_async)
        except GraphBubbleUp as exc:
            raise PassThrough(exc) from None
        if tool is self.request.tool:
            self.result = result
        # the content is the result loop detection compares (a ToolMessage has its own id)
        return result.content if isinstance(result, ToolMessage) else result

    def arguments(self) -> tuple[str, dict[str, Any]]:
        """The ToolGuard's call: the tool's name and the model's arguments."""
        return self.request.tool_call["name"], dict(self.request.tool_call["args"])

    def message(self, outcome: ToolOutcome) -> Any:
        """The ToolGuard's outcome as what LangChain expects from the tool node. Its loop hint
        is left out: the model-side guard gives the model the same hints, and a hint written
        into the history would make an unchanged result look like progress."""
        outcome = dataclasses.replace(outcome, hint="")
        call = self.request.tool_call
        own = outcome.ok and outcome.fallback is None and not outcome.replayed
        if own and self.result is not None:
            return self.result  # the tool node's own message (artifact, name, id)
        status = "success" if outcome.ok else "error"
        return ToolMessage(
            content=outcome.content, tool_call_id=call["id"], name=call["name"], status=status
        )


class AgentGuardMiddleware(KeepsReports, AgentMiddleware):
    """The guard for ``langchain.agents.create_agent``: ``middleware=[AgentGuardMiddleware()]``.

    Args:
        config: the guard's configuration (defaults when ``None``).
        tiers: stronger LangChain chat models by tier name, for escalation. With tiers in
            ``config``, each named tier is served by its model here (others by the agent's).
            With none, the chain becomes ``primary`` (the agent's model) then these, in order.
        tool_guard: the :class:`~agentguard.ToolGuard` for tool calls (default: one built from
            ``config``); ``False`` leaves tool calls alone. LangChain tools are registered in it
            on first use, with the options ``tool_options`` gives their name.
        tool_options: :meth:`ToolGuard.register <agentguard.ToolGuard.register>` options by tool
            name (``criticality``, ``side_effecting``, ``fallbacks``, ``timeout`` ...).
        asleep: the async guard's wait between retries (``sleep`` in ``options`` is the sync one).
        **options: keyword options of :class:`~agentguard.Guard` (``ledger``, ``clock``,
            ``sleep``, ``rng``, ``hooks``, ``confirm`` ...).

    The guard's structured stops (``LoopDetected``, ``BudgetExceeded``,
    ``ToolValidationFailed`` ...) end the run by raising from ``invoke`` / ``ainvoke``. What the
    guard did is in :attr:`reports` and on each AI message (``agentguard.report_of(message)``).
    """

    def __init__(
        self,
        config: GuardConfig | None = None,
        *,
        tiers: Mapping[str, Any] | None = None,
        tool_guard: ToolGuard | bool = True,
        tool_options: Mapping[str, Mapping[str, Any]] | None = None,
        asleep: Callable[[float], Awaitable[None]] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        config = config or GuardConfig()
        self._models = dict(tiers or {})
        config, self._start = primary_chain(config, "primary", {n: n for n in self._models})

        def transport(tier: Tier) -> Any:  # a transport that does not stream
            return _Transport(tier, self._models)

        self.guard, self.aguard = twin_guards(config, transport, options, asleep)
        if tool_guard is True:
            tool_guard = ToolGuard(config, hooks=options.get("hooks"))
        # not ``tools``: that is the extra tools a LangChain middleware brings
        self.tool_guard: ToolGuard | None = tool_guard or None
        self._tools = FrameworkTools(tool_guard, tool_options) if tool_guard else None

    def _call(self, request: Any, handler: Callable[[Any], Any]) -> ModelRequest:
        messages = [request.system_message] if request.system_message is not None else []
        chat = [_chat_form(m) for m in [*messages, *request.messages]]
        for tool in request.tools:  # so a tool's fallbacks can name the agent's other tools
            if not isinstance(tool, Mapping):
                self._register(tool)
        model = request.model
        cap = request.model_settings.get("max_tokens", getattr(model, "max_tokens", None))
        name = self._start or getattr(model, "model_name", None) or getattr(model, "model", "")
        params = {} if request.tool_choice is None else {"tool_choice": request.tool_choice}
        structured = _structured(request)
        return ModelRequest(
            str(name or type(model).__name__),
            chat,
            params,
            tools=_tool_specs(request, structured),
            max_output_tokens=cap if isinstance(cap, int) else None,
            extensions={_CALL: _ModelCall(request, handler, chat, cap, structured)},
        )

    def _guarded(self, request: Any, handler: Callable[[Any], Any]) -> ModelRequest | None:
        with fail_open(self.guard, "LangChain", "request"):
            return self._call(request, handler)
        return None  # the adapter failed: the call goes on unguarded

    def _done(self, request: ModelRequest, response: ModelResponse) -> Any:
        self._keep(response.report)
        with fail_open(self.guard, "LangChain", "response"):
            if response.message.get("tool_calls") and self.tool_guard is not None:
                self.tool_guard.new_turn(reasoning=response.message.get("content") or None)
            return _answer(response, request.extensions[_CALL].structured)
        return response.raw  # the chat model's answer as LangChain's handler gave it

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """One model call of the agent, guarded."""
        guarded = self._guarded(request, handler)
        if guarded is None:
            return handler(request)
        return self._done(guarded, self.guard.complete(guarded))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Async twin of :meth:`wrap_model_call`."""
        guarded = self._guarded(request, handler)
        if guarded is None:
            return await handler(request)
        return self._done(guarded, await self.aguard.acomplete(guarded))

    def _register(self, tool: Any) -> None:
        if self._tools is not None:
            self._tools.register(tool.name, tool, takes_key="idempotency_key" in tool.args)

    def _begin(
        self, request: Any, handler: Callable[[Any], Any], is_async: bool
    ) -> _ToolCall | None:
        """The tool call to run through the ToolGuard; ``None`` to leave to the tool node (no
        ToolGuard, or a tool the agent does not have: its tool node says so)."""
        if self._tools is None or request.tool is None:
            return None
        with fail_open(self.guard, "LangChain", "tool registration"):
            self._register(request.tool)
            return _ToolCall(request, handler, is_async)
        return None

    def _run_of(self, request: Any) -> str | None:
        """The agent run of a tool call: the session of the guarded answer that asked for it
        (loop state is per run; the one middleware serves every run of the agent)."""
        call_id = request.tool_call.get("id")
        return self.guard.run_of_call(call_id) if isinstance(call_id, str) else None

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """One tool call of the agent, through the ToolGuard."""
        call = self._begin(request, handler, is_async=False)
        if call is None or self._tools is None:
            return handler(request)
        outcome = self._tools.call(*call.arguments(), call.run, run=self._run_of(request))
        return call.message(outcome)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Async twin of :meth:`wrap_tool_call`."""
        call = self._begin(request, handler, is_async=True)
        if call is None or self._tools is None:
            return await handler(request)
        outcome = await self._tools.acall(*call.arguments(), call.run, run=self._run_of(request))
        return call.message(outcome)
