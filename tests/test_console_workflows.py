"""Workflows in the console: the API, the pages, the actions behind the token (audited),
and the live stream of a workflow's steps from a real console process and a real
supervisor. The workflows are the console test app's (tests/apps/console_app.atl)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

pytest.importorskip("starlette")

from tests.test_console_api import (
    BEARER,
    SECRET,
    Client,
    Console,
    client,
    console_server,
    read_events,
)
from tests.test_tide_workflow import APP, owes_its_undo, start, wait_workflow

__all__ = ["client", "console_server"]  # fixtures used here


def test_api_lists_and_shows_workflows(db: psycopg.Connection[Any], db_url: str,
                                       client: Client) -> None:
    first = start(db_url, "console.Diamond", account_id="acme")
    second = start(db_url, "console.Doomed", account_id="beta", message="boom")
    c = client(redact=("account_id",))
    listed = c.get("/api/workflows").json()
    assert [w["id"] for w in listed["workflows"]] == [second, first]
    assert listed["workflows"][0]["args"]["account_id"] != "beta"  # redacted
    assert listed["next_before"] is None
    page = c.get("/api/workflows?limit=1").json()
    assert [w["id"] for w in page["workflows"]] == [second] and page["next_before"] == second
    older = c.get(f"/api/workflows?limit=1&before={second}").json()
    assert [w["id"] for w in older["workflows"]] == [first]
    assert c.get("/api/workflows?state=complete").json()["workflows"] == []
    assert c.get("/api/workflows?state=bogus").status_code == 400

    doc = c.get(f"/api/workflows/{first}").json()
    assert (doc["id"], doc["workflow"], doc["state"]) == (first, "console.Diamond", "running")
    assert [s["step"] for s in doc["steps"]] == ["first", "right", "left", "last"]
    assert doc["now"] and doc["args"]["account_id"] != "acme"
    for r in (c.get("/api/workflows/999999"), c.get("/api/workflows/nope"),
              c.get("/api/workflows/999999/stream"),
              c.post("/api/workflows/999999/cancel", headers=BEARER)):
        assert r.status_code in (403, 404) and "error" in r.json()
    assert c.get("/api/workflows/999999").json() == {"error": "no workflow with id 999999"}

    html = c.get(f"/workflows/{first}").text
    assert "Compensation trail" in html and "└─ right" in html and "waiting" in html
    assert 'data-live="workflow"' in html
    listing = c.get("/workflows").text
    assert f'href="/workflows/{first}"' in listing and 'href="/workflows"' in listing
    step_row = doc["steps"][0]["job_id"]
    job_page = c.get(f"/jobs/{step_row}").text
    assert f'href="/workflows/{first}"' in job_page and "step first" in job_page
    assert c.get("/workflows/999999").status_code == 404


def test_cancel_and_retry_need_the_token_and_are_audited(db: psycopg.Connection[Any],
                                                         db_url: str, client: Client) -> None:
    workflow_id = start(db_url, "console.Doomed", account_id="acme", message="boom")
    read_only = client()
    assert read_only.post(f"/api/workflows/{workflow_id}/cancel").status_code == 403
    c = client(token=True)
    assert c.post(f"/api/workflows/{workflow_id}/cancel").status_code == 403
    assert c.post(f"/api/workflows/{workflow_id}/cancel",
                  headers={"Authorization": "Bearer nope"}).status_code == 401
    assert c.get(f"/api/workflows/{workflow_id}").json()["state"] == "running"
    page = c.get(f"/workflows/{workflow_id}", headers=BEARER).text
    assert f'action="/workflows/{workflow_id}/cancel"' in page

    r = c.post(f"/api/workflows/{workflow_id}/cancel", headers=BEARER)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": workflow_id, "state": "cancelled"}
    again = c.post(f"/api/workflows/{workflow_id}/cancel", headers=BEARER)
    assert again.status_code == 409 and "nothing to cancel" in again.json()["error"]
    retry = c.post(f"/api/workflows/{workflow_id}/retry", headers=BEARER)
    assert retry.status_code == 409 and "compensation_failed" in retry.json()["error"]
    step_row = c.get(f"/api/workflows/{workflow_id}").json()["steps"][0]["job_id"]
    refused = c.post(f"/api/jobs/{step_row}/retry", headers=BEARER)
    assert refused.status_code == 409
    assert f"use tide workflow retry {workflow_id}" in refused.json()["error"]
    rows = db.execute("SELECT action, target, label, outcome FROM atlantis.console_audit "
                      "ORDER BY id").fetchall()
    assert [(a, t, lbl) for a, t, lbl, _ in rows] == [
        ("workflow-cancel", str(workflow_id), "ops-team"),
        ("workflow-cancel", str(workflow_id), "ops-team"),
        ("workflow-retry", str(workflow_id), "ops-team"),
        ("retry", str(step_row), "ops-team")]
    assert rows[0][3] == "cancelled" and all(r[3].startswith("refused") for r in rows[1:])
    by = db.execute("SELECT cancelled_by FROM atlantis.workflows WHERE id = %s",
                    (workflow_id,)).fetchone()
    assert by == ("console:ops-team",)


def test_dismiss_needs_the_token_and_csrf_is_audited_and_frees_the_key(
        db: psycopg.Connection[Any], db_url: str, client: Client) -> None:
    first = owes_its_undo(db, db_url, "acme")
    read_only = client()
    assert read_only.post(f"/api/workflows/{first}/dismiss").status_code == 403
    c = client(token=True, private=True)
    assert c.post(f"/api/workflows/{first}/dismiss").status_code == 403
    assert c.post(f"/api/workflows/{first}/dismiss",
                  headers={"Authorization": "Bearer nope"}).status_code == 401
    running = start(db_url, "console.Doomed", account_id="beta", message="boom")
    r = c.post(f"/api/workflows/{running}/dismiss", headers=BEARER)
    assert r.status_code == 409
    assert r.json() == {"error": f"workflow {running} is running: only a compensation_failed "
                                 "workflow can be dismissed"}
    # The page: behind the login cookie and the session's CSRF token.
    assert c.post("/login", data={"token": SECRET, "next": "/workflows"},
                  follow_redirects=False).status_code == 303
    page = c.get(f"/workflows/{first}").text
    assert f'action="/workflows/{first}/dismiss"' in page
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert csrf is not None
    assert c.post(f"/workflows/{first}/dismiss", data={}).status_code == 403
    assert c.get(f"/api/workflows/{first}").json()["dismissed_at"] is None
    r = c.post(f"/workflows/{first}/dismiss", data={"csrf": csrf.group(1)},
               follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/workflows/{first}"
    doc = c.get(f"/api/workflows/{first}").json()
    assert doc["state"] == "compensation_failed" and doc["dismissed_at"] is not None
    assert doc["dismissed_by"] == "console:ops-team"
    page = c.get(f"/workflows/{first}").text
    assert "dismissed by console:ops-team" in page
    assert f'action="/workflows/{first}/dismiss"' not in page
    # The key is free: a new workflow of it starts; retrying the first names it.
    second = start(db_url, "console.BadUndo", account_id="acme", message="again")
    assert second != first
    retry = c.post(f"/api/workflows/{first}/retry", headers=BEARER)
    assert retry.status_code == 409
    assert retry.json()["error"].startswith(
        f'workflow {second} (console.BadUndo) holds the unique key ["acme"] now')
    audit = db.execute("SELECT action, target, outcome FROM atlantis.console_audit"
                       " ORDER BY id").fetchall()
    assert [(a, t) for a, t, _ in audit] == [
        ("workflow-dismiss", str(running)), ("workflow-dismiss", str(first)),
        ("workflow-retry", str(first))]
    assert [o.split(":")[0] for _, _, o in audit] == [
        "refused", "compensation_failed", "refused"]


def test_the_stream_follows_the_steps(db: psycopg.Connection[Any], db_url: str,
                                      supervise: Callable[..., Any],
                                      console_server: Callable[..., Console]) -> None:
    workflow_id = start(db_url, "console.Doomed", account_id="live", message="smtp down")
    con = console_server()

    def settled(seen: list[tuple[str, Any]]) -> bool:
        return any(n == "workflow" and d["state"] == "failed" for n, d in seen)

    with httpx.Client(base_url=con.url, timeout=httpx.Timeout(60.0)) as http, \
            http.stream("GET", f"/api/workflows/{workflow_id}/stream") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        supervise(queues=("console",), app=APP)
        seen = read_events(r, settled)
    docs = [d for n, d in seen if n == "workflow"]
    assert docs[0]["id"] == workflow_id and docs[0]["state"] == "running"
    assert docs[0]["steps"][0]["state"] == "available"
    assert settled(seen), [d["state"] for d in docs]
    assert len(docs) >= 2
    final = docs[-1]
    assert [(s["step"], s["state"], s["compensation"]) for s in final["steps"]] == [
        ("create", "complete", False), ("welcome", "dead", False),
        ("create", "complete", True)]
    wait_workflow(db_url, workflow_id, "failed")
