"""The server-rendered pages. Forms post to page routes that share the API's actions
(:func:`atlantis.console.api.do_action`, ``do_bulk``, ``set_paused``, ``do_send_event``), then
redirect.

Handler-controlled text (progress messages, errors, logs, args) only ever reaches a page
through Jinja's autoescaping or, live, through ``textContent`` in ``static/console.js``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

import orjson
import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from atlantis import environ
from atlantis.console import api
from atlantis.console.actions import do_send_event, event_name, form_payload
from atlantis.console.api import ApiError, db_of, settings_of
from atlantis.console.auth import COOKIE, CSRF_FIELD, Principal, check_secret, identify, new_session
from atlantis.console.data import children_of, job_doc, job_page_doc, redact_held, sparkline
from atlantis.errors import JobNotFoundError, UniqueKeyTakenError
from atlantis.store import admin, fleet, liveness
from atlantis.store import console_queries as store
from atlantis.store.schedules import list_schedules
from atlantis.units import format_duration, format_size

HERE = Path(__file__).resolve().parent

env = Environment(loader=FileSystemLoader(HERE / "templates"),
                  autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return "0s"
    return format_duration(round(seconds))


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0:
        return f"in {_duration(-seconds)}"
    return f"{_duration(seconds)} ago"


def _ts(value: Any) -> str:
    if value is None:
        return "-"
    return str(value.strftime("%Y-%m-%d %H:%M:%S UTC") if hasattr(value, "strftime") else value)


def _age(value: Any, now: Any) -> str:
    if value is None or now is None:
        return "-"
    return _ago((now - value).total_seconds())


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


env.filters.update(duration=_duration, ago=_ago, ts=_ts, pretty=_json, size=format_size)
def _approx(queue: dict[str, Any], state: str) -> str:
    """A queue's count of ``state``; an estimate (above fleet.COUNT_CAP) reads "≈12,345"."""
    count = int(queue[state])
    return f"≈{count:,}" if state in queue["approximate"] else str(count)


env.globals.update(age=_age, sparkline=sparkline, approx=_approx)


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    settings = settings_of(request)
    who: Principal = context.pop("who", None) or identify(request, settings)
    context.update(
        request=request, who=who, private=settings.private,
        token_configured=settings.token is not None,
        can_write=settings.token is not None and who.authenticated,
        csrf=who.csrf or "", csrf_field=CSRF_FIELD,
        path=request.url.path,
    )
    html = env.get_template(name).render(**context)
    return HTMLResponse(html, status_code=status)


def page(fn: Any) -> Any:
    """Access for reads (``--private``: log in first) and errors as pages."""

    async def wrapper(request: Request) -> Response:
        settings = settings_of(request)
        who = identify(request, settings)
        if settings.private and not who.authenticated:
            return RedirectResponse("/login?" + urlencode({"next": request.url.path}), 303)
        try:
            response: Response = await fn(request, who)
            return response
        except ApiError as exc:
            return render(request, "error.html", exc.status, who=who, message=exc.message)
        except (JobNotFoundError, UniqueKeyTakenError) as exc:
            return render(request, "error.html", 409, who=who, message=str(exc))
        except psycopg.OperationalError as exc:
            return render(request, "error.html", 503, who=who,
                          message=f"database unavailable: {type(exc).__name__}")
        except psycopg.DataError as exc:
            return render(request, "error.html", 400, who=who,
                          message=f"bad parameter: {exc.diag.message_primary or exc}")

    wrapper.__name__ = fn.__name__
    return wrapper


@page
async def overview(request: Request, who: Principal) -> Response:
    def read(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        return {"queues": api.overview_data(conn),
                "stalled": admin.list_jobs(conn, stalled=True, limit=20),
                "orphaned": liveness.orphaned_jobs(conn, limit=20),
                "workers": fleet.list_workers(conn),
                "estimate": store.estimated_jobs(conn)}

    data = await db_of(request).run(read)
    return render(request, "overview.html", who=who, **data)


@page
async def jobs(request: Request, who: Principal) -> Response:
    settings = settings_of(request)
    params = request.query_params
    flt = api.job_filter(params, settings.redact)
    before = api.int_param(params.get("before"), "before")
    limit = api.int_param(params.get("limit"), "limit", default=50, low=1, high=api.PAGE_LIMIT)
    assert limit is not None

    def read(conn: psycopg.Connection[Any]) -> tuple[store.JobsPage, int | None]:
        return store.jobs_page(conn, flt, before=before, limit=limit), store.estimated_jobs(conn)

    page, estimate = await db_of(request).run(read)
    rows = page.rows
    filters = {k: params.get(k, "") for k in ("state", "queue", "job", "args")}
    next_link = None
    if page.next_before is not None:
        next_link = "/jobs?" + urlencode({**{k: v for k, v in filters.items() if v},
                                          "before": page.next_before})
    return render(request, "jobs.html", who=who,
                  jobs=[job_doc(r, settings.redact) for r in rows], filters=filters,
                  states=admin.STATES, next_link=next_link, estimate=estimate,
                  searched_from=page.searched_from if len(rows) < limit else None,
                  window=store.SCAN_WINDOW,
                  filter_json=_json({k: v for k, v in filters.items() if v}))


@page
async def job(request: Request, who: Principal) -> Response:
    job_id = api.path_job_id(request)
    settings = settings_of(request)

    def read(conn: psycopg.Connection[Any]) -> tuple[dict[str, Any], ...] | None:
        row = admin.get_job(conn, job_id)
        if row is None:
            return None
        logs = api.read_logs(conn, job_id, None, 0, 200)
        assert logs is not None
        doc = job_page_doc(conn, row, settings.redact, admin.job_attempts(conn, job_id))
        doc["held"] = redact_held(fleet.limit_hold(conn, job_id), settings.redact)
        return doc, logs, children_of(conn, doc)

    found = await db_of(request).run(read)
    if found is None:
        raise ApiError(404, f"no job with id {job_id}")
    doc, logs, children = found
    history = [float(h.get("pct", 0)) for h in doc["progress_history"] if isinstance(h, dict)]
    sent = request.query_params.get("event_sent", "")  # after the Send event form
    return render(request, "job.html", who=who, job=doc, logs=logs, history=history,
                  children=children,
                  event_sent=sent if sent.isascii() and sent.isdigit() and len(sent) < 20
                  else None)


@page
async def dlq(request: Request, who: Principal) -> Response:
    queue = api.text_param(request.query_params.get("queue"), "queue") or None
    groups = await db_of(request).run(lambda conn: store.dlq_groups(conn, queue=queue))
    return render(request, "dlq.html", who=who, groups=groups, queue=queue or "")


@page
async def queues(request: Request, who: Principal) -> Response:
    data = await db_of(request).run(api.overview_data)
    return render(request, "queues.html", who=who, queues=data)


@page
async def workers(request: Request, who: Principal) -> Response:
    rows = await db_of(request).run(fleet.list_workers)
    return render(request, "workers.html", who=who, workers=rows)


@page
async def schedules(request: Request, who: Principal) -> Response:
    found, now = await db_of(request).run(list_schedules)
    return render(request, "schedules.html", who=who, schedules=found, now=now)


@page
async def audit(request: Request, who: Principal) -> Response:
    rows = await db_of(request).run(lambda conn: store.audit_log(conn, limit=200))
    return render(request, "audit.html", who=who, rows=rows)


async def _form(request: Request) -> dict[str, str]:
    form = await request.form()
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _back(fallback: str, form: dict[str, str]) -> str:
    target = form.get("next") or fallback
    return target if target.startswith("/") and not target.startswith("//") else fallback


@page
async def job_action(request: Request, who: Principal) -> Response:
    form = await _form(request)
    writer = api.require_write(request, form.get(CSRF_FIELD, ""))
    action = request.path_params["action"]
    if action not in ("retry", "cancel", "delete"):
        raise ApiError(404, "no such action")
    job_id = api.path_job_id(request)
    await api.do_action(request, writer, action, job_id)
    return RedirectResponse(_back("/jobs" if action == "delete" else f"/jobs/{job_id}", form),
                            303)


@page
async def job_event(request: Request, who: Principal) -> Response:
    """``POST /jobs/{id}/events``, the job page's form: ``event`` (its name) and ``payload``
    (JSON text; empty: none); then back to the job's page, which says the event was sent."""
    form = await _form(request)
    writer = api.require_write(request, form.get(CSRF_FIELD, ""))
    job_id = api.path_job_id(request)
    event = event_name(form.get("event"))
    sent = await do_send_event(request, writer, job_id, event,
                               form_payload(form.get("payload", "")))
    return RedirectResponse(f"/jobs/{job_id}?" + urlencode({"event_sent": sent["event_id"]}),
                            303)


@page
async def queue_action(request: Request, who: Principal) -> Response:
    """``POST /queues/pause|resume`` with the queue in the form field ``queue``
    (percent-encoded: any name, whatever a browser does to paths and line breaks), or the
    older ``POST /queues/{name}/pause|resume``."""
    form = await _form(request)
    writer = api.require_write(request, form.get(CSRF_FIELD, ""))
    action = request.path_params["action"]
    if action not in ("pause", "resume"):
        raise ApiError(404, "no such action")
    if "name" in request.path_params:
        queue = request.path_params["name"]
    elif form.get("queue"):
        try:
            queue = unquote(form["queue"], errors="strict")
        except UnicodeDecodeError:
            raise ApiError(400, "queue: not percent-encoded UTF-8") from None
    else:
        raise ApiError(400, "queue: missing")
    await api.set_paused(request, writer, queue, action == "pause", form.get("reason") or None)
    return RedirectResponse(_back("/queues", form), 303)


@page
async def bulk(request: Request, who: Principal) -> Response:
    """Bulk actions from the jobs page: first a dry run showing the count, then, once
    confirmed, the action itself."""
    form = await request.form()
    csrf = form.get(CSRF_FIELD)
    writer = api.require_write(request, csrf if isinstance(csrf, str) else "")
    action = str(form.get("action", ""))
    scope = str(form.get("scope", "selection"))
    body: dict[str, Any] = {"action": action}
    if scope == "filter":
        try:
            body["filter"] = orjson.loads(str(form.get("filter") or "{}"))
        except orjson.JSONDecodeError:
            raise ApiError(400, "filter: not JSON") from None
    else:
        try:
            body["ids"] = [int(str(v)) for v in form.getlist("ids")]
        except ValueError:
            raise ApiError(400, "ids: integers") from None
        if not body["ids"]:
            raise ApiError(400, "select some jobs first")
    if form.get("confirm") != "yes":
        preview = await api.do_bulk(request, writer, {**body, "dry_run": True})
        return render(request, "confirm.html", who=who, preview=preview, scope=scope,
                      body=body, body_json=_json(body),
                      filter_json=orjson.dumps(body.get("filter") or {}).decode())
    result = await api.do_bulk(request, writer, body)
    return render(request, "bulk_done.html", who=who, result=result)


async def login(request: Request) -> Response:
    settings = settings_of(request)
    nxt = request.query_params.get("next", "/")
    if request.method == "GET":
        return render(request, "login.html", next=nxt, failed=False)
    form = await _form(request)
    target = _back("/", form)
    if settings.token is None:
        return render(request, "login.html", 403, next=target, failed=True,
                      message=f"This console has no token ({environ.CONSOLE_TOKEN}): it is "
                              "read-only for everyone.")
    if not check_secret(settings.token, form.get("token", "")):
        return render(request, "login.html", 403, next=target, failed=True,
                      message="Wrong token.")
    response = RedirectResponse(target, 303)
    response.set_cookie(COOKIE, new_session(settings.token), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse("/", 303)
    response.delete_cookie(COOKIE, path="/")
    return response


routes = [
    Route("/", overview),
    Route("/jobs", jobs),
    Route("/jobs/bulk", bulk, methods=["POST"]),
    Route("/jobs/{job_id}", job),
    Route("/jobs/{job_id}/events", job_event, methods=["POST"]),
    Route("/jobs/{job_id}/{action}", job_action, methods=["POST"]),
    Route("/dlq", dlq),
    Route("/queues", queues),
    Route("/queues/{action}", queue_action, methods=["POST"]),
    Route("/queues/{name:path}/{action}", queue_action, methods=["POST"]),
    Route("/workers", workers),
    Route("/schedules", schedules),
    Route("/audit", audit),
    Route("/login", login, methods=["GET", "POST"]),
    Route("/logout", logout, methods=["POST"]),
]
