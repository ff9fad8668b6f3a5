"""The handler's spans in the child (OpenTelemetry): made in the attempt span's context,
sent to the supervisor with the ``Done``.

A ``Run`` whose ``trace`` is set (the supervisor traces) runs its handler with the attempt
span (the supervisor's, :mod:`atlantis.supervisor.tracing`) as the current context, so a
span the handler opens with any tracer is its child. Where those spans go:

- Nobody set a tracer provider in this process (the usual case: the app sets one for the
  supervisor, or the supervisor runs under ``opentelemetry-instrument``, and the children's
  is left alone): at the first traced attempt this module sets one of OpenTelemetry's SDK
  whose only processor keeps the attempt's finished spans in a list, with no thread and no
  exporter. They travel in ``Done.spans`` and the supervisor exports them. A reused child
  so never holds an exporter's thread (which would count as a handler's leftover work) nor
  a connection.
- The app set a provider of the SDK in this process too: its processors export the spans
  from here, and at the end of each attempt :meth:`AttemptTrace.end` flushes it, so that
  every span of the attempt is exported before its ``Done``.

Nothing is imported until a traced ``Run`` comes, or :func:`prepare` finds OpenTelemetry
already loaded by the app (the zygote imports the SDK once, for every worker it forks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from atlantis import tracing
from atlantis.protocol.messages import MAX_TEXT

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

FLUSH_TIMEOUT_MS = 5000
"""The longest the flush of an app's own provider may hold an attempt's ``Done``."""


def prepare() -> None:
    """Import the SDK now if the app loaded OpenTelemetry: a forked worker then pays nothing
    for it at its first attempt."""
    if tracing.loaded():
        try:
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError:
            pass


class _Keep:
    """Finished spans kept for the ``Done``, by the SDK span processor of :func:`_keeper`."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.lock = threading.Lock()

    def take(self) -> list[ReadableSpan]:
        with self.lock:
            spans, self.spans = self.spans, []
        return spans


def _keeper(keep: _Keep) -> Any:
    """An SDK span processor appending every finished span to ``keep`` (the class is made
    here: the SDK is imported only once tracing is on)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class Keeper(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            with keep.lock:
                keep.spans.append(span)

    return Keeper()


class AttemptTrace:
    """This child's side of tracing, set up at the first traced attempt."""

    def __init__(self) -> None:
        self._ready = False
        self._keep: _Keep | None = None
        """Set when this module's provider is the process's: the spans go in ``Done``."""
        self._own: Any = None
        """The app's own SDK provider, flushed after each attempt."""

    def _setup(self) -> None:
        self._ready = True
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if not isinstance(provider, trace.ProxyTracerProvider):
            self._own = provider if hasattr(provider, "force_flush") else None
            return
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        except ImportError:  # the API alone: handlers' spans record nothing anyway
            return
        keep = _Keep()
        # No resource detection: the supervisor exports these spans under its own resource.
        mine = TracerProvider(sampler=ParentBased(ALWAYS_ON), resource=Resource({}),
                              shutdown_on_exit=False)
        mine.add_span_processor(_keeper(keep))
        trace.set_tracer_provider(mine)
        if trace.get_tracer_provider() is mine:
            self._keep = keep

    def begin(self, traceparent: str | None) -> object | None:
        """Make the attempt span current for the handler; a token for :meth:`end`."""
        if traceparent is None:
            return None
        if not self._ready:
            self._setup()
        from opentelemetry import context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent},
                                                         context=context.Context())
        return context.attach(parent)

    def end(self, token: object | None) -> tuple[str | None, int]:
        """Leave the attempt's context; the spans to send (JSON text, or None) and how many
        did not fit in a message."""
        if token is None:
            return None, 0
        from opentelemetry import context

        try:
            context.detach(token)  # type: ignore[arg-type]
        except Exception:  # a handler that detached more than it attached
            pass
        if self._own is not None:
            self._own.force_flush(FLUSH_TIMEOUT_MS)
        if self._keep is None:
            return None, 0
        return tracing.encode_spans(self._keep.take(), MAX_TEXT)


TRACE = AttemptTrace()
"""This process's (a forked worker inherits the zygote's, never set up there)."""


def begin(traceparent: str | None, warn: Callable[[str], None]) -> object | None:
    """:meth:`AttemptTrace.begin` on :data:`TRACE`; a failure of tracing is one warning
    line on the attempt's stderr, never the attempt's failure."""
    if traceparent is None:
        return None
    try:
        return TRACE.begin(traceparent)
    except Exception as exc:
        warn(f"atlantis: tracing this attempt failed: {exc!r}")
        return None


def end(token: object | None, warn: Callable[[str], None]) -> str | None:
    """:meth:`AttemptTrace.end` on :data:`TRACE`: the spans for ``Done.spans``."""
    if token is None:
        return None
    try:
        spans, dropped = TRACE.end(token)
    except Exception as exc:
        warn(f"atlantis: sending this attempt's spans failed: {exc!r}")
        return None
    if dropped:
        warn(f"atlantis: {dropped} of the handler's spans did not fit in the message to the "
             "supervisor and were not exported")
    return spans
