"""`tide` end to end, the schema migrations, and the async enqueue twins."""

from __future__ import annotations

import asyncio
import getpass
import os
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.store import fleet, migrate
from atlantis.store.migrate import migrations
from tests.conftest import BIN, ROOT, job_row, run_tide, url_for, wait_for, wait_state
from tests.test_operations import make_dead, make_running


def tide(db_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_tide(["--database-url", db_url, *args], check=check)


def test_gen_writes_and_checks(tmp_path: Path, db_url: str) -> None:
    out = tmp_path / "jobs_gen.py"
    source = ROOT / "examples" / "contacts" / "jobs.atl"
    tide(db_url, "gen", str(source), "-o", str(out))
    text = out.read_text()
    assert "def enqueue_import_contacts(" in text and "def register_import_contacts(" in text
    assert tide(db_url, "gen", str(source), "-o", str(out), "--check").returncode == 0
    out.write_text(text + "# edited\n")
    stale = tide(db_url, "gen", str(source), "-o", str(out), "--check", check=False)
    assert stale.returncode == 1 and "stale" in stale.stderr
    bad = tmp_path / "bad.atl"
    bad.write_text("job X in y {\n  retry 3\n}\n")
    refused = tide(db_url, "gen", str(bad), "-o", str(out), check=False)
    assert refused.returncode == 2 and "bad.atl:2:3" in refused.stderr and "retry" in refused.stderr


def test_list_stats_and_workers(db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    done = atlantis.enqueue(db, "tests.Echo", {"key": "a"})
    waiting = atlantis.enqueue(db, "tests.Echo", {"key": "b"}, queue="elsewhere")
    supervise(concurrency=1)
    wait_state(db, done, "complete")
    rows = orjson.loads(tide(db_url, "job", "list", "--json").stdout)
    assert [r["id"] for r in rows] == [waiting, done]
    only = orjson.loads(tide(db_url, "job", "list", "--queue", "elsewhere", "--json").stdout)
    assert [r["id"] for r in only] == [waiting]
    stats = {s["queue"]: s for s in orjson.loads(tide(db_url, "queue", "stats", "--json").stdout)}
    assert stats["tests"]["complete"] == 1 and stats["elsewhere"]["available"] == 1
    assert stats["elsewhere"]["oldest_waiting_seconds"] >= 0

    def workers() -> list[dict[str, Any]]:
        return list(orjson.loads(tide(db_url, "worker", "list", "--json").stdout))

    (worker,) = wait_for(workers, message="the supervisor in tide worker list")
    assert worker["queues"] == ["tests"] and worker["concurrency"] == 1
    assert "tests" in tide(db_url, "worker", "list").stdout
    assert "Echo" in tide(db_url, "job", "list").stdout


def test_cancel_waiting_and_running_jobs(db: psycopg.Connection[Any], db_url: str) -> None:
    later = atlantis.enqueue(db, "tests.Echo", {"key": "later"}, delay=3600)
    assert tide(db_url, "job", "cancel", str(later)).stdout == f"job {later} cancelled\n"
    row = job_row(db, later)
    assert row["state"] == "cancelled" and row["cancelled_by"] == getpass.getuser()
    running = atlantis.enqueue(db, "tests.Sleep", {"key": "long", "seconds": 60.0})
    make_running(db, running)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN atlantis_control")
        assert "stopping it" in tide(db_url, "job", "cancel", str(running)).stdout
        (note,) = listener.notifies(timeout=5, stop_after=1)
        assert orjson.loads(note.payload)["job_id"] == running
    row = job_row(db, running)
    assert row["state"] == "running" and row["cancel_requested_at"] is not None
    assert f"by {getpass.getuser()}; the job ends cancelled" in tide(
        db_url, "job", "status", str(running)).stdout
    again = tide(db_url, "job", "cancel", str(later), check=False)
    assert again.returncode == 1 and again.stderr.endswith(
        f"tide: job {later} is cancelled; nothing to cancel\n")
    assert tide(db_url, "job", "retry", str(later)).stdout == f"job {later} is available again\n"
    assert job_row(db, later)["retried_by"] == getpass.getuser()


def test_enqueue_errors_are_one_line_and_exit_1(db_url: str) -> None:
    unknown = tide(db_url, "job", "enqueue", "nope.Nothing", "--args", "{}", check=False)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "unknown job nope.Nothing" in unknown.stderr and "tide db sync" in unknown.stderr
    bad = tide(db_url, "job", "enqueue", "tests.Echo", "--args", '{"key": 1}', check=False)
    assert bad.returncode == 1 and "field key" in bad.stderr
    delayed = tide(db_url, "job", "enqueue", "tests.Echo", "--args", '{"key": "d"}',
                   "--delay", "10m", "--priority", "5")
    with psycopg.connect(db_url) as conn:
        row = job_row(conn, int(delayed.stdout))
        assert row["priority"] == 5 and row["run_at"] > row["created_at"]


def test_migrations_are_idempotent_and_safe_concurrently(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS atl_migrate")
        conn.execute("CREATE DATABASE atl_migrate")
    url = url_for(admin_url, "atl_migrate")
    try:
        procs = [subprocess.Popen([str(BIN / "tide"), "--database-url", url, "db", "migrate"],
                                  cwd=ROOT, stderr=subprocess.PIPE) for _ in range(3)]
        outputs = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        with psycopg.connect(url) as conn:
            assert migrate(conn) == []
            versions = [r[0] for r in conn.execute("SELECT version FROM atlantis.schema_migrations")]
            assert versions == [v for v, _, _ in migrations()]
        sync = tide(url, "db", "sync", "--app", "tests.apps.basic:registry")
        assert "synced" in sync.stderr
        with psycopg.connect(url) as conn:
            assert atlantis.enqueue(conn, "tests.Echo", {"key": "m"}) > 0
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS atl_migrate WITH (FORCE)")


def test_bad_app_for_sync_exits_2(db_url: str) -> None:
    out = tide(db_url, "db", "sync", "--app", "no.such.module:registry", check=False)
    assert out.returncode == 2 and "no module named" in out.stderr


def test_async_enqueue_twins(db_url: str) -> None:
    async def go() -> tuple[int, list[int]]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            one = await atlantis.enqueue_async(conn, "tests.Echo", {"key": "x"})
            many = await atlantis.enqueue_many_async(conn, "tests.Echo", [{"key": "y"}, {"key": "z"}])
            with pytest.raises(atlantis.ValidationError):
                await atlantis.enqueue_async(conn, "tests.Echo", {"nope": 1})
            await conn.commit()
            return one, many

    one, many = asyncio.run(go())
    with psycopg.connect(db_url) as conn:
        assert [job_row(conn, i)["args"]["key"] for i in (one, *many)] == ["x", "y", "z"]


def test_unknown_queue_exits_1(db_url: str) -> None:
    for args in (("job", "list", "--queue", "nope"), ("dlq", "list", "--queue", "nope")):
        out = tide(db_url, *args, check=False)
        assert out.returncode == 1 and "unknown queue 'nope'" in out.stderr and out.stdout == ""
    assert tide(db_url, "job", "list", "--queue", "typed").returncode == 0  # declared, no jobs yet


def test_watch_follows_a_job_until_it_finishes(db: psycopg.Connection[Any], db_url: str,
                                               supervise: Any) -> None:
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": "watch", "seconds": 1.5, "checkpoint": True})
    supervise(concurrency=1)
    out = tide(db_url, "job", "watch", str(job_id), "--interval", "200ms")
    assert "running" in out.stdout and "sleeping" in out.stdout
    assert "state      complete" in out.stdout


JOB_COLUMNS = ["id", "job", "queue", "args", "state", "attempt", "max_attempts", "priority",
               "run_at", "timeout", "heartbeat", "claimed_by", "claimed_until", "progress_pct",
               "progress_msg", "progress_at", "last_error", "errors", "error_count", "created_at",
               "started_at", "finished_at", "backoff", "unique_key", "cancel_requested_at",
               "cancelled_by", "retried_by", "retried_at", "progress_history", "run",
               "workflow_id", "step", "compensation", "result", "limit_group", "trace_context",
               "run_id", "suspended_for", "parent_id"]
COMPUTED = ["stall_after", "stalled", "rate", "eta_seconds"]


def table_columns(conn: psycopg.Connection[Any]) -> set[str]:
    return {r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = 'atlantis' AND table_name = 'jobs'")}


def test_status_json_has_every_column_and_the_bounded_error_history(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "errs"})
    for n in range(1, 26):
        db.execute("UPDATE atlantis.jobs SET errors = atlantis.errors_append(errors, "
                   "jsonb_build_object('attempt', %(n)s::int)), error_count = error_count + 1, "
                   "last_error = 'boom ' || %(n)s WHERE id = %(id)s", {"n": n, "id": job_id})
    doc = orjson.loads(tide(db_url, "job", "status", str(job_id), "--json").stdout)
    assert list(doc) == [*JOB_COLUMNS, *COMPUTED, "attempts", "held", "no_handler", "warning",
                         "handler_steps",
                         "suspended_until", "children", "holder_silent",
                         "holder_silent_seconds", "lease_ends_in_seconds"]
    assert table_columns(db) <= set(doc)  # a column added to atlantis.jobs must show here
    assert doc["error_count"] == 25 and [e["attempt"] for e in doc["errors"]] == list(range(6, 26))
    assert doc["timeout"] == 30.0 and doc["args"] == {"key": "errs", "value": None}
    text = tide(db_url, "job", "status", str(job_id)).stdout
    assert "error      boom 25" in text and "attempt 0/" in text
    assert "failures   25 in all (the last 20 kept in errors)" in text


def test_retry_a_dead_job_and_refuse_the_rest(db: psycopg.Connection[Any], db_url: str) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "dead"})
    db.execute("UPDATE atlantis.jobs SET state = 'dead', attempt = max_attempts, "
               "started_at = now(), finished_at = now() WHERE id = %s", (job_id,))
    dead = orjson.loads(tide(db_url, "dlq", "list", "--json").stdout)
    assert [r["id"] for r in dead] == [job_id] and dead[0]["state"] == "dead"
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN atlantis_jobs")
        assert tide(db_url, "job", "retry", str(job_id)).stdout == f"job {job_id} is available again\n"
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["tests"]
    row = job_row(db, job_id)
    assert row["state"] == "available" and row["attempt"] == 0 and row["finished_at"] is None
    again = tide(db_url, "job", "retry", str(job_id), check=False)
    assert again.returncode == 1 and "only dead or cancelled" in again.stderr
    for args in (("job", "retry", "999999"), ("job", "cancel", "999999")):
        missing = tide(db_url, *args, check=False)
        assert missing.returncode == 1 and "no job with id 999999" in missing.stderr


def test_listing_options_are_checked(db_url: str) -> None:
    out = tide(db_url, "job", "list", "--limit", "-1", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    watch = tide(db_url, "job", "watch", "1", "--interval", "nan", check=False)
    assert watch.returncode == 2 and "not a finite number" in watch.stderr
    assert "Traceback" not in watch.stderr


# ---- issue 8: tide in full --------------------------------------------------------------

def running_with_history(db: psycopg.Connection[Any], *, key: str = "imp") -> int:
    """A running attempt 2 of tests.Sleep, 10 minutes in at 1.5%/30s (3%/min), 30% done
    just now, with its first attempt in the timeline."""
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": key, "seconds": 60.0})
    db.execute("""
        UPDATE atlantis.jobs
           SET state = 'running', attempt = 2, claimed_by = 'web-1:4321:feedf00d',
               claimed_until = now() + heartbeat, started_at = now() - interval '10 minutes',
               progress_pct = 30, progress_msg = 'page=30 contacts=3000', progress_at = now(),
               progress_history = (
                   SELECT jsonb_agg(jsonb_build_object(
                              'at', now() - interval '10 minutes' + make_interval(secs => i * 30),
                              'pct', i * 1.5) ORDER BY i)
                     FROM generate_series(0, 19) AS i)
         WHERE id = %s""", (job_id,))
    db.execute("""
        INSERT INTO atlantis.attempts (job_id, attempt, worker, host, pid, child_pid, started_at,
                                       finished_at, outcome, error_kind, log_lines, log_dropped)
        VALUES (%s, 1, 'web-2:99:00000000', 'web-2', 99, 100, now() - interval '1 hour',
                now() - interval '50 minutes', 'failed', 'exception', 12, 3)""", (job_id,))
    return job_id


def test_status_of_a_running_job_shows_rate_eta_holder_and_timeline(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    job_id = running_with_history(db)
    text = tide(db_url, "job", "status", str(job_id)).stdout
    assert "state      running  attempt 2/2\n" in text  # not stalled: a checkpoint just now
    assert "page=30 contacts=3000  (" in text
    assert "rate       3.0%/min  ETA 2" in text  # 70% left at 3%/min: 23m20s
    assert "holder     web-1 pid 4321  (web-1:4321:feedf00d)" in text
    # The lease was renewed "just now" with a 3 s heartbeat: a slow tide may see it about to
    # expire ("expires just now") or expired.
    assert ("lease      expires " in text or "lease      expired " in text) \
        and ", renewed " in text
    assert "checkpoint " in text and " ago; stalled after 9s" in text
    assert "attempts   #1  started 1h ago, ran 10m  failed (exception)  web-2 pid 99 child 100" \
        "  12 log lines (3 dropped)" in text
    assert "           #2  started 10m" in text and "running  web-1 pid 4321" in text
    assert "\x1b[" not in text  # no colour in a pipe
    doc = orjson.loads(tide(db_url, "job", "status", str(job_id), "--json").stdout)
    assert doc["rate"] == pytest.approx(3.0) and doc["stalled"] is False
    assert 20 * 60 < doc["eta_seconds"] <= 70 / 3 * 60 + 1  # 23m20s from the last checkpoint
    assert doc["stall_after"] == 9.0 and len(doc["progress_history"]) == 20
    (first,) = doc["attempts"]
    assert first["outcome"] == "failed" and first["host"] == "web-2" and first["child_pid"] == 100


def test_a_stalled_job_is_flagged_in_status_list_and_queue_stats(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    quiet = atlantis.enqueue(db, "tests.Sleep", {"key": "quiet", "seconds": 60.0})
    make_running(db, quiet)
    db.execute("UPDATE atlantis.jobs SET started_at = now() - interval '1 minute' WHERE id = %s",
               (quiet,))
    busy = running_with_history(db, key="busy")
    def checkpoint_busy() -> None:  # "busy" checkpoints now: not stalled however slow tide is
        db.execute("UPDATE atlantis.jobs SET progress_at = now() WHERE id = %s", (busy,))

    text = tide(db_url, "job", "status", str(quiet)).stdout
    assert "STALLED" in text and "since the claim (no checkpoint yet); stalled after 9s" in text
    checkpoint_busy()
    listed = {r["id"]: r for r in orjson.loads(tide(db_url, "job", "list", "--json").stdout)}
    assert listed[quiet]["stalled"] is True and listed[busy]["stalled"] is False
    checkpoint_busy()
    only = orjson.loads(tide(db_url, "job", "list", "--stalled", "--json").stdout)
    assert [r["id"] for r in only] == [quiet]
    assert "running STALLED" in tide(db_url, "job", "list").stdout
    checkpoint_busy()
    stats = {q["queue"]: q for q in orjson.loads(tide(db_url, "queue", "stats", "--json").stdout)}
    assert stats["tests"]["stalled"] == 1 and stats["tests"]["running"] == 2


def test_listings_json_have_every_column_and_the_computed_ones(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    dead = atlantis.enqueue(db, "tests.Fail", {"key": "dlq", "mode": "raise"})
    make_dead(db, dead)
    running = running_with_history(db)
    columns = table_columns(db)
    for args in (("job", "list", "--json"), ("dlq", "list", "--json")):
        rows = orjson.loads(tide(db_url, *args).stdout)
        assert rows and all(list(r) == [*JOB_COLUMNS, *COMPUTED] for r in rows), args
        assert all(columns <= set(r) for r in rows)
    (row,) = orjson.loads(tide(db_url, "dlq", "list", "--json").stdout)
    assert row["id"] == dead and row["args"] == {"key": "dlq", "mode": "raise", "code": 7}
    assert row["errors"][0]["message"] == "ValueError: boom" and row["progress_at"] is not None
    assert row["claimed_by"] == "host-a:1:aa" and row["rate"] is None and row["eta_seconds"] is None
    listed = {r["id"]: r for r in orjson.loads(tide(db_url, "job", "list", "--json").stdout)}
    assert listed[running]["rate"] == pytest.approx(3.0) and listed[running]["eta_seconds"] > 0


def test_human_tables_have_readable_headers_and_relative_times(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    atlantis.enqueue(db, "tests.Echo", {"key": "soon"}, delay=180)
    dead = atlantis.enqueue(db, "tests.Fail", {"key": "gone", "mode": "raise"})
    make_dead(db, dead)
    running_with_history(db)
    lines = tide(db_url, "job", "list").stdout.splitlines()
    assert lines[0].split() == ["ID", "JOB", "QUEUE", "STATE", "ATTEMPT", "PROGRESS", "ETA", "WHEN",
                                "MESSAGE", "LAST", "ERROR"]
    text = "\n".join(lines)
    assert "due in 2m5" in text or "due in 3m" in text
    assert "[###-------]  30%" in text and "started 10m" in text and "ValueError: boom" in text
    assert all(line == line.rstrip() for line in lines)
    dlq = tide(db_url, "dlq", "list").stdout.splitlines()
    assert dlq[0].split() == ["ID", "JOB", "QUEUE", "ATTEMPTS", "DIED", "FAILURES", "LAST", "ERROR"]
    assert "just now" in dlq[1] or "s ago" in dlq[1]
    stats = tide(db_url, "queue", "stats").stdout
    assert "oldest_waiting_seconds" not in stats and "OLDEST" in stats


def test_queue_stats_lists_declared_queues_pauses_and_unserved_ones(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    atlantis.enqueue(db, "tests.Echo", {"key": "w"})
    atlantis.enqueue(db, "tests.Echo", {"key": "n"}, queue="nobody")
    atlantis.enqueue(db, "tests.Echo", {"key": "l"}, queue="later", delay=3600)
    assert tide(db_url, "queue", "pause", "tests", "--reason", "upstream down").stdout == \
        "queue tests paused\n"
    stats = {q["queue"]: q for q in orjson.loads(tide(db_url, "queue", "stats", "--json").stdout)}
    assert stats["typed"]["declared"] and stats["typed"]["available"] == 0  # declared, empty
    assert stats["tests"]["paused"] and stats["tests"]["paused_reason"] == "upstream down"
    assert stats["tests"]["paused_by"] == getpass.getuser() and stats["tests"]["unserved"]
    assert stats["nobody"]["unserved"] and not stats["nobody"]["declared"]
    assert stats["nobody"]["oldest_waiting_seconds"] >= 0
    assert not stats["later"]["unserved"] and stats["later"]["due"] == 0  # nothing due yet
    text = tide(db_url, "queue", "stats").stdout
    tests_line = next(line for line in text.splitlines() if line.startswith("tests "))
    assert "paused: upstream down" in tests_line and "no live supervisor" in tests_line
    db.execute("INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, expires_at) "
               "VALUES ('h:1:aa', 'h', 1, '{tests}', 2, now() + interval '1 minute')")
    assert tide(db_url, "queue", "resume", "tests").stdout == "queue tests resumed\n"
    assert tide(db_url, "queue", "resume", "tests").stdout == "queue tests was not paused\n"
    stats = {q["queue"]: q for q in orjson.loads(tide(db_url, "queue", "stats", "--json").stdout)}
    assert not stats["tests"]["paused"] and not stats["tests"]["unserved"]
    assert stats["tests"]["supervisors"] == 1
    unknown = tide(db_url, "queue", "pause", "nope", check=False)
    assert unknown.returncode == 1 and unknown.stderr.splitlines()[-1].startswith(
        "tide: unknown queue 'nope'")


def test_queue_counts_are_exact_up_to_the_cap_and_estimates_beyond(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    """The overview never counts every row: above the cap a count is the planner's
    estimate, flagged approximate; the oldest due job is found across priorities."""
    atlantis.enqueue_many(db, "tests.Echo", [{"key": f"k{i}"} for i in range(12)])
    atlantis.enqueue(db, "tests.Echo", {"key": "urgent"}, priority=-5)
    atlantis.enqueue(db, "tests.Echo", {"key": "later"}, delay=3600)
    db.execute("UPDATE atlantis.jobs SET run_at = now() - interval '1 hour'"
               " WHERE args->>'key' = 'k3'")
    db.execute("ANALYZE atlantis.jobs")
    (exact,) = [q for q in fleet.queue_stats(db) if q.queue == "tests"]
    assert (exact.available, exact.due, exact.approximate) == (14, 13, [])
    assert exact.oldest_waiting_seconds is not None
    assert 3590 <= exact.oldest_waiting_seconds <= 3700  # k3, at priority 0 behind "urgent"
    (capped,) = [q for q in fleet.queue_stats(db, cap=5) if q.queue == "tests"]
    assert capped.approximate == ["available", "due"]
    assert capped.available >= 6 and capped.due == 6  # the planner's, never below cap + 1
    assert capped.oldest_waiting_seconds == pytest.approx(exact.oldest_waiting_seconds, abs=5)
    assert capped.dead == 0 and capped.complete == 0
    (cli,) = [q for q in orjson.loads(tide(db_url, "queue", "stats", "--json").stdout)
              if q["queue"] == "tests"]
    assert cli["approximate"] == [] and cli["available"] == 14


def test_worker_list_shows_in_flight_jobs_and_memory(db: psycopg.Connection[Any],
                                                     db_url: str) -> None:
    db.execute("""
        INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, in_flight, expires_at, jobs)
        VALUES ('web-1:77:cafe0001', 'web-1', 77, '{tests,typed}', 4, 2,
                now() + interval '1 minute',
                '[{"job_id": 5, "attempt": 1, "child_pid": 501, "rss": 104857600},
                  {"job_id": 6, "attempt": 2, "child_pid": 502, "rss": 52428800}]')""")
    (doc,) = orjson.loads(tide(db_url, "worker", "list", "--json").stdout)
    assert doc["memory"] == 150 * 1024 * 1024 and doc["in_flight"] == 2
    assert [j["job_id"] for j in doc["jobs"]] == [5, 6] and doc["expires_at"]
    lines = tide(db_url, "worker", "list").stdout.splitlines()
    assert lines[0].split()[:2] == ["HOST", "PID"] and "IN FLIGHT" in lines[0]
    assert "tests,typed" in lines[1] and "2/4" in lines[1] and "150MB" in lines[1]
    assert "#5/1 pid 501 100MB, #6/2 pid 502 50MB" in lines[1]
    assert "web-1:77:cafe0001" in lines[1]  # as written: no emoji, no markup


def test_retry_refused_for_a_taken_unique_key_is_one_line(db: psycopg.Connection[Any],
                                                          db_url: str) -> None:
    first = atlantis.enqueue(db, "tests.Typed", {"name": "same"})
    make_dead(db, first)
    holder = atlantis.enqueue(db, "tests.Typed", {"name": "same"})
    out = tide(db_url, "job", "retry", str(first), check=False)
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1].startswith(
        f"tide: job {holder} (tests.Typed) already holds the unique key")


def insert_logs(db: psycopg.Connection[Any], job_id: int, attempt: int, *lines: str,
                stream: str = "stdout") -> None:
    for line in lines:
        db.execute("INSERT INTO atlantis.logs (job_id, attempt, stream, line) VALUES (%s, %s, %s, %s)",
                   (job_id, attempt, stream, line))


def test_job_logs_prints_an_attempts_lines(db: psycopg.Connection[Any], db_url: str) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "logs"})
    none = tide(db_url, "job", "logs", str(job_id))
    assert none.stdout == "" and "has no log lines" in none.stderr
    make_dead(db, job_id)  # one attempt (max_attempts 1)
    insert_logs(db, job_id, 1, "first [red]line[/red] :1234:", "second")
    insert_logs(db, job_id, 1, "oops", stream="stderr")
    out = tide(db_url, "job", "logs", str(job_id)).stdout.splitlines()
    assert [line.split(" ", 3)[2:] for line in out] == [
        ["stdout", "first [red]line[/red] :1234:"], ["stdout", "second"], ["stderr", "oops"]]
    docs = [orjson.loads(line) for line in tide(db_url, "job", "logs", str(job_id), "--json",
                                                "--attempt", "1").stdout.splitlines()]
    assert [(d["job_id"], d["attempt"], d["stream"], d["line"]) for d in docs] == [
        (job_id, 1, "stdout", "first [red]line[/red] :1234:"), (job_id, 1, "stdout", "second"),
        (job_id, 1, "stderr", "oops")]
    assert datetime.fromisoformat(docs[0]["at"]).tzinfo is not None
    missing = tide(db_url, "job", "logs", str(job_id), "--attempt", "5", check=False)
    assert missing.returncode == 1 and "has no attempt 5 (it has had 1)" in missing.stderr
    unknown = tide(db_url, "job", "logs", "987654", check=False)
    assert unknown.returncode == 1 and "no job with id 987654" in unknown.stderr


def test_job_logs_defaults_to_the_running_attempt(db: psycopg.Connection[Any], db_url: str) -> None:
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": "two", "seconds": 1.0})
    insert_logs(db, job_id, 1, "from the first attempt")
    make_running(db, job_id)
    make_running(db, job_id)  # attempt 2, no lines yet
    out = tide(db_url, "job", "logs", str(job_id))
    assert out.stdout == "" and "attempt 2 of job" in out.stderr
    insert_logs(db, job_id, 2, "from the second")
    assert tide(db_url, "job", "logs", str(job_id)).stdout.endswith("from the second\n")
    assert tide(db_url, "job", "logs", str(job_id), "--attempt", "1").stdout.endswith(
        "from the first attempt\n")


def test_job_logs_follow_streams_until_the_attempt_ends(db: psycopg.Connection[Any],
                                                        db_url: str) -> None:
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": "follow", "seconds": 60.0})
    make_running(db, job_id)
    insert_logs(db, job_id, 1, "one")
    seen: list[str] = []
    with subprocess.Popen([str(BIN / "tide"), "--database-url", db_url, "job", "logs", str(job_id),
                           "--follow"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, cwd=ROOT) as proc:
        reader = threading.Thread(target=lambda: seen.extend(proc.stdout or []), daemon=True)
        reader.start()
        try:
            wait_for(lambda: any(line.endswith(" one\n") for line in seen), message="the first line")
            insert_logs(db, job_id, 1, "two")
            insert_logs(db, job_id, 1, "err", stream="stderr")
            wait_for(lambda: len(seen) == 3, message="lines written while following")
            assert proc.poll() is None  # still following: the attempt runs
            db.execute("UPDATE atlantis.jobs SET state = 'complete', finished_at = now(), "
                       "claimed_until = NULL WHERE id = %s", (job_id,))
            insert_logs(db, job_id, 1, "three")  # written just after the end, as a batch may be
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        reader.join(10)
    assert [line.rstrip("\n").split(" ", 3)[2:] for line in seen] == [
        ["stdout", "one"], ["stdout", "two"], ["stderr", "err"], ["stdout", "three"]]


def test_prune_prints_the_count(db: psycopg.Connection[Any], db_url: str) -> None:
    old = atlantis.enqueue(db, "tests.Echo", {"key": "old"})
    make_dead(db, old)
    db.execute("UPDATE atlantis.jobs SET finished_at = now() - interval '10 days' WHERE id = %s",
               (old,))
    recent = atlantis.enqueue(db, "tests.Echo", {"key": "recent"})
    make_dead(db, recent)
    waiting = atlantis.enqueue(db, "tests.Echo", {"key": "waiting"})
    assert tide(db_url, "job", "prune", "--older-than", "7d", "--state", "complete").stdout == "0\n"
    out = tide(db_url, "job", "prune", "--older-than", "7d")
    assert out.stdout == "1\n" and "pruned 1" in out.stderr
    remaining = {r[0] for r in db.execute("SELECT id FROM atlantis.jobs")}
    assert remaining == {recent, waiting}


def test_prune_options_are_checked(db_url: str) -> None:
    out = tide(db_url, "job", "prune", "--older-than", "soon", check=False)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "--older-than" in out.stderr and "invalid duration 'soon'" in out.stderr
    out = tide(db_url, "job", "prune", "--older-than", "1d", "--state", "running", check=False)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_enqueue_to_a_queue_nobody_serves_warns_and_still_enqueues(db: psycopg.Connection[Any],
                                                                   db_url: str) -> None:
    out = tide(db_url, "job", "enqueue", "tests.Echo", "--args", '{"key": "q"}', "--queue", "tset")
    assert job_row(db, int(out.stdout))["queue"] == "tset"
    assert "warning: no declaration names queue 'tset' and no supervisor has served it" in out.stderr
    again = tide(db_url, "job", "enqueue", "tests.Echo", "--args", '{"key": "q"}', "--queue", "tset")
    assert "warning" in again.stderr  # a waiting job does not make the queue served
    declared = tide(db_url, "job", "enqueue", "tests.Echo", "--args", '{"key": "q"}',
                    "--queue", "typed")
    assert "warning" not in declared.stderr
    plain = tide(db_url, "job", "enqueue", "tests.Echo", "--args", '{"key": "q"}')
    assert "warning" not in plain.stderr


COMMANDS = [("job", "list"), ("dlq", "list"), ("queue", "stats"), ("worker", "list"),
            ("job", "status", "1"), ("job", "logs", "1"), ("job", "cancel", "1"),
            ("job", "retry", "1"), ("queue", "pause", "q"), ("job", "list", "--json"),
            ("job", "enqueue", "tests.Echo", "--args", "{}")]


@pytest.fixture
def empty_db_url(admin_url: str) -> Any:
    name = f"atl_empty_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    yield url_for(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_missing_schema_is_one_line_and_exit_1(empty_db_url: str) -> None:
    for args in COMMANDS:
        out = tide(empty_db_url, *args, check=False)
        assert out.returncode == 1, (args, out.stderr)
        assert "Traceback" not in out.stderr, args
        last = out.stderr.strip().splitlines()
        assert last[0].startswith("atlantis: using database"), (args, out.stderr)
        if "--json" in args:  # the error as a JSON object on stdout (issue 36)
            assert len(last) == 1 and orjson.loads(out.stdout) == {
                "error": "the atlantis schema is missing; run `tide db migrate`",
                "kind": "database"}, args
            continue
        assert out.stdout == "" and len(last) == 2, (args, out.stderr)
        assert last[1] == "tide: the atlantis schema is missing; run `tide db migrate`", args


def test_an_old_schema_says_which_version(db: psycopg.Connection[Any], db_url: str) -> None:
    latest = migrations()[-1][0]
    db.execute("DROP FUNCTION atlantis.cancel(bigint, text)")
    db.execute("DELETE FROM atlantis.schema_migrations WHERE version >= 5")
    out = tide(db_url, "job", "cancel", "1", check=False)
    assert out.returncode == 1 and out.stderr.splitlines()[-1] == (
        f"tide: the atlantis schema is at version 4, this tide needs {latest}; run `tide db migrate`")


def test_usage_errors_are_one_line_and_exit_2(db_url: str) -> None:
    for args in (("job", "list", "--bogus"), ("job", "lst"), ("job", "status"),
                 ("job", "status", "x"), ("queue", "stats", "--json", "extra"),
                 ("job", "logs", "1", "--attempt", "0")):
        out = tide(db_url, *args, check=False)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        if "--json" in args:  # the error as a JSON object on stdout (issue 36)
            lines, doc = out.stdout.strip().splitlines(), orjson.loads(out.stdout)
            assert out.stderr == "" and doc["kind"] == "usage", (args, out.stdout)
            lines = [f"tide: {doc['error']}"]
        assert len(lines) == 1 and lines[0].startswith("tide: "), (args, out.stderr)
        assert "--help`)" in lines[0], lines[0]
    done = subprocess.run([str(BIN / "atlantis-supervise"), "--bogus"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "atlantis-supervise: No such option '--bogus'. (see `atlantis-supervise --help`)"]
    helped = tide(db_url, "job", "--help")
    assert "Usage:" in helped.stdout and helped.returncode == 0


# ---- pure: how times and progress read ------------------------------------------------------

def test_short_durations_and_relative_times() -> None:
    from atlantis.cli.render import progress_bar, relative, short_duration

    assert [short_duration(s) for s in (0, 0.25, 4, 59.6, 60, 192, 3600, 7500, 93600, 90061)] == [
        "0s", "250ms", "4s", "1m", "1m", "3m12s", "1h", "2h5m", "1d2h", "1d1h"]
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert relative(now - timedelta(seconds=12), now) == "12s ago"
    assert relative(now + timedelta(minutes=3), now) == "in 3m"
    assert relative(now + timedelta(milliseconds=300), now) == "just now"
    assert relative(None, now) == "-"
    assert progress_bar(31, 10) == "[###-------]  31%"
    assert progress_bar(None, 4) == "[----]   0%" and progress_bar(250, 4) == "[####] 100%"
