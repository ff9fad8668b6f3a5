"""The supervisor's spans: one per attempt, one per claim and finish batch (OpenTelemetry).

On only when the process has OpenTelemetry loaded and a tracer provider set (the app
module, imported at start, or ``opentelemetry-instrument``); decided at the first claim,
then every call here is a no-op costing an attribute test.

- The attempt span (``atlantis.attempt <job>``, kind CONSUMER) starts at the claim, as a
  child of the context the enqueuer left in the row (a root when it left none), and ends
  when the supervisor decides the outcome: whatever ended it (a handler's return, a crash,
  a timeout, a lost lease) is on the span. Checkpoints are its events.
- Its traceparent goes to the child in ``Run.trace``: the handler runs in that context, so
  its own spans are the attempt's children. The child sends them back in ``Done.spans``
  and they are exported here, by this process's span processors (:meth:`ingest`).
- A claim batch (``atlantis.claim``) and a finish batch (``atlantis.finish``) link to the
  attempts they claimed or wrote.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec

import orjson

from atlantis import tracing
from atlantis.supervisor.attempts import Attempt

log = logging.getLogger("atlantis.supervisor")

P = ParamSpec("P")
_MAX_REPORTS = 10


def _safe(method: Callable[P, None]) -> Callable[P, None]:
    """Tracing never costs an attempt nor the supervisor: a failure (a bug, a hostile trace
    context, an SDK's) is logged, the first few times, and the span goes without."""
    @functools.wraps(method)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            method(*args, **kwargs)
        except Exception:
            Tracing.failures += 1
            if Tracing.failures <= _MAX_REPORTS:
                log.exception("tracing: %s failed%s", method.__name__,
                              " (not reported again)" if Tracing.failures == _MAX_REPORTS else "")
    return guarded


class Tracing:
    failures = 0

    def __init__(self) -> None:
        self._decided = False
        self.tracer: Any = None
        """The tracer of atlantis's scope; None while tracing is off."""
        self._provider: Any = None
        self._ingest_warned = False

    @property
    def on(self) -> bool:
        if not self._decided:
            self._decided = True
            self._decide()
        return self.tracer is not None

    def _decide(self) -> None:
        if not tracing.loaded():
            return
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return  # nobody set one: nothing would be exported
        self._provider = provider
        self.tracer = provider.get_tracer(tracing.SCOPE)

    # ---- attempts -----------------------------------------------------------------------

    @_safe
    def begin(self, a: Attempt, worker: str) -> None:
        """The row was claimed: its attempt's span starts."""
        if not self.on:
            return
        from opentelemetry import context, propagate
        from opentelemetry.trace import SpanKind

        row = a.row
        carrier = {k: v for k, v in (row.trace_context or {}).items()
                   if isinstance(k, str) and isinstance(v, str)}
        parent = propagate.extract(carrier) if carrier else context.Context()
        attributes: dict[str, Any] = {
            tracing.JOB: row.job, tracing.JOB_ID: row.id, tracing.ATTEMPT: row.attempt,
            tracing.RUN: row.run, tracing.QUEUE: row.queue, tracing.WORKER: worker,
            "messaging.system": "atlantis", "messaging.destination.name": row.queue,
            "messaging.operation.type": "process", "messaging.message.id": str(row.id),
        }
        if row.workflow_id is not None:
            attributes[tracing.WORKFLOW_ID] = row.workflow_id
            step = _step(row.workflow)
            if step is not None:
                attributes[tracing.STEP] = step
        a.span = self.tracer.start_span(f"{tracing.ATTEMPT_SPAN} {row.job}", context=parent,
                                        kind=SpanKind.CONSUMER, attributes=attributes)

    def traceparent(self, a: Attempt) -> str | None:
        """The attempt span's W3C traceparent, for the child (``Run.trace``)."""
        if a.span is None:
            return None
        ctx = a.span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    @_safe
    def checkpoint(self, a: Attempt, pct: float | None, msg: str) -> None:
        if a.span is not None:
            attributes: dict[str, Any] = {tracing.MESSAGE: msg}
            if pct is not None:
                attributes[tracing.PCT] = pct
            a.span.add_event(tracing.CHECKPOINT_EVENT, attributes)

    @_safe
    def end(self, a: Attempt, label: str, error: dict[str, Any] | None, lost: bool) -> None:
        """The supervisor decided how the attempt ended: its span ends, saying so."""
        span = a.span
        if span is None or a.span_ended:
            return
        a.span_ended = True
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute(tracing.OUTCOME, "lost" if lost else label)
        if a.child_pid:
            span.set_attribute("atlantis.child.pid", a.child_pid)
        if error is not None:
            kind = str(error.get("kind", "error"))
            span.set_attribute(tracing.ERROR_KIND, kind)
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, f"{kind}: {error.get('message', '')}"))
        elif lost:
            span.set_attribute(tracing.ERROR_KIND, "lease")
            span.set_status(Status(StatusCode.ERROR, "lease: the lease was lost"))
        span.end()

    @_safe
    def ingest(self, a: Attempt, text: str) -> None:
        """Export the spans the attempt's child sent, with this process's processors."""
        if self._provider is None:
            return
        processor = getattr(self._provider, "_active_span_processor", None)
        resource = getattr(self._provider, "resource", None)
        if processor is None or resource is None:
            if not self._ingest_warned:
                self._ingest_warned = True
                log.warning("the tracer provider is not OpenTelemetry's SDK: the spans of "
                            "handlers are not exported")
            return
        try:
            spans = tracing.decode_spans(text, resource)
        except ValueError as exc:
            log.warning("%s: the handler's spans were malformed: %s", a.tag(), exc,
                        extra=a.log_extra())
            return
        for span in spans:
            processor.on_end(span)

    # ---- batches ------------------------------------------------------------------------

    @_safe
    def batch(self, name: str, attempts: Iterable[Attempt], start_ns: int,
              attributes: dict[str, Any]) -> None:
        """A claim or finish batch's span, from ``start_ns`` to now, linked to the spans of
        ``attempts``."""
        if not self.on:
            return
        from opentelemetry import context
        from opentelemetry.trace import Link

        links = [Link(a.span.get_span_context()) for a in attempts if a.span is not None]
        span = self.tracer.start_span(name, context=context.Context(), links=links,
                                      start_time=start_ns,
                                      attributes={**attributes, tracing.BATCH_SIZE: len(links)})
        span.end()


def now_ns() -> int:
    return time.time_ns()


def _step(context: str | None) -> str | None:
    """The step's name in a step's context (``atlantis.step_context``'s JSON text)."""
    try:
        step = orjson.loads(context or "null")
    except orjson.JSONDecodeError:
        return None
    found = step.get("step") if isinstance(step, dict) else None
    return found if isinstance(found, str) else None
