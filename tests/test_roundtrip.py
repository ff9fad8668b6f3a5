"""The walking skeleton: enqueue -> supervise -> complete, with progress, in a child process."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from tests.conftest import BIN, ROOT, events, job_row, wait_state

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix


def test_round_trip_runs_in_a_child_and_records_checkpoints(
    db: psycopg.Connection[Any], db_url: str, supervise: Any
) -> None:
    with db.transaction():
        job_id = atlantis.enqueue(db, "tests.Checkpoints", {"key": "rt", "count": 3,
                                                            "pct": 87.5, "msg": "last step"})
    sup = supervise()
    row = wait_state(db, job_id, "complete")
    assert row["attempt"] == 1
    assert row["progress_pct"] == 88  # 87.5 rounds half away from zero
    assert row["progress_msg"] == "last step"
    assert row["progress_at"] is not None
    assert row["finished_at"] is not None and row["started_at"] is not None
    ((jid, attempt, event, pid),) = events(db, "rt")
    assert (jid, attempt, event) == (job_id, 1, "errors=0")
    assert pid not in (sup.pid, os.getpid())

    out = subprocess.run(
        [str(BIN / "tide"), "--database-url", db_url, "job", "status", str(job_id), "--json"],
        capture_output=True, check=True, cwd=ROOT,
    )
    doc = orjson.loads(out.stdout)
    assert doc["id"] == job_id
    assert doc["state"] == "complete"
    assert doc["progress_pct"] == 88
    assert doc["progress_msg"] == "last step"
    for column in ("job", "queue", "args", "attempt", "max_attempts", "priority", "run_at",
                   "timeout", "heartbeat", "claimed_by", "claimed_until", "progress_at",
                   "last_error", "errors", "created_at", "started_at", "finished_at"):
        assert column in doc

    text = subprocess.run(
        [str(BIN / "tide"), "--database-url", db_url, "job", "status", str(job_id)],
        capture_output=True, check=True, cwd=ROOT, text=True,
    ).stdout
    assert "complete" in text and "88%" in text and "last step" in text and "#" in text


def test_handler_output_becomes_tagged_log_lines(db: psycopg.Connection[Any], supervise: Any) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "out", "value": "hello-there"})
    sup = supervise()
    wait_state(db, job_id, "complete")
    sup.stop()
    assert f"job={job_id} attempt=1 echo out hello-there" in sup.log()


def test_rolled_back_enqueue_leaves_no_row(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        job_id = atlantis.enqueue(conn, "tests.Echo", {"key": "rb"})
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM atlantis.jobs WHERE id = %s", (job_id,)).fetchone() == (0,)


def test_uncommitted_enqueue_is_invisible_until_commit(db_url: str, db: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url) as conn:
        ids = atlantis.enqueue_many(conn, "tests.Echo", [{"key": "u1"}, {"key": "u2"}])
        assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)
        conn.commit()
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (2,)
    assert ids == sorted(ids) and len(set(ids)) == 2
    assert job_row(db, ids[0])["args"] == {"key": "u1", "value": None}


def test_tide_enqueue_prints_the_id_alone(db_url: str, db: psycopg.Connection[Any]) -> None:
    out = subprocess.run(
        [str(BIN / "tide"), "--database-url", db_url, "job", "enqueue", "tests.Echo",
         "--args", '{"key": "cli"}'],
        capture_output=True, check=True, cwd=ROOT, text=True,
    )
    job_id = int(out.stdout)
    assert out.stdout == f"{job_id}\n"
    assert job_row(db, job_id)["state"] == "available"


@pytest.mark.parametrize("args, field", [
    ({"count": 1}, "name"),
    ({"name": "waytoolongname"}, "name"),
    ({"name": "a", "count": "1"}, "count"),
    ({"name": "a", "count": 1.5}, "count"),
    ({"name": "a", "nope": 1}, "nope"),
    ({"name": "a", "id": "not-a-uuid"}, "id"),
    ({"name": "a", "tags": ["x", 1]}, "tags"),
    ({"name": "a", "flag": "true"}, "flag"),
    ({"name": "a", "ratio": "1.0"}, "ratio"),
])
def test_bad_args_are_refused_naming_job_and_field(
    db_url: str, args: dict[str, Any], field: str
) -> None:
    with psycopg.connect(db_url) as conn:
        with pytest.raises(atlantis.ValidationError) as info:
            atlantis.enqueue(conn, "tests.Typed", args)
        assert "tests.Typed" in str(info.value) and field in str(info.value)
        # The caller's transaction is still usable and nothing was written.
        assert conn.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)


def test_every_type_is_accepted(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Typed", {
        "name": "ok", "count": 3, "big": 2**40, "ratio": 1, "amount": 12.5, "flag": True,
        "id": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "at": "2026-01-01T00:00:00Z",
        "day": "2026-01-01", "extra": {"a": [1]}, "tags": ["x", "y"],
    })
    assert job_row(db, job_id)["queue"] == "typed"


def test_unknown_job_says_how_to_sync(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(atlantis.UnknownJobError, match="tide db sync"):
        atlantis.enqueue(db, "nowhere.Nothing", {})


def test_args_over_the_limit_are_refused(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(atlantis.ValidationError, match="limit"):
        atlantis.enqueue(db, "tests.Echo", {"key": "big", "value": "x" * (1024 * 1024 + 10)})


def test_unique_returns_the_existing_id(db: psycopg.Connection[Any]) -> None:
    first = atlantis.enqueue(db, "tests.Typed", {"name": "same"})
    again = atlantis.enqueue_many(db, "tests.Typed", [{"name": "same"}, {"name": "other"}])
    assert again[0] == first and again[1] != first


def test_sql_enqueue_applies_the_same_rules(db: psycopg.Connection[Any]) -> None:
    row = db.execute("SELECT atlantis.enqueue('tests.Echo', '{\"key\": \"sql\"}'::jsonb)").fetchone()
    assert row is not None
    assert job_row(db, row[0])["max_attempts"] == 1
    with pytest.raises(psycopg.Error, match="field key"):
        db.execute("SELECT atlantis.enqueue('tests.Echo', '{}'::jsonb)")
