"""`tide` end to end, the schema migrations, and the async enqueue twins."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.store import migrate
from atlantis.store.migrate import migrations
from tests.conftest import BIN, ROOT, events, job_row, url_for, wait_for, wait_state


def tide(db_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "tide"), "--database-url", db_url, *args],
                          capture_output=True, text=True, cwd=ROOT, check=check, timeout=60)


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


def test_cancel_waiting_and_running_jobs(db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    later = atlantis.enqueue(db, "tests.Echo", {"key": "later"}, delay=3600)
    assert "cancelled" in tide(db_url, "job", "cancel", str(later)).stdout
    assert job_row(db, later)["state"] == "cancelled"
    running = atlantis.enqueue(db, "tests.Sleep", {"key": "long", "seconds": 60.0})
    supervise(concurrency=1)
    wait_for(lambda: events(db, "long"), message="the attempt to start")
    assert "stopping it" in tide(db_url, "job", "cancel", str(running)).stdout
    row = wait_state(db, running, "cancelled", timeout=20)
    assert row["finished_at"] is not None
    again = tide(db_url, "job", "cancel", str(running), check=False)
    assert again.returncode == 1 and "nothing to cancel" in again.stderr
    assert "available again" in tide(db_url, "job", "retry", str(running)).stdout


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
    assert "state     complete" in out.stdout


JOB_COLUMNS = ["id", "job", "queue", "args", "state", "attempt", "max_attempts", "priority",
               "run_at", "timeout", "heartbeat", "claimed_by", "claimed_until", "progress_pct",
               "progress_msg", "progress_at", "last_error", "errors", "error_count", "created_at",
               "started_at", "finished_at", "cancel_requested_at"]


def test_status_json_has_every_column_and_the_bounded_error_history(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "errs"})
    for n in range(1, 26):
        db.execute("UPDATE atlantis.jobs SET errors = atlantis.errors_append(errors, "
                   "jsonb_build_object('attempt', %(n)s::int)), error_count = error_count + 1, "
                   "last_error = 'boom ' || %(n)s WHERE id = %(id)s", {"n": n, "id": job_id})
    doc = orjson.loads(tide(db_url, "job", "status", str(job_id), "--json").stdout)
    assert list(doc) == JOB_COLUMNS
    assert doc["error_count"] == 25 and [e["attempt"] for e in doc["errors"]] == list(range(6, 26))
    assert doc["timeout"] == 30.0 and doc["args"] == {"key": "errs", "value": None}
    text = tide(db_url, "job", "status", str(job_id)).stdout
    assert "error     boom 25" in text and "attempt 0/" in text


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
