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

import orjson
import psycopg
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from atlantis.console.auth import CSRF_HEADER, Principal, csrf_ok, identify
from atlantis.console.data import Database, dumps, job_doc
from atlantis.console.events import Broker, log_doc
from atlantis.console.settings import Settings
from atlantis.errors import JobNotFoundError, UniqueKeyTakenError
from atlantis.store import admin
from atlantis.store import console as store
from atlantis.store.schedules import list_schedules

#: The most jobs one bulk action "by filter" touches.
BULK_LIMIT = 10_000
#: The most jobs a page lists.
PAGE_LIMIT = 500
#: How long an event stream may stay silent before a comment keeps it open.
KEEPALIVE = 15.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json(doc: Any, status: int = 200) -> Response:
    return Response(dumps(doc), status_code=status, media_type="application/json")


def error(status: int, message: str) -> Response:
    return json({"error": message}, status)


def settings_of(request: Request) -> Settings:
    value: Settings = request.app.state.settings
    return value


def db_of(request: Request) -> Database:
    value: Database = request.app.state.db
    return value


def broker_of(request: Request) -> Broker:
    value: Broker = request.app.state.broker
    return value


def client_of(request: Request) -> str | None:
    return request.client.host if request.client else None


# -- parameters -----------------------------------------------------------------------------

def parse_args_filter(raw: str | None, hidden: frozenset[str]) -> dict[str, Any] | None:
    """``account_id:acme,region:eu`` or a JSON object: what the args must contain.

    A value that reads as JSON (``5``, ``true``, ``"5"``, ``{...}``) is taken as such,
    anything else as a string. Keys hidden by ``--args-redact`` cannot be filtered on.
    """
    raw = (raw or "").strip()
    if not raw:
        return None
    found: Any
    if raw.startswith("{"):
        try:
            found = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ApiError(400, "args: not a JSON object") from None
        if not isinstance(found, dict):
            raise ApiError(400, "args: not a JSON object")
    else:
        found = {}
        for part in raw.split(","):
            key, sep, value = part.partition(":")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise ApiError(400, "args: expected key:value[,key:value...] or a JSON object")
            try:
                found[key] = orjson.loads(value)
            except orjson.JSONDecodeError:
                found[key] = value
    if hidden and any(k in hidden for k in _keys(found)):
        raise ApiError(400, "args: a redacted key cannot be filtered on")
    return dict(found)


def _keys(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [*value.keys(), *(k for v in value.values() for k in _keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


def _int(raw: str | None, name: str, *, default: int | None = None,
         low: int | None = None, high: int | None = None) -> int | None:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name}: not an integer") from None
    if low is not None and value < low:
        raise ApiError(400, f"{name}: at least {low}")
    if high is not None and value > high:
        value = high
    return value


def job_filter(params: Any, hidden: frozenset[str]) -> store.JobFilter:
    state = params.get("state") or None
    if state is not None and state not in admin.STATES:
        raise ApiError(400, f"state: one of {', '.join(admin.STATES)}")
    return store.JobFilter(state=state, queue=params.get("queue") or None,
                           job=params.get("job") or None,
                           args=parse_args_filter(params.get("args"), hidden))


def _job_id(request: Request) -> int:
    raw = request.path_params["job_id"]
    try:
        return int(raw)
    except ValueError:
        raise ApiError(404, f"no job with id {raw}") from None


# -- access -----------------------------------------------------------------------------------

def require_read(request: Request) -> Principal:
    settings = settings_of(request)
    who = identify(request, settings)
    if who.bad_credentials:
        raise ApiError(401, "wrong token")
    if settings.private and not who.authenticated:
        raise ApiError(401, "this console is private: send Authorization: Bearer TOKEN")
    return who


def require_write(request: Request, csrf: str | None = None) -> Principal:
    settings = settings_of(request)
    if settings.token is None:
        raise ApiError(403, "read-only console: ATLANTIS_CONSOLE_TOKEN is not set")
    who = identify(request, settings)
    if who.bad_credentials:
        raise ApiError(401, "wrong token")
    if not who.authenticated:
        raise ApiError(403, "writes need Authorization: Bearer TOKEN")
    if not csrf_ok(who, csrf if csrf is not None else request.headers.get(CSRF_HEADER)):
        raise ApiError(403, "missing or wrong CSRF token")
    return who


async def _audit(request: Request, who: Principal, action: str, target: str, outcome: str,
                 detail: dict[str, Any] | None = None) -> None:
    client = client_of(request)
    await db_of(request).run(lambda conn: store.audit(
        conn, action=action, target=target, outcome=outcome, client=client, label=who.label,
        detail=detail))


def _by(who: Principal) -> str:
    return f"console:{who.label}"


def handle(fn: Any) -> Any:
    """Turn ApiError and database trouble into JSON errors."""

    async def wrapper(request: Request) -> Response:
        try:
            response: Response = await fn(request)
            return response
        except ApiError as exc:
            return error(exc.status, exc.message)
        except JobNotFoundError as exc:
            return error(404, str(exc))
        except UniqueKeyTakenError as exc:
            return error(409, str(exc))
        except psycopg.OperationalError as exc:
            return error(503, f"database unavailable: {type(exc).__name__}")
        except psycopg.errors.UndefinedTable:
            return error(503, "the atlantis schema is missing or old: run tide db migrate")

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


# -- actions, shared with the pages -------------------------------------------------------------

async def do_action(request: Request, who: Principal, action: str, job_id: int) -> dict[str, Any]:
    """Retry, cancel or delete one job, recorded in the audit table."""
    db = db_of(request)
    by = _by(who)

    def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        row = admin.get_job(conn, job_id)
        if row is None:
            raise ApiError(404, f"no job with id {job_id}")
        if action == "retry":
            if not admin.retry_job(conn, job_id, by=by):
                raise ApiError(409, f"job {job_id} is {row.state}: only dead or cancelled "
                                    "jobs can be retried")
            return {"id": job_id, "state": "available"}
        if action == "cancel":
            state = admin.cancel_job(conn, job_id, by=by)
            if state is None:
                raise ApiError(409, f"job {job_id} has finished ({row.state})")
            return {"id": job_id, "state": state}
        if not row.finished:
            raise ApiError(409, f"job {job_id} is {row.state}: only finished jobs can be "
                                "deleted")
        store.delete_finished(conn, [job_id])
        return {"id": job_id, "deleted": True}

    try:
        result = await db.run(run)
    except ApiError as exc:
        if exc.status == 409:
            await _audit(request, who, action, str(job_id), f"refused: {exc.message}")
        raise
    except UniqueKeyTakenError as exc:
        await _audit(request, who, action, str(job_id), f"refused: {exc}")
        raise
    await _audit(request, who, action, str(job_id),
                 str(result.get("state", "deleted")))
    return result


async def do_bulk(request: Request, who: Principal | None, body: dict[str, Any]) -> dict[str, Any]:
    """A bulk action; ``who`` None means a dry run was asked for without the right to write
    (allowed: it changes nothing)."""
    action = body.get("action")
    if action not in store.ACTION_STATES:
        raise ApiError(400, "action: one of retry, cancel, delete")
    dry_run = bool(body.get("dry_run", False))
    states = store.ACTION_STATES[action]
    hidden = settings_of(request).redact
    ids_in = body.get("ids")
    flt_in = body.get("filter")
    if (ids_in is None) == (flt_in is None):
        raise ApiError(400, "give either ids or filter")
    if ids_in is not None:
        if not isinstance(ids_in, list) or not all(isinstance(i, int) for i in ids_in):
            raise ApiError(400, "ids: a list of integers")
        if len(ids_in) > BULK_LIMIT:
            raise ApiError(400, f"ids: at most {BULK_LIMIT}")
        ids = list(ids_in)

        def select(conn: psycopg.Connection[Any]) -> list[int]:
            return store.ids_in_states(conn, ids, states)
    else:
        if not isinstance(flt_in, dict):
            raise ApiError(400, "filter: an object with state, queue, job, args")
        flt = job_filter({k: (orjson.dumps(v).decode() if k == "args" and isinstance(v, dict)
                              else v) for k, v in flt_in.items()}, hidden)

        def select(conn: psycopg.Connection[Any]) -> list[int]:
            return store.matching_ids(conn, flt, states, limit=BULK_LIMIT)

    db = db_of(request)
    chosen = await db.run(select)
    doc: dict[str, Any] = {"action": action, "dry_run": dry_run, "count": len(chosen),
                           "limit": BULK_LIMIT}
    if dry_run:
        return doc
    if who is None:
        raise ApiError(403, "writes need Authorization: Bearer TOKEN")
    by = _by(who)

    def act(conn: psycopg.Connection[Any]) -> tuple[int, list[dict[str, Any]]]:
        done = 0
        skipped: list[dict[str, Any]] = []
        if action == "delete":
            return store.delete_finished(conn, chosen), skipped
        for job_id in chosen:
            try:
                if action == "retry":
                    ok = admin.retry_job(conn, job_id, by=by)
                else:
                    ok = admin.cancel_job(conn, job_id, by=by) is not None
            except (UniqueKeyTakenError, JobNotFoundError) as exc:
                skipped.append({"id": job_id, "reason": str(exc)})
                continue
            if ok:
                done += 1
            else:
                skipped.append({"id": job_id, "reason": "changed state meanwhile"})
        return done, skipped

    done, skipped = await db.run(act)
    doc["done"] = done
    doc["skipped"] = skipped[:100]
    await _audit(request, who, f"bulk-{action}",
                 f"{len(chosen)} jobs" + (" by filter" if flt_in is not None else ""),
                 f"{done} done, {len(skipped)} skipped",
                 {"filter": flt_in, "ids": chosen[:1000]})
    return doc


# -- endpoints ---------------------------------------------------------------------------------

@handle
async def jobs(request: Request) -> Response:
    require_read(request)
    settings = settings_of(request)
    flt = job_filter(request.query_params, settings.redact)
    before = _int(request.query_params.get("before"), "before")
    limit = _int(request.query_params.get("limit"), "limit", default=50, low=1,
                 high=PAGE_LIMIT)
    assert limit is not None

    def read(conn: psycopg.Connection[Any]) -> tuple[list[admin.JobRow], int | None]:
        return store.jobs_page(conn, flt, before=before, limit=limit), store.estimated_jobs(conn)

    rows, estimate = await db_of(request).run(read)
    return json({"jobs": [job_doc(r, settings.redact) for r in rows],
                 "next_before": rows[-1].id if len(rows) == limit else None,
                 "estimated_total": estimate})


@handle
async def job(request: Request) -> Response:
    require_read(request)
    job_id = _job_id(request)
    settings = settings_of(request)

    def read(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
        row = admin.get_job(conn, job_id)
        if row is None:
            return None
        return job_doc(row, settings.redact, admin.job_attempts(conn, job_id))

    doc = await db_of(request).run(read)
    if doc is None:
        return error(404, f"no job with id {job_id}")
    return json(doc)


def read_logs(conn: psycopg.Connection[Any], job_id: int, attempt: int | None,
              after: int, limit: int) -> dict[str, Any] | None:
    row = admin.get_job(conn, job_id)
    if row is None:
        return None
    if attempt is None:
        attempt = admin.latest_log_attempt(conn, job_id) or max(row.attempt, 1)
    if after > 0:
        lines = [log_doc(ln) for ln in admin.log_lines(conn, job_id, attempt, after=after,
                                                       limit=limit)]
    else:
        lines = [log_doc(ln) for ln in store.log_tail(conn, job_id, attempt, limit=limit)]
    last = lines[-1]["id"] if lines else after
    return {"job_id": job_id, "attempt": attempt, "lines": lines, "next_after": last}


@handle
async def logs(request: Request) -> Response:
    require_read(request)
    job_id = _job_id(request)
    attempt = _int(request.query_params.get("attempt"), "attempt", low=1)
    after = _int(request.query_params.get("after"), "after", default=0, low=0)
    limit = _int(request.query_params.get("limit"), "limit", default=200, low=1, high=5000)
    assert after is not None and limit is not None
    doc = await db_of(request).run(lambda conn: read_logs(conn, job_id, attempt, after, limit))
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
    job_id = _job_id(request)
    settings = settings_of(request)

    def read(conn: psycopg.Connection[Any]) -> tuple[dict[str, Any], dict[str, Any], int] | None:
        row = admin.get_job(conn, job_id)
        if row is None:
            return None
        tail = read_logs(conn, job_id, None, 0, 200)
        assert tail is not None
        after = tail["lines"][-1]["id"] if tail["lines"] else store.last_log_id(conn)
        return job_doc(row, settings.redact), tail, after

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


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


@handle
async def retry(request: Request) -> Response:
    who = require_write(request)
    return json(await do_action(request, who, "retry", _job_id(request)))


@handle
async def cancel(request: Request) -> Response:
    who = require_write(request)
    return json(await do_action(request, who, "cancel", _job_id(request)))


@handle
async def delete(request: Request) -> Response:
    who = require_write(request)
    return json(await do_action(request, who, "delete", _job_id(request)))


@handle
async def bulk(request: Request) -> Response:
    body = await _body(request)
    if body.get("dry_run"):
        require_read(request)
        return json(await do_bulk(request, None, body))
    who = require_write(request)
    return json(await do_bulk(request, who, body))


async def set_paused(request: Request, who: Principal, queue: str, paused: bool,
                     reason: str | None) -> dict[str, Any]:
    by = _by(who)

    def run(conn: psycopg.Connection[Any]) -> bool:
        if paused:
            return admin.pause_queue(conn, queue, reason=reason, by=by)
        return admin.resume_queue(conn, queue, by=by)

    changed = await db_of(request).run(run)
    await _audit(request, who, "pause" if paused else "resume", queue,
                 "changed" if changed else "unchanged", {"reason": reason} if reason else None)
    return {"queue": queue, "paused": paused, "changed": changed}


@handle
async def pause(request: Request) -> Response:
    who = require_write(request)
    body = await _body(request)
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ApiError(400, "reason: a string")
    return json(await set_paused(request, who, request.path_params["name"], True, reason))


@handle
async def resume(request: Request) -> Response:
    who = require_write(request)
    return json(await set_paused(request, who, request.path_params["name"], False, None))


def overview_data(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Every queue's stats with ``per_minute``: completions in each of the last 60 minutes,
    oldest first."""
    stats = admin.queue_stats(conn)
    minutes: dict[str, list[int]] = {}
    for t in store.throughput(conn):
        if 0 <= t.minutes_ago < 60:
            minutes.setdefault(t.queue, [0] * 60)[59 - t.minutes_ago] = t.count
    out = []
    for s in stats:
        doc = admin.as_dict(s)
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
    rows = await db_of(request).run(admin.list_workers)
    return json({"workers": [w.document() for w in rows]})


@handle
async def schedules(request: Request) -> Response:
    require_read(request)
    found, now = await db_of(request).run(list_schedules)
    return json({"schedules": [s.document() for s in found], "now": now})


@handle
async def dlq(request: Request) -> Response:
    require_read(request)
    queue = request.query_params.get("queue") or None
    groups = await db_of(request).run(lambda conn: store.dlq_groups(conn, queue=queue))
    return json({"groups": [admin.as_dict(g) for g in groups]})


@handle
async def audit(request: Request) -> Response:
    require_read(request)
    before = _int(request.query_params.get("before"), "before")
    rows = await db_of(request).run(lambda conn: store.audit_log(conn, before=before))
    return json({"audit": [admin.as_dict(r) for r in rows]})


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
    Route("/queues", queues, methods=["GET"]),
    Route("/queues/{name}/pause", pause, methods=["POST"]),
    Route("/queues/{name}/resume", resume, methods=["POST"]),
    Route("/workers", workers, methods=["GET"]),
    Route("/schedules", schedules, methods=["GET"]),
    Route("/dlq", dlq, methods=["GET"]),
    Route("/audit", audit, methods=["GET"]),
    Route("/events", events, methods=["GET"]),
    Route("/{rest:path}", not_found),
]
