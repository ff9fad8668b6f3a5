"""OpenTelemetry (extra ``[otel]``): one trace from the enqueuer to the handler's own spans.

The enqueue keeps the current span's W3C context in the row (``trace_context``, migration
0019); the supervisor's attempt span is its child; the handler's spans, made in the child,
are the attempt span's children and reach the supervisor's exporter over the events pipe
(or the child's own, when the app set a provider there too). Claim and finish batches have
spans linked to the attempts. Real supervisors and children run the app
``tests/apps/traced.py``, whose exporter writes finished spans to a JSON-lines file.

Without OpenTelemetry (not installed, or no span current) the row's context is NULL, and a
process where ``opentelemetry`` cannot be imported enqueues and runs jobs as before without
ever trying to import it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed "
                    "(pip install -e '.[otel]', or '.[dev]')")

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

import atlantis
from atlantis import tracing
from atlantis.app import load_app
from atlantis.child.channel import Channel
from atlantis.protocol.framing import HEADER
from atlantis.protocol.messages import (
    MAX_EVENT_FRAME,
    ChildError,
    Done,
    EventReader,
    Run,
    decode,
    dumps,
)
from atlantis.store.migrate import sync
from tests.conftest import ROOT, job_row, wait_for, wait_state

APP = "tests.apps.traced:registry"
QUEUES = ("traced",)


@pytest.fixture
def traced_db(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's database with the traced app's declarations synced."""
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    return db


@pytest.fixture
def tracer() -> Iterator[tuple[trace.Tracer, InMemorySpanExporter]]:
    """A tracer of its own provider (the process's global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("tests.enqueuer"), exporter
    provider.shutdown()


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def _wait_spans(path: Path, *names: str) -> list[dict[str, Any]]:
    """Every span written so far, once one of each of ``names`` is among them."""
    def check() -> list[dict[str, Any]] | None:
        spans = _spans(path)
        return spans if all(_named(spans, n) for n in names) else None

    found: list[dict[str, Any]] = wait_for(check, message=f"spans {names} in {path}")
    return found


def _hex(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


# ---- one trace, across processes --------------------------------------------------------

@pytest.mark.parametrize(("everywhere", "isolation"),
                         [(False, "reuse"), (True, "reuse"), (False, "fresh")],
                         ids=["over-the-pipe", "child-exports", "fresh-over-the-pipe"])
def test_one_trace_runs_from_the_enqueuing_span_to_the_handlers_spans(
        traced_db: psycopg.Connection[Any], supervise: Any, tmp_path: Path,
        tracer: tuple[trace.Tracer, InMemorySpanExporter], everywhere: bool,
        isolation: str) -> None:
    """The enqueue span -> the attempt span (the supervisor's) -> the handler's spans (the
    child's), one trace id; the attempt span carries the job's attributes and its
    checkpoints; claim and finish spans link to it. ``everywhere``: the app set a provider
    in the child too, whose processor exports from there (flushed before the ``Done``).
    ``fresh``: each attempt in a worker forked by the zygote."""
    otel, exporter = tracer
    with otel.start_as_current_span("request") as request:
        job_id = atlantis.enqueue(traced_db, "traced.Work", {"key": "k1"})
    ctx = request.get_span_context()
    row = job_row(traced_db, job_id)
    assert row["trace_context"]["traceparent"].startswith(
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")

    path = tmp_path / "spans.jsonl"
    env = {"ATLANTIS_TEST_SPANS": str(path)}
    if everywhere:
        env["ATLANTIS_TEST_SPANS_EVERYWHERE"] = "1"
    supervise("--isolation", isolation, app=APP, queues=QUEUES, concurrency=1, env=env)
    wait_state(traced_db, job_id, "complete")
    spans = _wait_spans(path, "atlantis.attempt traced.Work", "handler.work", "handler.inner",
                        "atlantis.claim", "atlantis.finish")
    # A second attempt runs in the same reused child: tracing left nothing running in it.
    again = atlantis.enqueue(traced_db, "traced.Work", {"key": "k2"})
    wait_state(traced_db, again, "complete")
    pids = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(
        [s["attributes"]["atlantis.child.pid"]
         for s in _named(_spans(path), "atlantis.attempt traced.Work")]),
        message="the second attempt's span")
    assert (pids[0] == pids[1]) == (isolation == "reuse")

    (attempt,) = [s for s in _named(spans, "atlantis.attempt traced.Work")
                  if s["attributes"][tracing.JOB_ID] == job_id]
    (work,) = [s for s in _named(spans, "handler.work") if s["attributes"]["test.key"] == "k1"]
    (inner,) = [s for s in _named(spans, "handler.inner")
                if s["parent_id"] == work["context"]["span_id"]]
    trace_id = _hex(ctx.trace_id, 32)
    assert {attempt["context"]["trace_id"], work["context"]["trace_id"],
            inner["context"]["trace_id"]} == {trace_id}
    assert attempt["parent_id"] == _hex(ctx.span_id, 16)
    assert work["parent_id"] == attempt["context"]["span_id"]
    assert inner["parent_id"] == work["context"]["span_id"]
    assert work["attributes"]["test.key"] == "k1"

    assert attempt["kind"] == str(SpanKind.CONSUMER)
    attrs = attempt["attributes"]
    assert attrs[tracing.JOB] == "traced.Work"
    assert attrs[tracing.JOB_ID] == job_id
    assert attrs[tracing.ATTEMPT] == 1
    assert attrs[tracing.QUEUE] == "traced"
    assert attrs[tracing.OUTCOME] == "complete"
    assert attempt["status"]["status_code"] == "UNSET"
    checkpoints = [e for e in attempt["events"] if e["name"] == tracing.CHECKPOINT_EVENT]
    assert checkpoints and checkpoints[-1]["attributes"] == {
        tracing.MESSAGE: "last page", tracing.PCT: 90.0}

    for name in ("atlantis.claim", "atlantis.finish"):
        linked = [s for s in _named(spans, name)
                  if any(li["context"]["span_id"] == attempt["context"]["span_id"]
                         for li in s["links"])]
        assert linked, f"no {name} span links to the attempt"
        assert linked[0]["attributes"][tracing.BATCH_SIZE] >= 1
    assert [s.name for s in exporter.get_finished_spans()] == ["request"]


def test_a_failed_attempt_says_so_on_its_span(
        traced_db: psycopg.Connection[Any], supervise: Any, tmp_path: Path,
        tracer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    otel, _ = tracer
    with otel.start_as_current_span("request"):
        job_id = atlantis.enqueue(traced_db, "traced.Work", {"key": "bad", "fail": True})
    path = tmp_path / "spans.jsonl"
    supervise(app=APP, queues=QUEUES, concurrency=1, env={"ATLANTIS_TEST_SPANS": str(path)})
    wait_state(traced_db, job_id, "dead")
    spans = _wait_spans(path, "atlantis.attempt traced.Work", "handler.work")
    (attempt,) = _named(spans, "atlantis.attempt traced.Work")
    assert attempt["status"]["status_code"] == "ERROR"
    assert attempt["status"]["description"].startswith("exception: ValueError: failing bad")
    assert attempt["attributes"][tracing.ERROR_KIND] == "exception"
    assert attempt["attributes"][tracing.OUTCOME] == "failed"
    (work,) = _named(spans, "handler.work")  # the handler's span: its exception recorded
    assert work["status"]["status_code"] == "ERROR"
    assert work["parent_id"] == attempt["context"]["span_id"]


def test_an_attribute_json_cannot_carry_costs_only_that_value(
        traced_db: psycopg.Connection[Any], supervise: Any, tmp_path: Path,
        tracer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    """A bytes value and an integer past 64 bits (the SDK takes both) are converted to
    text; the span that holds them and the attempt's other spans all arrive."""
    otel, _ = tracer
    with otel.start_as_current_span("request"):
        job_id = atlantis.enqueue(traced_db, "traced.Work", {"key": "odd", "odd": True})
    path = tmp_path / "spans.jsonl"
    supervise(app=APP, queues=QUEUES, concurrency=1, env={"ATLANTIS_TEST_SPANS": str(path)})
    wait_state(traced_db, job_id, "complete")
    spans = _wait_spans(path, "atlantis.attempt traced.Work", "handler.work", "handler.inner")
    (work,) = _named(spans, "handler.work")
    (inner,) = _named(spans, "handler.inner")
    assert work["attributes"]["test.key"] == "odd"
    assert inner["parent_id"] == work["context"]["span_id"]
    assert inner["attributes"]["test.bytes"] == "ab\\xff"
    assert inner["attributes"]["test.huge"] == str(2**70)
    assert [(e["name"], e["attributes"]) for e in inner["events"]] == [
        ("odd", {"test.bytes": "cd", "test.n": 1})]


@pytest.mark.parametrize("context", [None, {"traceparent": "00-not-a-context"},
                                     {"traceparent": 5, "tracestate": ["x"]}],
                         ids=["none", "malformed", "not-text"])
def test_an_untraced_job_gets_a_root_attempt_span(
        traced_db: psycopg.Connection[Any], supervise: Any, tmp_path: Path,
        context: dict[str, Any] | None) -> None:
    """No context, or one a SQL caller wrote wrong: the job runs, its attempt a root."""
    row = traced_db.execute(
        "SELECT atlantis.enqueue('traced.Work', '{\"key\": \"root\"}'::jsonb,"
        " trace_context => %s::jsonb)",
        (None if context is None else orjson.dumps(context).decode(),)).fetchone()
    assert row is not None
    job_id = row[0]
    assert job_row(traced_db, job_id)["trace_context"] == context
    path = tmp_path / "spans.jsonl"
    supervise(app=APP, queues=QUEUES, concurrency=1, env={"ATLANTIS_TEST_SPANS": str(path)})
    wait_state(traced_db, job_id, "complete")
    spans = _wait_spans(path, "atlantis.attempt traced.Work", "handler.work")
    (attempt,) = _named(spans, "atlantis.attempt traced.Work")
    (work,) = _named(spans, "handler.work")
    assert attempt["parent_id"] is None
    assert work["parent_id"] == attempt["context"]["span_id"]


def test_a_workflows_steps_are_traced_from_its_start(
        traced_db: psycopg.Connection[Any], supervise: Any, tmp_path: Path,
        tracer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    """The workflow keeps its starter's context; every step's row gets it, the second one
    too (made by the database when the first completed)."""
    otel, _ = tracer
    with otel.start_as_current_span("request") as request:
        workflow_id = atlantis.start_workflow(traced_db, "traced.Flow", {"key": "w"})
    path = tmp_path / "spans.jsonl"
    supervise(app=APP, queues=QUEUES, concurrency=1, env={"ATLANTIS_TEST_SPANS": str(path)})
    wait_for(lambda: traced_db.execute(
        "SELECT state = 'complete' FROM atlantis.workflows WHERE id = %s",
        (workflow_id,)).fetchone() == (True,), message="the workflow complete")
    spans = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(
        _named(_spans(path), "atlantis.attempt traced.Work")), message="two attempt spans")
    ctx = request.get_span_context()
    assert [s["parent_id"] for s in spans] == [_hex(ctx.span_id, 16)] * 2
    assert {s["attributes"][tracing.STEP] for s in spans} == {"one", "two"}
    assert {s["attributes"][tracing.WORKFLOW_ID] for s in spans} == {workflow_id}


# ---- the row's context --------------------------------------------------------------------

def test_without_a_span_the_rows_trace_context_is_null(
        traced_db: psycopg.Connection[Any],
        tracer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    """OpenTelemetry loaded (it is, in this process) but no span current: NULL. Every
    enqueue path keeps the context of the span current when one is."""
    assert "opentelemetry.trace" in sys.modules
    (plain,) = atlantis.enqueue_many(traced_db, "traced.Work", [{"key": "a"}])
    assert job_row(traced_db, plain)["trace_context"] is None
    sql_id = traced_db.execute(
        "SELECT atlantis.enqueue('traced.Work', '{\"key\": \"s\"}'::jsonb)").fetchone()
    assert sql_id is not None and job_row(traced_db, sql_id[0])["trace_context"] is None

    otel, _ = tracer
    with otel.start_as_current_span("request") as span:
        many = atlantis.enqueue_many(traced_db, "traced.Work", [{"key": "b"}, {"key": "c"}])

        async def twins() -> list[int]:
            async with await psycopg.AsyncConnection.connect(
                    traced_db.info.dsn, autocommit=True) as conn:
                one = await atlantis.enqueue_async(conn, "traced.Work", {"key": "d"})
                return [one, *await atlantis.enqueue_many_async(conn, "traced.Work",
                                                                [{"key": "e"}])]

        async_ids = asyncio.run(twins())
    ctx = span.get_span_context()
    for job_id in [*many, *async_ids]:
        assert job_row(traced_db, job_id)["trace_context"]["traceparent"].startswith(
            f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")


def test_sql_callers_may_pass_a_context(traced_db: psycopg.Connection[Any]) -> None:
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    row = traced_db.execute(
        "SELECT atlantis.enqueue('traced.Work', '{\"key\": \"s\"}'::jsonb,"
        " trace_context => %s::jsonb)", (orjson.dumps(carrier).decode(),)).fetchone()
    assert row is not None
    assert job_row(traced_db, row[0])["trace_context"] == carrier
    with pytest.raises(psycopg.errors.CheckViolation):
        traced_db.execute("SELECT atlantis.enqueue('traced.Work', '{\"key\": \"s\"}'::jsonb,"
                          " trace_context => '[1]'::jsonb)")


# ---- without OpenTelemetry ----------------------------------------------------------------

BLOCKER = '''
import importlib.abc, os, sys

class Blocker(importlib.abc.MetaPathFinder):
    """opentelemetry is not installed, as far as this process knows; a try is recorded."""
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            with open(os.environ["ATLANTIS_TEST_OTEL_TRIED"], "a") as f:
                f.write(f"{os.getpid()} {name}\\n")
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
'''


def test_atlantis_runs_where_opentelemetry_cannot_be_imported(
        db_url: str, db: psycopg.Connection[Any], supervise: Any, tmp_path: Path) -> None:
    """Every process (the enqueuer, the supervisor, its children) with a finder that refuses
    ``opentelemetry`` and records any try: a job is enqueued and runs, and nobody tried."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    tried = tmp_path / "tried"
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "ATLANTIS_TEST_OTEL_TRIED": str(tried)}
    script = textwrap.dedent("""
        import sys, psycopg, atlantis
        with psycopg.connect(sys.argv[1], autocommit=True) as conn:
            print(atlantis.enqueue(conn, "tests.Echo", {"key": "no-otel"}))
        assert not any(m.startswith("opentelemetry") for m in sys.modules), sys.modules
    """)
    out = subprocess.run([sys.executable, "-c", script, db_url], env={**os.environ, **env},
                         capture_output=True, text=True, check=True)
    job_id = int(out.stdout.strip())
    assert job_row(db, job_id)["trace_context"] is None
    supervise(env=env)
    wait_state(db, job_id, "complete")
    assert not tried.exists(), tried.read_text()


# ---- the pieces ---------------------------------------------------------------------------

def test_the_messages_carry_the_trace_and_the_spans() -> None:
    run = Run(job_id=1, job="j", queue="q", attempt=1, max_attempts=2, args="{}",
              deadline="2026-12-02T00:00:00+00:00", lease_end=1.0, lease_margin=0.5,
              trace="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert decode(dumps(run)) == run
    done = Done(job_id=1, outcome="complete", spans="[]")
    assert decode(dumps(done)) == done


def test_spans_cross_the_pipe_as_they_were_and_stay_within_the_limit() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel = provider.get_tracer("tests.pipe", "1.2")
    with otel.start_as_current_span("outer", attributes={"a": 1, "b": ["x", "y"]}) as outer:
        outer.add_event("e", {"n": 2.5})
        with otel.start_as_current_span("inner", links=[trace.Link(outer.get_span_context())]):
            pass
    sent = exporter.get_finished_spans()
    text, dropped = tracing.encode_spans(sent, 100_000)
    assert text is not None and dropped == 0
    got = tracing.decode_spans(text, Resource.create({"service.name": "sup"}))
    for before, after in zip(sent, got, strict=True):
        assert (after.name, after.context, after.parent, after.kind, after.start_time,
                after.end_time, dict(after.attributes or {})) == (
            before.name, before.context, before.parent, before.kind, before.start_time,
            before.end_time, dict(before.attributes or {}))
        assert [(e.name, e.timestamp, dict(e.attributes or {})) for e in after.events] == [
            (e.name, e.timestamp, dict(e.attributes or {})) for e in before.events]
        assert [li.context.span_id for li in after.links] == [
            li.context.span_id for li in before.links]
        assert after.status.status_code == before.status.status_code == StatusCode.UNSET
        assert after.instrumentation_scope == before.instrumentation_scope
        assert after.resource.attributes["service.name"] == "sup"
    text, dropped = tracing.encode_spans(sent, 400)
    assert dropped >= 1 and (text is None or len(text) <= 400)
    with pytest.raises(ValueError, match="malformed spans"):
        tracing.decode_spans('[{"n": "x"}]', Resource.create({}))


def test_a_result_too_large_for_a_frame_loses_its_spans_first() -> None:
    """The spans give way before the traceback (then the traceback, as before)."""
    r, w = os.pipe()
    try:
        big = "\x01" * (MAX_EVENT_FRAME // 12)  # six bytes each in JSON: half a frame
        done = Done(job_id=8, outcome="failed", spans=big,
                    error=ChildError(kind="exception", message="m", traceback=big))
        sent = threading.Thread(target=Channel(w).send_done, args=(done,))
        sent.start()
        data = b""
        while not data or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
            data += os.read(r, 1 << 20)
        sent.join()
        (msg,) = EventReader().feed(data)
        assert msg == dataclasses.replace(done, spans=None)
    finally:
        os.close(r)
        os.close(w)
