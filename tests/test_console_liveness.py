"""A silent holder in the console's JSON API (issue 36): ``GET /api/jobs/{id}`` and the job
stream's ``event: job`` carry ``holder_silent``, ``holder_silent_seconds`` and
``lease_ends_in_seconds`` as ``tide job status --json`` does, and ``GET /api/workers`` each
supervisor's ``silent_for``. Real PostgreSQL, real supervisors, a real console for the
stream."""

from __future__ import annotations

import json
import signal
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import httpx

with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import atlantis
from atlantis.console.app import create_app
from atlantis.console.settings import Settings
from tests.conftest import Supervisor, events, job_row, run_tide, wait_for, wait_state
from tests.test_console_api import Console

#: A short liveness interval: a supervisor is silent after a second without a mark of life.
LIVE = ["--liveness-interval", "0.5s"]
HOLDER_KEYS = {"holder_silent", "holder_silent_seconds", "lease_ends_in_seconds"}


@pytest.fixture
def api(db_url: str) -> Iterator[TestClient]:
    settings = Settings(db_url, poll_interval=0.5, log_interval=0.2, debounce=0.05)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as tc:
        yield tc


def _long_job(db: psycopg.Connection[Any], key: str) -> int:
    """A tests.Sleep of an hour with a lease (heartbeat) of 60 s."""
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": key, "seconds": 3600,
                                                  "retry_seconds": 0.1})
    db.execute("UPDATE atlantis.jobs SET heartbeat = interval '60 seconds', "
               "timeout = interval '2 hours', max_attempts = 3 WHERE id = %s", (job_id,))
    db.commit()
    return job_id


def _started(db: psycopg.Connection[Any], key: str, job_id: int) -> str:
    """Wait for the job's first attempt; its holder (the worker id)."""
    wait_for(lambda: any(e[2] == "started" for e in events(db, key)),
             message="the first attempt")
    return str(job_row(db, job_id)["claimed_by"])


def _worker(api: TestClient, worker: str) -> dict[str, Any]:
    found = [w for w in api.get("/api/workers").json()["workers"] if w["id"] == worker]
    assert len(found) == 1, found
    worker_doc: dict[str, Any] = found[0]
    return worker_doc


def _first_job_event(url: str, job_id: int) -> dict[str, Any]:
    """The first ``event: job`` of the job's stream on a real console."""
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60.0)) as http, \
            http.stream("GET", f"/api/jobs/{job_id}/stream") as r:
        assert r.status_code == 200
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name == "job":
                doc: dict[str, Any] = json.loads(line[6:])
                return doc
    raise AssertionError("the stream ended without an event: job")


def _killed(db: psycopg.Connection[Any], supervise: Callable[..., Supervisor],
            tmp_path: Path) -> tuple[int, str]:
    """A long job whose supervisor was killed -9 while running it: (job id, its holder)."""
    sup = supervise(*LIVE, "--runtime-dir", str(tmp_path / "run"))
    job_id = _long_job(db, "killed")
    worker = _started(db, "killed", job_id)
    sup.signal(signal.SIGKILL)
    sup.wait()
    return job_id, worker


def test_the_api_says_a_killed_supervisors_job_has_a_silent_holder(
        db: psycopg.Connection[Any], db_url: str, api: TestClient,
        supervise: Callable[..., Supervisor], tmp_path: Path) -> None:
    job_id, worker = _killed(db, supervise, tmp_path)
    doc = wait_for(lambda: (d := api.get(f"/api/jobs/{job_id}").json())["holder_silent"] and d,
                   15, message="GET /api/jobs/{id} saying the holder is silent")
    assert doc["state"] == "running" and doc["claimed_by"] == worker
    assert doc["holder_silent"] is True
    assert doc["holder_silent_seconds"] > 1  # two liveness intervals of 0.5 s
    assert 0 < doc["lease_ends_in_seconds"] <= 60
    assert 'id="holder-silent"' in api.get(f"/jobs/{job_id}").text  # the page reads the same
    # The same three fields as tide's, with the same meaning.
    tide = json.loads(run_tide(["--database-url", db_url, "job", "status", str(job_id),
                                "--json"]).stdout)
    assert {k: tide[k] is None for k in HOLDER_KEYS} == {k: doc[k] is None for k in HOLDER_KEYS}
    assert tide["holder_silent"] is True
    assert tide["holder_silent_seconds"] >= doc["holder_silent_seconds"]
    assert tide["lease_ends_in_seconds"] <= doc["lease_ends_in_seconds"]
    # The workers listing: the killed supervisor, silent for as long.
    killed = _worker(api, worker)
    assert killed["liveness_interval"] == 0.5
    assert killed["silent_for"] > 1
    # The live-update stream's job document carries them too.
    con = Console(db_url, tmp_path / "console.log")
    try:
        streamed = _first_job_event(con.url, job_id)
    finally:
        con.stop()
    assert streamed["holder_silent"] is True
    assert streamed["holder_silent_seconds"] >= doc["holder_silent_seconds"]
    assert 0 < streamed["lease_ends_in_seconds"] <= doc["lease_ends_in_seconds"]


def test_the_api_says_a_healthy_supervisors_job_has_a_live_holder(
        db: psycopg.Connection[Any], api: TestClient, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    supervise(*LIVE, "--runtime-dir", str(tmp_path / "run"))
    job_id = _long_job(db, "healthy")
    worker = _started(db, "healthy", job_id)
    seen: set[Any] = set()

    def marks() -> bool:  # a few marks of life: well past two liveness intervals
        seen.add(db.execute("SELECT seen_at FROM atlantis.workers WHERE id = %s",
                            (worker,)).fetchone())
        db.commit()
        return len(seen) >= 4

    wait_for(marks, 15, message="marks of life")
    doc = api.get(f"/api/jobs/{job_id}").json()
    assert doc["state"] == "running"
    assert doc["holder_silent"] is False and doc["holder_silent_seconds"] is None
    assert 0 < doc["lease_ends_in_seconds"] <= 60
    assert _worker(api, worker)["silent_for"] is None
    assert 'id="holder-silent"' not in api.get(f"/jobs/{job_id}").text
    # A job that is not running has no holder: the three fields are null.
    done = atlantis.enqueue(db, "tests.Echo", {"key": "done"})
    db.commit()
    wait_state(db, done, "complete")
    finished = api.get(f"/api/jobs/{done}").json()
    assert {k: finished[k] for k in HOLDER_KEYS} == dict.fromkeys(HOLDER_KEYS)
