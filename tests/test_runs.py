"""Runs (issue 18): a retry starts a job's next run, whose attempts count from 1 again; its
logs, timeline and errors stay apart from the earlier run's, in tide and the console, and a
late write of an earlier run never lands on the next one. And who cancelled a job is named
however the job then ends. Real supervisors, children and PostgreSQL."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.store.queries import Q
from atlantis.store.supervision import (
    ClaimedRow,
    FinishedRow,
    Renewal,
    Result,
    finish_params,
    renew_params,
)
from atlantis.store.typed_rows import fields_row
from tests.conftest import events, job_row, run_tide, wait_for, wait_state
from tests.test_operations import make_dead

APP = "tests.apps.ops:registry"


def tide(db_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_tide(["--database-url", db_url, *args], check=check)


def _lines(out: str) -> list[str]:
    """The handler's text of each line ``tide job logs`` printed (stamp and stream cut)."""
    return [line.split(" ", 3)[3] for line in out.splitlines()]


def _run_to_dead(db: psycopg.Connection[Any], supervise: Any, key: str) -> int:
    supervise(queues=("ops",), app=APP, concurrency=1)
    job_id = atlantis.enqueue(db, "ops.Runs", {"key": key})
    row = wait_state(db, job_id, "dead")
    assert (row["run"], row["attempt"]) == (1, 2)
    _logged(db, job_id, 2)
    return job_id


def _logged(db: psycopg.Connection[Any], job_id: int, count: int) -> None:
    """Wait until the job's first ``count`` lines are written (lines are flushed in batches,
    after the job's state may have changed)."""
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.logs WHERE job_id = %s",
                                (job_id,)).fetchone() == (count,), message=f"{count} lines")


def _attempts(db: psycopg.Connection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return db.execute("SELECT run, attempt, outcome FROM atlantis.attempts WHERE job_id = %s "
                      "ORDER BY id", (job_id,)).fetchall()


def test_a_retried_job_keeps_its_runs_apart_in_tide(db: psycopg.Connection[Any], db_url: str,
                                                    supervise: Any) -> None:
    job_id = _run_to_dead(db, supervise, "tide-runs")
    before = tide(db_url, "job", "logs", str(job_id))
    assert _lines(before.stdout) == ["call 2 attempt 2"]
    assert " run " not in before.stderr  # one run: not labelled
    assert tide(db_url, "job", "retry", str(job_id)).returncode == 0
    assert job_row(db, job_id)["run"] == 2
    row = wait_state(db, job_id, "complete")
    _logged(db, job_id, 3)
    assert (row["run"], row["attempt"]) == (2, 1)
    assert _attempts(db, job_id) == [(1, 1, "failed"), (1, 2, "failed"), (2, 1, "complete")]
    assert [(e["run"], e["attempt"]) for e in row["errors"]] == [(1, 1), (1, 2)]
    # Default: the latest run, its latest attempt; which one is said on stderr.
    latest = tide(db_url, "job", "logs", str(job_id))
    assert _lines(latest.stdout) == ["call 3 attempt 1"]
    assert f"run 2 attempt 1 of job {job_id}" in latest.stderr
    assert _lines(tide(db_url, "job", "logs", str(job_id), "--attempt", "1").stdout) == [
        "call 3 attempt 1"]
    assert _lines(tide(db_url, "job", "logs", str(job_id), "--run", "1").stdout) == [
        "call 2 attempt 2"]
    assert _lines(tide(db_url, "job", "logs", str(job_id), "--run", "1", "--attempt", "1")
                  .stdout) == ["call 1 attempt 1"]
    docs = [orjson.loads(x) for x in tide(db_url, "job", "logs", str(job_id), "--json",
                                          "--run", "1", "--attempt", "2").stdout.splitlines()]
    assert [(d["run"], d["attempt"], d["line"]) for d in docs] == [(1, 2, "call 2 attempt 2")]
    no_run = tide(db_url, "job", "logs", str(job_id), "--run", "3", check=False)
    assert no_run.returncode == 1 and no_run.stdout == ""
    assert no_run.stderr.splitlines()[-1] == f"tide: job {job_id} has no run 3 (it has had 2)"
    no_attempt = tide(db_url, "job", "logs", str(job_id), "--attempt", "2", check=False)
    assert no_attempt.returncode == 1
    assert no_attempt.stderr.splitlines()[-1] == (
        f"tide: job {job_id} has no attempt 2 in run 2 (it has had 1)")
    # The timeline: each attempt with its run.
    status = tide(db_url, "job", "status", str(job_id)).stdout
    assert "run 2, attempt 1/2" in status
    assert re.findall(r"run (\d) #(\d)  started", status) == [("1", "1"), ("1", "2"),
                                                               ("2", "1")]
    doc = orjson.loads(tide(db_url, "job", "status", str(job_id), "--json").stdout)
    assert doc["run"] == 2
    assert [(a["run"], a["attempt"]) for a in doc["attempts"]] == [(1, 1), (1, 2), (2, 1)]


def test_the_console_keeps_a_retried_jobs_runs_apart(db: psycopg.Connection[Any], db_url: str,
                                                     supervise: Any) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    import warnings

    with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings, Token

    job_id = _run_to_dead(db, supervise, "console-runs")
    settings = Settings(db_url, token=Token("ops", "s3cret"), poll_interval=0.5,
                        log_interval=0.2, debounce=0.05)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as c:
        bearer = {"Authorization": "Bearer s3cret"}
        assert c.post(f"/api/jobs/{job_id}/retry", headers=bearer).json() == {
            "id": job_id, "state": "available"}
        wait_state(db, job_id, "complete")
        _logged(db, job_id, 3)

        def logs(query: str) -> dict[str, Any]:
            r = c.get(f"/api/jobs/{job_id}/logs{query}")
            assert r.status_code == 200, r.text
            doc: dict[str, Any] = r.json()
            return doc

        latest = logs("")
        assert (latest["run"], latest["attempt"]) == (2, 1)
        assert [(ln["run"], ln["attempt"], ln["line"]) for ln in latest["lines"]] == [
            (2, 1, "call 3 attempt 1")]
        first = logs("?run=1")
        assert (first["run"], first["attempt"]) == (1, 2)
        assert [ln["line"] for ln in first["lines"]] == ["call 2 attempt 2"]
        assert [ln["line"] for ln in logs("?run=1&attempt=1")["lines"]] == ["call 1 attempt 1"]
        assert [ln["line"] for ln in logs("?attempt=1")["lines"]] == ["call 3 attempt 1"]
        # Polling after a line id: only lines of the run asked for.
        (call_1,) = logs("?run=1&attempt=1")["lines"]
        assert logs(f"?run=1&attempt=1&after={call_1['id']}")["lines"] == []
        assert [ln["line"] for ln in logs(f"?run=2&attempt=1&after={call_1['id']}")["lines"]] == [
            "call 3 attempt 1"]
        refused = c.get(f"/api/jobs/{job_id}/logs?run=0")
        assert (refused.status_code, refused.json()) == (400, {"error": "run: at least 1"})
        doc = c.get(f"/api/jobs/{job_id}").json()
        assert doc["run"] == 2
        assert [(a["run"], a["attempt"]) for a in doc["attempts"]] == [(1, 1), (1, 2), (2, 1)]
        assert [(e["run"], e["attempt"]) for e in doc["errors"]] == [(1, 1), (1, 2)]
        page = c.get(f"/jobs/{job_id}").text
        assert "run 1 attempt 1 on" in page and "run 2 attempt 1 on" in page
        assert 'run <span id="log-run">2</span>' in page


def test_a_late_write_of_an_earlier_run_never_lands_on_the_next(
        db: psycopg.Connection[Any]) -> None:
    """One supervisor claims run 1's attempt 1, loses it (rescued: dead), the job is retried
    and the same supervisor claims run 2's attempt 1: same id, attempt and claimed_by. Run
    1's late renewal and result match nothing; run 2's own do."""
    worker = "host-a:4242:0badc0de"
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "fence"})

    def claim() -> dict[str, Any]:
        (row,) = db.cursor(row_factory=psycopg.rows.dict_row).execute(Q.claim, {"limited": [],
            "queues": ["tests"], "jobs": ["tests.Echo"], "limit": 1, "worker": worker,
            "within": 5.0}).fetchall()
        return row

    first = claim()
    assert (first["id"], first["run"], first["attempt"]) == (job_id, 1, 1)
    db.execute("UPDATE atlantis.jobs SET claimed_until = now() - interval '1 second' "
               "WHERE id = %s", (job_id,))
    assert db.execute(Q.rescue, {"limit": 10, "worker": "rescuer",
                                 "max_backoff": 86400.0}).fetchall() == [(job_id, "dead", "tests")]
    assert atlantis.retry(db, job_id) == job_id
    second = claim()
    assert (second["id"], second["run"], second["attempt"]) == (job_id, 2, 1)
    # Run 1's attempt 1, late: neither its renewal nor its result is written.
    late = Renewal(job_id, 1, None, run=1)
    assert db.execute(Q.renew, renew_params(worker, [late])).fetchall() == []
    result = Result(job_id, 1, "complete", True, 0.0, None, None, "complete", run=1)
    assert db.execute(Q.finish, finish_params(worker, [result])).fetchall() == []
    row = job_row(db, job_id)
    assert (row["state"], row["run"], row["attempt"]) == ("running", 2, 1)
    assert db.execute("SELECT count(*) FROM atlantis.attempts WHERE job_id = %s",
                      (job_id,)).fetchone() == (1,)  # run 1's rescue only
    # Run 2's own are.
    own = Renewal(job_id, 1, None, run=2)
    assert db.execute(Q.renew, renew_params(worker, [own])).fetchall() == [(job_id, False)]
    done = Result(job_id, 1, "complete", True, 0.0, None, None, "complete", run=2)
    assert db.execute(Q.finish, finish_params(worker, [done])).fetchall() == [(job_id, "complete")]
    assert db.execute("SELECT run, attempt, outcome FROM atlantis.attempts WHERE job_id = %s "
                      "ORDER BY id", (job_id,)).fetchall() == [
        (1, 1, "lease_expired"), (2, 1, "complete")]


def test_rows_from_before_runs_are_run_1_and_their_logs_read_as_before(
        db: psycopg.Connection[Any], db_url: str) -> None:
    """Lines written without a run (a supervisor of the previous release) are run 1's; a
    retry of such a job starts run 2 (the trigger counts it, whoever retries)."""
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "old"})
    make_dead(db, job_id)
    db.execute("INSERT INTO atlantis.logs (job_id, attempt, stream, line) "
               "VALUES (%s, 1, 'stdout', 'from before')", (job_id,))
    assert job_row(db, job_id)["run"] == 1
    assert _lines(tide(db_url, "job", "logs", str(job_id)).stdout) == ["from before"]
    db.execute("SELECT atlantis.retry(%s)", (job_id,))
    assert job_row(db, job_id)["run"] == 2
    assert _lines(tide(db_url, "job", "logs", str(job_id), "--run", "1").stdout) == [
        "from before"]
    fresh = tide(db_url, "job", "logs", str(job_id))
    assert fresh.stdout == "" and f"run 2 of job {job_id} has no log lines" in fresh.stderr


# ---- who cancelled ---------------------------------------------------------------------------

@pytest.fixture
def as_role(admin_url: str, db_url: str) -> Iterator[Callable[[], str]]:
    """A new role (not a login) that may call atlantis.cancel; dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"ops_{os.getpid()}_{len(made)}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {name} IN ROLE atlantis_operator")
        made.append(name)
        return name

    yield make
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in made:
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE IF EXISTS {name}")


def test_who_cancelled_is_named_however_the_job_ends(db: psycopg.Connection[Any], db_url: str,
                                                     supervise: Any, as_role: Any) -> None:
    role = as_role()
    supervise("--cancel-grace", "1s", queues=("ops",), app=APP, concurrency=3)
    modes = {"obey": "returns on ctx.cancelled", "ignore": "killed after the grace",
             "raise": "raises on ctx.cancelled"}
    ids = {mode: atlantis.enqueue(db, "ops.Long", {"key": f"who-{mode}", "mode": mode})
           for mode in modes}
    waiting = atlantis.enqueue(db, "ops.Long", {"key": "who-waiting", "mode": "obey"}, delay=3600)
    def started(mode: str) -> bool:
        return any(e[2] == "started" for e in events(db, f"who-{mode}"))

    for mode in modes:
        wait_for(lambda: started(mode), message=f"{mode} to start")  # noqa: B023
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"SET ROLE {role}")
        for job_id in [*ids.values(), waiting]:
            conn.execute("SELECT atlantis.cancel(%s)", (job_id,))
    for mode, job_id in [*ids.items(), ("waiting", waiting)]:
        row = wait_state(db, job_id, "cancelled")
        assert row["cancelled_by"] == role, mode
        assert row["last_error"] == f"cancelled by {role}", mode
        last = row["errors"][-1]
        assert (last["kind"], last["message"], last["by"]) == (
            "cancelled", f"cancelled by {role}", role), mode
        assert last["run"] == 1, mode
    assert [e["kind"] for e in job_row(db, ids["raise"])["errors"]] == ["exception", "cancelled"]


def test_a_cancelled_row_given_back_unrun_names_who_cancelled(db: psycopg.Connection[Any]) -> None:
    """A claim whose answer was lost (no child ever ran the row) while the job was cancelled:
    release_orphans ends it cancelled, saying who, as every other way does."""
    worker = "host-a:4242:0badc0de"
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "orphan"})
    assert len(db.execute(Q.claim, {"limited": [], "queues": ["tests"], "jobs": ["tests.Echo"], "limit": 1,
                                    "worker": worker, "within": 5.0}).fetchall()) == 1
    assert atlantis.cancel(db, job_id, by="carol") == "running"
    assert db.execute(Q.release_orphans, {"worker": worker, "known": []}).fetchall() == [(job_id,)]
    row = job_row(db, job_id)
    assert (row["state"], row["attempt"], row["last_error"]) == ("cancelled", 0, "cancelled by carol")
    (entry,) = row["errors"]
    assert (entry["run"], entry["kind"], entry["by"]) == (1, "cancelled", "carol")


def test_a_resumed_claim_is_told_apart_by_its_run_id(db: psycopg.Connection[Any]) -> None:
    """A resume spends no attempt: one supervisor's claim, a suspend, and its next claim of
    the row have the same id, run, attempt and claimed_by. The first claim's late renewal
    and result match nothing (its run id is not the row's); the second's own do."""
    worker = "host-a:4242:0badc0de"
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "resume"})

    def claim() -> dict[str, Any]:
        (row,) = db.cursor(row_factory=psycopg.rows.dict_row).execute(Q.claim, {"limited": [],
            "queues": ["tests"], "jobs": ["tests.Echo"], "limit": 1, "worker": worker,
            "within": 5.0}).fetchall()
        return row

    first = claim()
    asleep = Result(job_id, 1, "available", False, 0.0, None, None, "suspend", run=1,
                    run_id=first["run_id"], wake="2000-01-01T00:00:00+00:00", waits="sleep:nap")
    assert db.execute(Q.finish, finish_params(worker, [asleep])).fetchall() == [
        (job_id, "available")]
    second = claim()
    assert (second["run"], second["attempt"]) == (first["run"], first["attempt"]) == (1, 1)
    assert second["run_id"] != first["run_id"]
    late = Renewal(job_id, 1, None, run=1, run_id=first["run_id"])
    assert db.execute(Q.renew, renew_params(worker, [late])).fetchall() == []
    stale = Result(job_id, 1, "complete", True, 0.0, None, None, "complete", run=1,
                   run_id=first["run_id"])
    assert db.execute(Q.finish, finish_params(worker, [stale])).fetchall() == []
    assert job_row(db, job_id)["state"] == "running"
    own = Renewal(job_id, 1, None, run=1, run_id=second["run_id"])
    assert db.execute(Q.renew, renew_params(worker, [own])).fetchall() == [(job_id, False)]
    done = Result(job_id, 1, "complete", True, 0.0, None, None, "complete", run=1,
                  run_id=second["run_id"])
    assert db.execute(Q.finish, finish_params(worker, [done])).fetchall() == [(job_id, "complete")]
    assert db.execute("SELECT outcome FROM atlantis.attempts WHERE job_id = %s ORDER BY id",
                      (job_id,)).fetchall() == [("suspend",), ("complete",)]


def test_claimed_rows_are_read_by_column_name_as_class_row_reads_them(
        db: psycopg.Connection[Any]) -> None:
    """The supervisor reads its rows with ``typed_rows.fields_row``: by column name, as
    psycopg's ``class_row``, each row built positionally (the claim selects its columns in
    another order than ``ClaimedRow`` declares them). The run id comes as text: the
    supervisor only passes it on. A column the row type lacks fails, as with ``class_row``;
    a field the statement leaves out keeps its default."""
    atlantis.enqueue(db, "tests.Echo", {"key": "rows"}, priority=3)
    params = {"limited": [], "queues": ["tests"], "jobs": ["tests.Echo"], "limit": 1,
              "worker": "host-a:1:rows", "within": 5.0}
    read: dict[str, ClaimedRow] = {}
    for name, factory in (("class_row", psycopg.rows.class_row), ("fields_row", fields_row)):
        with db.transaction(force_rollback=True):
            (read[name],) = db.cursor(row_factory=factory(ClaimedRow)).execute(
                Q.claim, params).fetchall()
    by_name, positional = read["class_row"], read["fields_row"]
    assert isinstance(positional.run_id, str) and len(positional.run_id) == 36
    assert dataclasses.replace(positional, run_id=None, deadline=by_name.deadline) == \
        dataclasses.replace(by_name, run_id=None)
    with pytest.raises(TypeError):
        db.cursor(row_factory=fields_row(FinishedRow)).execute(
            "SELECT 1 AS id, 'complete' AS state, 2 AS extra").fetchall()
    assert db.cursor(row_factory=fields_row(FinishedRow)).execute(
        "SELECT 'complete' AS state, 1 AS id").fetchall() == [FinishedRow(1, "complete")]
    left_out = db.cursor(row_factory=fields_row(Renewal)).execute(
        "SELECT 1 AS attempt, 7 AS job_id, NULL AS progress").fetchall()
    assert left_out == [Renewal(7, 1, None)]
