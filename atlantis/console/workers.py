"""One supervisor in the console: its page, and an operator's drain, eviction or resume.

``GET /workers/{id}`` shows a supervisor (by id, or by name: a drained one that restarted
keeps its name) with its attempts in flight and the order kept for it. Its forms post to
``POST /workers/action`` (the worker and the action in form fields: an id holds colons, a
name any text); the API is ``POST /api/workers/{id}/drain|evict|resume`` (body
``{"exit": true}`` for a drain that exits). Each is a write: behind the token and the CSRF
token, confirmed in the browser, audited as ``worker-drain``, ``worker-evict`` or
``worker-resume``, and made by :mod:`atlantis.store.orders`, as ``tide worker`` makes it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import psycopg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from atlantis.console.actions import handle, record_audit, recorded_by
from atlantis.console.auth import CSRF_FIELD, Principal
from atlantis.console.common import ApiError, db_of, json, json_body, require_write, text_param
from atlantis.console.pages import page, render
from atlantis.presentation import worker_document
from atlantis.store import fleet, orders
from atlantis.store.orders import StandingOrder, WorkerOrderError

ACTIONS = ("drain", "evict", "resume")


async def act(request: Request, who: Principal, worker: str, action: str,
              exit_when_drained: bool = False) -> dict[str, Any]:
    """Order (or resume) the supervisor ``worker``; audited whether done or refused."""
    if not text_param(worker, "worker"):
        raise ApiError(400, "worker: missing")
    if action not in ACTIONS:
        raise ApiError(404, "no such action: drain, evict or resume")
    by = recorded_by(who)

    def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        if action == "resume":
            name = orders.resume(conn, worker, by=by)
            return {"worker": worker, "name": name, "resumed": name is not None}
        w = orders.order(conn, worker, action, exit_when_drained=exit_when_drained, by=by)
        return {"id": w.id, "name": w.name, "order": action, "exit": exit_when_drained,
                "silent": w.silent, "in_flight": w.in_flight}

    try:
        done = await db_of(request).run(run)
    except WorkerOrderError as exc:
        await record_audit(request, who, f"worker-{action}", worker, f"refused: {exc}")
        raise ApiError(404, str(exc)) from None
    outcome = "unchanged" if action == "resume" and not done["resumed"] else "done"
    await record_audit(request, who, f"worker-{action}", worker, outcome,
                       {"exit": True} if exit_when_drained else None)
    return done


@handle
async def worker_api(request: Request) -> Response:
    who = require_write(request)
    action = request.url.path.rsplit("/", 1)[-1]
    body = await json_body(request) if action != "resume" else {}
    exit_when_drained = body.get("exit", False)
    if type(exit_when_drained) is not bool:
        raise ApiError(400, "exit: true or false")
    return json(await act(request, who, request.path_params["worker"], action,
                          exit_when_drained))


@page
async def worker_page(request: Request, who: Principal) -> Response:
    wanted = request.path_params["worker"]

    def read(conn: psycopg.Connection[Any]) -> tuple[list[fleet.WorkerRow], list[StandingOrder]]:
        return fleet.list_workers(conn), orders.standing_orders(conn)

    rows, standing = await db_of(request).run(read)
    found = next((w for w in rows if w.id == wanted), None) or next(
        (w for w in reversed(rows) if w.name == wanted), None)
    name = found.name if found is not None else wanted
    order = next((o for o in standing if o.name == name), None)
    if found is None and order is None:
        raise ApiError(404, f"no supervisor {wanted}")
    return render(request, "worker.html", who=who, worker=found, order=order, worker_name=name,
                  doc=worker_document(found) if found is not None else None)


@page
async def worker_action(request: Request, who: Principal) -> Response:
    """``POST /workers/action``: fields ``worker`` (an id or a name), ``action`` (drain,
    evict, resume) and ``exit`` (``yes``: a drain that exits)."""
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    writer = require_write(request, form.get(CSRF_FIELD, ""))
    worker = form.get("worker", "")
    await act(request, writer, worker, form.get("action", ""), form.get("exit") == "yes")
    return RedirectResponse("/workers/" + quote(worker, safe=""), 303)


# A worker's id or name runs up to the last "/drain", "/evict" or "/resume".
api_routes = [Route(f"/workers/{{worker:path}}/{action}", worker_api, methods=["POST"])
              for action in ACTIONS]

# Before the pages' routes: "/workers/action" is not a worker's page.
page_routes = [Route("/workers/action", worker_action, methods=["POST"]),
               Route("/workers/{worker:path}", worker_page)]
