"""The OpenAI Agents SDK: guarded models (chat completions and Responses, streaming included) and
tools whose execution goes through a :class:`~agentguard.ToolGuard`.

- :func:`guarded_model` / :class:`GuardedProvider`: the SDK's own ``OpenAIResponsesModel`` or
  ``OpenAIChatCompletionsModel`` over a client wrapped by :func:`agentguard.wrap`, so every model
  call of a ``Runner.run`` / ``run_streamed`` goes through the whole pipeline (repair, correction,
  escalation, loop checks, budgets) before the SDK sees the answer. The client's own retries are
  off: the guard is the only retry layer (the SDK's runner-managed ``ModelSettings.retry`` is
  opt-in and stays the user's choice).
- :func:`guard_tool` / :func:`guard_tools`: each ``FunctionTool`` runs through the ToolGuard
  (loop checks on executed calls, timeouts, retries, breakers, idempotency, fallbacks), and
  carries its decisions as SDK tool guardrails: an input guardrail that refuses a call while the
  tool's breaker is open (nothing runs), an output guardrail whose ``output_info`` is the
  :class:`~agentguard.ToolOutcome` and which rejects the result when the guard refused the call.
  The SDK records both in ``RunResult.tool_input_guardrail_results`` /
  ``tool_output_guardrail_results``.

See ``docs/integrations/openai-agents.md``.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import json
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Literal

from agentguard import wrap
from agentguard.config import GuardConfig
from agentguard.guard import AsyncGuard, Guard
from agentguard.integrations.openai import is_async_client
from agentguard.integrations.openai._client import guard_of
from agentguard.tools import ToolGuard, ToolOutcome

from ._lazy import require

require("agents", "openai-agents")

from agents import (  # noqa: E402 - after the check that names the extra
    Agent,
    FunctionTool,
    Model,
    ModelProvider,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
    ToolOutputGuardrail,
    ToolOutputGuardrailData,
)
from agents.models import get_default_model  # noqa: E402
from agents.tool import set_function_tool_failure_error_function  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = ["GuardedProvider", "guard_tool", "guard_tools", "guarded_model"]

Api = Literal["responses", "chat_completions"]


def _model(name: str, client: Any, api: Api) -> Model:
    if api == "responses":
        return OpenAIResponsesModel(name, client)
    if api == "chat_completions":
        return OpenAIChatCompletionsModel(name, client)
    raise ValueError(f"api must be 'responses' or 'chat_completions', not {api!r}")


def guarded_model(
    model: str | None = None,
    client: Any = None,
    config: GuardConfig | Mapping[str, Any] | str | None = None,
    *,
    api: Api = "responses",
    **options: Any,
) -> Model:
    """A model for ``Agent(model=...)`` whose every call goes through the guard.

    Args:
        model: the model name (default: the SDK's default model).
        client: the ``openai.AsyncOpenAI`` client to wrap (default: one from the environment,
            ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``). The original is not changed.
        config: the guard's configuration, as for :func:`agentguard.wrap`.
        api: ``"responses"`` (the SDK's default) or ``"chat_completions"``.
        **options: keyword options of :class:`~agentguard.AsyncGuard` (``ledger``, ``hooks``,
            ``clock``, ``sleep``, ``rng``, ``confirm`` ...).

    Returns:
        The SDK's ``OpenAIResponsesModel`` / ``OpenAIChatCompletionsModel`` over the guarded
        client; ``agentguard.report_of`` works on the raw responses its client returns.

    Raises:
        TypeError: ``client`` is not an ``AsyncOpenAI`` client (the SDK awaits its model).
        ValueError: ``api`` is neither of the two.
    """
    return GuardedProvider(client, config, api=api, **options).get_model(model)


class GuardedProvider(ModelProvider):
    """A model provider for ``RunConfig(model_provider=...)``: every agent of a run, whatever
    model it names, is served through one guarded client (one ledger, one set of breakers).

    Args:
        client: the ``openai.AsyncOpenAI`` client to wrap (default: one from the environment).
        config: the guard's configuration, as for :func:`agentguard.wrap`.
        api: ``"responses"`` or ``"chat_completions"``.
        **options: keyword options of :class:`~agentguard.AsyncGuard`.
    """

    def __init__(
        self,
        client: Any = None,
        config: GuardConfig | Mapping[str, Any] | str | None = None,
        *,
        api: Api = "responses",
        **options: Any,
    ) -> None:
        if client is None:
            from openai import AsyncOpenAI  # noqa: PLC0415 - the SDK depends on openai

            client = AsyncOpenAI()
        _model("", None, api)  # fail here, not at the first call, on a misspelt api
        if not is_async_client(client):
            raise TypeError("the Agents SDK calls its model with await: give an AsyncOpenAI client")
        self.client = wrap(client, config, **options)
        #: The guard every model call goes through.
        self.guard = guard_of(self.client)
        self.api: Api = api
        self._models: dict[str, Model] = {}

    def get_model(self, model_name: str | None) -> Model:
        """The guarded model for ``model_name`` (the SDK's default when ``None``)."""
        name = model_name or get_default_model()
        if name not in self._models:
            self._models[name] = _model(name, self.client, self.api)
        return self._models[name]


# -- tools -------------------------------------------------------------------------------------

# The SDK's ToolContext of the call in progress, for the function the ToolGuard runs: the guard
# calls tools with the model's arguments only, the SDK's invoker needs its context too.
_CONTEXT: contextvars.ContextVar[ToolContext[Any]] = contextvars.ContextVar("agentguard_oa_tool")


def _model_guard(context: ToolContext[Any]) -> Guard | AsyncGuard | None:
    """The guard of the model serving the run of a tool call, when agentguard guards it (a
    :func:`guarded_model`, a :class:`GuardedProvider`, a model over a :func:`agentguard.wrap`
    client)."""
    config = context.run_config
    model = getattr(config, "model", None) or getattr(context.agent, "model", None)
    if isinstance(model, Model):  # the SDK's OpenAI models keep their client as ``_client``
        return guard_of(getattr(model, "_client", None))
    provider = getattr(config, "model_provider", None)
    return provider.guard if isinstance(provider, GuardedProvider) else None


#: A key per SDK run, by ``id`` of the run's ``Usage`` (one object per run, shared by every
#: ToolContext of the run; not hashable), held weakly: the key goes when the run does.
_SDK_RUNS: dict[int, tuple[weakref.ref[Any], str]] = {}


def _sdk_run(context: ToolContext[Any]) -> str | None:
    """A key of the SDK run making a tool call (its ``Usage`` object), for a run whose model no
    guard serves; ``None`` when it has none."""
    usage = getattr(context, "usage", None)
    found = _SDK_RUNS.get(id(usage))
    if found is not None and found[0]() is usage:
        return found[1]
    number = id(usage)

    def gone(ref: weakref.ref[Any]) -> None:
        if _SDK_RUNS.get(number, (None,))[0] is ref:  # (not a later object with its id)
            del _SDK_RUNS[number]

    try:
        ref = weakref.ref(usage, gone)
    except TypeError:  # None, or an object that takes no weak reference
        return None
    key = f"agents-run-{uuid.uuid4().hex[:12]}"
    _SDK_RUNS[number] = (ref, key)
    return key


def _run_of(context: ToolContext[Any]) -> str | None:
    """The run of a tool call, whose loop state judges it: the session of the guarded answer
    that asked for it, else the SDK run making it."""
    guard = _model_guard(context)
    run = guard.run_of_call(context.tool_call_id) if guard is not None else None
    return run if run is not None else _sdk_run(context)


@dataclasses.dataclass
class _Decisions:
    """The outcomes of calls whose output guardrail has not run yet, by tool call id."""

    tools: ToolGuard
    outcomes: dict[str, ToolOutcome] = dataclasses.field(default_factory=dict)

    def input_guardrail(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        """Refuse a call up front while its tool's breaker is open and nothing can stand in."""
        name = data.context.tool_name
        tool = self.tools.tools.get(name)
        if tool is None or tool.fallbacks or self.tools.breaker(name).state != "open":
            return ToolGuardrailFunctionOutput.allow()
        message = json.dumps(
            {
                "error": "breaker_open",
                "tool": name,
                "message": f"{name} keeps failing and is paused; use another way or try later.",
                "retryable": True,
            }
        )
        return ToolGuardrailFunctionOutput.reject_content(message, {"breaker": "open"})

    def output_guardrail(self, data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        """The ToolGuard's outcome as the guardrail's ``output_info``; a refusal rejects."""
        outcome = self.outcomes.pop(data.context.tool_call_id, None)
        if outcome is None:
            return ToolGuardrailFunctionOutput.allow()
        info = outcome.to_dict()
        if not outcome.ok and outcome.attempts == 0:  # refused: the guard did not run it
            return ToolGuardrailFunctionOutput.reject_content(outcome.content, info)
        return ToolGuardrailFunctionOutput.allow(info)


def guard_tool(tool: FunctionTool, tools: ToolGuard, **options: Any) -> FunctionTool:
    """A copy of ``tool`` that runs through ``tools`` and carries its decisions as guardrails.

    The tool is registered with the ToolGuard under its SDK name (``options`` are those of
    :meth:`ToolGuard.register`: ``criticality``, ``side_effecting``, ``fallbacks``, ``retry`` ...).
    Its errors reach the guard as exceptions (the SDK's error-to-text formatting is off for the
    guarded run, so failures are classified, retried and counted by the breaker); the model gets
    the value, or the guard's structured error. The original tool is not changed.
    """
    inner = copy.copy(tool)
    set_function_tool_failure_error_function(inner, None)  # raise: the guard classifies errors

    async def run(**arguments: Any) -> Any:
        return await inner.on_invoke_tool(_CONTEXT.get(), json.dumps(arguments))

    tools.register(run, name=tool.name, **options)
    decisions = _Decisions(tools)

    async def invoke(context: ToolContext[Any], arguments: str) -> Any:
        token = _CONTEXT.set(context)
        try:
            outcome = await tools.acall(tool.name, arguments or "{}", run=_run_of(context))
        finally:
            _CONTEXT.reset(token)
        decisions.outcomes[context.tool_call_id] = outcome
        if outcome.ok and not outcome.hint:
            return outcome.value  # the tool's own value, as the SDK would have passed it on
        return outcome.content

    guarded = copy.copy(tool)
    guarded.on_invoke_tool = invoke
    name = f"agentguard:{tool.name}"
    guarded.tool_input_guardrails = [
        *(tool.tool_input_guardrails or ()),
        ToolInputGuardrail(decisions.input_guardrail, name=name),
    ]
    guarded.tool_output_guardrails = [
        *(tool.tool_output_guardrails or ()),
        ToolOutputGuardrail(decisions.output_guardrail, name=name),
    ]
    return guarded


def guard_tools(agent: Agent[Any], tools: ToolGuard | None = None, **options: Any) -> Agent[Any]:
    """A clone of ``agent`` whose function tools run through ``tools`` (see :func:`guard_tool`).

    Args:
        agent: the SDK agent; not changed.
        tools: the ToolGuard (default: a new one with default settings).
        **options: registration options applied to every tool (see :meth:`ToolGuard.register`).
    """
    guard = tools or ToolGuard()
    wrapped = [
        guard_tool(t, guard, **options) if isinstance(t, FunctionTool) else t for t in agent.tools
    ]
    return agent.clone(tools=wrapped)
