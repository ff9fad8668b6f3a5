"""The console's JSON API and pages, without a browser: Starlette's TestClient on the app,
and a real ``python -m atlantis.console`` on 127.0.0.1 for the event streams. Real
PostgreSQL, real supervisors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import warnings

import httpx

with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import atlantis
from atlantis.console.app import create_app
from atlantis.console.settings import Settings, Token
from tests.conftest import ROOT, stop_process, wait_for, wait_state
from tests.docs import bad_input_text

APP = "tests.apps.console_app:registry"
SECRET = "s3cret-token"
BEARER = {"Authorization": f"Bearer {SECRET}"}

Client = Callable[..., TestClient]


@pytest.fixture
def client(db_url: str) -> Iterator[Client]:
    opened: list[TestClient] = []

    def make(*, token: bool = False, private: bool = False,
             redact: tuple[str, ...] = ()) -> TestClient:
        settings = Settings(db_url, token=Token("ops-team", SECRET) if token else None,
                            private=private, redact=frozenset(redact), poll_interval=0.5,
                            log_interval=0.2, debounce=0.05)
        tc = TestClient(create_app(settings), base_url="http://127.0.0.1")
        tc.__enter__()
        opened.append(tc)
        return tc

    yield make
    for tc in opened:
        tc.__exit__(None, None, None)


def enqueue(conn: psycopg.Connection[Any], name: str, **args: Any) -> int:
    return atlantis.enqueue(conn, name, args)


def test_read_only_without_token(db: psycopg.Connection[Any], client: Client) -> None:
    job_id = enqueue(db, "console.Import", account_id="acme")
    c = client()
    r = c.get("/api/jobs")
    assert r.status_code == 200
    assert [j["id"] for j in r.json()["jobs"]] == [job_id]
    assert c.post(f"/api/jobs/{job_id}/cancel").status_code == 403
    assert c.post(f"/api/jobs/{job_id}/cancel", headers=BEARER).status_code == 403
    assert c.delete(f"/api/jobs/{job_id}").status_code == 403
    assert c.post("/api/queues/console/pause").status_code == 403
    page = c.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert "data-action" not in page.text  # no write button at all
    assert wait_state(db, job_id, "available")["state"] == "available"
    assert r.headers["content-type"].startswith("application/json")
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_writes_with_bearer_token_are_audited(db: psycopg.Connection[Any], client: Client) -> None:
    job_id = enqueue(db, "console.Import", account_id="acme")
    c = client(token=True)
    assert c.post(f"/api/jobs/{job_id}/cancel").status_code == 403
    bad = c.post(f"/api/jobs/{job_id}/cancel", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "error" in bad.json()
    r = c.post(f"/api/jobs/{job_id}/cancel", headers=BEARER)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": job_id, "state": "cancelled"}
    assert c.post(f"/api/jobs/{job_id}/cancel", headers=BEARER).status_code == 409
    r = c.post(f"/api/jobs/{job_id}/retry", headers=BEARER)
    assert r.json() == {"id": job_id, "state": "available"}
    assert c.delete(f"/api/jobs/{job_id}", headers=BEARER).status_code == 409
    assert c.post("/api/queues/console/pause", headers=BEARER,
                  json={"reason": "upstream down"}).json() == {
        "queue": "console", "paused": True, "changed": True}
    queues = {q["queue"]: q for q in c.get("/api/queues").json()["queues"]}
    assert queues["console"]["paused"] and queues["console"]["paused_reason"] == "upstream down"
    assert len(queues["console"]["per_minute"]) == 60
    assert c.post("/api/queues/console/resume", headers=BEARER).json()["changed"] is True
    rows = db.execute("SELECT action, target, label, client, outcome FROM atlantis.console_audit "
                      "ORDER BY id").fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("cancel", str(job_id), "ops-team"), ("cancel", str(job_id), "ops-team"),
        ("retry", str(job_id), "ops-team"), ("delete", str(job_id), "ops-team"),
        ("pause", "console", "ops-team"), ("resume", "console", "ops-team")]
    assert rows[0][4] == "cancelled" and rows[1][4].startswith("refused")
    assert all(r[3] for r in rows)
    by = db.execute("SELECT retried_by FROM atlantis.jobs WHERE id = %s", (job_id,)).fetchone()
    assert by == ("console:ops-team",)


def test_errors_are_json(db: psycopg.Connection[Any], client: Client) -> None:
    c = client(token=True)
    for r in (c.get("/api/jobs/999999"), c.get("/api/jobs/999999/logs"),
              c.post("/api/jobs/999999/cancel", headers=BEARER), c.get("/api/nothing")):
        assert r.status_code == 404 and "error" in r.json()
    assert c.get("/api/jobs?state=bogus").status_code == 400
    assert c.get("/api/jobs?args=nocolon").status_code == 400
    assert c.get("/jobs/999999").status_code == 404


def test_filters_and_keyset_paging(db: psycopg.Connection[Any], client: Client) -> None:
    ids = [enqueue(db, "console.Import", account_id=f"a{i % 3}", steps=i + 1) for i in range(9)]
    c = client()
    got = c.get("/api/jobs?args=account_id:a1").json()["jobs"]
    assert [j["id"] for j in got] == [ids[7], ids[4], ids[1]]
    got = c.get('/api/jobs', params={"args": '{"account_id": "a2", "steps": 9}'}).json()["jobs"]
    assert [j["id"] for j in got] == [ids[8]]
    assert c.get("/api/jobs?args=steps:3").json()["jobs"][0]["id"] == ids[2]
    assert c.get("/api/jobs?job=console.Quick").json()["jobs"] == []
    assert len(c.get("/api/jobs?queue=console&state=available").json()["jobs"]) == 9
    seen: list[int] = []
    url = "/api/jobs?limit=4"
    while True:
        page = c.get(url).json()
        seen += [j["id"] for j in page["jobs"]]
        if page["next_before"] is None:
            break
        url = f"/api/jobs?limit=4&before={page['next_before']}"
    assert seen == sorted(ids, reverse=True)
    html = c.get("/jobs?args=account_id:a1").text
    assert f'href="/jobs/{ids[7]}"' in html and f'href="/jobs/{ids[0]}"' not in html


def test_a_filter_no_index_serves_searches_a_window_of_ids_a_page(
    db: psycopg.Connection[Any], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a big table an args or job filter must not scan every row per page: it searches
    SCAN_WINDOW ids, and an emptier page says where to go on, until every match was seen."""
    from atlantis.store import console_queries as store

    monkeypatch.setattr(store, "SCAN_WINDOW", 4)
    ids = [enqueue(db, "console.Import", account_id="w" if i in (0, 1, 6) else "x")
           for i in range(10)]
    c = client()
    seen: list[int] = []
    url = "/api/jobs?args=account_id:w"
    for _ in range(10):
        page = c.get(url).json()
        seen += [j["id"] for j in page["jobs"]]
        assert page["searched_from"] is not None
        if page["next_before"] is None:
            break
        url = f"/api/jobs?args=account_id:w&before={page['next_before']}"
    assert seen == [ids[6], ids[1], ids[0]]
    first = c.get("/api/jobs?args=account_id:w").json()
    assert first["searched_from"] == ids[-1] + 1 - 4 and first["next_before"] is not None
    html = c.get("/jobs?args=account_id:w").text
    assert f"Searched jobs down to id {ids[-1] + 1 - 4}" in html and "Older jobs" in html
    assert c.get("/api/jobs?state=available").json()["searched_from"] is None


def test_bulk_dry_run_then_act(db: psycopg.Connection[Any], client: Client) -> None:
    ids = [enqueue(db, "console.Import", account_id="bulk") for _ in range(3)]
    other = enqueue(db, "console.Import", account_id="keep")
    c = client(token=True)
    body = {"action": "cancel", "filter": {"args": {"account_id": "bulk"}}, "dry_run": True}
    r = c.post("/api/jobs/bulk", json=body)  # a dry run changes nothing: no token needed
    assert r.status_code == 200 and r.json()["count"] == 3 and r.json()["dry_run"] is True
    assert c.post("/api/jobs/bulk", json={**body, "dry_run": False}).status_code == 403
    r = c.post("/api/jobs/bulk", json={**body, "dry_run": False}, headers=BEARER)
    assert r.json()["done"] == 3
    states = dict(db.execute("SELECT id, state FROM atlantis.jobs").fetchall())
    assert [states[i] for i in ids] == ["cancelled"] * 3 and states[other] == "available"
    r = c.post("/api/jobs/bulk", headers=BEARER,
               json={"action": "delete", "ids": [*ids, other], "dry_run": True})
    assert r.json()["count"] == 3
    r = c.post("/api/jobs/bulk", headers=BEARER, json={"action": "delete", "ids": [*ids, other]})
    assert r.json()["done"] == 3
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (1,)
    audit = db.execute("SELECT action, outcome FROM atlantis.console_audit ORDER BY id").fetchall()
    assert audit == [("bulk-cancel", "3 done, 0 skipped"), ("bulk-delete", "3 done, 0 skipped")]
    assert c.post("/api/jobs/bulk", json={"action": "explode", "ids": []},
                  headers=BEARER).status_code == 400


def test_private_login_cookie_and_csrf(db: psycopg.Connection[Any], client: Client) -> None:
    job_id = enqueue(db, "console.Import", account_id="acme")
    c = client(token=True, private=True)
    assert c.get("/api/jobs").status_code == 401
    assert c.get(f"/api/jobs/{job_id}/stream").status_code == 401
    r = c.get("/jobs", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    assert c.get("/api/jobs", headers=BEARER).status_code == 200
    assert c.post("/login", data={"token": "wrong", "next": "/jobs"}).status_code == 403
    r = c.post("/login", data={"token": SECRET, "next": "/jobs"}, follow_redirects=False)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = c.get(f"/jobs/{job_id}")
    assert page.status_code == 200 and 'data-action="cancel"' in page.text
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert csrf is not None
    # The cookie alone is not enough: a write needs the session's CSRF token too.
    assert c.post(f"/jobs/{job_id}/cancel", data={}).status_code == 403
    assert c.post(f"/api/jobs/{job_id}/cancel").status_code == 403
    r = c.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf.group(1)}, follow_redirects=False)
    assert r.status_code == 303
    assert wait_state(db, job_id, "cancelled")["cancelled_by"] == "console:ops-team"


def test_a_non_ascii_cookie_or_csrf_token_is_refused_not_a_500(
        db: psycopg.Connection[Any], client: Client) -> None:
    """A cookie any other app on 127.0.0.1 can set, and a CSRF token a client sends, may hold
    any byte: a bad cookie is anonymous, a bad CSRF token a 403, never a traceback."""
    job_id = enqueue(db, "console.Import", account_id="acme")
    bad_cookie = {"Cookie": b"atlantis_console=abc.\xe9\xe9"}
    open_console = client(token=True)
    assert open_console.get("/api/jobs", headers=bad_cookie).status_code == 200
    assert open_console.get("/jobs", headers=bad_cookie).status_code == 200
    assert open_console.post(f"/api/jobs/{job_id}/cancel",
                             headers=bad_cookie).status_code == 403
    c = client(token=True, private=True)
    assert c.get("/api/jobs", headers=bad_cookie).status_code == 401
    r = c.get("/jobs", headers=bad_cookie, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    r = c.post("/login", data={"token": "s\u00e9cret", "next": "/jobs"})
    assert r.status_code == 403
    r = c.post("/login", data={"token": SECRET, "next": "/jobs"}, follow_redirects=False)
    assert r.status_code == 303
    assert c.get(f"/jobs/{job_id}").status_code == 200
    assert c.post(f"/api/jobs/{job_id}/cancel",
                  headers={"X-CSRF-Token": b"\xe9\xe9"}).status_code == 403
    assert c.post(f"/jobs/{job_id}/cancel", data={"csrf": "\u00e9\u00e9"}).status_code == 403
    assert db.execute("SELECT state FROM atlantis.jobs WHERE id = %s",
                      (job_id,)).fetchone() == ("available",)


def test_args_redact_and_escaping(db: psycopg.Connection[Any], client: Client,
                                  supervise: Callable[..., Any]) -> None:
    job_id = enqueue(db, "console.Import", account_id="acme", secret="hunter2",
                     message="<script>alert(1)</script>", steps=400)
    supervise(queues=("console",), app=APP)
    c = client(redact=("secret",))
    wait_for(lambda: (c.get(f"/api/jobs/{job_id}").json().get("progress_pct") or 0) > 0,
             message="a checkpoint")
    doc = c.get(f"/api/jobs/{job_id}").json()
    assert doc["args"]["secret"] == "[redacted]" and doc["args"]["account_id"] == "acme"
    assert doc["progress_msg"].startswith("<script>")
    assert {"rate", "eta_seconds", "stalled", "holder", "lease_expires_in"} <= set(doc)
    page = c.get(f"/jobs/{job_id}").text
    assert "hunter2" not in page and "hunter2" not in c.get("/api/jobs").text
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in c.get("/jobs").text
    assert c.get("/api/jobs?args=secret:hunter2").status_code == 400
    logs = c.get(f"/api/jobs/{job_id}/logs")
    wait_for(lambda: c.get(f"/api/jobs/{job_id}/logs").json()["lines"], message="a log line")
    logs = c.get(f"/api/jobs/{job_id}/logs").json()
    assert logs["lines"][0]["line"].startswith("account acme: imported page")
    more = c.get(f"/api/jobs/{job_id}/logs?after={logs['next_after']}").json()
    assert all(ln["id"] > logs["next_after"] for ln in more["lines"])


def test_dead_letters_grouped_by_fingerprint(db: psycopg.Connection[Any], client: Client,
                                             supervise: Callable[..., Any]) -> None:
    ids = [enqueue(db, "console.Fail", account_id=f"a{i}", message="upstream said 502\nmore")
           for i in range(3)]
    ids.append(enqueue(db, "console.Fail", account_id="z", message="bad row 7"))
    supervise(queues=("console",), app=APP)
    for i in ids:
        wait_state(db, i, "dead")
    c = client()
    groups = c.get("/api/dlq").json()["groups"]
    assert [(g["count"], g["kind"], g["first_line"]) for g in groups] == [
        (3, "exception", "RuntimeError: upstream said 502"), (1, "exception",
                                                              "RuntimeError: bad row 7")]
    assert "upstream said 502" in c.get("/dlq").text


def test_workers_schedules_and_pages_render(db: psycopg.Connection[Any], client: Client,
                                            supervise: Callable[..., Any]) -> None:
    job_id = enqueue(db, "console.Import", account_id="w", steps=2000)
    supervise(queues=("console",), app=APP)
    wait_state(db, job_id, "running")
    c = client()
    workers = wait_for(lambda: c.get("/api/workers").json()["workers"], message="a worker")
    assert "console" in workers[0]["queues"] and "memory" in workers[0]
    assert "schedules" in c.get("/api/schedules").json()
    for path in ("/", "/jobs", "/dlq", "/queues", "/workers", "/schedules", "/audit",
                 f"/jobs/{job_id}", "/login"):
        assert c.get(path).status_code == 200, path


# -- a real server: event streams ---------------------------------------------------------------

class Console:
    def __init__(self, db_url: str, log: Path, *args: str, env: dict[str, str] | None = None):
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atlantis.console", "--database-url", db_url,
             "--host", "127.0.0.1", "--port", "0", *args],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})})
        found = wait_for(lambda: re.search(r"on (http://[^/ ]+)/", self.log()),
                         message="the console to listen")
        self.url: str = found.group(1)

    def log(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@pytest.fixture
def console_server(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Console]]:
    started: list[Console] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Console:
        con = Console(db_url, tmp_path / f"console-{len(started)}.log", *args, env=env)
        started.append(con)
        return con

    yield start
    for con in started:
        con.stop()


def read_events(response: httpx.Response, want: Callable[[list[tuple[str, Any]]], bool]
                ) -> list[tuple[str, Any]]:
    import json

    seen: list[tuple[str, Any]] = []
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name:
            seen.append((name, json.loads(line[6:])))
            name = None
            if want(seen):
                return seen
    return seen


def test_stream_sends_progress_and_log_lines(db: psycopg.Connection[Any],
                                             supervise: Callable[..., Any],
                                             console_server: Callable[..., Console]) -> None:
    job_id = enqueue(db, "console.Import", account_id="live", steps=400)
    con = console_server()
    supervise(queues=("console",), app=APP)
    wait_state(db, job_id, "running")

    def moved(seen: list[tuple[str, Any]]) -> bool:
        pcts = {d["progress_pct"] for n, d in seen if n == "job" and d["progress_pct"]}
        logs = [d for n, d in seen if n == "log"]
        return len(pcts) >= 3 and len(logs) >= 2

    with httpx.Client(base_url=con.url, timeout=httpx.Timeout(60.0)) as http, \
            http.stream("GET", f"/api/jobs/{job_id}/stream") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        seen = read_events(r, moved)
    assert moved(seen)
    job_docs = [d for n, d in seen if n == "job"]
    assert job_docs[0]["id"] == job_id and "eta_seconds" in job_docs[0]
    lines = [ln for n, d in seen if n == "log" for ln in d]
    assert all("imported page" in ln["line"] for ln in lines)
    assert [ln["id"] for ln in lines] == sorted({ln["id"] for ln in lines})


def test_list_pages_hear_refreshes(db: psycopg.Connection[Any],
                                   console_server: Callable[..., Console]) -> None:
    con = console_server()
    with httpx.Client(base_url=con.url, timeout=httpx.Timeout(60.0)) as http, \
            http.stream("GET", "/api/events") as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("retry:")
        enqueue(db, "console.Quick", account_id="x")
        for line in lines:
            if line == "event: refresh":
                break


def test_console_refuses_foreign_host_headers(console_server: Callable[..., Console]) -> None:
    con = console_server()
    assert httpx.get(con.url + "/api/jobs").status_code == 200
    assert httpx.get(con.url + "/api/jobs", headers={"Host": "evil.example"}).status_code == 400


def test_without_the_extra_it_says_how_to_install() -> None:
    code = ("import sys; sys.modules['uvicorn'] = None\n"
            "from atlantis.console.command import console\n"
            "console(['--port', '0'], prog_name='tide console')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 2
    assert "pip install 'atlantis-jobs[console]'" in r.stderr


# ---- queue names, bad parameters, the bound host -------------------------------------------

def _paused(conn: psycopg.Connection[Any]) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM atlantis.queues WHERE paused")}


def test_any_queue_name_can_be_paused_and_a_button_acts_only_on_its_row(
        db: psycopg.Connection[Any], client: Client) -> None:
    from urllib.parse import quote, unquote

    names = ["reports/daily", "../queues/bh", "bh", "50% off & more?", "..", "a/pause"]
    for name in names:
        atlantis.enqueue(db, "console.Quick", {"account_id": "x"}, queue=name)
    c = client(token=True)
    # The API: the name percent-encoded in the path, a "/" as %2F.
    for name in ("reports/daily", "../queues/bh", "50% off & more?", "a/pause"):
        r = c.post(f"/api/queues/{quote(name, safe='')}/pause", headers=BEARER)
        assert r.json() == {"queue": name, "paused": True, "changed": True}, (name, r.text)
        assert _paused(db) == {name}
        r = c.post(f"/api/queues/{quote(name, safe='')}/resume", headers=BEARER)
        assert r.json() == {"queue": name, "paused": False, "changed": True}, (name, r.text)
    assert c.post("/api/queues/bh/pause", headers=BEARER).json()["queue"] == "bh"
    assert c.post("/api/queues/bh/resume", headers=BEARER).json()["changed"] is True

    # The page: each row's form names its own queue, and pausing it pauses that one only.
    page = c.get("/queues", headers=BEARER).text
    rows = re.findall(r'<a href="/jobs\?queue=([^"]*)">.*?</a>.*?action="/queues/(pause|resume)"'
                      r'.*?name="queue" value="([^"]*)"', page, re.S)
    assert set(names) <= {unquote(link) for link, _, _ in rows}
    for link, action, value in rows:
        assert (action, value) == ("pause", link)
    for name in names:
        r = c.post("/queues/pause", headers=BEARER, follow_redirects=False,
                   data={"queue": quote(name), "reason": "test"})
        assert r.status_code == 303, (name, r.text)
        assert _paused(db) == {name}, name
        r = c.post("/queues/resume", headers=BEARER, follow_redirects=False,
                   data={"queue": quote(name)})
        assert r.status_code == 303 and _paused(db) == set(), name
    # The path form of the pages still works for plain names.
    assert c.post("/queues/bh/pause", headers=BEARER, follow_redirects=False).status_code == 303
    assert _paused(db) == {"bh"}
    assert c.post("/queues/pause", headers=BEARER).status_code == 400


#: (method, path, JSON body or None): (status, the error's exact text)
BAD_PARAMETERS: dict[str, tuple[str, str, Any, int, str]] = {
    "before-out-of-range": ("GET", "/api/jobs?before=99999999999999999999", None, 400,
                            "before: out of range (at most 9223372036854775807)"),
    "after-out-of-range": ("GET", "/api/jobs/{job}/logs?after=99999999999999999999", None, 400,
                           "after: out of range (at most 9223372036854775807)"),
    "attempt-out-of-range": ("GET", "/api/jobs/{job}/logs?attempt=2147483648", None, 400,
                             "attempt: out of range (at most 2147483647)"),
    "audit-before-out-of-range": ("GET", "/api/audit?before=-99999999999999999999", None, 400,
                                  "before: out of range (at most 9223372036854775807)"),
    "job-id-out-of-range": ("GET", "/api/jobs/99999999999999999999", None, 404,
                            "no job with id 99999999999999999999"),
    "nul-in-args-json": ("GET", "/api/jobs?args=%7B%22a%22%3A%22%5Cu0000%22%7D", None, 400,
                         "args: contains a NUL character (\\u0000), which PostgreSQL cannot "
                         "store"),
    "nul-in-args-pairs": ("GET", "/api/jobs?args=a:%00", None, 400,
                          "args: contains a NUL character (\\u0000), which PostgreSQL cannot "
                          "store"),
    "nul-in-queue": ("GET", "/api/jobs?queue=a%00b", None, 400,
                     "queue: contains a NUL character (\\u0000), which PostgreSQL cannot store"),
    "nul-in-dlq-queue": ("GET", "/api/dlq?queue=%00", None, 400,
                         "queue: contains a NUL character (\\u0000), which PostgreSQL cannot "
                         "store"),
    "bool-ids": ("POST", "/api/jobs/bulk", {"action": "cancel", "ids": [True]}, 400,
                 "ids: a list of integers (job ids)"),
    "huge-ids": ("POST", "/api/jobs/bulk", {"action": "cancel", "ids": [2**63]}, 400,
                 "ids: a list of integers (job ids)"),
    "list-action": ("POST", "/api/jobs/bulk", {"action": ["retry"], "ids": [1]}, 400,
                    "action: one of retry, cancel, delete"),
    "number-queue-filter": ("POST", "/api/jobs/bulk",
                            {"action": "cancel", "dry_run": True, "filter": {"queue": 5}}, 400,
                            "queue: a string"),
    "list-args-filter": ("POST", "/api/jobs/bulk",
                         {"action": "cancel", "dry_run": True, "filter": {"args": [1]}}, 400,
                         "args: expected key:value[,key:value...] or a JSON object"),
    "nul-in-args-filter": ("POST", "/api/jobs/bulk",
                           {"action": "cancel", "filter": {"args": {"a": "\u0000"}}}, 400,
                           "args: contains a NUL character (\\u0000), which PostgreSQL cannot "
                           "store"),
    "nul-in-reason": ("POST", "/api/queues/console/pause", {"reason": "a\u0000"}, 400,
                      "reason: contains a NUL character (\\u0000), which PostgreSQL cannot "
                      "store"),
    "empty-queue-name": ("POST", "/api/queues//pause", None, 400, "queue: missing"),
    "nul-in-queue-name": ("POST", "/api/queues/a%00b/pause", None, 400,
                          "queue: contains a NUL character (\\u0000), which PostgreSQL cannot "
                          "store"),
}


@pytest.mark.parametrize("case", list(BAD_PARAMETERS))
def test_bad_parameters_are_json_4xx_not_500(db: psycopg.Connection[Any], client: Client,
                                             case: str) -> None:
    method, path, body, status, message = BAD_PARAMETERS[case]
    job_id = enqueue(db, "console.Import", account_id="acme")
    c = client(token=True)
    r = c.request(method, path.format(job=job_id), headers=BEARER,
                  json=body if body is not None else None)
    assert r.headers["content-type"].startswith("application/json"), r.text
    assert (r.status_code, r.json()) == (status, {"error": message})
    # The pages answer the same refusals with an error page, never a 500.
    if method == "GET" and path.startswith("/api/jobs?"):
        page = c.get(path.removeprefix("/api"))
        assert page.status_code == status and "text/html" in page.headers["content-type"]
    assert db.execute("SELECT state FROM atlantis.jobs WHERE id = %s",
                      (job_id,)).fetchone() == ("available",)
    assert db.execute("SELECT count(*) FROM atlantis.queues WHERE paused").fetchone() == (0,)


def test_a_console_bound_to_another_loopback_address_answers_it(
        console_server: Callable[..., Console]) -> None:
    con = console_server("--host", "127.0.0.2")
    assert con.url.startswith("http://127.0.0.2:")
    r = httpx.get(con.url + "/api/jobs")  # Host: 127.0.0.2:PORT
    assert r.status_code == 200, r.text
    assert httpx.get(con.url + "/queues").status_code == 200
    # DNS rebinding is still refused: a name that is not the bound address nor loopback.
    assert httpx.get(con.url + "/api/jobs", headers={"Host": "evil.example"}).status_code == 400
    assert httpx.get(con.url + "/api/jobs",
                     headers={"Host": "127.0.0.2.evil.example"}).status_code == 400


def test_the_bad_input_table_quotes_these_messages() -> None:
    text = bad_input_text()
    for case, (*_, status, message) in BAD_PARAMETERS.items():
        assert f"| {status}, `{message}` | `tests/test_console_api.py::" \
               f"test_bad_parameters_are_json_4xx_not_500[{case}]` |" in text, case
