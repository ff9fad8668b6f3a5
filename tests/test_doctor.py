"""`tide db doctor`: each problem made for real in a fresh database, then diagnosed."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.store import doctor
from tests.conftest import BIN, ROOT, run_tide, url_for, wait_for


def tide_doctor(db_url: str, *args: str) -> tuple[int, dict[str, Any]]:
    """Exit code and the --json document of ``tide db doctor``."""
    done = run_tide(["--database-url", db_url, "db", "doctor", "--json", *args], check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, orjson.loads(done.stdout)


def failed(doc: dict[str, Any]) -> list[str]:
    return [name for name, check in doc["checks"].items() if not check["ok"]]


def test_a_healthy_database_exits_0(db_url: str) -> None:
    code, doc = tide_doctor(db_url)
    assert code == 0
    assert doc["ok"] is True and doc["problems"] == [] and failed(doc) == []
    assert list(doc["checks"]) == ["server_version", "jobs_table", "jobs_indexes",
                                   "old_transactions", "expired_leases", "silent_holders",
                                   "unserved_queues",
                                   "unserved_jobs", "unserved_declarations", "missed_schedules",
                                   "duplicate_unique_keys"]
    version = doc["checks"]["server_version"]["items"][0]
    assert version["version_num"] >= 160000
    table = doc["checks"]["jobs_table"]["items"][0]
    assert table["table"] == "atlantis.jobs" and table["dead_tuples"] >= 0
    indexes = {i["index"] for i in doc["checks"]["jobs_indexes"]["items"]}
    assert {"jobs_pkey", "jobs_fetch_idx", "jobs_lease_idx"} <= indexes
    # Declarations are synced but no supervisor runs at all: noted, not a problem.
    assert "no live supervisor" in doc["checks"]["unserved_declarations"]["summary"]

    text = run_tide(["--database-url", db_url, "db", "doctor"], check=False)
    assert text.returncode == 0, text.stderr
    # The embedded wheel's 18.4 is behind the newest minor doctor knows of: a warning, exit 0.
    behind = doc["checks"]["server_version"]["warning"]
    assert doc["warnings"] == (["server_version"] if behind else [])
    label = "warning" if behind else "ok"
    assert text.stdout.startswith(f"{label:7} server_version")
    assert "PostgreSQL " in text.stdout.splitlines()[0]
    assert "doctor: 0 problems" in text.stderr


def test_a_running_row_past_its_lease(db: psycopg.Connection[Any], db_url: str) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "lease"})
    # As a supervisor that claimed it and then died would leave it: nobody renews the lease.
    db.execute("UPDATE atlantis.jobs SET state = 'running', attempt = 1, "
               "claimed_by = 'gone-host:4242:0badc0de', started_at = now() - interval '2 hours', "
               "claimed_until = now() - interval '1 hour' WHERE id = %s", (job_id,))
    code, doc = tide_doctor(db_url)
    assert code == 1
    assert failed(doc) == ["expired_leases"] and doc["problems"] == ["expired_leases"]
    check = doc["checks"]["expired_leases"]
    assert [r["id"] for r in check["items"]] == [job_id]
    assert check["items"][0]["claimed_by"] == "gone-host:4242:0badc0de"
    assert check["items"][0]["overdue_seconds"] >= 3599
    assert check["summary"].startswith("1 running rows are past their lease")

    text = run_tide(["--database-url", db_url, "db", "doctor"], check=False)
    assert text.returncode == 1
    assert "PROBLEM expired_leases" in text.stdout
    assert f"id={job_id}" in text.stdout
    assert "doctor: 1 problem (expired_leases)" in text.stderr
    # Within the grace (a live supervisor's rescue would release it): not a problem.
    code, doc = tide_doctor(db_url, "--lease-grace", "2h")
    assert code == 0, doc


def test_waiting_jobs_nobody_serves_then_a_supervisor(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "unserved"})
    code, doc = tide_doctor(db_url)
    assert code == 1 and failed(doc) == ["unserved_queues"]
    [row] = doc["checks"]["unserved_queues"]["items"]
    assert row["queue"] == "tests" and row["waiting"] == 1 and row["paused"] is False

    # A real supervisor on that queue: the job runs, and the other declared queues are now
    # the problem (a fleet is up, but nothing serves them).
    supervise(queues=("tests",))
    wait_for(lambda: db.execute("SELECT state = 'complete' FROM atlantis.jobs WHERE id = %s",
                                (job_id,)).fetchone() == (True,), message="the job done")
    code, doc = tide_doctor(db_url)
    assert code == 1 and failed(doc) == ["unserved_declarations"], doc
    unserved = doc["checks"]["unserved_declarations"]["items"]
    assert unserved and "tests" not in {r["queue"] for r in unserved}
    assert "sched.Tick" in {r["job"] for r in unserved}


def test_an_open_transaction_holding_back_vacuum(db_url: str,
                                                 db: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url) as other:
        # A snapshot held open on another connection: its xmin holds back vacuum.
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT count(*) FROM atlantis.jobs")
        pid = other.info.backend_pid

        def seen() -> list[dict[str, Any]]:
            check = doctor.diagnose(db, xact_age=0.2).checks[3]
            assert check.name == "old_transactions"
            return [] if check.ok else [r for r in check.items if r["pid"] == pid]

        [row] = wait_for(seen, message="the open transaction reported")
        assert row["kind"] == "session" and row["state"] == "idle in transaction"
        assert row["age_seconds"] >= 0.2 and row["xid_age"] >= 0

        code, doc = tide_doctor(db_url, "--xact-age", "200ms")
        assert code == 1 and "old_transactions" in failed(doc)
        assert pid in [r["pid"] for r in doc["checks"]["old_transactions"]["items"]]
        # The default threshold (5 minutes) is not reached.
        code, doc = tide_doctor(db_url)
        assert code == 0, doc
        other.rollback()
    wait_for(lambda: doctor.diagnose(db, xact_age=0.2).checks[3].ok,
             message="the transaction gone from the report")


def test_a_missed_schedule_slot(db: psycopg.Connection[Any], db_url: str) -> None:
    # An old one only: counted, not a problem.
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, job_id) "
               "VALUES ('sched.Nightly', now() - interval '3 days', NULL)")
    code, doc = tide_doctor(db_url)
    assert code == 0, doc
    assert "1 older missed slots kept" in doc["checks"]["missed_schedules"]["summary"]
    # A slot missed a minute ago, as schedule_fire records one first seen past its grace.
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, job_id) "
               "VALUES ('sched.Tick', date_trunc('second', now()) - interval '1 minute', NULL)")
    code, doc = tide_doctor(db_url)
    assert code == 1 and failed(doc) == ["missed_schedules"]
    rows = {r["job"]: r for r in doc["checks"]["missed_schedules"]["items"]}
    assert rows["sched.Tick"]["missed"] == 1 and rows["sched.Tick"]["recent"] == 1
    assert rows["sched.Nightly"]["missed"] == 1 and rows["sched.Nightly"]["recent"] == 0
    assert "sched.Tick (1)" in doc["checks"]["missed_schedules"]["summary"]


def test_dead_tuples_of_the_jobs_table(db: psycopg.Connection[Any], db_url: str) -> None:
    # This test's own database: autovacuum off for the table so that nothing cleans up
    # before the doctor looks.
    db.execute("ALTER TABLE atlantis.jobs SET (autovacuum_enabled = false)")
    db.execute("INSERT INTO atlantis.jobs (job, queue, state, attempt, max_attempts, timeout, "
               "heartbeat, backoff, started_at, finished_at) "
               "SELECT 'bulk.Job', 'bulk', 'complete', 1, 1, '1m', '1m', '0', now(), now() "
               "FROM generate_series(1, 12000)")
    db.execute("DELETE FROM atlantis.jobs WHERE queue = 'bulk'")
    db.execute("SELECT pg_stat_force_next_flush()")

    def dead() -> dict[str, Any] | None:
        _, doc = tide_doctor(db_url)
        table: dict[str, Any] = doc["checks"]["jobs_table"]["items"][0]
        return doc if table["dead_tuples"] >= 12000 else None

    doc = wait_for(dead, message="the dead tuples counted")
    assert failed(doc) == ["jobs_table"]
    table = doc["checks"]["jobs_table"]["items"][0]
    assert table["live_tuples"] == 0 and table["dead_ratio"] == 1.0
    assert table["bloat_bytes"] == table["table_bytes"] > 0
    assert "vacuum is not keeping up" in doc["checks"]["jobs_table"]["summary"]
    db.execute("VACUUM atlantis.jobs")
    db.execute("SELECT pg_stat_force_next_flush()")
    wait_for(lambda: tide_doctor(db_url)[0] == 0, message="the table clean after VACUUM")


def test_server_version_is_checked(db: psycopg.Connection[Any]) -> None:
    number, text = doctor.server_version(db)
    assert number >= doctor.MIN_SERVER_VERSION
    doctor.require_server_version(db)
    newer = (number // 10000 + 1) * 10000
    with pytest.raises(doctor.ServerTooOld) as caught:
        doctor.require_server_version(db, minimum=newer)
    message = str(caught.value)
    assert message == (f"PostgreSQL {text} is too old: atlantis needs {newer // 10000} or newer")
    assert "\n" not in message
    # A psycopg error that is not an OperationalError: tide reports it on one line and the
    # supervisor exits at once instead of waiting for the database.
    assert isinstance(caught.value, psycopg.Error)
    assert not isinstance(caught.value, psycopg.OperationalError)


def test_a_database_without_the_schema(admin_url: str) -> None:
    name = "doctor_empty"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        done = subprocess.run([str(BIN / "tide"), "--database-url", url_for(admin_url, name),
                               "db", "doctor"], capture_output=True, text=True, cwd=ROOT,
                              timeout=60)
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            "tide: the atlantis schema is missing; run `tide db migrate`")
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
