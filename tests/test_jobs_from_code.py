"""Jobs from code (issue 36): ``atlantis.get_job``, ``list_jobs``, ``wait`` and their async
twins, the one NOTIFY per finish batch that wakes ``wait``, ``tide job wait`` and
``tide db server status|stop``.

The waits that must be woken by a notification run with ``RECHECK_INTERVAL`` (the slow
re-read of a listening wait) set past their own timeout: without the notification they time
out instead. ``tide db server`` runs on a throwaway embedded home (``tests/demo_home.py``),
never on the suite's server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis import jobs
from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.queries import Q
from tests.conftest import ROOT, TEST_APP, run_tide, wait_for, wait_state
from tests.demo_home import home as home  # the fixture
from tests.pgbouncer import Bouncer, pgbouncer
from tests.test_roles import login as login  # the fixture

pytestmark = pytest.mark.server_matrix

APP = "tests.apps.results:registry"
STATE_REFUSED = ("state: 'done' is not a job's state "
                 "(one of available, running, complete, dead, cancelled)")
LIMIT_REFUSED = "limit: expected a whole number from 0 to 9223372036854775807, not -1"
ID_REFUSED = "job_id: 9223372036854775808 is out of range for bigint (at most 9223372036854775807)"
TIMEOUT_REFUSED = "timeout: expected seconds, 0 or more, or None, not -1"
IN_TRANSACTION = "wait needs a connection with no transaction open: commit (or roll back) first"
NOT_EMBEDDED = ("tide: --database-url (or ATLANTIS_DATABASE_URL) names another server; "
                "`tide db server` manages the embedded PostgreSQL only")
DICT = {"key": "k", "n": 1, "nested": {"list": [1, 2.5, "x", None]}, "ok": True}


@pytest.fixture
def rdb(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's database with tests/apps/results.py's declarations."""
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    db.commit()
    return db


@pytest.fixture
def heard_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listening wait re-reads its job only when a notification names it."""
    monkeypatch.setattr(jobs, "RECHECK_INTERVAL", 3600.0)


def _returns(conn: psycopg.Connection[Any], mode: str, key: str = "k") -> int:
    return atlantis.enqueue(conn, "results.Return", {"key": key, "mode": mode})


def _later(conn: psycopg.Connection[Any], key: str = "later") -> int:
    """A job that waits an hour: nothing runs it meanwhile."""
    return atlantis.enqueue(conn, "tests.Echo", {"key": key}, delay=3600)


def _cancel_soon(url: str, job_id: int) -> threading.Thread:
    """Cancel ``job_id`` once some session waits on it (its last statement read its state)."""
    def run() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle'"
                " AND query LIKE 'SELECT state, result, last_error%'").fetchone()[0],  # type: ignore[index]
                message="the wait to start")
            atlantis.cancel(conn, job_id)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


# ---- get_job, list_jobs ------------------------------------------------------------------

def test_get_job_and_list_jobs_read_typed_jobs(db: psycopg.Connection[Any]) -> None:
    first = atlantis.enqueue(db, "tests.Echo", {"key": "a", "value": "x"})
    later = _later(db)
    cancelled = atlantis.enqueue(db, "tests.Fail", {"key": "c", "mode": "raise"})
    atlantis.cancel(db, cancelled)

    job = atlantis.get_job(db, first)
    assert isinstance(job, atlantis.Job)
    assert (job.id, job.job, job.queue, job.args, job.state, job.attempt, job.run) == (
        first, "tests.Echo", "tests", {"key": "a", "value": "x"}, "available", 0, 1)
    assert job.max_attempts == 1 and job.run_at.tzinfo is not None and not job.finished
    assert job.result is None and job.workflow_id is None and job.parent_id is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = "complete"  # type: ignore[misc]
    gone = atlantis.get_job(db, cancelled)
    assert gone is not None and gone.finished and gone.state == "cancelled"
    assert gone.last_error is not None and gone.error_count == 1
    assert atlantis.get_job(db, 10**12) is None

    assert [j.id for j in atlantis.list_jobs(db)] == [cancelled, later, first]
    assert [j.id for j in atlantis.list_jobs(db, job="tests.Echo")] == [later, first]
    assert [j.id for j in atlantis.list_jobs(db, state="cancelled")] == [cancelled]
    assert [j.id for j in atlantis.list_jobs(db, queue="tests", limit=1)] == [cancelled]
    assert atlantis.list_jobs(db, queue="nowhere") == []
    with pytest.raises(atlantis.ValidationError) as info:
        atlantis.list_jobs(db, state="done")
    assert str(info.value) == STATE_REFUSED
    with pytest.raises(atlantis.ValidationError) as info:
        atlantis.list_jobs(db, limit=-1)
    assert str(info.value) == LIMIT_REFUSED
    with pytest.raises(atlantis.ValidationError) as info:
        atlantis.get_job(db, 2**63)
    assert str(info.value) == ID_REFUSED


def test_the_reader_role_reads_and_waits(db: psycopg.Connection[Any], login: Any) -> None:
    job_id = atlantis.enqueue(db, "tests.Fail", {"key": "r", "mode": "raise"})
    atlantis.cancel(db, job_id)
    url = login("atlantis_reader")
    with psycopg.connect(url, autocommit=True) as conn:
        job = atlantis.get_job(conn, job_id)
        assert job is not None and job.state == "cancelled"
        assert [j.id for j in atlantis.list_jobs(conn)] == [job_id]
        with pytest.raises(atlantis.JobFailedError, match="cancelled"):
            atlantis.wait(conn, job_id, timeout=30)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT atlantis.cancel(%s)", (job_id,))


# ---- wait ----------------------------------------------------------------------------------

def test_wait_returns_the_result_of_a_job_that_completes(rdb: psycopg.Connection[Any],
                                                         db_url: str, supervise: Any,
                                                         heard_only: None) -> None:
    job_id = _returns(rdb, "dict")
    supervise(queues=("results",), app=APP)
    assert atlantis.wait(db_url, job_id, timeout=60) == DICT
    # Complete before the wait began: read after the LISTEN, returned at once.
    assert atlantis.wait(db_url, job_id, timeout=30) == DICT
    nothing = _returns(rdb, "none")
    assert atlantis.wait(rdb, nothing, timeout=60) is None
    assert rdb.autocommit  # the caller's connection as it was


def test_wait_raises_on_a_dead_job(rdb: psycopg.Connection[Any], db_url: str,
                                   supervise: Any, heard_only: None) -> None:
    job_id = _returns(rdb, "no-such-mode")
    supervise(queues=("results",), app=APP)
    with psycopg.connect(db_url) as conn:  # not autocommit: put back as it was
        with pytest.raises(atlantis.JobFailedError) as info:
            atlantis.wait(conn, job_id, timeout=60)
        assert not conn.autocommit
    assert (info.value.job_id, info.value.state) == (job_id, "dead")
    assert "unknown mode" in (info.value.last_error or "")
    assert str(info.value).startswith(f"job {job_id} ended dead: ")


def test_wait_is_woken_by_the_cancel_of_a_waiting_job(db: psycopg.Connection[Any],
                                                      db_url: str, heard_only: None) -> None:
    job_id = _later(db)
    thread = _cancel_soon(db_url, job_id)
    try:
        with pytest.raises(atlantis.JobFailedError) as info:
            atlantis.wait(db_url, job_id, timeout=30)
    finally:
        thread.join()
    assert info.value.state == "cancelled" and "cancelled by" in (info.value.last_error or "")


def test_wait_times_out_and_refuses_bad_input(db: psycopg.Connection[Any],
                                              db_url: str) -> None:
    job_id = _later(db)
    with pytest.raises(atlantis.WaitTimeout, match=f"job {job_id} had not ended after 0.2s"):
        atlantis.wait(db_url, job_id, timeout=0.2)
    with pytest.raises(TimeoutError):
        atlantis.wait(db, job_id, timeout=0)
    with pytest.raises(atlantis.JobNotFoundError) as unknown:
        atlantis.wait(db, 10**12, timeout=1)
    assert str(unknown.value) == "no job with id 1000000000000"
    with pytest.raises(atlantis.ValidationError) as info:
        atlantis.wait(db, job_id, timeout=-1)
    assert str(info.value) == TIMEOUT_REFUSED
    with pytest.raises(atlantis.ValidationError) as info:
        atlantis.wait(db, 2**63)
    assert str(info.value) == ID_REFUSED
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(atlantis.ValidationError) as info:
            atlantis.wait(conn, job_id, timeout=1)
        assert str(info.value).startswith(IN_TRANSACTION)
    # A wait that ended leaves its connection listening to nothing.
    with pytest.raises(atlantis.WaitTimeout):
        atlantis.wait(db, job_id, timeout=0.1)
    assert db.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)


def test_async_twins(rdb: psycopg.Connection[Any], db_url: str, supervise: Any,
                     heard_only: None) -> None:
    done = _returns(rdb, "dict")
    later = _later(rdb)

    async def run() -> tuple[Any, ...]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            job = await atlantis.get_job_async(conn, later)
            listed = await atlantis.list_jobs_async(conn, job="results.Return")
            result = await atlantis.wait_async(conn, done, timeout=60)
            again = await atlantis.wait_async(db_url, done, timeout=30)
            with pytest.raises(atlantis.WaitTimeout):
                await atlantis.wait_async(conn, later, timeout=0.2)
            await atlantis.cancel_async(conn, later)
            with pytest.raises(atlantis.JobFailedError, match="cancelled"):
                await atlantis.wait_async(db_url, later, timeout=30)
            return job, listed, result, again

    supervise(queues=("results",), app=APP)
    job, listed, result, again = asyncio.run(run())
    assert isinstance(job, atlantis.Job) and job.id == later
    assert [j.id for j in listed] == [done]
    assert result == again == DICT


# ---- the notifications -----------------------------------------------------------------------

def test_one_finish_batch_sends_one_notify(db: psycopg.Connection[Any], db_url: str,
                                           supervise: Any) -> None:
    count = 50
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN atlantis_finished")
        ids = atlantis.enqueue_many(db, "tests.Echo", [{"key": f"e{i}"} for i in range(count)])
        supervise(concurrency=16)
        for job_id in ids:
            wait_state(db, job_id, "complete")
        heard: list[str] = []

        def every_id_heard() -> bool:
            heard.extend(n.payload for n in listener.notifies(timeout=0.2))
            return {str(i) for i in ids} <= {x for p in heard for x in p.split(",")}

        wait_for(every_id_heard, message="every id to be notified")
    assert all(p for p in heard)
    assert len(heard) < count, heard


def test_a_rescue_notifies_the_jobs_it_ends_and_too_many_get_an_empty_payload(
        db: psycopg.Connection[Any], db_url: str) -> None:
    many = atlantis.enqueue_many(db, "tests.Echo", [{"key": f"r{i}"} for i in range(2000)])
    db.execute("UPDATE atlantis.jobs SET state = 'running', attempt = max_attempts,"
               " started_at = now(), claimed_by = 'gone:1:aa',"
               " claimed_until = now() - interval '1 minute' WHERE id = ANY(%s)", (many,))
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN atlantis_finished")
        one = db.execute(Q.rescue, {"limit": 1, "worker": "test", "max_backoff": 1}).fetchall()
        rest = db.execute(Q.rescue, {"limit": 5000, "worker": "test",
                                     "max_backoff": 1}).fetchall()
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert len(one) == 1 and one[0][1] == "dead" and len(rest) == len(many) - 1
    assert heard == [str(one[0][0]), ""]  # 1,999 ids and their commas: 8,890 bytes


def test_wait_names_and_empty_payloads() -> None:
    note = psycopg.Notify
    assert jobs._names(note("atlantis_finished", "4,17,170", 1), 17)
    assert not jobs._names(note("atlantis_finished", "4,170", 1), 17)
    assert jobs._names(note("atlantis_finished", "", 1), 17)
    assert not jobs._names(note("atlantis_jobs", "", 1), 17)


# ---- behind PgBouncer ------------------------------------------------------------------------

@pytest.fixture
def bouncer(admin_url: str) -> Iterator[Bouncer]:
    with pgbouncer(admin_url) as b:
        yield b


def test_wait_through_pgbouncer_polls(bouncer: Bouncer, rdb: psycopg.Connection[Any],
                                      db_url: str, supervise: Any, heard_only: None) -> None:
    pooled = bouncer.url(db_url)
    job_id = _returns(rdb, "dict")
    supervise(queues=("results",), app=APP)
    assert atlantis.wait(pooled, job_id, timeout=60) == DICT
    with psycopg.connect(pooled, autocommit=True) as conn:  # psycopg's prepare_threshold
        later = _later(rdb, "pooled")
        with pytest.raises(atlantis.WaitTimeout):
            atlantis.wait(conn, later, timeout=3)  # 6 reads: none prepared
        atlantis.cancel(rdb, later)
        with pytest.raises(atlantis.JobFailedError):
            atlantis.wait(conn, later, timeout=30)
    assert asyncio.run(atlantis.wait_async(pooled, job_id, timeout=30)) == DICT


# ---- tide job wait ---------------------------------------------------------------------------

def _said(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a failure on stderr (after tide's line naming the database)."""
    lines = [line for line in done.stderr.splitlines()
             if not line.startswith("atlantis: using database")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_tide_job_wait_exit_codes(rdb: psycopg.Connection[Any], db_url: str,
                                  supervise: Any) -> None:
    done, dead = _returns(rdb, "dict"), _returns(rdb, "no-such-mode", "d")
    later = _later(rdb)
    supervise(queues=("results",), app=APP)

    def tide(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_tide(["--database-url", db_url, "job", "wait", *argv], check=False)

    ok = tide(str(done), "--timeout", "60s")
    assert ok.returncode == 0 and orjson.loads(ok.stdout) == DICT
    failed = tide(str(dead), "--timeout", "60s")
    assert failed.returncode == 1 and failed.stdout == ""
    assert _said(failed).startswith(f"tide: job {dead} ended dead: ValueError: unknown mode")
    timed_out = tide(str(later), "--timeout", "300ms")
    assert (timed_out.returncode, _said(timed_out)) == (
        3, f"tide: job {later} had not ended after 0.3s")
    atlantis.cancel(rdb, later)
    cancelled = tide(str(later))
    assert cancelled.returncode == 1
    assert _said(cancelled).startswith(f"tide: job {later} ended cancelled: cancelled by")
    unknown = tide("999999999")
    assert (unknown.returncode, _said(unknown)) == (1, "tide: no job with id 999999999")
    bad = tide(str(done), "--timeout", "soon")
    assert (bad.returncode, _said(bad)) == (2, (
        "tide: Invalid value for --timeout: invalid duration 'soon' (use e.g. 500ms, 30s, "
        "10m, 2h, 1d, 1h30m) (see `tide job wait --help`)"))


# ---- tide db server --------------------------------------------------------------------------

def _start_embedded(home: Path) -> str:
    code = ("import sys; from pathlib import Path; from atlantis.store.embedded import "
            "embedded_url; print(embedded_url(Path(sys.argv[1])))")
    done = subprocess.run([sys.executable, "-c", code, str(home)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_tide_db_server_status_and_stop(home: Path, supervise: Any, db_url: str) -> None:
    env = {"ATLANTIS_HOME": str(home)}

    def tide(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_tide(["db", "server", *argv], check=False, env=env)

    data = home / "pgdata"
    assert tide("status").stdout == f"the embedded PostgreSQL of {data} is not running\n"
    url = _start_embedded(home)
    pid = int((data / "postmaster.pid").read_text().split()[0])
    status = tide("status")
    assert status.returncode == 0
    assert status.stdout.startswith(f"the embedded PostgreSQL runs: pid {pid}, data {data}, ")
    assert " port 5432, PostgreSQL 1" in status.stdout
    with psycopg.connect(url) as conn:
        migrate(conn)
        registry = load_app(TEST_APP)
        sync(conn, list(registry.decls.values()), list(registry.workflows.values()))
        conn.commit()
    sup = supervise(database_url=url)
    with psycopg.connect(url, autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM atlantis.workers").fetchone()[0],  # type: ignore[index]
                 message="the supervisor's row")
    refused = tide("stop")
    assert refused.returncode == 1
    assert f":{sup.pid} (database postgres); stop it first, or use --force" in refused.stderr
    assert refused.stderr.startswith("tide: 1 supervisor uses the embedded PostgreSQL: ")
    assert tide("status").stdout.startswith("the embedded PostgreSQL runs")
    # Killed with -9: its row has not expired, but its process on this host is gone. A live
    # process of this host with a row (this test's own) still holds the server.
    sup.signal(signal.SIGKILL)
    sup.wait()
    here = socket.gethostname()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM atlantis.workers WHERE pid = %s AND "
                            "expires_at > now()", (sup.pid,)).fetchone() == (1,)
        conn.execute("INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, "
                     "expires_at) VALUES (%s, %s, %s, '{tests}', 1, now() + interval '1 hour')",
                     (f"{here}:{os.getpid()}:ab", here, os.getpid()))
    refused = tide("stop")
    assert refused.returncode == 1
    assert refused.stderr == (f"tide: 1 supervisor uses the embedded PostgreSQL: "
                              f"{here}:{os.getpid()} (database postgres); stop it first, or use "
                              f"--force\n"), refused.stderr
    # A URL naming another server (the suite's): both say so, exit 2.
    other = run_tide(["--database-url", db_url, "db", "server", "status"], check=False, env=env)
    assert (other.returncode, other.stderr) == (2, NOT_EMBEDDED + "\n")
    # The URL `tide db url` prints for this home is the embedded server's own.
    assert run_tide(["--database-url", url, "db", "server", "status"], check=False,
                    env=env).returncode == 0
    forced = tide("stop", "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stderr == f"stopped the embedded PostgreSQL of {data} (pid {pid})\n"
    assert not (data / "postmaster.pid").exists()
    assert "is not running" in tide("status").stdout
    assert tide("stop").returncode == 0
