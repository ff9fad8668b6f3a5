"""Keys of any length (issue 31, migration 0021), and one row never stops its queue.

A `by` or `unique` value may be anything the args accept (up to 1 MiB), far past what a
btree entry holds (2,704 bytes): every index over a key derived from args holds the key's
digest (``atlantis.key_digest``). The values here are random, so that PostgreSQL cannot
compress them under that size. And a row the claim cannot take ends ``dead`` with error
kind ``claim`` while the rest of its queue runs (``atlantis.claim_isolate``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.declarations import parse_atl
from atlantis.store.migrate import migrate, migrations, sync
from tests.conftest import Supervisor, job_row, url_for, wait_for, wait_state
from tests.test_input_limits import _app_env, _write_app, tide

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix

LIMITED_APP = "tests.apps.limited:registry"

#: A ~4,000-character value and a 100 KB one, neither compressible under a btree entry.
LENGTHS = {"4000": 3000, "100KB": 75000}


def long_value(case: str) -> str:
    return secrets.token_urlsafe(LENGTHS[case])


def enqueue(db_url: str, job: str, args: dict[str, Any], **kw: Any) -> int:
    """`tide job enqueue`: exit 0 and the id alone on stdout."""
    code, out, last = tide(db_url, "job", "enqueue", job, "--args",
                           orjson.dumps(args).decode(), **kw)
    assert code == 0 and out.strip().isdigit(), (code, out, last)
    return int(out)


def spans(db: psycopg.Connection[Any], key: str) -> dict[int, tuple[Any, Any]]:
    """job id: (started, ended) of each job that recorded under ``key``."""
    rows = db.execute("SELECT job_id, min(at) FILTER (WHERE event = 'started'),"
                      " max(at) FILTER (WHERE event = 'ended') FROM test_events"
                      " WHERE key = %s GROUP BY job_id", (key,)).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


# ---- `by` and `unique` values of any length -------------------------------------------------

@pytest.mark.parametrize("case", list(LENGTHS))
def test_a_long_by_value_is_enqueued_by_tide_and_runs_under_its_limit(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        case: str) -> None:
    key = long_value(case)
    ids = [enqueue(db_url, "limited.PerKey", {"key": key, "hold": 0.3}) for _ in range(2)]
    other = enqueue(db_url, "limited.PerKey", {"key": key[:-1] + "!", "hold": 0.3})
    assert len({*ids, other}) == 3
    groups = {g for (g,) in db.execute(
        "SELECT limit_group FROM atlantis.jobs WHERE id = ANY(%s)", (ids,))}
    assert groups == {hashlib.sha256(orjson.dumps([key])).hexdigest()}
    # Operators read the limit with the value clipped (tide job status, the console).
    assert db.execute("SELECT label FROM atlantis.limits_of(%s)", (ids[0],)).fetchall() == [
        (f"concurrency 1 by key={key[:200]}... ({len(key)} characters)",)]
    supervise(queues=("limited",), app=LIMITED_APP, concurrency=3)
    for i in [*ids, other]:
        wait_state(db, i, "complete")
    (a_start, a_end), (b_start, b_end) = sorted(spans(db, key).values())
    assert a_end <= b_start, "two jobs of one key ran at once under `concurrency 1 by key`"


KEYS_ATL = """
job Unique in keys {
  args { key text not null }
  unique (key)
  heartbeat 2s
  queue "keys"
}
job Limited in keys {
  args { key text not null }
  %s
  heartbeat 2s
  queue "keys"
}
job Free in keys {
  args { key text not null }
  heartbeat 2s
  queue "keys"
}
"""
KEYS_JOBS = ("keys.Unique", "keys.Limited", "keys.Free")


def keys_app(folder: Path, module: str, limit: str) -> str:
    """An app of the three jobs above (keys.Limited declaring ``limit``) in ``folder``."""
    _write_app(folder, module, KEYS_ATL % limit, KEYS_JOBS)
    return f"{module}:registry"


@pytest.mark.parametrize("case", list(LENGTHS))
def test_a_long_unique_key_is_enqueued_by_tide_and_deduplicated(
        db: psycopg.Connection[Any], db_url: str, tmp_path: Path,
        supervise: Callable[..., Supervisor], case: str) -> None:
    env = _app_env(tmp_path)
    app = keys_app(tmp_path, "keys_unique", "concurrency 1 by key")
    assert tide(db_url, "db", "sync", "--app", app, cwd=tmp_path, env=env)[0] == 0
    key = long_value(case)
    first = enqueue(db_url, "keys.Unique", {"key": key})
    assert enqueue(db_url, "keys.Unique", {"key": key}) == first
    other = enqueue(db_url, "keys.Unique", {"key": key[:-1] + "!"})
    assert other != first
    assert job_row(db, first)["unique_key"] == orjson.dumps([key]).decode()
    supervise(queues=("keys",), app=app, env=env)
    for i in (first, other):
        wait_state(db, i, "complete")
    # Its key is free once it finished: the same key is a new job.
    assert enqueue(db_url, "keys.Unique", {"key": key}) not in (first, other)


def test_a_deploy_declaring_the_limit_succeeds_while_long_keyed_rows_wait(
        db: psycopg.Connection[Any], db_url: str, tmp_path: Path,
        supervise: Callable[..., Supervisor]) -> None:
    env = _app_env(tmp_path)
    old = keys_app(tmp_path, "keys_old", "")
    new = keys_app(tmp_path, "keys_new", "concurrency 1 by key")
    assert tide(db_url, "db", "sync", "--app", old, cwd=tmp_path, env=env)[0] == 0
    key = long_value("4000")
    waiting = enqueue(db_url, "keys.Limited", {"key": key})
    cancelled = enqueue(db_url, "keys.Limited", {"key": key})
    assert tide(db_url, "job", "cancel", str(cancelled))[0] == 0
    code, out, last = tide(db_url, "db", "sync", "--app", new, cwd=tmp_path, env=env)
    assert code == 0, last
    digest = hashlib.sha256(orjson.dumps([key])).hexdigest()
    assert job_row(db, waiting)["limit_group"] == digest
    # Retried after the deploy, it is claimed like any other row of its key.
    assert tide(db_url, "job", "retry", str(cancelled))[0] == 0
    free = enqueue(db_url, "keys.Free", {"key": "x"})
    supervise(queues=("keys",), app=new, env=env)
    for i in (waiting, cancelled, free):
        wait_state(db, i, "complete")


# ---- one row never stops its queue ----------------------------------------------------------

#: How each poison row is written by SQL: a lease no timestamp can hold (now() + heartbeat
#: is past the year 294276), on a job without limits and on a limited one.
POISONS = {"plain": "limited.Free", "limited": "limited.PerKey"}


@pytest.mark.parametrize("case", list(POISONS))
def test_a_row_the_claim_cannot_take_ends_dead_and_the_queue_runs(
        db: psycopg.Connection[Any], supervise: Callable[..., Supervisor], case: str) -> None:
    poison = atlantis.enqueue(db, POISONS[case], {"key": "poison"})
    db.execute("UPDATE atlantis.jobs SET heartbeat = interval '1000000 years' WHERE id = %s",
               (poison,))
    sup = supervise(queues=("limited",), app=LIMITED_APP)
    free = atlantis.enqueue(db, "limited.Free", {"key": "free"})
    wait_state(db, free, "complete", timeout=20)
    row = wait_state(db, poison, "dead", timeout=20)
    assert row["errors"][-1]["kind"] == "claim", row["errors"]
    assert row["last_error"] == ("the claim cannot take this job: timestamp out of range "
                                 "(SQLSTATE 22008)")
    assert row["attempt"] == 0 and row["finished_at"] is not None
    # The supervisor says so, and keeps serving.
    wait_for(lambda: f"job={poison}: ends dead (kind claim)" in sup.log(), 10)
    later = atlantis.enqueue(db, "limited.PerKey", {"key": "later"})
    wait_state(db, later, "complete", timeout=20)
    assert sup.proc.poll() is None


# ---- the migration ----------------------------------------------------------------------------

def test_the_migration_converts_rows_holding_long_keys(admin_url: str) -> None:
    """A database at 0020 holding long keys (compressible ones: those its indexes could
    hold) migrates, and its keys then work as the new ones do."""
    name = f"t_keys_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(url_for(admin_url, name)) as conn:
            _migrate_to(conn, 20)
            _check_converted(conn)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _migrate_to(conn: psycopg.Connection[Any], last: int) -> None:
    """The migrations up to ``last`` only, as a database of that release holds them."""
    conn.execute("CREATE SCHEMA atlantis")
    conn.execute("CREATE TABLE atlantis.schema_migrations (version int PRIMARY KEY,"
                 " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
    for version, file, sql in migrations():
        if version <= last:
            conn.execute(sql)
            conn.execute("INSERT INTO atlantis.schema_migrations (version, name)"
                         " VALUES (%s, %s)", (version, file))
    conn.commit()


def _check_converted(conn: psycopg.Connection[Any]) -> None:
    key = orjson.dumps(["k" * 6000]).decode()  # compressible: 0020's indexes held it
    columns = ("INSERT INTO atlantis.jobs (job, queue, args, state, max_attempts, timeout,"
               " heartbeat, backoff, unique_key, limit_group) VALUES (%s, 'keys', %s, 'available',"
               " 3, '1h', '2s', '1s', %s, %s) RETURNING id")
    args = psycopg.types.json.Jsonb({"key": "k" * 6000})
    unique = conn.execute(columns, ("keys.Unique", args, key, None)).fetchone()
    limited = conn.execute(columns, ("keys.Limited", args, None, key)).fetchone()
    assert unique is not None and limited is not None
    conn.execute("INSERT INTO atlantis.limit_starts (key, job_id, at, until)"
                 " VALUES (%s, %s, now(), now() + interval '1 hour')",
                 ("keys.Limited rate by key=" + key, limited[0]))
    conn.execute("INSERT INTO atlantis.workflow_instances (workflow, args, unique_key)"
                 " VALUES ('keys.Flow', %s, %s)", (args, key))
    conn.commit()

    assert 21 in migrate(conn)
    conn.commit()
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert conn.execute("SELECT unique_key, limit_group FROM atlantis.jobs ORDER BY id"
                        ).fetchall() == [(key, None), (None, digest)]
    assert conn.execute("SELECT key FROM atlantis.limit_starts").fetchall() == [
        (hashlib.sha256(("keys.Limited rate by key=" + key).encode()).hexdigest(),)]
    # The converted rows are found as new ones are: the same unique key is the same job, and
    # the limited row is counted in its group.
    sync(conn, parse_atl(KEYS_ATL % "concurrency 1 by key"))
    conn.commit()
    assert atlantis.enqueue(conn, "keys.Unique", {"key": "k" * 6000}) == unique[0]
    again = atlantis.enqueue(conn, "keys.Limited", {"key": "k" * 6000})
    assert conn.execute("SELECT count(DISTINCT limit_group) FROM atlantis.jobs"
                        " WHERE id = ANY(%s)", ([limited[0], again],)).fetchone() == (1,)
    conn.commit()
