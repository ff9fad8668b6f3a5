"""The JSON API under ``/api`` (documented in ``docs/console-api.md``); the pages use it too.

Errors are ``{"error": "..."}`` with 400 (a bad parameter), 401 (``--private`` and no
credentials, or a wrong bearer token), 403 (a write without the right to write), 404 (an
unknown id), 409 (the job is not in a state the action applies to) or 503 (the database
cannot be reached).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from atlantis import operations
from atlantis.console.actions import do_action as do_action
from atlantis.console.actions import do_bulk as do_bulk
from atlantis.console.actions import do_send_event, event_name, record_audit, recorded_by
from atlantis.console.actions import handle as handle
from atlantis.console.auth import Principal
from atlantis.console.common import INT_MAX, json_body
from atlantis.console.common import KEEPALIVE as KEEPALIVE
from atlantis.console.common import PAGE_LIMIT as PAGE_LIMIT
from atlantis.console.common import ApiError as ApiError
from atlantis.console.common import broker_of as broker_of
from atlantis.console.common import db_of as db_of
from atlantis.console.common import error as error
from atlantis.console.common import int_param as int_param
from atlantis.console.common import job_filter as job_filter
from atlantis.console.common import json as json
from atlantis.console.common import path_job_id as path_job_id
from atlantis.console.common import require_read as require_read
from atlantis.console.common import require_write as require_write
from atlantis.console.common import settings_of as settings_of
from atlantis.console.common import text_param as text_param
from atlantis.console.data import dumps, job_doc, job_page_doc, redact_held
from atlantis.console.events import Broker
from atlantis.presentation import log_document, worker_document
from atlantis.store import admin, fleet
from atlantis.store import console_queries as store
from atlantis.store.schedules import list_schedules
from atlantis.store.typed_rows import as_dict

# -- endpoints ---------------------------------------------------------------------------------

@handle
async def jobs(request: Request) -> Response:
    require_read(request)
    settings = settings_of(request)
    flt = job_filter(request.query_params, settings.redact)
    before = int_param(request.query_params.get("before"), "before")
    limit = int_param(request.query_params.get("limit"), "limit", default=50, low=1,
                      high=PAGE_LIMIT)
    assert limit is not None

    def read(conn: psycopg.Connection[Any]) -> tuple[store.JobsPage, int | None]:
        return store.jobs_page(conn, flt, before=before, limit=limit), store.estimated_jobs(conn)

    page, estimate = await db_of(request).run(read)
    return json({"jobs": [job_doc(r, settings.redact) for r in page.rows],
                 "next_before": page.next_before, "searched_from": page.searched_from,
                 "estimated_total": estimate})


@handle
async def job(request: Request) -> Response:
    require_read(request)
    job_id = path_job_id(request)
    settings = settings_of(request)

    def read(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
        row = admin.get_job(conn, job_id)
        if row is None:
            return None
        doc = job_page_doc(conn, row, settings.redact, admin.job_attempts(conn, job_id))
        doc["held"] = redact_held(fleet.limit_hold(conn, job_id), settings.redact)
        return doc

    doc = await db_of(request).run(read)
    if doc is None:
        return error(404, f"no job with id {job_id}")
    return json(doc)


def read_logs(conn: psycopg.Connection[Any], job_id: int, attempt: int | None,
              after: int, limit: int, run: int | None = None) -> dict[str, Any] | None:
    """Lines of one attempt, (``run``, ``attempt``): by default the job's latest run (a
    retry starts the next one, whose attempts count from 1 again), and in it the attempt
    that wrote the newest line, else the job's current one."""
    row = admin.get_job(conn, job_id)
    if row is None:
        return None
    if run is None:
        run = row.run
    if attempt is None:
        current = row.attempt if run == row.run else 0
        attempt = admin.latest_log_attempt(conn, job_id, run=run) or max(current, 1)
    if after > 0:
        lines = [log_document(ln) for ln in admin.log_lines(conn, job_id, attempt, run=run,
                                                            after=after, limit=limit)]
    else:
        lines = [log_document(ln) for ln in store.log_tail(conn, job_id, attempt, run=run,
                                                           limit=limit)]
    last = lines[-1]["id"] if lines else after
    return {"job_id": job_id, "run": run, "attempt": attempt, "lines": lines,
            "next_after": last}


@handle
async def logs(request: Request) -> Response:
    require_read(request)
    job_id = path_job_id(request)
    run = int_param(request.query_params.get("run"), "run", low=1, maximum=INT_MAX)
    attempt = int_param(request.query_params.get("attempt"), "attempt", low=1, maximum=INT_MAX)
    after = int_param(request.query_params.get("after"), "after", default=0, low=0)
    limit = int_param(request.query_params.get("limit"), "limit", default=200, low=1, high=5000)
    assert after is not None and limit is not None
    doc = await db_of(request).run(lambda conn: read_logs(conn, job_id, attempt, after, limit,
                                                          run))
    if doc is None:
        return error(404, f"no job with id {job_id}")
    return json(doc)


def _sse(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


async def _stream(request: Request, sub_events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(sub_events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _drain(request: Request, broker: Broker, sub: Any,
                 first: list[bytes]) -> AsyncIterator[bytes]:
    try:
        yield b"retry: 2000\n\n"
        for chunk in first:
            yield chunk
        while True:
            try:
                name, data = await asyncio.wait_for(sub.queue.get(), KEEPALIVE)
            except TimeoutError:
                if await request.is_disconnected():
                    return
                yield b": keepalive\n\n"
                continue
            yield _sse(name, data)
    finally:
        broker.unsubscribe(sub)


@handle
async def stream(request: Request) -> Response:
    """``event: job`` (the job's document) on every change, ``event: log`` (a JSON array of
    new lines) as they are written; the first events are the job and its log tail."""
    require_read(request)
    job_id = path_job_id(request)
    settings = settings_of(request)

    def read(conn: psycopg.Connection[Any]) -> tuple[dict[str, Any], dict[str, Any], int] | None:
        row = admin.get_job(conn, job_id)
        if row is None:
            return None
        tail = read_logs(conn, job_id, None, 0, 200)
        assert tail is not None
        after = tail["lines"][-1]["id"] if tail["lines"] else store.last_log_id(conn)
        return job_page_doc(conn, row, settings.redact), tail, after

    found = await db_of(request).run(read)
    if found is None:
        return error(404, f"no job with id {job_id}")
    doc, tail, after = found
    broker = broker_of(request)
    sub = broker.subscribe_job(job_id, after)
    first = [_sse("job", dumps(doc))]
    if tail["lines"]:
        first.append(_sse("log", dumps(tail["lines"])))
    return await _stream(request, _drain(request, broker, sub, first))


@handle
async def events(request: Request) -> Response:
    """List pages: ``event: refresh`` when anything changed, at most ~4 a second."""
    require_read(request)
    broker = broker_of(request)
    sub = broker.subscribe_lists()
    return await _stream(request, _drain(request, broker, sub, []))


@handle
async def retry(request: Request) -> Response:
    who = require_write(request)
    return json(await do_action(request, who, "retry", path_job_id(request)))


@handle
async def cancel(request: Request) -> Response:
    who = require_write(request)
    return json(await do_action(request, who, "cancel", path_job_id(request)))


@handle
async def delete(request: Request) -> Response:
    who = require_write(request)
    return json(await do_action(request, who, "delete", path_job_id(request)))


@handle
async def send_event(request: Request) -> Response:
    """Body ``{"event": NAME, "payload": JSON}`` (``payload`` optional): the event is kept
    until the job's handler waits for it; a job that waits for it already is woken."""
    who = require_write(request)
    job_id = path_job_id(request)
    body = await json_body(request)
    event = event_name(body.get("event"))
    return json(await do_send_event(request, who, job_id, event, body.get("payload")))


@handle
async def bulk(request: Request) -> Response:
    body = await json_body(request)
    if body.get("dry_run"):
        require_read(request)
        return json(await do_bulk(request, None, body))
    who = require_write(request)
    return json(await do_bulk(request, who, body))


async def set_paused(request: Request, who: Principal, queue: str, paused: bool,
                     reason: str | None) -> dict[str, Any]:
    by = recorded_by(who)
    if not text_param(queue, "queue"):
        raise ApiError(400, "queue: missing")

    def run(conn: psycopg.Connection[Any]) -> bool:
        if paused:
            return operations.pause(conn, queue, reason=reason, by=by)
        return operations.resume(conn, queue, by=by)

    changed = await db_of(request).run(run)
    await record_audit(request, who, "pause" if paused else "resume", queue,
                       "changed" if changed else "unchanged",
                       {"reason": reason} if reason else None)
    return {"queue": queue, "paused": paused, "changed": changed}


@handle
async def pause(request: Request) -> Response:
    who = require_write(request)
    body = await json_body(request)
    reason = body.get("reason")
    if reason is not None:
        text_param(reason, "reason")
    return json(await set_paused(request, who, request.path_params["name"], True, reason))


@handle
async def resume(request: Request) -> Response:
    who = require_write(request)
    return json(await set_paused(request, who, request.path_params["name"], False, None))


def overview_data(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Every queue's stats with ``per_minute``: completions in each of the last 60 minutes,
    oldest first; and its limits (``concurrency_limit``, ``limited_running``, ``held``)."""
    stats = fleet.queue_stats(conn)
    limits = fleet.queue_limits(conn, [s.queue for s in stats])
    minutes: dict[str, list[int]] = {}
    for t in store.throughput(conn):
        if 0 <= t.minutes_ago < 60:
            minutes.setdefault(t.queue, [0] * 60)[59 - t.minutes_ago] = t.count
    out = []
    for s in stats:
        doc = as_dict(s) | as_dict(limits.get(s.queue, fleet.NO_LIMITS))
        doc["per_minute"] = minutes.get(s.queue, [0] * 60)
        out.append(doc)
    return out


@handle
async def queues(request: Request) -> Response:
    require_read(request)
    return json({"queues": await db_of(request).run(overview_data)})


@handle
async def workers(request: Request) -> Response:
    require_read(request)
    rows = await db_of(request).run(fleet.list_workers)
    return json({"workers": [worker_document(w) for w in rows]})


@handle
async def schedules(request: Request) -> Response:
    require_read(request)
    found, now = await db_of(request).run(list_schedules)
    return json({"schedules": [s.document() for s in found], "now": now})


@handle
async def dlq(request: Request) -> Response:
    require_read(request)
    queue = text_param(request.query_params.get("queue"), "queue") or None
    groups = await db_of(request).run(lambda conn: store.dlq_groups(conn, queue=queue))
    return json({"groups": [as_dict(g) for g in groups]})


@handle
async def audit(request: Request) -> Response:
    require_read(request)
    before = int_param(request.query_params.get("before"), "before")
    rows = await db_of(request).run(lambda conn: store.audit_log(conn, before=before))
    return json({"audit": [as_dict(r) for r in rows]})


@handle
async def not_found(request: Request) -> Response:
    return error(404, "no such endpoint")


routes = [
    Route("/jobs", jobs, methods=["GET"]),
    Route("/jobs/bulk", bulk, methods=["POST"]),
    Route("/jobs/{job_id}", job, methods=["GET"]),
    Route("/jobs/{job_id}", delete, methods=["DELETE"]),
    Route("/jobs/{job_id}/stream", stream, methods=["GET"]),
    Route("/jobs/{job_id}/logs", logs, methods=["GET"]),
    Route("/jobs/{job_id}/retry", retry, methods=["POST"]),
    Route("/jobs/{job_id}/cancel", cancel, methods=["POST"]),
    Route("/jobs/{job_id}/events", send_event, methods=["POST"]),
    Route("/queues", queues, methods=["GET"]),
    # Any queue name, "/" included: percent-encoded in the path ("reports%2Fdaily"), which
    # the server decodes before routing, so the name runs up to the last "/pause".
    Route("/queues/{name:path}/pause", pause, methods=["POST"]),
    Route("/queues/{name:path}/resume", resume, methods=["POST"]),
    Route("/workers", workers, methods=["GET"]),
    Route("/schedules", schedules, methods=["GET"]),
    Route("/dlq", dlq, methods=["GET"]),
    Route("/audit", audit, methods=["GET"]),
    Route("/events", events, methods=["GET"]),
    Route("/{rest:path}", not_found),
]

