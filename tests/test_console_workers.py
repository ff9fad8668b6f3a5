"""The console's page per supervisor and its drain, evict and resume (issue 37): the API
``POST /api/workers/{id}/drain|evict|resume`` and the page's forms ``POST /workers/action``,
behind the console's token (a login cookie also needs its CSRF token), confirmed in the
browser, audited. Starlette's TestClient on the real app, real PostgreSQL, a real
supervisor. ``tide worker``'s side: tests/test_worker_orders.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import warnings

with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from tests.conftest import CONSOLE_BEARER as BEARER
from tests.conftest import CONSOLE_SECRET as SECRET
from tests.conftest import console_audit as audit
from tests.conftest import wait_for


def _worker(db: psycopg.Connection[Any], name: str) -> tuple[str, str] | None:
    row = db.execute("SELECT id, status FROM atlantis.workers WHERE name = %s",
                     (name,)).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def test_drain_and_resume_from_the_api_are_audited(
        db: psycopg.Connection[Any], supervise: Any, console: TestClient,
        tmp_path: Path) -> None:
    supervise("--name", "console-w", "--pause-poll", "0.5s", "--runtime-dir",
              str(tmp_path / "run"))
    worker_id = wait_for(lambda: _worker(db, "console-w"), message="registered")[0]
    # Without the token: refused, nothing ordered.
    assert console.post(f"/api/workers/{worker_id}/drain", json={}).status_code == 403
    r = console.post(f"/api/workers/{worker_id}/drain", headers=BEARER, json={"exit": False})
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "console-w" and r.json()["order"] == "drain"
    wait_for(lambda: _worker(db, "console-w") == (worker_id, "drained"), message="drained")
    assert db.execute("SELECT asked_by FROM atlantis.worker_orders").fetchone() == (
        "console:ops-team",)
    page = console.get("/workers/" + quote(worker_id, safe=""), headers=BEARER).text
    assert 'id="worker-status">drained' in page and 'data-action="resume"' in page
    r = console.post(f"/api/workers/{worker_id}/resume", headers=BEARER)
    assert r.status_code == 200 and r.json()["resumed"] is True, r.text
    wait_for(lambda: _worker(db, "console-w") == (worker_id, "running"), message="running")
    r = console.post("/api/workers/nobody/evict", headers=BEARER, json={})
    assert (r.status_code, r.json()) == (404, {"error": "no supervisor nobody"})
    assert audit(db) == [("worker-drain", worker_id, "ops-team", "done", {}),
                          ("worker-resume", worker_id, "ops-team", "done", {}),
                          ("worker-evict", "nobody", "ops-team",
                           "refused: no supervisor nobody", {})]


def test_the_worker_page_forms_need_the_csrf_token_and_confirm(
        db: psycopg.Connection[Any], supervise: Any, console: TestClient,
        tmp_path: Path) -> None:
    supervise("--name", "form-w", "--pause-poll", "0.5s", "--runtime-dir",
              str(tmp_path / "run"))
    worker_id = wait_for(lambda: _worker(db, "form-w"), message="registered")[0]
    listing = console.get("/workers").text
    assert f'href="/workers/{quote(worker_id, safe="")}"' in listing
    # A read-only visitor sees the page and no forms.
    assert 'data-action="drain"' not in console.get("/workers/form-w").text
    r = console.post("/login", data={"token": SECRET, "next": "/workers/form-w"},
                     follow_redirects=False)
    assert r.status_code == 303
    page = console.get("/workers/form-w").text
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert csrf is not None and 'data-confirm="Evict form-w?' in page
    assert 'data-confirm="Drain form-w?' in page
    fields = {"worker": worker_id, "action": "evict"}
    assert console.post("/workers/action", data=fields).status_code == 403
    r = console.post("/workers/action", follow_redirects=False,
                     data={**fields, "csrf": csrf.group(1)})
    assert r.status_code == 303 and r.headers["location"] == "/workers/" + quote(worker_id,
                                                                                  safe="")
    wait_for(lambda: _worker(db, "form-w") == (worker_id, "drained"), message="drained")
    assert db.execute("SELECT action FROM atlantis.worker_orders").fetchone() == ("evict",)
    assert audit(db) == [("worker-evict", worker_id, "ops-team", "done", {})]
