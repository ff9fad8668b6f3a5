"""Queue concurrency limits in the console: ``POST /api/queues/{name}/limit`` and the queues
page's form ``POST /queues/limit``.

Setting or removing a limit is a write: behind the token and the CSRF token, audited as
``limit`` (the detail holds the new and the previous limit), and made by
:func:`atlantis.operations.set_queue_limit`, the SQL function every path shares. What the
limits hold is read with the queues (``concurrency_limit``, ``limited_running``, ``held`` in
each queue's document) and with a job (``held``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import psycopg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from atlantis import operations
from atlantis.console.actions import handle, record_audit, recorded_by
from atlantis.console.auth import CSRF_FIELD, Principal
from atlantis.console.common import (
    INT_MAX,
    ApiError,
    db_of,
    json,
    json_body,
    require_write,
    text_param,
)
from atlantis.console.pages import page
from atlantis.errors import ValidationError

#: What a body or a form gets wrong about ``concurrency``.
NOT_A_LIMIT = "concurrency: a whole number, 1 or more, or null to remove the limit"


def api_concurrency(body: dict[str, Any]) -> int | None:
    """``concurrency`` of a JSON body: an integer from 1 (not a bool, nor a float), or null."""
    if "concurrency" not in body:
        raise ApiError(400, "concurrency: missing (a whole number, 1 or more, or null to "
                            "remove the limit)")
    value = body["concurrency"]
    if value is None:
        return None
    if type(value) is not int:
        raise ApiError(400, NOT_A_LIMIT)
    return _in_range(value)


def form_concurrency(raw: str) -> int | None:
    """The page form's ``concurrency``: digits, or ``none`` (the Remove button) or nothing."""
    text = raw.strip()
    if text.lower() in ("", "none"):
        return None
    digits = text.removeprefix("-").removeprefix("+")
    if not text.isascii() or not digits.isdigit():
        raise ApiError(400, NOT_A_LIMIT)
    if len(digits.lstrip("0")) > 10:  # past int, and int(str) refuses 4300 digits and more
        raise ApiError(400, f"concurrency: out of range (at most {INT_MAX})")
    return _in_range(int(text))


def _in_range(value: int) -> int:
    if value < 1:
        raise ApiError(400, f"concurrency: at least 1, not {value} (null removes the limit)")
    if value > INT_MAX:
        raise ApiError(400, f"concurrency: out of range (at most {INT_MAX})")
    return value


async def set_limit(request: Request, who: Principal, queue: str,
                    concurrency: int | None) -> dict[str, Any]:
    """Set (None: remove) ``queue``'s concurrency limit, recorded in the audit table."""
    if not text_param(queue, "queue"):
        raise ApiError(400, "queue: missing")
    by = recorded_by(who)

    def run(conn: psycopg.Connection[Any]) -> int | None:
        try:
            return operations.set_queue_limit(conn, queue, concurrency, by=by)
        except ValidationError as exc:
            raise ApiError(400, str(exc)) from None

    was = await db_of(request).run(run)
    await record_audit(request, who, "limit", queue,
                       "unchanged" if was == concurrency else "changed",
                       {"concurrency": concurrency, "was": was})
    return {"queue": queue, "concurrency": concurrency, "was": was}


@handle
async def limit_api(request: Request) -> Response:
    who = require_write(request)
    concurrency = api_concurrency(await json_body(request))
    return json(await set_limit(request, who, request.path_params["name"], concurrency))


@page
async def limit_page(request: Request, who: Principal) -> Response:
    """``POST /queues/limit``: the queue percent-encoded in the form field ``queue`` (as the
    pause form sends it), ``concurrency`` a number, or ``none`` to remove the limit."""
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    writer = require_write(request, form.get(CSRF_FIELD, ""))
    if not form.get("queue"):
        raise ApiError(400, "queue: missing")
    try:
        queue = unquote(form["queue"], errors="strict")
    except UnicodeDecodeError:
        raise ApiError(400, "queue: not percent-encoded UTF-8") from None
    await set_limit(request, writer, queue, form_concurrency(form.get("concurrency", "")))
    target = form.get("next") or "/queues"
    return RedirectResponse(target if target.startswith("/") and not target.startswith("//")
                            else "/queues", 303)


# Before the pause and resume routes: a queue name runs up to the last "/limit".
api_routes = [Route("/queues/{name:path}/limit", limit_api, methods=["POST"])]

# Before the pages' "/queues/{action}".
page_routes = [Route("/queues/limit", limit_page, methods=["POST"])]
