"""The console shows handler steps (issue 34): ``GET /api/jobs/{id}``, the job's page and its
event stream carry the job's records and what it sleeps for, live, against a real supervisor
running tests/apps/durable.py on real PostgreSQL (the API through Starlette's TestClient,
the stream from a real ``python -m atlantis.console`` on 127.0.0.1). ``tide``'s side:
tests/test_tide_steps.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
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
from atlantis.app import load_app
from atlantis.console.app import create_app
from atlantis.console.settings import Settings
from atlantis.store import sync
from tests.apps.durable import EFFECTS_DDL
from tests.conftest import job_row, wait_for
from tests.test_console_api import Console, read_events

APP = "tests.apps.durable:registry"
QUEUES = ("durable",)


@pytest.fixture
def ddb(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's database with the durable app's declarations and its effects table."""
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    db.execute(EFFECTS_DDL)
    db.commit()
    return db


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    settings = Settings(db_url, poll_interval=0.5, log_interval=0.2, debounce=0.05)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as tc:
        yield tc


@pytest.fixture
def console_server(db_url: str, tmp_path: Path) -> Iterator[Callable[[], Console]]:
    started: list[Console] = []

    def start() -> Console:
        con = Console(db_url, tmp_path / f"console-{len(started)}.log")
        started.append(con)
        return con

    yield start
    for con in started:
        con.stop()


def _start(supervise: Any) -> Any:
    return supervise(queues=QUEUES, app=APP, concurrency=2)


def _nap(db: psycopg.Connection[Any], key: str, seconds: float) -> int:
    return atlantis.enqueue(db, "durable.Nap", {"key": key, "seconds": seconds})


def _asleep(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    row = job_row(db, job_id)
    return row if row["state"] == "available" and row["suspended_for"] else None


def test_the_job_api_and_page_carry_the_steps_and_the_sleep(
        ddb: psycopg.Connection[Any], supervise: Any, client: TestClient) -> None:
    _start(supervise)
    job_id = _nap(ddb, "console-nap", 600)
    row = wait_for(lambda: _asleep(ddb, job_id), message="the job to sleep")
    doc = client.get(f"/api/jobs/{job_id}").json()
    assert doc["suspended_for"] == "sleep:nap"
    assert datetime.fromisoformat(doc["suspended_until"]) == row["run_at"]
    assert doc["handler_steps"]["records"] == 2
    assert [(s["name"], s["kind"]) for s in doc["handler_steps"]["last"]] == [
        ("before", "step"), ("nap", "sleep")]
    assert [a["outcome"] for a in doc["attempts"]] == ["suspend"]
    # A listing does not read every job's steps.
    listed = client.get("/api/jobs").json()["jobs"]
    assert [j["id"] for j in listed] == [job_id] and "handler_steps" not in listed[0]

    page = client.get(f"/jobs/{job_id}").text
    asleep = re.search(r'<p id="asleep"( hidden)?>(.*?)</p>', page, re.S)
    assert asleep and asleep.group(1) is None, page
    assert "in handler step nap" in asleep.group(2)
    assert f"{row['run_at'].astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" in asleep.group(2)
    block = re.search(r'<section id="steps-block"([^>]*)>(.*?)</section>', page, re.S)
    assert block and "hidden" not in block.group(1), page
    assert re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", block.group(2)) == [
        ("before", "step"), ("nap", "sleep")]
    assert '<span id="steps-count">2</span>' in block.group(2)
    assert "<b>suspend</b> (no attempt spent)" in page.split('<section class="timeline">', 1)[1]


def test_the_page_of_a_job_without_steps_hides_them(ddb: psycopg.Connection[Any],
                                                     client: TestClient) -> None:
    job_id = _nap(ddb, "no-steps", 1)  # no supervisor: it waits, with no records
    page = client.get(f"/jobs/{job_id}").text
    assert re.search(r'<section id="steps-block"[^>]* hidden>', page)
    assert re.search(r'<p id="asleep" hidden>', page)
    doc = client.get(f"/api/jobs/{job_id}").json()
    assert doc["handler_steps"] == {"records": 0, "bytes": 0, "last": []}
    assert doc["suspended_for"] is None and doc["suspended_until"] is None


def test_the_stream_follows_the_sleep_and_the_steps_live(
        ddb: psycopg.Connection[Any], supervise: Any,
        console_server: Callable[[], Console]) -> None:
    job_id = _nap(ddb, "console-live", 3)
    con = console_server()

    def done(seen: list[tuple[str, Any]]) -> bool:
        return any(n == "job" and d["state"] == "complete" for n, d in seen)

    with httpx.Client(base_url=con.url, timeout=httpx.Timeout(60.0)) as http, \
            http.stream("GET", f"/api/jobs/{job_id}/stream") as r:
        assert r.status_code == 200
        _start(supervise)  # after the first event was read: it shows no step yet
        seen = read_events(r, done)
    docs = [d for n, d in seen if n == "job"]
    assert docs[0]["handler_steps"] == {"records": 0, "bytes": 0, "last": []}
    asleep = [d for d in docs if d["suspended_for"] == "sleep:nap"]
    assert asleep, [(d["state"], d["suspended_for"]) for d in docs]
    assert [s["name"] for s in asleep[0]["handler_steps"]["last"]] == ["before", "nap"]
    assert asleep[0]["state"] == "available" and asleep[0]["suspended_until"] is not None
    final = docs[-1]
    assert final["state"] == "complete" and final["suspended_for"] is None
    assert [s["name"] for s in final["handler_steps"]["last"]] == ["before", "nap", "after"]
