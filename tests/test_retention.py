"""Retention: finished jobs deleted after --retention / --dead-retention with their attempts
and logs, in batches, by one supervisor at a time; waiting and running jobs never."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from atlantis.errors import ConfigurationError
from atlantis.supervisor.retention import LOCK_KEY, Retention
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.settings import DAY, Settings, from_options
from tests.conftest import Supervisor, wait_for

STATES = ("available", "running", "complete", "cancelled", "dead")


def make_job(db: psycopg.Connection[Any], state: str, days_ago: float) -> int:
    """A tests.Echo job in ``state``, finished (or created) ``days_ago`` days ago, with one
    attempt row and one log line."""
    job_id: int = db.execute(
        "SELECT atlantis.enqueue('tests.Echo', %s)", ('{"key": "prune"}',)).fetchone()[0]  # type: ignore[index]
    age = {"id": job_id, "days": days_ago, "state": state}
    db.execute("UPDATE atlantis.jobs SET created_at = now() - make_interval(days => %(days)s) "
               "WHERE id = %(id)s", age)
    if state == "running":
        db.execute("UPDATE atlantis.jobs SET state = 'running', attempt = 1, claimed_by = 'w', "
                   "claimed_until = now() + interval '1 hour', "
                   "started_at = now() - make_interval(days => %(days)s) WHERE id = %(id)s", age)
    elif state != "available":
        db.execute("UPDATE atlantis.jobs SET state = %(state)s, attempt = 1, "
                   "started_at = now() - make_interval(days => %(days)s), "
                   "finished_at = now() - make_interval(days => %(days)s) WHERE id = %(id)s", age)
    db.execute("INSERT INTO atlantis.attempts (job_id, attempt, outcome) VALUES (%s, 1, 'failed')",
               (job_id,))
    db.execute("INSERT INTO atlantis.logs (job_id, attempt, stream, line) "
               "VALUES (%s, 1, 'stdout', 'hello')", (job_id,))
    return job_id


def remaining(db: psycopg.Connection[Any], table: str = "jobs") -> set[int]:
    column = "id" if table == "jobs" else "job_id"
    rows = db.execute(f"SELECT {column} FROM atlantis.{table}").fetchall()  # noqa: S608 - fixed names
    return {r[0] for r in rows}


def prune(db: psycopg.Connection[Any], older_than: str, states: list[str] | None = None,
          batch: int = 1000) -> int:
    if states is None:
        row = db.execute("SELECT atlantis.prune(%s::interval)", (older_than,)).fetchone()
    else:
        row = db.execute("SELECT atlantis.prune(%s::interval, %s::text[], %s)",
                         (older_than, states, batch)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def aged(db: psycopg.Connection[Any]) -> dict[tuple[str, int], int]:
    """One job per state, 2 days and 10 days old (by finish, or by creation if unfinished)."""
    return {(state, days): make_job(db, state, days) for state in STATES for days in (2, 10)}


# --------------------------------------------------------------------------- atlantis.prune


def test_prune_deletes_old_finished_jobs_of_the_states_given_with_attempts_and_logs(
        db: psycopg.Connection[Any], aged: dict[tuple[str, int], int]) -> None:
    assert prune(db, "7 days", ["complete", "cancelled"]) == 2
    gone = {aged["complete", 10], aged["cancelled", 10]}
    assert remaining(db) == set(aged.values()) - gone
    assert remaining(db, "attempts") == set(aged.values()) - gone
    assert remaining(db, "logs") == set(aged.values()) - gone
    assert prune(db, "7 days", ["dead"]) == 1
    assert aged["dead", 10] not in remaining(db)


def test_prune_never_touches_waiting_or_running_jobs(
        db: psycopg.Connection[Any], aged: dict[tuple[str, int], int]) -> None:
    assert prune(db, "0") == 6  # every finished job, whatever its age: the default states
    kept = {aged[state, days] for state in ("available", "running") for days in (2, 10)}
    assert remaining(db) == kept
    assert remaining(db, "attempts") == kept
    with pytest.raises(psycopg.Error) as info:
        prune(db, "0", ["available"])
    assert info.value.sqlstate == "22023"
    assert "only complete, cancelled and dead jobs can be pruned, not available" in str(info.value)
    with pytest.raises(psycopg.Error) as info:
        prune(db, "0", ["running", "dead"])
    assert info.value.sqlstate == "22023"
    assert remaining(db) == kept


def test_prune_refuses_a_negative_age(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.Error) as info:
        prune(db, "-1 day")
    assert info.value.sqlstate == "22023"


def test_prune_goes_in_batches_oldest_first(db: psycopg.Connection[Any]) -> None:
    ids = [make_job(db, "complete", days) for days in (9, 8, 7, 6, 5)]
    assert prune(db, "1 day", ["complete"], batch=2) == 2
    assert remaining(db) == set(ids[2:])
    assert prune(db, "1 day", ["complete"], batch=2) == 2
    assert prune(db, "1 day", ["complete"], batch=2) == 1
    assert prune(db, "1 day", ["complete"], batch=2) == 0


# --------------------------------------------------------------------------- the service


def run_retention(db_url: str, **settings: Any) -> int | None:
    async def main() -> int | None:
        rt = Runtime(Settings(queues=("tests",), database_url=db_url, **settings))
        try:
            return await Retention(rt).prune()
        finally:
            await rt.close_databases()

    return asyncio.run(main())


def test_retention_applies_both_ages(db_url: str, db: psycopg.Connection[Any],
                                     aged: dict[tuple[str, int], int]) -> None:
    assert run_retention(db_url, retention=7 * DAY, dead_retention=30 * DAY) == 2
    assert aged["complete", 10] not in remaining(db)
    assert aged["cancelled", 10] not in remaining(db)
    assert aged["dead", 10] in remaining(db)
    assert run_retention(db_url, retention=7 * DAY, dead_retention=DAY) == 2
    assert remaining(db) == {aged[key] for key in aged
                             if key[0] in ("available", "running") or key in
                             (("complete", 2), ("cancelled", 2))}


def test_zero_disables_either(db_url: str, db: psycopg.Connection[Any],
                              aged: dict[tuple[str, int], int]) -> None:
    assert run_retention(db_url, retention=0.0, dead_retention=DAY) == 2
    assert {aged["dead", 2], aged["dead", 10]} & remaining(db) == set()
    assert aged["complete", 10] in remaining(db)
    assert run_retention(db_url, retention=DAY, dead_retention=0.0) == 4

    async def loops(**settings: Any) -> int:
        rt = Runtime(Settings(queues=("tests",), database_url=db_url, **settings))
        return len(Retention(rt).loops())

    assert asyncio.run(loops(retention=0.0, dead_retention=0.0)) == 0
    assert asyncio.run(loops(retention=0.0, dead_retention=DAY)) == 1


def test_one_supervisor_at_a_time(db_url: str, db: psycopg.Connection[Any],
                                  aged: dict[tuple[str, int], int]) -> None:
    """While another session holds the retention lock, a supervisor's round deletes nothing."""
    with psycopg.connect(db_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        assert run_retention(db_url, retention=DAY, dead_retention=DAY) is None
        assert remaining(db) == set(aged.values())
        other.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
    assert run_retention(db_url, retention=DAY, dead_retention=DAY) == 6


def test_old_schedule_runs_go_but_each_schedules_latest_stays(
        db_url: str, db: psycopg.Connection[Any]) -> None:
    db.execute("""
        INSERT INTO atlantis.schedule_runs (job, slot, job_id, created_at) VALUES
            ('sched.Tick', now() - interval '40 days', 1, now() - interval '40 days'),
            ('sched.Tick', now() - interval '35 days', 2, now() - interval '35 days'),
            ('sched.Tick', now() - interval '1 day', 3, now() - interval '1 day'),
            ('sched.Nightly', now() - interval '50 days', NULL, now() - interval '50 days'),
            ('sched.Nightly', now() - interval '45 days', 4, now() - interval '45 days')
    """)
    run_retention(db_url, retention=7 * DAY, dead_retention=30 * DAY)
    assert remaining(db, "schedule_runs") == {3, 4}
    # Not while a retention is disabled: the runs may still be the only trace of their jobs.
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, job_id, created_at) VALUES "
               "('sched.Tick', now() - interval '90 days', 5, now() - interval '90 days')")
    run_retention(db_url, retention=0.0, dead_retention=30 * DAY)
    assert remaining(db, "schedule_runs") == {3, 4, 5}


def test_retention_options() -> None:
    s = from_options({"queues": ("q",), "retention": "12h", "dead_retention": "0"})
    assert (s.retention, s.dead_retention) == (12 * 3600.0, 0.0)
    assert (s.retention_interval, s.schedule_interval, s.schedule_grace) == (60.0, 1.0, 60.0)
    defaults = from_options({"queues": ("q",)})
    assert (defaults.retention, defaults.dead_retention) == (7 * DAY, 30 * DAY)
    with pytest.raises(ConfigurationError) as info:
        from_options({"queues": ("q",), "retention": "-1d"})
    assert str(info.value).startswith("--retention: ")


# --------------------------------------------------------------------------- a real supervisor


def test_a_supervisor_prunes_what_is_old_enough(
        supervise: Callable[..., Supervisor], db: psycopg.Connection[Any],
        aged: dict[tuple[str, int], int]) -> None:
    sup = supervise("--retention", "1d", "--dead-retention", "5d", "--retention-interval", "1s")
    wait_for(lambda: remaining(db) == {aged[key] for key in aged if key[0] in
                                       ("available", "running") or key == ("dead", 2)},
             message="old finished jobs to be pruned")
    assert remaining(db, "logs") == remaining(db)
    wait_for(lambda: "retention: deleted" in sup.log(), message="the supervisor to say so")
