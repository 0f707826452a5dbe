"""Spans agentguard records, caught by the real OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from agentguard import telemetry


@contextlib.contextmanager
def recorded_spans() -> Iterator[Any]:
    """agentguard's telemetry into an in-memory exporter (yielded) while the block runs; the
    test is skipped when ``opentelemetry-sdk`` is not installed. The SDK is on for the block
    (another test module may have switched it off for its framework: ``OTEL_SDK_DISABLED``)."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    disabled = os.environ.pop("OTEL_SDK_DISABLED", None)
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=provider)
    try:
        yield exporter
    finally:
        telemetry.configure()
        if disabled is not None:
            os.environ["OTEL_SDK_DISABLED"] = disabled
