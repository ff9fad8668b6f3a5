"""The operator API: SQL functions `atlantis.cancel/retry/pause/resume` (migration 0005) and
their Python callers `atlantis.cancel/retry` (and async twins), on a real PostgreSQL.

Running jobs are made by hand here (a claimed row, no supervisor): what a supervisor does
with a cancel or a pause is tested with real supervisors elsewhere.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis import progress
from tests.conftest import job_row

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix


def make_running(conn: psycopg.Connection[Any], job_id: int, *,
                 worker: str = "host-a:4242:0badc0de") -> None:
    conn.execute(
        "UPDATE atlantis.jobs SET state = 'running', attempt = attempt + 1, claimed_by = %s, "
        "claimed_until = now() + heartbeat, started_at = now() WHERE id = %s", (worker, job_id))


def make_dead(conn: psycopg.Connection[Any], job_id: int) -> None:
    conn.execute(
        "UPDATE atlantis.jobs SET state = 'dead', attempt = max_attempts, started_at = now(), "
        "finished_at = now(), claimed_by = 'host-a:1:aa', claimed_until = NULL, "
        "last_error = 'ValueError: boom', error_count = error_count + 1, "
        "errors = atlantis.errors_append(errors, jsonb_build_object('attempt', max_attempts, "
        "'kind', 'exception', 'message', 'ValueError: boom')), progress_pct = 40, "
        "progress_msg = 'page 4', progress_at = now(), "
        "progress_history = jsonb_build_array(jsonb_build_object('at', now(), 'pct', 40)) "
        "WHERE id = %s", (job_id,))


def notifications(listener: psycopg.Connection[Any], count: int) -> list[tuple[str, Any]]:
    got = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=count)]
    return [(channel, orjson.loads(payload) if channel == "atlantis_control" else payload)
            for channel, payload in got]


@pytest.fixture
def listener(db_url: str) -> Any:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("LISTEN atlantis_control")
        conn.execute("LISTEN atlantis_jobs")
        yield conn


# ---- cancel -----------------------------------------------------------------------------

def test_cancel_of_a_waiting_job_is_immediate(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "c"}, delay=3600)
    assert atlantis.cancel(db, job_id, by="alice") == "cancelled"
    row = job_row(db, job_id)
    assert row["state"] == "cancelled" and row["finished_at"] is not None
    assert row["cancelled_by"] == "alice" and row["last_error"] == "cancelled by alice"
    assert row["error_count"] == 1
    (entry,) = row["errors"]
    assert entry["kind"] == "cancelled" and entry["message"] == "cancelled by alice"
    assert entry["attempt"] == 0 and "at" in entry


def test_cancel_by_defaults_to_the_database_role(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "role"})
    role = db.execute("SELECT current_user").fetchone()
    assert role is not None
    assert db.execute("SELECT atlantis.cancel(%s)", (job_id,)).fetchone() == ("cancelled",)
    assert job_row(db, job_id)["cancelled_by"] == role[0]
    assert atlantis.cancel(db, job_id) is None  # finished already


def test_cancel_of_a_running_job_flags_it_and_tells_its_supervisor(
    db: psycopg.Connection[Any], listener: psycopg.Connection[Any]
) -> None:
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": "r", "seconds": 60.0})
    assert notifications(listener, 1) == [("atlantis_jobs", "tests")]  # the enqueue's wake-up
    make_running(db, job_id)
    assert atlantis.cancel(db, job_id, by="bob") == "running"
    assert notifications(listener, 1) == [
        ("atlantis_control", {"op": "cancel", "job_id": job_id, "worker": "host-a:4242:0badc0de"})]
    first = job_row(db, job_id)
    assert first["state"] == "running" and first["cancel_requested_at"] is not None
    assert first["cancelled_by"] == "bob" and first["errors"] == []
    # Asked again: the first request stands, the supervisor is told again.
    assert atlantis.cancel(db, job_id, by="carol") == "running"
    assert notifications(listener, 1)[0][1]["op"] == "cancel"
    again = job_row(db, job_id)
    assert again["cancel_requested_at"] == first["cancel_requested_at"]
    assert again["cancelled_by"] == "bob"


def test_cancel_of_finished_and_unknown_jobs(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "f"})
    make_dead(db, job_id)
    assert atlantis.cancel(db, job_id) is None
    assert job_row(db, job_id)["state"] == "dead"
    with pytest.raises(atlantis.JobNotFoundError, match="no job with id 424242"):
        atlantis.cancel(db, 424242)
    with pytest.raises(psycopg.Error) as raw:
        db.execute("SELECT atlantis.cancel(424242)")
    assert raw.value.sqlstate == "ATL04"


def test_cancel_never_commits_and_a_refusal_leaves_the_transaction_usable(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        job_id = atlantis.enqueue(conn, "tests.Echo", {"key": "tx"})
        conn.commit()
        with pytest.raises(atlantis.JobNotFoundError):
            atlantis.cancel(conn, 999_999)  # no transaction open: the failed one is rolled back
        assert atlantis.cancel(conn, job_id) == "cancelled"
        conn.rollback()
        assert job_row(conn, job_id)["state"] == "available"
        conn.execute("SELECT 1")  # a transaction is open now
        with pytest.raises(atlantis.JobNotFoundError):
            atlantis.cancel(conn, 999_999)
        assert atlantis.cancel(conn, job_id) == "cancelled"  # the savepoint kept it usable
        conn.commit()
        assert job_row(conn, job_id)["state"] == "cancelled"


# ---- retry ------------------------------------------------------------------------------

def test_retry_clears_progress_and_keeps_the_error_history(
    db: psycopg.Connection[Any], listener: psycopg.Connection[Any]
) -> None:
    job_id = atlantis.enqueue(db, "tests.Fail", {"key": "again", "mode": "raise"})
    assert notifications(listener, 1) == [("atlantis_jobs", "tests")]  # the enqueue's wake-up
    make_dead(db, job_id)
    assert atlantis.retry(db, job_id, by="dora") == job_id
    assert notifications(listener, 1) == [("atlantis_jobs", "tests")]
    row = job_row(db, job_id)
    assert row["state"] == "available" and row["attempt"] == 0 and row["finished_at"] is None
    assert row["claimed_by"] is None and row["claimed_until"] is None
    assert row["progress_pct"] is None and row["progress_msg"] is None
    assert row["progress_at"] is None and row["progress_history"] == []
    assert row["last_error"] is None and row["cancel_requested_at"] is None
    assert row["error_count"] == 1 and [e["message"] for e in row["errors"]] == ["ValueError: boom"]
    assert row["retried_by"] == "dora" and row["retried_at"] is not None
    assert atlantis.retry(db, job_id) is None  # available: nothing to retry
    with pytest.raises(atlantis.JobNotFoundError):
        atlantis.retry(db, 777_777)


def test_retry_of_a_cancelled_job_and_who_by_default(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "back"})
    atlantis.cancel(db, job_id)
    role = db.execute("SELECT current_user").fetchone()
    assert db.execute("SELECT atlantis.retry(%s)", (job_id,)).fetchone() == (job_id,)
    row = job_row(db, job_id)
    assert row["state"] == "available" and row["cancelled_by"] is None
    assert role is not None and row["retried_by"] == role[0]
    assert row["errors"][-1]["kind"] == "cancelled"


def test_retry_with_a_taken_unique_key_names_the_holder(db: psycopg.Connection[Any]) -> None:
    first = atlantis.enqueue(db, "tests.Typed", {"name": "uniq"})
    make_dead(db, first)
    holder = atlantis.enqueue(db, "tests.Typed", {"name": "uniq"})
    assert holder != first
    with pytest.raises(atlantis.UniqueKeyTakenError) as caught:
        atlantis.retry(db, first)
    message = str(caught.value)
    assert message.startswith(f"job {holder} (tests.Typed) already holds the unique key")
    assert str(first) in message
    assert job_row(db, first)["state"] == "dead"
    with pytest.raises(psycopg.Error) as raw:
        db.execute("SELECT atlantis.retry(%s)", (first,))
    assert raw.value.sqlstate == "ATL03"
    atlantis.cancel(db, holder)  # the key is free again
    assert atlantis.retry(db, first) == first


def test_a_refused_retry_leaves_the_callers_transaction_usable(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        first = atlantis.enqueue(conn, "tests.Typed", {"name": "tx"})
        make_dead(conn, first)
        atlantis.enqueue(conn, "tests.Typed", {"name": "tx"})
        other = atlantis.enqueue(conn, "tests.Echo", {"key": "other"})
        with pytest.raises(atlantis.UniqueKeyTakenError):
            atlantis.retry(conn, first)
        assert atlantis.cancel(conn, other) == "cancelled"
        conn.commit()
        assert job_row(conn, other)["state"] == "cancelled"
        assert job_row(conn, first)["state"] == "dead"


def test_async_twins(db_url: str, db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "async"})

    async def go() -> tuple[str | None, int | None]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            state = await atlantis.cancel_async(conn, job_id, by="eve")
            with pytest.raises(atlantis.JobNotFoundError):
                await atlantis.retry_async(conn, 555_555)
            again = await atlantis.retry_async(conn, job_id, by="eve")
            await conn.commit()
            return state, again

    assert asyncio.run(go()) == ("cancelled", job_id)
    row = job_row(db, job_id)
    assert row["state"] == "available" and row["retried_by"] == "eve"


# ---- pause and resume -------------------------------------------------------------------

def test_pause_and_resume_persist_and_notify(db: psycopg.Connection[Any],
                                            listener: psycopg.Connection[Any]) -> None:
    assert db.execute("SELECT atlantis.pause('tests', 'upstream down', 'frank')").fetchone() == (True,)
    assert notifications(listener, 1) == [("atlantis_control", {"op": "pause", "queue": "tests"})]
    row = db.execute("SELECT paused, reason, changed_by, changed_at IS NOT NULL "
                     "FROM atlantis.queues WHERE name = 'tests'").fetchone()
    assert row == (True, "upstream down", "frank", True)
    # Paused again: still paused, the new reason kept, and not a change.
    assert db.execute("SELECT atlantis.pause('tests', 'still down')").fetchone() == (False,)
    notifications(listener, 1)
    assert db.execute("SELECT reason FROM atlantis.queues WHERE name = 'tests'").fetchone() == (
        "still down",)
    assert db.execute("SELECT atlantis.resume('tests', 'grace')").fetchone() == (True,)
    got = notifications(listener, 2)
    assert ("atlantis_control", {"op": "resume", "queue": "tests"}) in got
    assert ("atlantis_jobs", "tests") in got
    row = db.execute("SELECT paused, reason, changed_by FROM atlantis.queues "
                     "WHERE name = 'tests'").fetchone()
    assert row == (False, None, "grace")
    assert db.execute("SELECT atlantis.resume('tests')").fetchone() == (False,)


def test_python_pause_and_resume(db: psycopg.Connection[Any]) -> None:
    from atlantis import operations

    assert operations.pause(db, "typed", reason="migration", by="gus") is True
    assert operations.resume(db, "typed") is True
    role = db.execute("SELECT current_user").fetchone()
    assert role is not None
    assert db.execute("SELECT changed_by FROM atlantis.queues WHERE name = 'typed'").fetchone() == (
        role[0],)


# ---- stall ------------------------------------------------------------------------------

def test_stalled_uses_the_declared_threshold_or_three_heartbeats(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": "st", "seconds": 1.0})
    make_running(db, job_id)

    def stalled() -> tuple[Any, ...] | None:
        return db.execute("SELECT atlantis.stalled(j), "
                          "extract(epoch FROM atlantis.stall_after(j.job, j.heartbeat)) "
                          "FROM atlantis.jobs j WHERE id = %s", (job_id,)).fetchone()

    assert stalled() == (False, 9)  # heartbeat 3s, no stall declared
    db.execute("UPDATE atlantis.jobs SET started_at = now() - interval '10 seconds' WHERE id = %s",
               (job_id,))
    assert stalled() == (True, 9)
    db.execute("UPDATE atlantis.jobs SET progress_at = now(), progress_pct = 5 WHERE id = %s",
               (job_id,))
    assert stalled() == (False, 9)
    db.execute("UPDATE atlantis.job_types SET stall = interval '1 hour' WHERE job = 'tests.Sleep'")
    db.execute("UPDATE atlantis.jobs SET progress_at = now() - interval '30 minutes' WHERE id = %s",
               (job_id,))
    assert stalled() == (False, 3600)


# ---- rate and ETA (pure) ----------------------------------------------------------------

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def history(*points: tuple[float, float]) -> list[dict[str, Any]]:
    """`progress_history` entries for (seconds after T0, pct) pairs, as the database stores."""
    return [{"at": (T0 + timedelta(seconds=s)).isoformat(), "pct": p} for s, p in points]


def test_rate_is_the_least_squares_slope_in_pct_per_minute() -> None:
    steady = progress.samples(history((0, 0), (60, 2), (120, 4), (180, 6)))
    assert progress.rate_per_minute(steady) == pytest.approx(2.0)
    # One late checkpoint moves a least-squares rate less than it moves first/last.
    jumpy = progress.samples(history((0, 0), (60, 2), (120, 4), (180, 12)))
    rate = progress.rate_per_minute(jumpy)
    assert rate is not None and 2.0 < rate < 4.0
    # Only the newest `window` samples count: an old slow phase is forgotten.
    phases = progress.samples(history((0, 0), (600, 1), (660, 11), (720, 21)))
    assert progress.rate_per_minute(phases, window=3) == pytest.approx(10.0)


def test_rate_needs_two_distinct_instants() -> None:
    assert progress.rate_per_minute([]) is None
    assert progress.rate_per_minute(progress.samples(history((0, 5)))) is None
    assert progress.rate_per_minute(progress.samples(history((0, 5), (0, 7)))) is None


def test_samples_skip_malformed_entries_and_sort() -> None:
    raw: list[dict[str, Any]] = [{"at": "not a time", "pct": 1}, {"pct": 2}, {"at": T0.isoformat()},
                                 {"at": "2026-01-01T12:00:00", "pct": 3},  # no time zone
                                 {"at": (T0 + timedelta(seconds=5)).isoformat(), "pct": "nan"},
                                 *history((10, 20), (0, 10))]
    assert progress.samples(raw) == [progress.Sample(T0, 10.0),
                                     progress.Sample(T0 + timedelta(seconds=10), 20.0)]


def test_eta_extends_the_rate_from_the_last_checkpoint() -> None:
    last = progress.Sample(T0, 40.0)
    assert progress.eta_seconds(last, 2.0, T0) == pytest.approx(30 * 60)
    assert progress.eta_seconds(last, 2.0, T0 + timedelta(minutes=10)) == pytest.approx(20 * 60)
    assert progress.eta_seconds(last, 2.0, T0 + timedelta(hours=2)) == 0.0  # overdue: due now
    assert progress.eta_seconds(last, 0.0, T0) is None
    assert progress.eta_seconds(last, -1.0, T0) is None
    assert progress.eta_seconds(last, None, T0) is None
    assert progress.eta_seconds(None, 2.0, T0) is None
    assert progress.eta_seconds(progress.Sample(T0, 100.0), None, T0) == 0.0


def test_estimate_counts_the_latest_checkpoint_and_gives_an_eta_only_while_running() -> None:
    points = history((0, 0), (60, 5))
    now = T0 + timedelta(seconds=120)
    # The latest checkpoint (10% at 120s) is newer than the last sample: it counts.
    guess = progress.estimate(points, pct=10, at=now, now=now, running=True)
    assert guess.rate == pytest.approx(5.0)
    assert guess.eta_seconds == pytest.approx(18 * 60)
    finished = progress.estimate(points, pct=10, at=now, now=now, running=False)
    assert finished == progress.Estimate(None, None)  # no rate either once it stopped
    # From the current run only: what came before it started does not count.
    resumed = progress.estimate(points, pct=10, at=now, now=now, running=True,
                                since=T0 + timedelta(seconds=90))
    assert resumed == progress.Estimate(None, None)
    assert progress.estimate([], pct=None, at=None, now=now, running=True) == progress.Estimate(
        None, None)
