"""OpenTelemetry, optional (extra ``atlantis-jobs[otel]``): what every process shares.

Nothing here imports ``opentelemetry`` unless the process already did. A process that never
imported it has no span to propagate and no provider to export with, so checking
``sys.modules`` is the whole cost of tracing for those who do not trace: enqueue pays one
dictionary lookup, and a process where ``opentelemetry`` cannot even be imported runs as
before.

- :func:`enqueue_context`: the W3C trace context of the span current in the enqueuer, as
  the global propagator writes it (``{"traceparent": ..., "tracestate": ...}``); the
  enqueue functions store it in the row (``atlantis.jobs.trace_context``, migration 0019).
- The attribute and span names every process writes (docs/operating.md lists them).
- :func:`encode_spans` / :func:`decode_spans`: finished spans as the child sends them to
  the supervisor (``Done.spans``), which exports them with its own processors: a reused
  child then runs no exporter, no thread and no connection of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan

#: Span names: one attempt of a job (``atlantis.attempt directory.ImportContacts``), a claim
#: and a finish batch of a supervisor.
ATTEMPT_SPAN = "atlantis.attempt"
CLAIM_SPAN = "atlantis.claim"
FINISH_SPAN = "atlantis.finish"
CHECKPOINT_EVENT = "atlantis.checkpoint"

JOB = "atlantis.job.name"
JOB_ID = "atlantis.job.id"
ATTEMPT = "atlantis.job.attempt"
RUN = "atlantis.job.run"
QUEUE = "atlantis.queue"
OUTCOME = "atlantis.outcome"
ERROR_KIND = "atlantis.error.kind"
WORKFLOW_ID = "atlantis.workflow.id"
STEP = "atlantis.workflow.step"
PCT = "atlantis.progress.pct"
MESSAGE = "atlantis.progress.message"
BATCH_SIZE = "atlantis.batch.size"
WORKER = "atlantis.worker"

_SCALARS = (str, bool, int, float)

SCOPE = "atlantis"
"""The instrumentation scope of atlantis's own spans."""


def loaded() -> bool:
    """Whether this process imported OpenTelemetry's API (a blocked import counts as not)."""
    return sys.modules.get("opentelemetry.trace") is not None


def enqueue_context() -> dict[str, str] | None:
    """The current span's context as a W3C carrier; None when there is no valid span (no
    OpenTelemetry loaded, no span current). A valid span that is not sampled is carried
    too: the attempt then follows the enqueuer's decision not to record."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    if not api.get_current_span().get_span_context().is_valid:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


# ---- spans across the pipe ---------------------------------------------------------------


def _ctx(ctx: Any) -> list[Any] | None:
    if ctx is None:
        return None
    return [f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", int(ctx.trace_flags)]


_INT64 = (-(2**63), 2**63 - 1)
_DROP = object()


def _attribute(value: Any) -> Any:
    """An attribute value as JSON can carry it and OTLP can export it. The SDK also takes
    bytes and integers past 64 bits, which neither can: bytes become text (undecodable
    bytes as ``\\xNN``), such an integer its decimal text. Anything else is dropped."""
    if isinstance(value, str | bool | float):
        return value
    if isinstance(value, int):
        return value if _INT64[0] <= value <= _INT64[1] else str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, list | tuple):
        items = [_attribute(v) for v in value]
        return items if _DROP not in items else _DROP
    return _DROP


def _attributes(attributes: Any) -> dict[str, Any]:
    """A span's (or an event's, a link's) attributes: one value that cannot travel costs
    that value (converted or dropped), never the span, let alone the attempt's spans."""
    out = {}
    for key, value in dict(attributes or {}).items():
        clean = _attribute(value)
        if clean is not _DROP:
            out[str(key)] = clean
    return out


def encode_spans(spans: Iterable[ReadableSpan], limit: int) -> tuple[str | None, int]:
    """Finished spans as one JSON text of at most ``limit`` characters (the spans that do
    not fit are left out), and how many were left out."""
    parts: list[bytes] = []
    size = 2
    dropped = 0
    for span in spans:
        scope = span.instrumentation_scope
        one = orjson.dumps({
            "n": span.name, "c": _ctx(span.context), "p": _ctx(span.parent),
            "k": span.kind.value, "s": span.start_time, "e": span.end_time,
            "a": _attributes(span.attributes),
            "v": [[e.name, e.timestamp, _attributes(e.attributes)] for e in span.events],
            "l": [[_ctx(li.context), _attributes(li.attributes)] for li in span.links],
            "st": [span.status.status_code.value, span.status.description],
            "sc": [scope.name, scope.version] if scope is not None else None,
        })
        if size + len(one) + 1 > limit:
            dropped += 1
            continue
        parts.append(one)
        size += len(one) + 1
    if not parts:
        return None, dropped
    return (b"[" + b",".join(parts) + b"]").decode(), dropped


def decode_spans(text: str, resource: Resource) -> list[ReadableSpan]:
    """The spans of :func:`encode_spans`, as the SDK's span processors take them, under
    ``resource`` (the receiving process's). Raises ValueError on a malformed text."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    def ctx(raw: Sequence[Any] | None, remote: bool = False) -> SpanContext | None:
        if raw is None:
            return None
        return SpanContext(int(raw[0], 16), int(raw[1], 16), is_remote=remote,
                           trace_flags=TraceFlags(int(raw[2])))

    def attrs(raw: dict[str, Any]) -> dict[str, Any]:
        """Values of the types an attribute may have (sequences are tuples in the SDK)."""
        return {str(k): tuple(v) if isinstance(v, list) else v for k, v in raw.items()
                if isinstance(v, _SCALARS) or isinstance(v, list)
                and all(isinstance(x, _SCALARS) for x in v)}

    try:
        out = []
        for raw in orjson.loads(text):
            context = ctx(raw["c"])
            assert context is not None
            scope = raw["sc"]
            out.append(ReadableSpan(
                name=str(raw["n"]), context=context, parent=ctx(raw["p"]),
                resource=resource, attributes=attrs(raw["a"]),
                events=[Event(str(n), attrs(a), int(t)) for n, t, a in raw["v"]],
                links=[Link(ctx(c, True) or context, attrs(a)) for c, a in raw["l"]],
                kind=SpanKind(int(raw["k"])),
                status=Status(StatusCode(int(raw["st"][0])), raw["st"][1]),
                start_time=int(raw["s"]), end_time=int(raw["e"]),
                instrumentation_scope=InstrumentationScope(scope[0], scope[1]) if scope else None,
            ))
        return out
    except (KeyError, TypeError, IndexError, AssertionError, AttributeError,
            orjson.JSONDecodeError) as exc:
        raise ValueError(f"malformed spans: {exc}") from exc
