"""Workflows in the console: the API under ``/api/workflows`` and the pages ``/workflows``.

A workflow page follows its steps live: its event stream sends the workflow's document
whenever one of its rows changed (the broker reads it once for every viewer), and the page
then reads itself again. Cancel, retry (of a ``compensation_failed`` workflow's dead
compensations) and dismiss (its owed undo given up, its unique key freed) are writes:
behind the token, audited as the job actions are, and made by the SQL functions every path
shares.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import psycopg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

import atlantis
from atlantis.console import api
from atlantis.console.actions import handle, record_audit, recorded_by
from atlantis.console.auth import CSRF_FIELD, Principal
from atlantis.console.common import (
    BIGINT_MAX,
    PAGE_LIMIT,
    ApiError,
    broker_of,
    db_of,
    int_param,
    json,
    require_read,
    require_write,
    settings_of,
    text_param,
)
from atlantis.console.data import dumps, redact, workflow_doc
from atlantis.console.events import workflow_rows
from atlantis.console.pages import page, render
from atlantis.errors import AtlantisError, WorkflowNotFoundError
from atlantis.store.typed_rows import as_dict
from atlantis.store.workflows import (
    COUNT_CAP,
    WORKFLOW_FINISHED,
    WORKFLOW_STATES,
    WorkflowListRow,
    get_workflow,
    list_workflow_rows,
    workflow_counts,
)


def path_workflow_id(request: Request) -> int:
    raw = request.path_params["workflow_id"]
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(404, f"no workflow with id {raw}") from None
    if not -BIGINT_MAX - 1 <= value <= BIGINT_MAX:
        raise ApiError(404, f"no workflow with id {raw}")
    return value


def _listing(request: Request) -> tuple[str | None, int | None, int]:
    params = request.query_params
    state = text_param(params.get("state"), "state") or None
    if state is not None and state not in WORKFLOW_STATES:
        raise ApiError(400, f"state: one of {', '.join(WORKFLOW_STATES)}")
    before = int_param(params.get("before"), "before")
    limit = int_param(params.get("limit"), "limit", default=50, low=1, high=PAGE_LIMIT)
    assert limit is not None
    return state, before, limit


def _list_doc(row: WorkflowListRow, keys: frozenset[str]) -> dict[str, Any]:
    doc = as_dict(row)
    doc["args"] = redact(doc["args"], keys)
    return doc


async def _read_list(request: Request) -> tuple[list[dict[str, Any]], int | None]:
    state, before, limit = _listing(request)
    keys = settings_of(request).redact
    rows = await db_of(request).run(
        lambda conn: list_workflow_rows(conn, state=state, before=before, limit=limit))
    docs = [_list_doc(r, keys) for r in rows]
    return docs, rows[-1].id if len(rows) == limit else None


async def _read_one(request: Request, workflow_id: int) -> dict[str, Any]:
    keys = settings_of(request).redact
    found = await db_of(request).run(lambda conn: get_workflow(conn, workflow_id))
    if found is None:
        raise ApiError(404, f"no workflow with id {workflow_id}")
    return workflow_doc(found, keys)


# -- the API -----------------------------------------------------------------------------

@handle
async def list_api(request: Request) -> Response:
    require_read(request)
    docs, next_before = await _read_list(request)
    return json({"workflows": docs, "next_before": next_before})


@handle
async def get_api(request: Request) -> Response:
    require_read(request)
    return json(await _read_one(request, path_workflow_id(request)))


@handle
async def stream_api(request: Request) -> Response:
    """``event: workflow`` (the workflow's document): first as it is, then on every change
    of its state or of one of its steps' rows."""
    require_read(request)
    workflow_id = path_workflow_id(request)
    keys = settings_of(request).redact
    found = await db_of(request).run(lambda conn: get_workflow(conn, workflow_id))
    if found is None:
        raise ApiError(404, f"no workflow with id {workflow_id}")
    doc = workflow_doc(found, keys)
    broker = broker_of(request)
    sub = broker.subscribe_workflow(workflow_id, workflow_rows(found), doc)
    first = [b"event: workflow\ndata: " + dumps(doc) + b"\n\n"]
    return await api._stream(request, api._drain(request, broker, sub, first))


async def act(request: Request, who: Principal, action: str,
              workflow_id: int) -> dict[str, Any]:
    """Cancel, retry or dismiss a workflow, recorded in the audit table
    (``workflow-cancel``, ``workflow-retry``, ``workflow-dismiss``); a refusal is a 409,
    recorded too."""
    by = recorded_by(who)

    def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        found = get_workflow(conn, workflow_id)
        if found is None:
            raise ApiError(404, f"no workflow with id {workflow_id}")
        state = found.row.state
        try:
            if action == "cancel":
                if state in WORKFLOW_FINISHED:
                    raise ApiError(409, f"workflow {workflow_id} is {state}: nothing to cancel")
                after = atlantis.cancel_workflow(conn, workflow_id, by=by)
            elif action == "dismiss":
                after = atlantis.dismiss_workflow(conn, workflow_id, by=by)
            else:
                after = atlantis.retry_workflow(conn, workflow_id, by=by)
        except WorkflowNotFoundError as exc:  # pruned meanwhile
            raise ApiError(404, str(exc)) from None
        except AtlantisError as exc:
            raise ApiError(409, str(exc)) from None
        return {"id": workflow_id, "state": after}

    try:
        result = await db_of(request).run(run)
    except ApiError as exc:
        if exc.status == 409:
            await record_audit(request, who, f"workflow-{action}", str(workflow_id),
                               f"refused: {exc.message}")
        raise
    await record_audit(request, who, f"workflow-{action}", str(workflow_id),
                       str(result["state"]))
    return result


@handle
async def cancel_api(request: Request) -> Response:
    who = require_write(request)
    return json(await act(request, who, "cancel", path_workflow_id(request)))


@handle
async def retry_api(request: Request) -> Response:
    who = require_write(request)
    return json(await act(request, who, "retry", path_workflow_id(request)))


@handle
async def dismiss_api(request: Request) -> Response:
    who = require_write(request)
    return json(await act(request, who, "dismiss", path_workflow_id(request)))


# -- the pages ---------------------------------------------------------------------------

@page
async def list_page(request: Request, who: Principal) -> Response:
    docs, next_before = await _read_list(request)
    state = request.query_params.get("state", "")
    next_link = None
    if next_before is not None:
        next_link = "/workflows?" + urlencode({**({"state": state} if state else {}),
                                              "before": next_before})
    counts = await db_of(request).run(workflow_counts)
    return render(request, "workflows.html", who=who, workflows=docs, state=state,
                  states=WORKFLOW_STATES, next_link=next_link, counts=counts, cap=COUNT_CAP)


@page
async def detail_page(request: Request, who: Principal) -> Response:
    doc = await _read_one(request, path_workflow_id(request))
    forward = [s for s in doc["steps"] if not s["compensation"]]
    undo = [s for s in doc["steps"] if s["compensation"]]
    depth: dict[str, int] = {}
    for s in forward:
        depth[s["step"]] = 1 + max((depth.get(a, 0) for a in s["after"]), default=-1)
    return render(request, "workflow.html", who=who, flow=doc, forward=forward, undo=undo,
                  depth=depth, finished=doc["state"] in WORKFLOW_FINISHED)


@page
async def action_page(request: Request, who: Principal) -> Response:
    form = await request.form()
    csrf = form.get(CSRF_FIELD)
    writer = require_write(request, csrf if isinstance(csrf, str) else "")
    action = request.path_params["action"]
    if action not in ("cancel", "retry", "dismiss"):
        raise ApiError(404, "no such action")
    workflow_id = path_workflow_id(request)
    await act(request, writer, action, workflow_id)
    return RedirectResponse(f"/workflows/{workflow_id}", 303)


api_routes = [
    Route("/workflows", list_api, methods=["GET"]),
    Route("/workflows/{workflow_id}", get_api, methods=["GET"]),
    Route("/workflows/{workflow_id}/stream", stream_api, methods=["GET"]),
    Route("/workflows/{workflow_id}/cancel", cancel_api, methods=["POST"]),
    Route("/workflows/{workflow_id}/retry", retry_api, methods=["POST"]),
    Route("/workflows/{workflow_id}/dismiss", dismiss_api, methods=["POST"]),
]

page_routes = [
    Route("/workflows", list_page),
    Route("/workflows/{workflow_id}", detail_page),
    Route("/workflows/{workflow_id}/{action}", action_page, methods=["POST"]),
]
