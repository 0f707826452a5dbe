"""One guarded OpenHands conversation in a process of its own, with the SDK's Laminar
observability on: run by test_integrations_openhands, which sets
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` to its loopback collector. The SDK turns Laminar on when
it is imported with that variable set, and Laminar sets the process's global tracer provider
when none is set yet: each case needs a fresh interpreter.

The first argument says whose tracer provider agentguard records with:

- ``laminar``: the application set none; Laminar's becomes the global one.
- ``app``: the application set its own global provider first (exporting to the same collector as
  service ``app``) and runs the conversation inside its span, handed to the SDK as the
  conversation's parent (``observability_parent_span_context``).

The model is a scripted one on loopback, reached through the SDK's own LLM (litellm): a weather
call with cut-off arguments (the guard repairs them), then ``finish``. Prints one JSON line: the
run's status and the application span's trace and span ids (0 without one).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

from opentelemetry import trace


def _app_provider() -> None:
    """The application's global provider, exporting over OTLP/HTTP to the same collector."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource({"service.name": "app"}))
    endpoint = os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)


def main(mode: str) -> None:
    if mode == "app":
        _app_provider()  # before the SDK is imported, as an application's startup would
    from lmnr import Laminar
    from openhands.sdk import Agent, Conversation, Tool

    from agentguard.integrations.openhands import GuardedLLM
    from agentguard.testing import Reply, ScriptedModel
    from test_integrations_openhands import served  # registers its WeatherTool too

    assert Laminar.is_initialized(), "the SDK did not turn Laminar on"
    script = [
        Reply.call("weather", '{"city": "Paris"'),
        Reply.call("finish", {"message": "It is sunny in Paris."}),
    ]
    root = trace.INVALID_SPAN
    with ScriptedModel(script).serve() as url, contextlib.ExitStack() as stack:
        options = {}
        if mode == "app":
            root = stack.enter_context(trace.get_tracer("app").start_as_current_span("agent task"))
            options["observability_parent_span_context"] = Laminar.serialize_span_context(root)
        conversation = Conversation(
            agent=Agent(llm=served(GuardedLLM, url), tools=[Tool(name="WeatherTool")]),
            workspace=tempfile.mkdtemp(),
            visualizer=None,
            **options,
        )
        conversation.send_message("What is the weather in Paris?")
        conversation.run()
        conversation.close()  # ends the conversation's span
    Laminar.shutdown()  # exports what is left (of agentguard's spans too, in its provider)
    context = root.get_span_context()
    status = conversation.state.execution_status.value
    print(json.dumps({"status": status, "trace_id": context.trace_id, "span_id": context.span_id}))


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    # Every span is exported by now: skip the interpreter's teardown (litellm's and Laminar's
    # exit hooks, the SDK's worker threads), seconds of the test's time spent on nothing it checks.
    os._exit(0)
