"""Through PgBouncer in transaction mode (Debian's 1.18: no prepared statements there).

Enqueue from Python (single, batch, async) and SQL, a supervisor with its LISTEN over a
direct URL, polling only (``--no-listen``), or finding out that its LISTEN goes through the
pooler; and a PostgreSQL restart behind the pooler. Callers' connections keep psycopg's
default ``prepare_threshold`` here: what atlantis sends on them must prepare nothing.
Skipped with one line when ``/usr/sbin/pgbouncer`` is missing (``scripts/test`` installs it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import atlantis
from chaos.server import scratch_root
from tests.conftest import (
    Supervisor,
    events,
    prepare_template,
    run_tide,
    url_for,
    wait_for,
    wait_state,
)
from tests.pgbouncer import (
    Bouncer,
    pgbouncer,
    restart_server,
    server_pid,
    start_server,
    stop_server,
)

OPS = "tests.apps.ops:registry"


@pytest.fixture(scope="module")
def bouncer(admin_url: str) -> Iterator[Bouncer]:
    with pgbouncer(admin_url) as b:
        yield b


def _prepared(conn: psycopg.Connection[Any]) -> int:
    """Statements prepared on ``conn``'s own server session (pg_prepared_statements is per
    session: asked on the same connection)."""
    row = conn.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False).fetchone()
    assert row is not None
    return int(row[0])


def _flaky(i: int) -> dict[str, str]:
    return {"key": f"f{i}", "mode": "flaky"}


# ---- callers' connections ---------------------------------------------------------------------

def test_statements_on_a_callers_connection_are_never_prepared(db_url: str) -> None:
    """Direct, no pooler needed: psycopg would prepare the 5th run of the same statement."""
    with psycopg.connect(db_url) as conn:
        assert conn.prepare_threshold == 5  # psycopg's default: callers keep it
        ids = [atlantis.enqueue(conn, "ops.Long", _flaky(i)) for i in range(12)]
        conn.commit()
        for _ in range(12):
            atlantis.enqueue_many(conn, "ops.Long", [_flaky(100), _flaky(101)])
        with conn.transaction():  # a savepoint each, inside the caller's transaction
            for i in range(12):
                atlantis.enqueue(conn, "ops.Long", _flaky(200 + i))
        for job_id in ids[:8]:
            atlantis.cancel(conn, job_id)
        conn.commit()
        assert _prepared(conn) == 0
        assert not conn._prepared._names  # psycopg's own record of what it prepared


def test_async_statements_on_a_callers_connection_are_never_prepared(db_url: str) -> None:
    async def run() -> int:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for i in range(12):
                await atlantis.enqueue_async(conn, "ops.Long", _flaky(i))
                await atlantis.enqueue_many_async(conn, "ops.Long", [_flaky(i), _flaky(i + 50)])
            cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements",
                                     prepare=False)
            row = await cur.fetchone()
            assert not conn._prepared._names
            return int(row[0]) if row else -1

    assert asyncio.run(run()) == 0


# ---- enqueue through the pooler ---------------------------------------------------------------

def test_enqueue_through_pgbouncer(bouncer: Bouncer, db_url: str,
                                   db: psycopg.Connection[Any]) -> None:
    pooled = bouncer.url(db_url)
    with psycopg.connect(pooled, autocommit=True) as conn:  # prepare_threshold 5, as callers
        single = [atlantis.enqueue(conn, "ops.Long", _flaky(i)) for i in range(12)]
        batches = [atlantis.enqueue_many(conn, "ops.Long", [_flaky(i), _flaky(i + 1)])
                   for i in range(12)]
        for job_id in single[:6]:
            atlantis.cancel(conn, job_id)
    with psycopg.connect(pooled) as conn:  # in the caller's transactions, committed
        for i in range(12):
            with conn.transaction():
                atlantis.enqueue(conn, "ops.Long", _flaky(300 + i))
    with psycopg.connect(pooled) as conn:  # rolled back with the caller's transaction
        atlantis.enqueue(conn, "ops.Long", _flaky(999))
        conn.rollback()
    # SQL, as other languages and triggers do it; PgBouncer 1.18 wants no prepared
    # statements from any client, so this one's connection prepares none.
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as conn:
        sql = [conn.execute("SELECT atlantis.enqueue('ops.Long', %s::jsonb)",
                            (psycopg.types.json.Jsonb(_flaky(400 + i)),)).fetchone()
               for i in range(12)]
    assert all(row is not None for row in sql)
    row = db.execute("SELECT count(*) FILTER (WHERE state = 'cancelled'), count(*), "
                     "count(*) FILTER (WHERE args->>'key' = 'f999') FROM atlantis.jobs").fetchone()
    assert row == (6, 12 + 24 + 12 + 12, 0)
    assert len({i for b in batches for i in b}) == 24


def test_async_enqueue_through_pgbouncer(bouncer: Bouncer, db_url: str,
                                         db: psycopg.Connection[Any]) -> None:
    pooled = bouncer.url(db_url)

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(pooled, autocommit=True) as conn:
            for i in range(12):
                await atlantis.enqueue_async(conn, "ops.Long", _flaky(i))
                await atlantis.enqueue_many_async(conn, "ops.Long", [_flaky(i), _flaky(i + 50)])
        async with await psycopg.AsyncConnection.connect(pooled) as conn:
            for i in range(12):
                async with conn.transaction():
                    await atlantis.enqueue_async(conn, "ops.Long", _flaky(100 + i))

    asyncio.run(run())
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (48,)


def test_a_pooler_is_told_apart_from_a_direct_connection(bouncer: Bouncer, db_url: str) -> None:
    """The supervisor's connections prepare what they repeat, except through a pooler."""
    from atlantis.supervisor import pooler

    async def run(url: str, declared: bool) -> tuple[bool, int | None]:
        conn, pooled = await pooler.connect(url, "test", 5.0, pooled=declared)
        async with conn:
            return pooled, conn.prepare_threshold

    assert asyncio.run(run(db_url, False)) == (False, pooler.PREPARE_THRESHOLD)
    assert asyncio.run(run(bouncer.url(db_url), False)) == (True, None)
    assert asyncio.run(run(db_url, True)) == (True, None)  # --pooled: not even asked


def test_tide_through_pgbouncer(bouncer: Bouncer, db_url: str) -> None:
    pooled = bouncer.url(db_url)
    tide = ["--database-url", pooled]
    # The same statements, six times, each command on a connection of its own through the
    # pooler (tide in-process: tests/conftest.py:run_tide): nothing prepared may be left behind.
    for _ in range(6):
        out = run_tide([*tide, "job", "enqueue", "ops.Long", "--args",
                        '{"key": "t", "mode": "flaky"}'], check=False)
        assert out.returncode == 0, out.stderr
        status = run_tide([*tide, "job", "status", out.stdout.strip()], check=False)
        assert status.returncode == 0, status.stderr


# ---- a supervisor through the pooler ----------------------------------------------------------

def _kinds(db: psycopg.Connection[Any], key: str) -> list[str]:
    return [e[2] for e in events(db, key)]


@pytest.mark.parametrize("mode", ["listen-direct", "no-listen", "listen-pooled"])
def test_a_supervisor_through_pgbouncer(bouncer: Bouncer, db_url: str,
                                        db: psycopg.Connection[Any], supervise: Any,
                                        mode: str) -> None:
    """Jobs run, and a cancel and a pause reach the supervisor, whichever way it listens:
    over a direct URL, not at all, or (given nothing else) through the pooler, which it
    finds out and then polls as with --no-listen."""
    pooled = bouncer.url(db_url)
    args = {"listen-direct": ["--listen-database-url", db_url], "no-listen": ["--no-listen"],
            "listen-pooled": []}[mode]
    # The default 1s polls, not the fixture's 0.2s: what a poll-only supervisor really does.
    sup = supervise("--poll-interval", "1s", "--cancel-grace", "2s", *args, queues=("ops",),
                    app=OPS, concurrency=2, database_url=pooled)
    with psycopg.connect(pooled, autocommit=True) as conn:
        ids = [atlantis.enqueue(conn, "ops.Long", _flaky(i)) for i in range(10)]
    for job_id in ids:  # each failed once and ran again: claims, finishes, retries
        assert wait_state(db, job_id, "complete", "dead")["state"] == "complete"
    # A cancel: ops.Long's 10 min heartbeat renews its lease every 200 s, so without a
    # NOTIFY only the cancel poll can bring it.
    with psycopg.connect(pooled, autocommit=True) as conn:
        obey = atlantis.enqueue(conn, "ops.Long", {"key": "obey", "mode": "obey"})
        wait_for(lambda: "started" in _kinds(db, "obey"), message="obey to start")
        atlantis.cancel(conn, obey)
    row = wait_state(db, obey, "cancelled")
    assert _kinds(db, "obey") == ["started", "saw-cancel"]
    assert row["errors"][-1]["kind"] == "cancelled"
    # A pause and a resume.
    with psycopg.connect(pooled, autocommit=True) as conn:
        conn.execute("SELECT atlantis.pause('ops', 'through the pooler')", prepare=False)
        wait_for(lambda: "queue ops is paused" in sup.log(), message="the pause to arrive")
        later = atlantis.enqueue(conn, "ops.Long", _flaky(77))
        conn.execute("SELECT atlantis.resume('ops')", prepare=False)
    wait_for(lambda: "queue ops is resumed" in sup.log(), message="the resume to arrive")
    wait_state(db, later, "complete")
    log = sup.log()
    assert 'prepared statement "' not in log, log  # "... does not exist" / "already exists"
    assert "goes through a connection pooler: no prepared statements" in log
    if mode == "listen-pooled":
        assert "the LISTEN connection goes through a connection pooler" in log
    if mode == "no-listen":
        assert "polling only (--no-listen)" in log
    assert sup.proc.poll() is None


def test_listen_options_are_checked(db_url: str, supervise: Any) -> None:
    sup = supervise("--no-listen", "--listen-database-url", db_url)
    assert sup.wait() == 2
    assert "--listen-database-url and --no-listen exclude each other" in sup.log()
    bad = supervise("--listen-database-url", "host='x password=s3cretpw")
    assert bad.wait() == 2
    assert "--listen-database-url: invalid database URL" in bad.log()
    assert "s3cretpw" not in bad.log()


# ---- a PostgreSQL restart behind the pooler ---------------------------------------------------

def test_a_server_restart_behind_pgbouncer(tmp_path: Path) -> None:
    """A server of the test's own (never the session's shared one), restarted with pg_ctl
    while a supervisor works through the pooler; new work is enqueued through the pooler
    after it, and every job completes. Every process started here is stopped by its pid."""
    from tests.pgbouncer import require_pgbouncer

    require_pgbouncer()
    home = Path(tempfile.mkdtemp(prefix="atl-r-", dir=scratch_root()))
    home.chmod(0o755)
    try:
        admin = start_server(home)
        prepare_template(admin, "atl_restart")
        direct = url_for(admin, "atl_restart")
        with pgbouncer(admin) as b:
            pooled = b.url(direct)
            argv = ["--queue", "ops", "--app", OPS, "--concurrency", "2", "--poll-interval",
                    "0.2s", "--drain-timeout", "5s", "--kill-grace", "2s",
                    "--listen-database-url", direct]
            sup = Supervisor(pooled, tmp_path / "supervisor.log", argv, dict(os.environ))
            try:
                _restart_while_working(home, pooled, direct, sup)
            finally:
                sup.stop(hurry=True)
    finally:
        stop_server(home)
        shutil.rmtree(home, ignore_errors=True)


def _enqueue(pooled: str, keys: range) -> list[int] | None:
    try:
        with psycopg.connect(pooled, autocommit=True, connect_timeout=5) as conn:
            return atlantis.enqueue_many(conn, "ops.Long", [_flaky(i) for i in keys])
    except (psycopg.OperationalError, atlantis.AtlantisError):
        return None  # the server is still coming back


def _done(direct: str, ids: list[int]) -> bool:
    try:
        with psycopg.connect(direct, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM atlantis.jobs WHERE id = ANY(%s) "
                               "AND state = 'complete'", (ids,)).fetchone()
    except psycopg.OperationalError:
        return False
    return row is not None and row[0] == len(ids)


def _restart_while_working(home: Path, pooled: str, direct: str, sup: Supervisor) -> None:
    before = _enqueue(pooled, range(10))
    assert before is not None
    wait_for(lambda: _done(direct, before), timeout=60, message="the first jobs")
    postmaster = server_pid(home)
    restart_server(home)
    assert server_pid(home) not in (None, postmaster)
    # Its direct LISTEN connection sees the restart; the pooled ones may never notice.
    wait_for(lambda: "database connection listen lost" in sup.log(), message="the restart")
    after: list[int] = wait_for(lambda: _enqueue(pooled, range(10, 20)), timeout=60,
                                message="an enqueue through the pooler after the restart")
    wait_for(lambda: _done(direct, after), timeout=60, message="the jobs enqueued after it")
    assert sup.proc.poll() is None
    assert 'prepared statement "' not in sup.log()
    assert conninfo_to_dict(pooled)["host"] == "127.0.0.1"


def test_handler_steps_through_pgbouncer(bouncer: Bouncer, db_url: str, supervise: Any,
                                         ddb: psycopg.Connection[Any]) -> None:
    """Transaction steps and a durable sleep through the pooler in transaction mode: the
    fence, the record and the writes share one transaction, and nothing is prepared."""
    sup = supervise(queues=("durable",), app="tests.apps.durable:registry", concurrency=2,
                    database_url=bouncer.url(db_url))
    pages = atlantis.enqueue(ddb, "durable.Pages", {"key": "pooled", "pages": 4, "hold_at": -9})
    nap = atlantis.enqueue(ddb, "durable.Nap", {"key": "pooled-nap", "seconds": 0.2})
    assert wait_state(ddb, pages, "complete", "dead")["state"] == "complete"
    assert wait_state(ddb, nap, "complete", "dead")["state"] == "complete"
    assert [r[0] for r in ddb.execute(
        "SELECT page FROM durable_effects WHERE key = 'pooled' ORDER BY page")] == [0, 1, 2, 3]
    assert 'prepared statement "' not in sup.log()
