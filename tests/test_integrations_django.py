"""``atlantis.integrations.django``: enqueue inside ``transaction.atomic()``.

Django's settings are the process's own (``settings.configure`` runs once per process, and
nothing undoes it), so each scenario runs in a fresh Python started by its test: Django is
configured there for the test's database (``ENGINE django.db.backends.postgresql`` on
psycopg 3, the embedded server's unix socket as ``HOST``) and nowhere else, whatever
pytest-xdist runs beside it. The scenario raises on any surprise; the test then looks at
the database from its own connection, and starts a real supervisor where a job must run.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

pytest.importorskip(
    "django", reason="django is not installed (pip install 'django>=5.2,<6'): "
    "the Django integration is not tested")

import atlantis
from tests.conftest import ROOT, Supervisor, events, wait_state


def count(conn: psycopg.Connection[Any], key: str) -> int:
    """Rows of jobs whose args carry ``key``, as ``conn`` sees them."""
    row = conn.execute("SELECT count(*) FROM atlantis.jobs WHERE args->>'key' = %s",
                       (key,)).fetchone()
    assert row is not None
    return int(row[0])


def run(scenario: str, db_url: str) -> str:
    """Run ``scenario`` (a function below) in a fresh Python; what it printed."""
    code = ("import sys; from tests.test_integrations_django import main; "
            "main(sys.argv[1], sys.argv[2])")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code, scenario, db_url],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"scenario {scenario} failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


# ------------------------------------------------------------------ in the fresh Python


def configure(db_url: str) -> None:
    """Django for this process: the test's database as ``default``, SQLite as ``other``."""
    import django
    from django.conf import settings

    parts = psycopg.conninfo.conninfo_to_dict(db_url)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": parts["dbname"],
                "USER": parts.get("user") or "",
                "PASSWORD": parts.get("password") or "",
                "HOST": parts.get("host") or "",
                "PORT": parts.get("port") or "",
            },
            "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        },
        USE_TZ=True,
    )
    django.setup()


def main(scenario: str, db_url: str) -> None:
    configure(db_url)
    from django.db import connections

    try:
        with psycopg.connect(db_url, autocommit=True) as outside:
            SCENARIOS[scenario](db_url, outside)
    finally:
        connections.close_all()


def commit_scenario(db_url: str, outside: psycopg.Connection[Any]) -> None:
    from django.db import connection, transaction

    from atlantis.integrations import django as jobs

    with transaction.atomic():
        job_id = jobs.enqueue("tests.Echo", {"key": "dj-commit", "value": "v"})
        assert count(outside, "dj-commit") == 0, "visible before the block committed"
        assert connection.in_atomic_block
    assert count(outside, "dj-commit") == 1
    print(job_id)


def rollback_scenario(db_url: str, outside: psycopg.Connection[Any]) -> None:
    from django.db import transaction

    from atlantis.integrations import django as jobs

    try:
        with transaction.atomic():
            jobs.enqueue("tests.Echo", {"key": "dj-rollback"})
            jobs.enqueue_many("tests.Echo", [{"key": "dj-rollback"}] * 2)
            raise RuntimeError("the order failed")
    except RuntimeError:
        pass
    with transaction.atomic():
        jobs.enqueue("tests.Echo", {"key": "dj-rollback"})
        transaction.set_rollback(True)
    with transaction.atomic():  # a nested block is a savepoint: its jobs go with it alone
        jobs.enqueue("tests.Echo", {"key": "dj-kept"})
        try:
            with transaction.atomic():
                jobs.enqueue("tests.Echo", {"key": "dj-rollback"})
                raise RuntimeError("the inner part failed")
        except RuntimeError:
            pass
    assert count(outside, "dj-rollback") == 0


def refused_scenario(db_url: str, outside: psycopg.Connection[Any]) -> None:
    from django.db import connection, transaction

    from atlantis.integrations import django as jobs

    with transaction.atomic():
        # The refusal is the transaction's first statement ...
        try:
            jobs.enqueue("tests.NoSuchJob", {"key": "dj-refused"})
        except atlantis.UnknownJobError as exc:
            assert "tests.NoSuchJob" in str(exc), exc
        else:
            raise AssertionError("an unknown job was enqueued")
        jobs.enqueue("tests.Echo", {"key": "dj-refused"})
        # ... or comes after Django's own work: a savepoint undoes it alone.
        with connection.cursor() as cursor:
            cursor.execute("SELECT 41 + 1")
            assert cursor.fetchone() == (42,)
        for job, args, error in (("tests.NoSuchJob", {}, atlantis.UnknownJobError),
                                 ("tests.Echo", {"value": "no key"}, atlantis.ValidationError)):
            try:
                jobs.enqueue(job, args)
            except error:
                pass
            else:
                raise AssertionError(f"{job} {args} was enqueued")
        assert not connection.needs_rollback
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM atlantis.jobs")
        jobs.enqueue("tests.Echo", {"key": "dj-refused"})
    assert count(outside, "dj-refused") == 2


def aborted_scenario(db_url: str, outside: psycopg.Connection[Any]) -> None:
    from django.db import DataError, connection, transaction

    from atlantis.integrations import django as jobs

    try:
        with transaction.atomic():
            jobs.enqueue("tests.Echo", {"key": "dj-aborted"})
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1/0")
            except DataError:
                pass  # caught without a rollback: the transaction is aborted
            jobs.enqueue("tests.Echo", {"key": "dj-aborted"})
    except atlantis.AtlantisError as exc:
        assert "aborted by an earlier error" in str(exc), exc
    else:
        raise AssertionError("enqueued in an aborted transaction")
    assert count(outside, "dj-aborted") == 0


class Psycopg2Connection:
    """Stands in for the connection a psycopg2 backend hands over."""


def autocommit_and_more_scenario(db_url: str, outside: psycopg.Connection[Any]) -> None:
    from django.db import connections

    from atlantis.integrations import django as jobs

    # Outside atomic() Django autocommits: the job is there at once, as an ORM write is.
    job_id = jobs.enqueue("tests.Echo", {"key": "dj-auto"})
    assert count(outside, "dj-auto") == 1
    assert jobs.cancel(job_id, by="django") == "cancelled"
    # Django binds parameters on the client (psycopg's ClientCursor): the options arrive.
    assert issubclass(jobs.connection().cursor_factory, psycopg.ClientCursor)
    later = datetime.now(UTC) + timedelta(hours=1)
    ids = jobs.enqueue_many("tests.Echo", [{"key": "dj-options", "value": "é'\\"}] * 2,
                            priority=-3, run_at=later, queue="tests")
    rows = outside.execute("SELECT priority, run_at, args->>'value' FROM atlantis.jobs "
                           "WHERE id = ANY(%s)", (ids,)).fetchall()
    assert rows == [(-3, later, "é'\\")] * 2, rows
    assert jobs.connection().autocommit
    try:
        jobs.start_workflow("tests.NoSuchFlow")
    except atlantis.UnknownJobError:
        pass
    else:
        raise AssertionError("an unknown workflow started")
    # A backend connecting with psycopg2 (psycopg 3, installed with atlantis, is what
    # Django's own backend picks): the connection it hands over is not psycopg 3's.
    wrapper = connections["default"]
    real, wrapper.connection = wrapper.connection, Psycopg2Connection()
    try:
        jobs.enqueue("tests.Echo", {"key": "dj-auto"})
    except atlantis.ConfigurationError as exc:
        assert "connects with tests.test_integrations_django.Psycopg2Connection: atlantis " \
            "needs psycopg 3" in str(exc), exc
    else:
        raise AssertionError("enqueued on a connection that is not psycopg 3's")
    finally:
        wrapper.connection = real
    try:
        jobs.enqueue("tests.Echo", {"key": "dj-auto"}, using="other")
    except atlantis.ConfigurationError as exc:
        assert "django.db.backends.sqlite3 (sqlite): atlantis needs PostgreSQL" in str(exc), exc
    else:
        raise AssertionError("enqueued on SQLite")


SCENARIOS: dict[str, Callable[[str, psycopg.Connection[Any]], None]] = {
    "commit": commit_scenario,
    "rollback": rollback_scenario,
    "refused": refused_scenario,
    "aborted": aborted_scenario,
    "autocommit": autocommit_and_more_scenario,
}


# ------------------------------------------------------------------ the tests


def test_a_committed_atomic_block_leaves_a_job_a_supervisor_runs(
        db_url: str, db: psycopg.Connection[Any],
        supervise: Callable[..., Supervisor]) -> None:
    job_id = int(run("commit", db_url))
    supervise()
    assert wait_state(db, job_id, "complete")["attempt"] == 1
    assert [e[2] for e in events(db, "dj-commit")] == ["ran"]


def test_a_rolled_back_atomic_block_leaves_no_job(db_url: str,
                                                  db: psycopg.Connection[Any]) -> None:
    run("rollback", db_url)
    assert count(db, "dj-rollback") == 0
    assert count(db, "dj-kept") == 1


def test_a_refused_enqueue_leaves_the_atomic_block_usable(db_url: str,
                                                          db: psycopg.Connection[Any]) -> None:
    run("refused", db_url)
    assert count(db, "dj-refused") == 2


def test_an_aborted_transaction_is_refused(db_url: str, db: psycopg.Connection[Any]) -> None:
    run("aborted", db_url)
    assert count(db, "dj-aborted") == 0


def test_autocommit_cancel_workflows_and_other_backends(db_url: str,
                                                        db: psycopg.Connection[Any]) -> None:
    run("autocommit", db_url)
    row = db.execute("SELECT state, cancelled_by FROM atlantis.jobs "
                     "WHERE args->>'key' = 'dj-auto'").fetchone()
    assert row == ("cancelled", "django")
