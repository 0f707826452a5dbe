"""Spans agentguard records, caught by the real OpenTelemetry SDK's in-memory exporter; and a
loopback OTLP/HTTP collector for spans another process or another tracer provider exports."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from _processes import serving
from agentguard import telemetry


@contextlib.contextmanager
def recorded_trace() -> Iterator[tuple[Any, Any]]:
    """agentguard's telemetry into an in-memory exporter while the block runs; yields the
    exporter and a tracer of the same provider for the application's own spans. The test is
    skipped when ``opentelemetry-sdk`` is not installed. The SDK is on for the block (another
    test module may have switched it off for its framework: ``OTEL_SDK_DISABLED``)."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    disabled = os.environ.pop("OTEL_SDK_DISABLED", None)
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=provider)
    try:
        yield exporter, provider.get_tracer("app")
    finally:
        telemetry.configure()
        if disabled is not None:
            os.environ["OTEL_SDK_DISABLED"] = disabled


@contextlib.contextmanager
def recorded_spans() -> Iterator[Any]:
    """:func:`recorded_trace`'s exporter alone."""
    with recorded_trace() as (exporter, _):
        yield exporter


@dataclasses.dataclass(frozen=True)
class ReceivedSpan:
    """A span as an OTLP exporter sent it: ids as integers (as the SDK's span contexts hold
    them), ``parent_id`` 0 for a root; ``service`` the exporting provider's ``service.name``;
    each event its name and attributes."""

    name: str
    scope: str
    service: str
    trace_id: int
    span_id: int
    parent_id: int
    events: list[dict[str, Any]]


@contextlib.contextmanager
def otlp_collector() -> Iterator[tuple[str, list[ReceivedSpan]]]:
    """A collector on loopback taking OTLP/HTTP trace exports (protobuf, gzipped or not) while
    the block runs; yields its endpoint (``http://127.0.0.1:<port>/v1/traces``) and the list the
    received spans are appended to. Skipped without ``opentelemetry-proto``."""
    service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
    received: list[ReceivedSpan] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path != "/v1/traces":  # logs, metrics: not collected
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            spans = _spans(service.ExportTraceServiceRequest.FromString(body))
            with lock:
                received.extend(spans)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    with serving(Handler) as port:
        yield f"http://127.0.0.1:{port}/v1/traces", received


def _spans(request: Any) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                events = [{"name": e.name, **_attributes(e.attributes)} for e in span.events]
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        scope=scope_spans.scope.name,
                        service=str(resource.get("service.name", "")),
                        trace_id=int.from_bytes(span.trace_id, "big"),
                        span_id=int.from_bytes(span.span_id, "big"),
                        parent_id=int.from_bytes(span.parent_span_id or b"\0", "big"),
                        events=events,
                    )
                )
    return spans


def _attributes(pairs: Any) -> dict[str, Any]:
    """OTLP key-values as a dict (scalars only: the assertions need no arrays)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        if kind in {"string_value", "bool_value", "int_value", "double_value"}:
            out[pair.key] = getattr(pair.value, kind)
    return out
