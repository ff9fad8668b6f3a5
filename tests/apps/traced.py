"""A traced app (tests/test_otel.py): its handler opens spans with its own tracer.

With ``ATLANTIS_TEST_SPANS`` set to a file, importing this module sets a tracer provider of
OpenTelemetry's SDK whose processor writes each finished span as one JSON line to that
file, synchronously. It does so in the supervisor only (as an app that leaves the children's
spans to atlantis's pipe would), or in every process when ``ATLANTIS_TEST_SPANS_EVERYWHERE``
is set (the children then export the handler's spans themselves).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import atlantis

registry = atlantis.Registry.from_atl("traced.atl")
tracer = trace.get_tracer("tests.apps.traced")


class JsonLinesExporter(SpanExporter):
    """Each span as one line of JSON (``ReadableSpan.to_json``), appended to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(span.to_json(indent=None) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def _install() -> None:
    path = os.environ.get("ATLANTIS_TEST_SPANS")
    in_supervisor = "atlantis.supervisor.cli" in sys.modules
    if path and (in_supervisor or os.environ.get("ATLANTIS_TEST_SPANS_EVERYWHERE")):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
        trace.set_tracer_provider(provider)


_install()


@registry.handler("traced.Work")
def work(ctx: atlantis.JobContext, args: Any) -> None:
    with tracer.start_as_current_span("handler.work") as span:
        span.set_attribute("test.key", args.key)
        ctx.checkpoint(10, "first page")
        with tracer.start_as_current_span("handler.inner") as inner:
            ctx.checkpoint(90, "last page")
            if args.odd:  # values the SDK takes but neither JSON nor OTLP carries
                inner.set_attribute("test.bytes", b"ab\xff")
                inner.set_attribute("test.huge", 2**70)
                inner.add_event("odd", {"test.bytes": b"cd", "test.n": 1})
        if args.fail:
            raise ValueError(f"failing {args.key} on purpose")
