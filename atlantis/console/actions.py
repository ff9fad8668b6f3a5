"""The console's writes (retry, cancel, delete; one job or in bulk; an event sent to a job),
audited."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
from starlette.requests import Request
from starlette.responses import Response

from atlantis import operations
from atlantis.console.auth import Principal
from atlantis.console.common import (
    BIGINT_MAX,
    BULK_LIMIT,
    ApiError,
    client_of,
    db_of,
    error,
    job_filter,
    settings_of,
    text_param,
)
from atlantis.errors import (
    JobEndedError,
    JobNotFoundError,
    UniqueKeyTakenError,
    ValidationError,
    WorkflowStateError,
)
from atlantis.store import admin
from atlantis.store import console_queries as store


async def record_audit(request: Request, who: Principal, action: str, target: str,
                       outcome: str, detail: dict[str, Any] | None = None) -> None:
    """One row of the audit table: a write the console made, or refused."""
    client = client_of(request)
    await db_of(request).run(lambda conn: store.audit(
        conn, action=action, target=target, outcome=outcome, client=client, label=who.label,
        detail=detail))


def recorded_by(who: Principal) -> str:
    """Who a change is recorded as (who cancelled, retried, paused): ``console:label``."""
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
        except psycopg.DataError as exc:  # a value the database refused: still the caller's
            return error(400, f"bad parameter: {exc.diag.message_primary or exc}")

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


# -- actions, shared with the pages -------------------------------------------------------------

async def do_action(request: Request, who: Principal, action: str, job_id: int) -> dict[str, Any]:
    """Retry, cancel or delete one job, recorded in the audit table."""
    db = db_of(request)
    by = recorded_by(who)

    def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        row = admin.get_job(conn, job_id)
        if row is None:
            raise ApiError(404, f"no job with id {job_id}")
        if action == "retry":
            try:
                retried = operations.retry(conn, job_id, by=by)
            except WorkflowStateError as exc:  # a workflow's row: retried with its workflow
                raise ApiError(409, str(exc)) from None
            if retried is None:
                raise ApiError(409, f"job {job_id} is {row.state}: only dead or cancelled "
                                    "jobs can be retried")
            return {"id": job_id, "state": "available"}
        if action == "cancel":
            state = operations.cancel(conn, job_id, by=by)
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
            await record_audit(request, who, action, str(job_id), f"refused: {exc.message}")
        raise
    except UniqueKeyTakenError as exc:
        await record_audit(request, who, action, str(job_id), f"refused: {exc}")
        raise
    await record_audit(request, who, action, str(job_id),
                       str(result.get("state", "deleted")))
    return result


# -- events ------------------------------------------------------------------------------------

#: The longest name an event may have (``atlantis.send_event``'s own limit).
EVENT_NAME_MAX = 200
NUL_IN_PAYLOAD = ("payload: contains a NUL character (\\u0000), which PostgreSQL cannot "
                  "store")


def event_name(value: Any) -> str:
    """The ``event`` of a body or a form: a name of 1 to 200 characters."""
    if value is None or value == "":
        raise ApiError(400, "event: missing (the name of the event to send)")
    name = text_param(value, "event")
    if len(name) > EVENT_NAME_MAX:
        raise ApiError(400, f"event: at most {EVENT_NAME_MAX} characters, not {len(name)}")
    return name


def form_payload(raw: str) -> Any:
    """The job page's ``payload``: JSON text, as ``tide job send-event --payload`` takes it
    (nothing but blanks: no payload)."""
    if not raw.strip():
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"payload: not JSON ({exc})") from None


def _has_nul(value: Any) -> bool:
    """Whether a NUL character stands anywhere in a JSON value, keys included (jsonb cannot
    store one). A loop, not recursion: a payload may be nested 1024 deep."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


async def do_send_event(request: Request, who: Principal, job_id: int, event: str,
                        payload: Any) -> dict[str, Any]:
    """Send ``event`` (with ``payload``, any JSON value, None for none) to one job, recorded
    in the audit table as ``send-event``: ``sent EVENT``, or ``refused: ...`` when the
    database refused it (the job has ended: 409; too large a payload, too many pending: 400).
    """
    if _has_nul(payload):
        raise ApiError(400, NUL_IN_PAYLOAD)
    by = recorded_by(who)

    def run(conn: psycopg.Connection[Any]) -> int:
        try:
            return operations.send_event(conn, job_id, event, payload, by=by)
        except JobNotFoundError:
            raise ApiError(404, f"no job with id {job_id}") from None
        except JobEndedError as exc:
            raise ApiError(409, str(exc)) from None
        except ValidationError as exc:
            raise ApiError(400, str(exc)) from None

    try:
        sent = await db_of(request).run(run)
    except ApiError as exc:
        if exc.status != 404:
            await record_audit(request, who, "send-event", str(job_id),
                               f"refused: {exc.message}", {"event": event})
        raise
    await record_audit(request, who, "send-event", str(job_id), f"sent {event}",
                       {"event": event, "event_id": sent})
    return {"id": job_id, "event": event, "event_id": sent}


async def do_bulk(request: Request, who: Principal | None, body: dict[str, Any]) -> dict[str, Any]:
    """A bulk action; ``who`` None means a dry run was asked for without the right to write
    (allowed: it changes nothing)."""
    action = body.get("action")
    if not isinstance(action, str) or action not in store.ACTION_STATES:
        raise ApiError(400, "action: one of retry, cancel, delete")
    dry_run = bool(body.get("dry_run", False))
    states = store.ACTION_STATES[action]
    hidden = settings_of(request).redact
    ids_in = body.get("ids")
    flt_in = body.get("filter")
    if (ids_in is None) == (flt_in is None):
        raise ApiError(400, "give either ids or filter")
    if ids_in is not None:
        # Not bool (an int to Python), nor beyond the database's bigint ids.
        if not isinstance(ids_in, list) or not all(
                type(i) is int and -BIGINT_MAX - 1 <= i <= BIGINT_MAX for i in ids_in):
            raise ApiError(400, "ids: a list of integers (job ids)")
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
    by = recorded_by(who)

    def act(conn: psycopg.Connection[Any]) -> tuple[int, list[dict[str, Any]]]:
        done = 0
        skipped: list[dict[str, Any]] = []
        if action == "delete":
            return store.delete_finished(conn, chosen), skipped
        for job_id in chosen:
            try:
                if action == "retry":
                    ok = operations.retry(conn, job_id, by=by) is not None
                else:
                    ok = operations.cancel(conn, job_id, by=by) is not None
            except (UniqueKeyTakenError, JobNotFoundError, WorkflowStateError) as exc:
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
    await record_audit(request, who, f"bulk-{action}",
                       f"{len(chosen)} jobs" + (" by filter" if flt_in is not None else ""),
                       f"{done} done, {len(skipped)} skipped",
                       {"filter": flt_in, "ids": chosen[:1000]})
    return doc


