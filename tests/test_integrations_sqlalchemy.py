"""``atlantis.integrations.sqlalchemy``: enqueue inside a SQLAlchemy 2 transaction.

Real engines on the ``postgresql+psycopg`` dialect against the embedded database: a
committed session leaves a job that another connection sees and a real supervisor runs, a
rolled-back one leaves none, and a refused enqueue leaves the session's transaction usable.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

pytest.importorskip(
    "sqlalchemy", reason="sqlalchemy is not installed (pip install 'sqlalchemy>=2.0'): "
    "the SQLAlchemy integration is not tested")

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg
from sqlalchemy.dialects.postgresql import psycopg2 as pg_psycopg2
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import atlantis
from atlantis.integrations import sqlalchemy as jobs
from tests.conftest import Supervisor, events, wait_state


def sa_url(db_url: str) -> URL:
    """The test database's libpq URL as a ``postgresql+psycopg`` one (a unix socket host)."""
    parts = psycopg.conninfo.conninfo_to_dict(db_url)
    query = {"host": str(parts["host"])} if "host" in parts else {}
    return URL.create("postgresql+psycopg", username=str(parts.get("user") or "") or None,
                      password=str(parts.get("password") or "") or None,
                      database=str(parts["dbname"]),
                      port=int(str(parts["port"])) if "port" in parts else None, query=query)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = create_engine(sa_url(db_url))
    yield eng
    eng.dispose()


def count(db: psycopg.Connection[Any], key: str) -> int:
    """Rows of jobs whose args carry ``key``, seen from another (autocommit) connection."""
    row = db.execute("SELECT count(*) FROM atlantis.jobs WHERE args->>'key' = %s",
                     (key,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_committed_session_leaves_a_job_a_supervisor_runs(
        engine: Engine, db: psycopg.Connection[Any],
        supervise: Callable[..., Supervisor]) -> None:
    with Session(engine) as session, session.begin():
        job_id = jobs.enqueue(session, "tests.Echo", {"key": "sa-commit", "value": "v"})
        assert count(db, "sa-commit") == 0, "visible before the session committed"
    assert count(db, "sa-commit") == 1
    supervise()
    assert wait_state(db, job_id, "complete")["attempt"] == 1
    assert [e[2] for e in events(db, "sa-commit")] == ["ran"]


def test_a_rolled_back_session_leaves_no_job(engine: Engine,
                                             db: psycopg.Connection[Any]) -> None:
    with Session(engine) as session:
        jobs.enqueue(session, "tests.Echo", {"key": "sa-rollback"})
        jobs.enqueue_many(session, "tests.Echo", [{"key": "sa-rollback"}] * 2)
        session.rollback()
    with pytest.raises(RuntimeError, match="the order failed"), Session(engine) as session, \
            session.begin():
        jobs.enqueue(session, "tests.Echo", {"key": "sa-rollback"})
        raise RuntimeError("the order failed")
    with Session(engine) as session:  # closed without a commit
        jobs.enqueue(session, "tests.Echo", {"key": "sa-rollback"})
    assert count(db, "sa-rollback") == 0


def test_a_connection_commits_as_you_go_or_in_a_begin_block(
        engine: Engine, db: psycopg.Connection[Any]) -> None:
    with engine.connect() as conn:  # no statement yet: the enqueue begins the transaction
        jobs.enqueue(conn, "tests.Echo", {"key": "sa-conn"})
        conn.commit()
        jobs.enqueue(conn, "tests.Echo", {"key": "sa-conn"})
        conn.rollback()
        jobs.enqueue(conn, "tests.Echo", {"key": "sa-conn"})
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))
        jobs.enqueue(conn, "tests.Echo", {"key": "sa-conn"})
    assert count(db, "sa-conn") == 2


def test_a_refused_enqueue_leaves_the_sessions_transaction_usable(
        engine: Engine, db: psycopg.Connection[Any]) -> None:
    with Session(engine) as session, session.begin():
        # The refusal is the transaction's first statement ...
        with pytest.raises(atlantis.UnknownJobError, match="tests.NoSuchJob"):
            jobs.enqueue(session, "tests.NoSuchJob", {"key": "sa-refused"})
        first = jobs.enqueue(session, "tests.Echo", {"key": "sa-refused"})
        # ... or comes after the session's own work: a savepoint undoes it alone.
        assert session.execute(text("SELECT 41 + 1")).scalar_one() == 42
        with pytest.raises(atlantis.UnknownJobError):
            jobs.enqueue(session, "tests.NoSuchJob", {"key": "sa-refused"})
        with pytest.raises(atlantis.ValidationError, match="key"):
            jobs.enqueue(session, "tests.Echo", {"value": "no key"})
        second = jobs.enqueue(session, "tests.Echo", {"key": "sa-refused"})
    assert count(db, "sa-refused") == 2
    wait_state(db, first, "available")
    wait_state(db, second, "available")


def test_an_aborted_transaction_is_refused_until_it_is_rolled_back(
        engine: Engine, db: psycopg.Connection[Any]) -> None:
    with engine.connect() as conn:
        jobs.enqueue(conn, "tests.Echo", {"key": "sa-aborted"})
        with pytest.raises(DBAPIError, match="division by zero"):
            conn.execute(text("SELECT 1/0"))
        with pytest.raises(atlantis.AtlantisError, match="aborted by an earlier error"):
            jobs.enqueue(conn, "tests.Echo", {"key": "sa-aborted"})
        conn.rollback()
        jobs.enqueue(conn, "tests.Echo", {"key": "sa-aborted"})
        conn.commit()
    assert count(db, "sa-aborted") == 1


def test_scoped_sessions_workflows_and_cancel(engine: Engine,
                                              db: psycopg.Connection[Any]) -> None:
    scoped = scoped_session(sessionmaker(engine))
    try:
        job_id = jobs.enqueue(scoped, "tests.Echo", {"key": "sa-scoped"})
        scoped.commit()
        assert jobs.cancel(scoped, job_id, by="sa-test") == "cancelled"
        wait_state(db, job_id, "available")  # not before the commit
        scoped.commit()
        assert wait_state(db, job_id, "cancelled")["cancelled_by"] == "sa-test"
        with pytest.raises(atlantis.UnknownJobError):
            jobs.start_workflow(scoped, "tests.NoSuchFlow", {})
        scoped.rollback()
    finally:
        scoped.remove()


def test_async_sessions_commit_and_roll_back(db_url: str, db: psycopg.Connection[Any]) -> None:
    async def run() -> int:
        engine = create_async_engine(sa_url(db_url))
        try:
            async with AsyncSession(engine) as session:
                async with session.begin():
                    job_id = await jobs.enqueue_async(session, "tests.Echo",
                                                      {"key": "sa-async"})
                    assert count(db, "sa-async") == 0
                async with session.begin():
                    await jobs.enqueue_many_async(session, "tests.Echo",
                                                  [{"key": "sa-async"}] * 3)
                    await session.rollback()
                async with session.begin():
                    await session.execute(text("SELECT 1"))
                    with pytest.raises(atlantis.UnknownJobError):
                        await jobs.enqueue_async(session, "tests.NoSuchJob", {})
                    await jobs.enqueue_async(session, "tests.Echo", {"key": "sa-async"})
            async with engine.connect() as conn:
                await jobs.enqueue_async(conn, "tests.Echo", {"key": "sa-async"})
                await conn.commit()
            return job_id
        finally:
            await engine.dispose()

    job_id = asyncio.run(run())
    assert count(db, "sa-async") == 3
    wait_state(db, job_id, "available")


def test_other_databases_and_drivers_are_refused(tmp_path: Any) -> None:
    sqlite = create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        with Session(sqlite) as session, \
                pytest.raises(atlantis.ConfigurationError, match="sqlite.*needs PostgreSQL"):
            jobs.enqueue(session, "tests.Echo", {"key": "x"})
    finally:
        sqlite.dispose()
    # psycopg2 and asyncpg need not be installed to be named: their dialects are enough.
    others = [(pg_psycopg2.dialect(), "psycopg2"),  # type: ignore[no-untyped-call]
              (pg_asyncpg.dialect(), "asyncpg")]  # type: ignore[no-untyped-call]
    for dialect, driver in others:
        with pytest.raises(atlantis.ConfigurationError,
                           match=f"postgresql\\+{driver}: atlantis needs the psycopg 3"):
            jobs._check(dialect, object(), psycopg.Connection)


def test_import_atlantis_imports_neither_framework() -> None:
    code = ("import sys, atlantis; "
            "print(sorted({'django', 'sqlalchemy', 'atlantis.integrations'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"
