"""CrewAI: :class:`GuardedLLM` (a guarded ``BaseLLM``), :class:`ToolHooks` (tool calls through a
ToolGuard) and :func:`instrument` (both, for every agent of a crew, for one kickoff).

CrewAI's ``after_llm_call`` hook never sees a native tool-call answer and a malformed tool call
fires no tool hook: the LLM wrapper is where those are caught. The wrapped LLM's own retries
(its SDK's ``max_retries``, CrewAI's rate-limit retry around ``call``) are off: the guard is the
only retry layer. See ``docs/integrations/crewai.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import anyio.to_thread

from agentguard.config import GuardConfig
from agentguard.guard import Guard, GuardReport
from agentguard.telemetry import provider_name
from agentguard.tools import ToolGuard, ToolOutcome
from agentguard.transport import ModelRequest, ModelResponse, tool_arguments
from agentguard.types import Tier, Usage

from ._lazy import require
from ._tiers import with_tier_chain

require("crewai", "crewai")

from crewai.hooks import (  # noqa: E402 - after the check that names the extra
    register_after_tool_call_hook,
    register_before_tool_call_hook,
    unregister_after_tool_call_hook,
    unregister_before_tool_call_hook,
)
from crewai.llms.base_llm import BaseLLM, call_stop_override  # noqa: E402
from crewai.utilities.agent_utils import extract_tool_call_info  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

__all__ = ["CrewAITransport", "GuardedLLM", "ToolHooks", "instrument", "without_retries"]

# The ModelRequest.extensions key of the crewai call in progress: (its GuardedLLM, the crewai
# call's own keyword arguments, the executor's stop words for the call or None). A shared guard
# serves several GuardedLLMs: the request says whose.
_CALL = "agentguard.crewai.call"


def without_retries(llm: BaseLLM) -> BaseLLM:
    """A copy of ``llm`` whose SDK client does not retry (``max_retries=0``), or ``llm`` itself
    when it has no such setting or it is already 0. The original is not changed."""
    if not getattr(llm, "max_retries", 0):
        return llm
    # Rebuilt rather than model_copy'd: provider LLMs build their SDK client at validation.
    return type(llm)(**{**dict(llm), "max_retries": 0})


def _unretried_call(llm: BaseLLM) -> Callable[..., Any]:
    """``llm.call`` without the rate-limit retry CrewAI wraps around every ``BaseLLM.call``."""
    method = type(llm).call
    if getattr(method, "_crewai_rate_limit_wrapped", False):
        method = getattr(method, "__wrapped__", method)
    return method.__get__(llm)  # type: ignore[no-any-return]


def _tool_calls(answer: Any) -> list[dict[str, Any]] | None:
    """A crewai LLM's tool-call answer (any provider's shape) as OpenAI ``tool_calls``."""
    if not isinstance(answer, list) or not answer:
        return None
    calls = []
    for item in answer:
        info = extract_tool_call_info(item)
        if info is None:
            return None
        call_id, name, arguments = info
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        function = {"name": name, "arguments": text}
        calls.append({"id": call_id, "type": "function", "function": function})
    return calls


class CrewAITransport:
    """A transport over a crewai LLM: one retry-less ``llm.call`` per request.

    The model named in the request is ignored (the LLM object knows its model); the crewai
    call's own arguments (callbacks, task, agent, response model) are those of the
    :class:`GuardedLLM` call that made the request (in its extensions).
    """

    def __init__(self, llm: BaseLLM) -> None:
        self.llm = without_retries(llm)
        self._call = _unretried_call(self.llm)

    def send(self, request: ModelRequest) -> ModelResponse:
        """One call of the wrapped LLM, its answer in neutral form."""
        current = request.extensions.get(_CALL)
        kwargs = dict(current[1]) if current else {}
        stops = current[2] if current else None
        tools = list(request.tools) or None
        before = self.llm.get_token_usage_summary()
        if stops is not None:  # a tier LLM's own stop words kept as well
            stops = stops + [s for s in self.llm.stop if s not in stops]
        # crewai keys a call's stop words by the LLM object (the GuardedLLM): the LLM called
        # here must see them to send and apply them as it would unguarded
        with call_stop_override(self.llm, stops):
            answer = self._call(list(request.messages), tools=tools, **kwargs)
        after = self.llm.get_token_usage_summary()
        prompt = after.prompt_tokens - before.prompt_tokens
        completion = after.completion_tokens - before.completion_tokens
        usage = Usage(prompt, completion) if prompt or completion else None
        calls = _tool_calls(answer)
        if calls is not None:
            message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls}
            finish = "tool_calls"
        else:
            text = answer.model_dump_json() if hasattr(answer, "model_dump_json") else answer
            message, finish = {"role": "assistant", "content": text}, "stop"
        return ModelResponse(message, finish, usage, model=self.llm.model, raw=answer)

    def stream(self, request: ModelRequest) -> Iterator[Any]:
        """Not offered: crewai streams through its own event bus, not a chunk iterator."""
        raise NotImplementedError("CrewAITransport does not stream")

    def otel_attributes(self, request: ModelRequest) -> dict[str, Any]:
        """The LLM's provider, for telemetry (``gen_ai.provider.name``)."""
        provider = getattr(self.llm, "provider", None)
        return {"gen_ai.provider.name": provider_name(provider)}


class _TierTransport:
    """A tier's transport for whichever :class:`GuardedLLM` made the request."""

    def __init__(self, tier: Tier) -> None:
        self._tier = tier

    def send(self, request: ModelRequest) -> ModelResponse:
        llm: GuardedLLM = request.extensions[_CALL][0]
        return llm._transport(self._tier).send(request)

    def otel_attributes(self, request: ModelRequest) -> dict[str, Any]:
        llm: GuardedLLM = request.extensions[_CALL][0]
        return llm._transport(self._tier).otel_attributes(request)

    def stream(self, request: ModelRequest) -> Iterator[Any]:
        raise NotImplementedError("CrewAITransport does not stream")


class GuardedLLM(BaseLLM):
    """A crewai LLM that runs every call of the wrapped one through the guard.

    Args:
        llm: the user's crewai LLM (``crewai.LLM(...)`` or any ``BaseLLM``); a copy without
            retries is called, the original is not changed.
        config: the guard's configuration (defaults when ``None``).
        tiers: stronger crewai LLMs by tier name, for escalation. When ``config`` defines
            tiers, each named tier is served by its LLM here (others by ``llm``). When it
            defines none, the chain becomes ``primary`` (``llm``) followed by these in order.
        guard: a :class:`~agentguard.Guard` to share (one ledger, one set of breakers for
            several agents: :func:`instrument` does this); default: one of its own.
        **options: keyword options of :class:`~agentguard.Guard` (``ledger``, ``clock``,
            ``sleep``, ``rng``, ``hooks``, ``confirm`` ...).
    """

    llm_type: str = "agentguard"

    _inner: BaseLLM = PrivateAttr()
    _tiers: dict[str, CrewAITransport] = PrivateAttr(default_factory=dict)
    _start: str = PrivateAttr()
    _guard: Guard = PrivateAttr()
    _turns: ToolGuard | None = PrivateAttr(default=None)
    _report: GuardReport | None = PrivateAttr(default=None)

    def __init__(
        self,
        llm: BaseLLM,
        config: GuardConfig | None = None,
        *,
        tiers: Mapping[str, BaseLLM] | None = None,
        guard: Guard | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model=llm.model, temperature=llm.temperature, stop=list(llm.stop))
        tiers = dict(tiers or {})
        config = config or GuardConfig()
        self._start = llm.model
        if tiers and not config.tiers:
            self._start = "primary"
            tiers = {"primary": llm, **tiers}
            config = with_tier_chain(config, {name: t.model for name, t in tiers.items()})
        self._inner = llm
        self._tiers = {name: CrewAITransport(t) for name, t in tiers.items()}
        self._tiers.setdefault("", CrewAITransport(llm))
        self._guard = guard or Guard(config=config, tier_transport=_TierTransport, **options)

    @property
    def guard(self) -> Guard:
        """The guard this LLM's calls run through (its pipeline, ledger and config)."""
        return self._guard

    @property
    def last_report(self) -> GuardReport | None:
        """What the guard did for the latest call (crewai's answers cannot carry a report)."""
        return self._report

    def _transport(self, tier: Tier) -> CrewAITransport:
        return self._tiers.get(tier.name) or self._tiers[""]

    def call(  # noqa: PLR0917 - crewai's BaseLLM.call signature
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        """One guarded call; the answer in the form the wrapped LLM gives (text, tool calls).

        Tool calls come back validated (repaired or corrected), in OpenAI format, for the
        agent to run. With ``available_functions``, the (first) call is run here instead and
        its result returned, as crewai's own LLMs do.
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        kwargs = {
            "callbacks": callbacks,
            "from_task": from_task,
            "from_agent": from_agent,
            "response_model": response_model,
        }
        # the executor's stop words (crewai's call_stop_override of this object), for the LLM
        stops = self.stop_sequences
        call = (self, kwargs, list(stops) if stops != self.stop else None)
        request = ModelRequest(self._start, messages, tools=tools or (), extensions={_CALL: call})
        response = self._guard.complete(request)
        self._report = response.report
        message = response.message
        calls = message.get("tool_calls")
        if not calls:
            raw, content = response.raw, message.get("content") or ""
            dump = getattr(raw, "model_dump_json", None)
            if callable(dump) and dump() == content:
                return raw  # unchanged structured answer: the provider's own object
            return content
        if self._turns is not None:
            self._turns.new_turn(reasoning=message.get("content") or None)
        calls = [dict(c) for c in calls]
        if available_functions:
            function = calls[0]["function"]
            return available_functions[function["name"]](**tool_arguments(function["arguments"]))
        return calls

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        """Async twin of :meth:`call` (the guarded call runs on a worker thread)."""
        return await anyio.to_thread.run_sync(lambda: self.call(*args, **kwargs))

    def supports_function_calling(self) -> bool:
        """Whether the wrapped LLM calls tools natively."""
        supports = getattr(self._inner, "supports_function_calling", None)
        return bool(supports()) if callable(supports) else False

    def supports_stop_words(self) -> bool:
        """Whether the wrapped LLM honours stop words."""
        return bool(self._inner.supports_stop_words())

    def get_context_window_size(self) -> int:
        """The wrapped LLM's usable context window."""
        return int(self._inner.get_context_window_size())


# CrewAI wraps every BaseLLM subclass's call in its own rate-limit retry; around the guard
# that would retry the whole guarded call (retries nested). The guard is the only retry layer.
for _name in ("call", "acall"):
    _method = GuardedLLM.__dict__[_name]
    setattr(GuardedLLM, _name, getattr(_method, "__wrapped__", _method))


class ToolHooks:
    """CrewAI tool hooks that run each tool call through a :class:`~agentguard.ToolGuard`.

    ``before_tool_call`` runs the call through the guard (loop check, breaker, timeout,
    retries within the turn's budget, fallbacks) and stops crewai from running it again;
    ``after_tool_call`` hands the outcome back as the tool's result: the value, or a
    structured error telling the model what failed and whether retrying can help. Tools the
    ToolGuard does not know are registered on first use with default options; register a tool
    under its crewai name first to give it options (criticality, fallbacks ...).

    Args:
        tools: the ToolGuard to use (default: one built from ``config``).
        config: its configuration, when ``tools`` is not given.
        crew: act only on this crew's tool calls (default: every crew's).
        hints: append the loop detector's hints to results. :func:`instrument` turns them off:
            its :class:`GuardedLLM` gives the model the same hints, and a hint written into
            crewai's history would make an unchanged result look like progress.
    """

    def __init__(
        self,
        tools: ToolGuard | None = None,
        config: GuardConfig | None = None,
        *,
        crew: Any = None,
        hints: bool = True,
    ) -> None:
        self.tools = tools or ToolGuard(config)
        self.crew = crew
        self.hints = hints
        self._outcomes: dict[int, ToolOutcome] = {}

    def before_tool_call(self, context: Any) -> bool | None:
        """Run the call guarded; ``False`` (crewai must not run it) once it has run."""
        if self.crew is not None and context.crew is not self.crew:
            return None
        name = context.tool_name
        if name not in self.tools.tools:
            tool = context.tool
            if tool is None:
                return None  # unknown to crewai as well: its own message says so
            self.tools.register(lambda **kw: tool.invoke(kw), name=name)
        self._outcomes[id(context.tool_input)] = self.tools.call(name, dict(context.tool_input))
        return False

    def after_tool_call(self, context: Any) -> str | None:
        """The guarded outcome as the tool's result (``None``: a call these hooks left alone)."""
        outcome = self._outcomes.pop(id(context.tool_input), None)
        if outcome is None:
            return None
        if outcome.ok:  # the value as crewai renders it for the model (the tool's own formatter)
            render = getattr(context.tool, "format_output_for_agent", str)
            outcome = dataclasses.replace(outcome, value=str(render(outcome.value)))
        return (outcome if self.hints else dataclasses.replace(outcome, hint="")).content

    @contextlib.contextmanager
    def installed(self) -> Iterator[ToolHooks]:
        """Register the hooks with crewai for the duration of the block."""
        register_before_tool_call_hook(self.before_tool_call)
        register_after_tool_call_hook(self.after_tool_call)
        try:
            yield self
        finally:
            unregister_before_tool_call_hook(self.before_tool_call)
            unregister_after_tool_call_hook(self.after_tool_call)


@contextlib.contextmanager
def instrument(
    crew: Any,
    config: GuardConfig | None = None,
    *,
    tiers: Mapping[str, BaseLLM] | None = None,
    tools: ToolGuard | None = None,
    **options: Any,
) -> Iterator[list[GuardedLLM]]:
    """Guard every agent of ``crew`` (its LLM and its tool calls) inside the block.

    Each agent's LLM is replaced by a :class:`GuardedLLM`, all sharing one
    :class:`~agentguard.Guard` (one token ledger and one set of breakers for the crew), and
    :class:`ToolHooks` acting on this crew only are installed; all is undone on exit.

    Args:
        crew: the ``crewai.Crew``.
        config: the configuration of the guard and of the default ToolGuard.
        tiers: stronger crewai LLMs by tier name (see :class:`GuardedLLM`).
        tools: the ToolGuard for the crew's tool calls (default: one built from ``config``,
            with the same event ``hooks``).
        **options: keyword options of :class:`~agentguard.Guard`.

    Yields:
        The guarded LLMs, one per agent (``llm.guard``, ``llm.last_report``).
    """
    hooks = ToolHooks(
        tools or ToolGuard(config, hooks=options.get("hooks")), crew=crew, hints=False
    )
    agents: Sequence[Any] = list(crew.agents)
    originals = [agent.llm for agent in agents]
    guarded: list[GuardedLLM] = []
    try:
        for agent, llm in zip(agents, originals, strict=True):
            if not isinstance(llm, GuardedLLM):
                shared = guarded[0].guard if guarded else None
                llm = GuardedLLM(llm, config, tiers=tiers, guard=shared, **options)  # noqa: PLW2901
                agent.llm = llm
            llm._turns = hooks.tools
            guarded.append(llm)
        with hooks.installed():
            yield guarded
    finally:
        for agent, llm in zip(agents, originals, strict=True):
            agent.llm = llm
        for llm in guarded:
            llm._turns = None
        if tools is None:
            hooks.tools.close()  # the worker threads of the ToolGuard made here
