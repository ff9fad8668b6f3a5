"""Least privilege: the atlantis roles, logged in as each, and what each can and cannot do.

Roles are cluster-wide: the template's migration created them (the test server's superuser
may). Each test creates LOGIN users of its own, one atlantis role each, dropped at the end.
The embedded server trusts its unix socket, so no password is needed.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.store import migrate
from atlantis.store.migrate import ROLES, migrations, roles_sql
from tests.conftest import BIN, ROOT, job_row, run_tide, url_for, wait_for, wait_state
from tests.test_operations import make_dead

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix

_names = itertools.count()
MIB = 1048576


def tide(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tide(["--database-url", url, *args], check=False)


def as_user(url: str, user: str) -> str:
    return psycopg.conninfo.make_conninfo(url, user=user)


def denied(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> str:
    """Run ``sql``, which must be refused for want of a privilege; returns the message."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
        conn.execute(sql, params)
    return str(info.value)


def clean(log: str) -> bool:
    """A supervisor's log without a traceback, an error or a refused privilege."""
    return not any(bad in log for bad in ("Traceback", " ERROR ", "permission denied"))


@pytest.fixture
def login(admin_url: str, db_url: str) -> Iterator[Callable[[str], str]]:
    """``login("atlantis_enqueuer")``: a new LOGIN user in that role; its URL for the test's
    database. Every user made is dropped afterwards (its sessions ended first)."""
    made: list[str] = []

    def make(role: str) -> str:
        name = f"u_{role.removeprefix('atlantis_')[:4]}_{os.getpid()}_{next(_names)}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'not-checked' IN ROLE {role}")
        made.append(name)
        return as_user(db_url, name)

    yield make
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in made:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE usename = %s", (name,))
            conn.execute(f"DROP ROLE IF EXISTS {name}")


# ---- the roles themselves -------------------------------------------------------------------


def test_the_roles_exist_cannot_log_in_and_public_has_nothing(db: psycopg.Connection[Any]) -> None:
    rows = db.execute("SELECT rolname, rolcanlogin, rolsuper, rolcreaterole, rolcreatedb"
                      "  FROM pg_roles WHERE rolname LIKE 'atlantis\\_%' ORDER BY rolname").fetchall()
    assert sorted(r[0] for r in rows) == sorted(ROLES)
    assert all(r[1:] == (False, False, False, False) for r in rows)
    # PUBLIC: no right on the schema, a table or a function.
    assert db.execute("SELECT has_schema_privilege('public', 'atlantis', 'USAGE')").fetchone() == (
        False,)
    public = db.execute(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'atlantis'::regnamespace"
        "   AND EXISTS (SELECT 1 FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner)))"
        "                WHERE grantee = 0)"
        " UNION ALL "
        "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'atlantis'::regnamespace"
        "   AND EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner)))"
        "                WHERE grantee = 0)").fetchall()
    assert public == []
    # The functions callers use run as the owner, with a fixed search_path.
    definers = dict(db.execute(
        "SELECT proname, proconfig FROM pg_proc"
        " WHERE pronamespace = 'atlantis'::regnamespace AND prosecdef").fetchall())
    assert set(definers) == {"enqueue", "enqueue_many", "cancel", "retry", "pause", "resume", "set_queue_limit",
                             "prune", "schedule_fire", "schedule_catch_up", "schedule_advance",
                             "schedule_set_enabled", "delete_finished",
                             "start_workflow", "cancel_workflow", "retry_workflow",
                             "dismiss_workflow", "workflow_advance", "workflow_sweep", "prune_workflows",
                             "step_fence", "step_records", "record_step", "step_sleep",
                             "clear_steps", "send_event", "step_wait_event", "event_sweep",
                             "step_spawn", "step_spawn_many", "step_join", "join_sweep", "child_ended",
                             "cancel_children", "wait_check", "order_worker", "resume_worker"}
    assert all(c == ["search_path=pg_catalog, atlantis, pg_temp"] for c in definers.values())


def test_creating_the_roles_is_safe_when_several_sessions_race(admin_url: str) -> None:
    """The DO block each role is made by, run by four sessions at once (each holding its
    transaction open a moment, as a migration does): all succeed, one role results."""
    from atlantis.store.migrate import _CREATE_ROLE

    name = f"atl_race_{os.getpid()}_{next(_names)}"
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def create() -> None:
        try:
            with psycopg.connect(admin_url) as conn:
                barrier.wait(10)
                conn.execute(_CREATE_ROLE.format(role=name))
                conn.execute("SELECT pg_sleep(0.3)")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        with psycopg.connect(admin_url) as conn:
            assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s",
                                (name,)).fetchone() == (1,)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {name}")


def test_concurrent_migrations_of_several_databases_grant_each(admin_url: str) -> None:
    names = [f"atl_roles_{os.getpid()}_{next(_names)}" for _ in range(3)]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(f"CREATE DATABASE {name}")
    try:
        procs = [subprocess.Popen([str(BIN / "tide"), "--database-url", url_for(admin_url, name),
                                   "db", "migrate"], cwd=ROOT, stderr=subprocess.PIPE)
                 for name in names]
        outputs = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        for name in names:
            with psycopg.connect(url_for(admin_url, name)) as conn:
                assert conn.execute(
                    "SELECT has_function_privilege('atlantis_enqueuer',"
                    " 'atlantis.enqueue_many(text, jsonb[], timestamptz, int, text, interval,"
                    " jsonb)',"
                    " 'EXECUTE'), has_table_privilege('atlantis_reader', 'atlantis.jobs', 'SELECT'),"
                    " has_table_privilege('atlantis_enqueuer', 'atlantis.jobs', 'SELECT')"
                ).fetchone() == (True, True, False)
                assert migrate(conn) == []
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_an_owner_that_may_not_create_roles_migrates_and_grants_the_existing_roles(
        admin_url: str) -> None:
    owner = f"u_own_{os.getpid()}_{next(_names)}"
    name = f"atl_owned_{os.getpid()}_{next(_names)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {owner} LOGIN")
        conn.execute(f"CREATE DATABASE {name} OWNER {owner}")
    url = as_user(url_for(admin_url, name), owner)
    try:
        with psycopg.connect(url) as conn:
            assert migrate(conn) == [v for v, _, _ in migrations()]  # no CREATEROLE: no error
            assert conn.execute(
                "SELECT has_function_privilege('atlantis_enqueuer', 'atlantis.cancel(bigint, text)',"
                " 'EXECUTE'), has_function_privilege('atlantis_reader',"
                " 'atlantis.cancel(bigint, text)', 'EXECUTE')").fetchone() == (True, False)
        roles = tide(url, "db", "roles")
        assert roles.returncode == 0 and "granted atlantis_enqueuer" in roles.stderr, roles.stderr
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {owner}")


def test_roles_sql_works_for_a_superuser(db: psycopg.Connection[Any], db_url: str,
                                         login: Callable[[str], str]) -> None:
    printed = subprocess.run([str(BIN / "tide"), "db", "roles", "--sql"], capture_output=True,
                             text=True, cwd=ROOT, timeout=60, check=True).stdout
    assert printed == roles_sql() and "CREATE ROLE atlantis_worker NOLOGIN" in printed
    enqueuer = login("atlantis_enqueuer")
    # Take this database's grants away: the enqueuer can no longer enqueue...
    for role in ROLES:
        db.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA atlantis FROM {role}")
        db.execute(f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA atlantis FROM {role}")
        db.execute(f"REVOKE ALL ON SCHEMA atlantis FROM {role}")
    with psycopg.connect(enqueuer, autocommit=True) as conn:
        denied(conn, "SELECT atlantis.enqueue('tests.Echo', '{\"key\": \"r\"}')")
    # ...until a superuser runs the printed statements (twice: they are idempotent).
    db.execute(printed)
    db.execute(printed)
    with psycopg.connect(enqueuer, autocommit=True) as conn:
        assert atlantis.enqueue(conn, "tests.Echo", {"key": "r"}) > 0
    assert db.execute("SELECT has_table_privilege('atlantis_worker', 'atlantis.jobs', 'UPDATE'),"
                      " has_table_privilege('atlantis_reader', 'atlantis.jobs', 'UPDATE')"
                      ).fetchone() == (True, False)


# ---- the enqueuer ---------------------------------------------------------------------------


def test_an_enqueuer_enqueues_and_cancels_and_nothing_else(
        db: psycopg.Connection[Any], login: Callable[[str], str]) -> None:
    url = login("atlantis_enqueuer")
    user = psycopg.conninfo.conninfo_to_dict(url)["user"]
    with psycopg.connect(url, autocommit=True) as conn:
        first = atlantis.enqueue(conn, "tests.Echo", {"key": "e1"})
        more = atlantis.enqueue_many(conn, "tests.Echo", [{"key": "e2"}, {"key": "e3"}])
        (sql_id,) = conn.execute(
            "SELECT atlantis.enqueue('tests.Echo', '{\"key\": \"e4\"}')").fetchone() or (None,)
        assert atlantis.cancel(conn, first) == "cancelled"
        with pytest.raises(atlantis.ValidationError, match="field key is required"):
            atlantis.enqueue(conn, "tests.Echo", {})

        # No table rights at all: not even to read its own job.
        for sql in ("SELECT * FROM atlantis.jobs",
                    "SELECT * FROM atlantis.job_types",
                    "SELECT * FROM atlantis.settings",
                    "DELETE FROM atlantis.jobs",
                    "SELECT nextval('atlantis.jobs_id_seq')"):
            denied(conn, sql)
        # It cannot write a `running` row (a claim it does not hold) ...
        denied(conn, "INSERT INTO atlantis.jobs (job, queue, state, attempt, max_attempts,"
                     " timeout, heartbeat, backoff, claimed_by, claimed_until, started_at)"
                     " VALUES ('tests.Echo', 'tests', 'running', 1, 1, '1m', '1m', '0',"
                     " 'me', now() + interval '1h', now())")
        # ... nor change a job's state, directly or through the operators' functions.
        denied(conn, "UPDATE atlantis.jobs SET state = 'complete', finished_at = now()"
                     " WHERE id = %s", (more[0],))
        denied(conn, "SELECT atlantis.retry(%s)", (first,))
        denied(conn, "SELECT atlantis.pause('tests')")
        denied(conn, "SELECT atlantis.prune(interval '0')")
        denied(conn, "SELECT atlantis.delete_finished(ARRAY[%s]::bigint[])", (first,))
        denied(conn, "SELECT atlantis.check_args(atlantis.job_type('tests.Echo'), '{}')")
        # Nor plant an object the definer functions could find.
        denied(conn, "CREATE TABLE atlantis.jobs_shadow (id int)")

        # The size cap: a GUC any session may SET no longer counts ...
        conn.execute("SET atlantis.max_args_bytes = '100000000'")
        big = {"key": "x" * (MIB + 10)}
        with pytest.raises(atlantis.ValidationError, match=f"larger than the limit of {MIB} bytes"):
            atlantis.enqueue(conn, "tests.Echo", big)
        # ... and the settings table is the owner's alone.
        denied(conn, "UPDATE atlantis.settings SET value = '100000000'"
                     " WHERE name = 'max_args_bytes'")
        denied(conn, "INSERT INTO atlantis.settings VALUES ('max_args_bytes', '100000000')"
                     " ON CONFLICT (name) DO UPDATE SET value = excluded.value")
        with pytest.raises(atlantis.ValidationError, match=f"larger than the limit of {MIB} bytes"):
            atlantis.enqueue(conn, "tests.Echo", big)

    rows = {i: job_row(db, i) for i in (first, *more, sql_id)}
    assert rows[first]["state"] == "cancelled" and rows[first]["cancelled_by"] == user
    assert [rows[i]["state"] for i in (*more, sql_id)] == ["available"] * 3
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (4,)


def test_the_owner_sets_the_cap_in_the_settings_table(db: psycopg.Connection[Any]) -> None:
    assert db.execute("SELECT value FROM atlantis.settings WHERE name = 'max_args_bytes'"
                      ).fetchone() == (str(MIB),)
    db.execute("UPDATE atlantis.settings SET value = '100' WHERE name = 'max_args_bytes'")
    with pytest.raises(atlantis.ValidationError, match="args are 111 bytes, larger than the "
                                                       "limit of 100 bytes"):
        atlantis.enqueue(db, "tests.Echo", {"key": "k" * 100})
    assert atlantis.enqueue(db, "tests.Echo", {"key": "small"}) > 0
    # No row (or an empty value) is the default, 1 MiB.
    db.execute("DELETE FROM atlantis.settings WHERE name = 'max_args_bytes'")
    assert atlantis.enqueue(db, "tests.Echo", {"key": "k" * 1000}) > 0
    with pytest.raises(atlantis.ValidationError, match=f"limit of {MIB} bytes"):
        atlantis.enqueue(db, "tests.Echo", {"key": "x" * MIB})
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("INSERT INTO atlantis.settings VALUES ('max_args_bytes', 'lots')")


# ---- the reader and the operator ------------------------------------------------------------


def test_a_reader_reads_with_tide_and_changes_nothing(
        db: psycopg.Connection[Any], login: Callable[[str], str]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "read"})
    dead = atlantis.enqueue(db, "tests.Echo", {"key": "dead"})
    make_dead(db, dead)
    url = login("atlantis_reader")
    listed = tide(url, "job", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["id"] for r in orjson.loads(listed.stdout)} == {job_id, dead}
    reads: list[tuple[str, ...]] = [
        ("job", "status", str(job_id)), ("job", "logs", str(dead)), ("dlq", "list"),
        ("queue", "stats"), ("worker", "list"), ("schedule", "list")]
    for args in reads:
        out = tide(url, *args)
        assert out.returncode == 0, (args, out.stderr)
    writes: list[tuple[str, ...]] = [
        ("job", "cancel", str(job_id)), ("job", "retry", str(dead)), ("queue", "pause", "tests"),
        ("job", "prune", "--older-than", "0s"), ("worker", "drain", "nobody")]
    for args in writes:
        out = tide(url, *args)
        assert out.returncode == 1, (args, out.stderr)
        assert out.stderr.splitlines()[-1].startswith("tide: database error: permission denied"), (
            args, out.stderr)
    assert job_row(db, job_id)["state"] == "available" and job_row(db, dead)["state"] == "dead"
    with psycopg.connect(url, autocommit=True) as conn:
        denied(conn, "SELECT atlantis.enqueue('tests.Echo', '{\"key\": \"no\"}')")
        denied(conn, "UPDATE atlantis.jobs SET priority = 1")


def test_an_operator_retries_cancels_pauses_and_prunes(
        db: psycopg.Connection[Any], login: Callable[[str], str]) -> None:
    dead = atlantis.enqueue(db, "tests.Echo", {"key": "op-dead"})
    make_dead(db, dead)
    waiting = atlantis.enqueue(db, "tests.Echo", {"key": "op-wait"})
    old = atlantis.enqueue(db, "tests.Echo", {"key": "op-old"})
    db.execute("UPDATE atlantis.jobs SET state = 'complete', attempt = 1, started_at = now(),"
               " finished_at = now() - interval '2 days' WHERE id = %s", (old,))
    db.execute("INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, expires_at,"
               " name) VALUES ('h:1:ab', 'h', 1, '{tests}', 1, now() + interval '1 minute',"
               " 'h:tests')")
    db.commit()
    url = login("atlantis_operator")
    commands: list[tuple[str, ...]] = [
        ("job", "retry", str(dead)), ("job", "cancel", str(waiting)),
        ("queue", "pause", "tests", "--reason", "deploy"), ("queue", "stats"), ("job", "list"),
        ("job", "prune", "--older-than", "1d"), ("worker", "drain", "h:1:ab"),
        ("worker", "list")]
    for args in commands:
        out = tide(url, *args)
        assert out.returncode == 0, (args, out.stderr)
    assert job_row(db, dead)["state"] == "available"
    assert job_row(db, waiting)["state"] == "cancelled"
    assert db.execute("SELECT count(*) FROM atlantis.jobs WHERE id = %s", (old,)).fetchone() == (0,)
    assert db.execute("SELECT paused, reason FROM atlantis.queues WHERE name = 'tests'"
                      ).fetchone() == (True, "deploy")
    assert tide(url, "queue", "resume", "tests").returncode == 0
    assert db.execute("SELECT action FROM atlantis.worker_orders").fetchone() == ("drain",)
    assert tide(url, "worker", "resume", "h:tests").returncode == 0
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT atlantis.delete_finished(ARRAY[%s, %s]::bigint[])",
                            (waiting, dead)).fetchone() == (1,)  # `dead` now waits: kept
        denied(conn, "UPDATE atlantis.jobs SET state = 'dead'")
        denied(conn, "DELETE FROM atlantis.jobs")
        denied(conn, "SELECT atlantis.enqueue('tests.Echo', '{\"key\": \"no\"}')")
        denied(conn, "UPDATE atlantis.settings SET value = '1'")


# ---- the worker -----------------------------------------------------------------------------


def test_a_worker_runs_a_supervisor_without_migrating(
        db: psycopg.Connection[Any], db_url: str, login: Callable[[str], str],
        supervise: Any) -> None:
    url = login("atlantis_worker")
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "worker", "value": "w"})
    db.execute("UPDATE atlantis.job_types SET priority = 9 WHERE job = 'tests.Echo'")
    # Handlers get their own database URL: test_events is not the worker's.
    sup = supervise("--handler-database-url", db_url, database_url=url, concurrency=1)
    row = wait_state(db, job_id, "complete")
    assert row["claimed_by"] is not None and row["attempt"] == 1
    assert db.execute("SELECT event FROM test_events WHERE key = 'worker'").fetchall() == [("ran",)]
    # It synced the declarations (job_types rights) ...
    assert db.execute("SELECT priority FROM atlantis.job_types WHERE job = 'tests.Echo'"
                      ).fetchone() == (0,)
    # ... and said why it did not migrate.
    assert "not migrating" in sup.log()
    sup.stop()
    assert clean(sup.log()), sup.log()
    with psycopg.connect(url, autocommit=True) as conn:
        denied(conn, "CREATE TABLE atlantis.extra (id int)")
        denied(conn, "ALTER TABLE atlantis.jobs ADD COLUMN extra int")
        denied(conn, "UPDATE atlantis.settings SET value = '1'")
        denied(conn, "INSERT INTO atlantis.schema_migrations VALUES (99, 'x')")
        denied(conn, "SELECT atlantis.pause('tests')")
        denied(conn, "SELECT atlantis.retry(%s)", (job_id,))


def test_a_worker_fires_schedules_and_prunes_finished_jobs(
        db: psycopg.Connection[Any], db_url: str, login: Callable[[str], str],
        supervise: Any) -> None:
    url = login("atlantis_worker")
    old = atlantis.enqueue(db, "tests.Echo", {"key": "old"})
    db.execute("UPDATE atlantis.jobs SET state = 'complete', attempt = 1, started_at = now(),"
               " finished_at = now() - interval '2 days' WHERE id = %s", (old,))
    sup = supervise("--handler-database-url", db_url, "--retention", "1d",
                    "--retention-interval", "0.5s", database_url=url, queues=("sched",),
                    app="tests.apps.sched:registry")
    wait_for(lambda: db.execute("SELECT count(*) >= 1 FROM test_events WHERE key = 'tick'"
                                ).fetchone() == (True,), message="a scheduled Tick ran")
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.jobs WHERE id = %s", (old,)
                                ).fetchone() == (0,), message="the old job pruned")
    sup.stop()
    assert clean(sup.log()), sup.log()


def test_a_worker_refuses_a_schema_that_is_behind(
        db: psycopg.Connection[Any], login: Callable[[str], str], supervise: Any) -> None:
    url = login("atlantis_worker")
    *_, (previous, _, _), (latest, _, _) = migrations()  # numbers may leave gaps
    db.execute("DELETE FROM atlantis.schema_migrations WHERE version = %s", (latest,))
    sup = supervise(database_url=url)
    assert sup.wait(30) == 2
    lines = sup.log().strip().splitlines()
    assert lines[-1] == (f"atlantis-supervise: the atlantis schema is at version {previous}, "
                         f"this atlantis needs {latest}; run `tide db migrate` as its owner")
    assert len(lines) == 2 and lines[0].startswith("atlantis: using database"), lines


def test_settings_are_kept_out_of_reach_of_every_role(db: psycopg.Connection[Any]) -> None:
    rights = db.execute(
        "SELECT r, has_table_privilege(r, 'atlantis.settings', 'INSERT, UPDATE, DELETE')"
        "  FROM unnest(%s::text[]) AS r", (list(ROLES),)).fetchall()
    assert rights == [(r, False) for r in ROLES]
