"""The operator's switch of a schedule in the console.

The schedules page's forms post to ``POST /schedules/action`` (fields ``job`` and
``action``, ``disable`` or ``enable``); the API is ``POST /api/schedules/{job}/disable|enable``.
Each is a write: behind the token and the CSRF token, confirmed in the browser, audited as
``schedule-disable`` or ``schedule-enable`` (outcome ``changed``, ``unchanged`` or
``refused: ...``), and made by :func:`atlantis.store.schedules.set_enabled`, as
``tide schedule disable|enable`` makes it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from atlantis.console.actions import handle, record_audit, recorded_by
from atlantis.console.auth import CSRF_FIELD, Principal
from atlantis.console.common import ApiError, db_of, json, require_write, text_param
from atlantis.console.pages import page
from atlantis.store.schedules import ScheduleNotFoundError, set_enabled

ACTIONS = ("disable", "enable")


async def switch(request: Request, who: Principal, job: str, action: str) -> dict[str, Any]:
    """Switch the schedule of ``job`` off or on; audited whether done or refused."""
    if not text_param(job, "job"):
        raise ApiError(400, "job: missing")
    if action not in ACTIONS:
        raise ApiError(404, "no such action: disable or enable")
    enabled = action == "enable"
    by = recorded_by(who)

    def run(conn: psycopg.Connection[Any]) -> bool:
        return set_enabled(conn, job, enabled, by=by)

    try:
        changed = await db_of(request).run(run)
    except ScheduleNotFoundError as exc:
        await record_audit(request, who, f"schedule-{action}", job, f"refused: {exc}")
        raise ApiError(404, str(exc)) from None
    await record_audit(request, who, f"schedule-{action}", job,
                       "changed" if changed else "unchanged")
    return {"job": job, "enabled": enabled, "changed": changed}


@handle
async def schedule_api(request: Request) -> Response:
    who = require_write(request)
    action = request.url.path.rsplit("/", 1)[-1]
    return json(await switch(request, who, request.path_params["job"], action))


@page
async def schedule_action(request: Request, who: Principal) -> Response:
    """``POST /schedules/action``: fields ``job`` and ``action`` (disable, enable)."""
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    writer = require_write(request, form.get(CSRF_FIELD, ""))
    await switch(request, writer, form.get("job", ""), form.get("action", ""))
    return RedirectResponse("/schedules", 303)


# A job's name runs up to the last "/disable" or "/enable".
api_routes = [Route(f"/schedules/{{job:path}}/{action}", schedule_api, methods=["POST"])
              for action in ACTIONS]

page_routes = [Route("/schedules/action", schedule_action, methods=["POST"])]
