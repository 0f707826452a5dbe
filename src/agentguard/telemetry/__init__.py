"""OpenTelemetry for agentguard: GenAI spans, guardrail span events and metrics.

Install the ``otel`` extra (``opentelemetry-api`` only) and configure OpenTelemetry in the
application as usual (SDK ``TracerProvider`` / ``MeterProvider``, ``opentelemetry-instrument``):
every guarded call then records, following the OpenTelemetry GenAI semantic conventions
(development status):

- ``agentguard chat {model}`` (INTERNAL): one guarded call, child of the current span;
- ``chat {model}`` (CLIENT): one per upstream attempt, with ``gen_ai.provider.name``,
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``,
  ``gen_ai.conversation.id`` (the session), ``gen_ai.usage.*`` and, for streams,
  ``gen_ai.response.time_to_first_chunk``;
- ``agentguard tool {name}`` and one ``execute_tool {name}`` per ToolGuard attempt;
- every guard decision as a ``gen_ai.guardrail.result`` span event;
- the metrics ``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage``,
  ``gen_ai.client.operation.time_to_first_chunk`` and the counter ``agentguard.guard.decisions``.

Without a configured provider nothing is recorded and nothing of OpenTelemetry is imported.
Message content is never recorded unless asked for (``capture_content=True`` or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``). See ``docs/telemetry.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _semconv
from ._gate import load, settings

__all__ = ["configure", "provider_name"]

# litellm-style provider names (also CrewAI's and OpenHands') -> the conventions' well-known
# ``gen_ai.provider.name`` values; names already equal are not listed
_PROVIDERS = {
    "text-completion-openai": "openai",
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "cohere_chat": "cohere",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
    "moonshot": "moonshot_ai",
    # Pydantic AI's Model.system and LangChain's ls_provider, where they differ from the above
    "google-gla": "gcp.gemini",
    "google_genai": "gcp.gemini",
    "google-vertex": "gcp.vertex_ai",
    "google_vertexai": "gcp.vertex_ai",
    "azure_openai": "azure.ai.openai",
    "amazon_bedrock": "aws.bedrock",
}


def provider_name(name: object) -> str:
    """The ``gen_ai.provider.name`` of a provider as litellm, CrewAI, OpenHands, Pydantic AI
    (``Model.system``) and LangChain (``ls_provider``) name it
    (``bedrock`` -> ``aws.bedrock``, ``gemini`` -> ``gcp.gemini`` ...); ``unknown`` for none.

    For adapters: a transport that knows its provider reports it from an
    ``otel_attributes(request)`` method (see ``docs/telemetry.md``).
    """
    if not isinstance(name, str) or not name:  # none, or not a name at all
        return "unknown"
    return _PROVIDERS.get(name, name)


def configure(
    *,
    enabled: bool = True,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    capture_content: bool | None = None,
    clock: Callable[[], float] | None = None,
) -> None:
    """Choose where agentguard's telemetry goes (by default: the global providers, if set).

    Args:
        enabled: ``False`` records nothing, whatever is configured.
        tracer_provider: record spans here instead of the global tracer provider.
        meter_provider: record metrics here instead of the global meter provider.
        capture_content: record message content, tool arguments and tool results on spans
            (they may hold personal data; secrets are redacted). ``None``: as
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says.
        clock: monotonic seconds for durations (tests inject one).

    Raises:
        ImportError: providers were given but ``opentelemetry-api`` is not installed.

    ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` emits the latest experimental
    conventions only; without it the provider is also given as the older ``gen_ai.system``.
    Call ``configure()`` again to go back to the global providers.
    """
    settings.explicit = None
    settings.auto = enabled
    custom = tracer_provider is not None or meter_provider is not None
    if not enabled or (not custom and capture_content is None and clock is None):
        return
    otel = load()
    if otel is None:
        raise ImportError(
            'agentguard telemetry needs OpenTelemetry: pip install "agentguard[otel]"'
        )
    from opentelemetry import metrics, trace  # noqa: PLC0415 - the extra is installed

    latest = _semconv.latest_from_env()
    settings.explicit = otel.Bridge(
        tracer_provider or trace.get_tracer_provider(),
        meter_provider or metrics.get_meter_provider(),
        capture_content=(
            _semconv.capture_from_env(latest) if capture_content is None else capture_content
        ),
        latest=latest,
        clock=clock,
    )
