"""Operating long-running jobs (issue 8), against real supervisors: prompt cancellation with
a grace, shutdown that is not cancellation, attempt history, attempt logs, checkpoint
history, queue pause and resume. Tests assert order, never milliseconds.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from tests.conftest import BIN, ROOT, events, job_row, wait_for, wait_state

APP = "tests.apps.ops:registry"
QUEUES = ("ops",)


def _start(supervise: Any, *args: str, concurrency: int = 2,
           queues: tuple[str, ...] = QUEUES) -> Any:
    return supervise("--cancel-grace", "2s", *args, queues=queues, app=APP, concurrency=concurrency)


def _long(db: psycopg.Connection[Any], key: str, mode: str) -> int:
    return atlantis.enqueue(db, "ops.Long", {"key": key, "mode": mode})


def _kinds(db: psycopg.Connection[Any], key: str) -> list[str]:
    return [e[2] for e in events(db, key)]


def _started(db: psycopg.Connection[Any], key: str) -> None:
    wait_for(lambda: "started" in _kinds(db, key), message=f"{key} to start")


# ---- cancellation -----------------------------------------------------------------------------

def test_cancel_reaches_the_handler_long_before_a_10m_heartbeat_renews(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise)
    obey = _long(db, "obey", "obey")
    ignore = _long(db, "ignore", "ignore")
    _started(db, "obey")
    _started(db, "ignore")
    assert db.execute("SELECT atlantis.cancel(%s)", (obey,)).fetchone() == ("running",)
    assert db.execute("SELECT atlantis.cancel(%s)", (ignore,)).fetchone() == ("running",)
    # With heartbeat 10m the first renewal is 200 s away: the handler hears it by NOTIFY.
    row = wait_state(db, obey, "cancelled")
    assert _kinds(db, "obey") == ["started", "saw-cancel"]
    assert row["errors"][-1]["kind"] == "cancelled" and row["attempt"] == 1
    # The one that ignores it gets its grace, then SIGTERM: it saw the cancel first.
    row = wait_state(db, ignore, "cancelled")
    assert _kinds(db, "ignore") == ["started", "saw-cancel", "terminated"]
    assert row["errors"][-1]["kind"] == "cancelled"
    assert "did not return within the cancel grace" in sup.log()
    assert sup.proc.poll() is None


def _request_cancel_without_notify(db: psycopg.Connection[Any], job_id: int) -> None:
    """As if the NOTIFY of ``atlantis.cancel`` was lost: only the row says it."""
    db.execute("UPDATE atlantis.jobs SET cancel_requested_at = now(), cancelled_by = 'test' "
               "WHERE id = %s", (job_id,))


@pytest.mark.parametrize(("job", "poll"), [
    # Renewed every second (3 s heartbeat), polled never: the renewal reads the request
    # (attempts renewed at least as often as the cancel poll are not polled).
    ("ops.Brief", "1h"),
    # A 10m heartbeat: no renewal for 200 s, so the poll finds the request.
    ("ops.Long", "0.3s"),
])
def test_a_cancel_whose_notify_was_lost_still_arrives(
        db: psycopg.Connection[Any], supervise: Any, job: str, poll: str) -> None:
    _start(supervise, "--cancel-poll", poll)
    job_id = atlantis.enqueue(db, job, {"key": "lost", "mode": "obey"})
    _started(db, "lost")
    _request_cancel_without_notify(db, job_id)
    row = wait_state(db, job_id, "cancelled")
    assert _kinds(db, "lost") == ["started", "saw-cancel"]
    assert row["errors"][-1]["kind"] == "cancelled"


def test_a_cancel_during_a_failing_attempt_is_not_undone_by_a_retry(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    job_id = _long(db, "raise", "raise")  # retries 2: it would be retried
    _started(db, "raise")
    db.execute("SELECT atlantis.cancel(%s)", (job_id,))
    row = wait_state(db, job_id, "cancelled")
    assert [e["kind"] for e in row["errors"]] == ["exception", "cancelled"]
    assert row["attempt"] == 1 and _kinds(db, "raise").count("started") == 1


def test_a_drain_is_not_a_cancel_and_a_cancel_during_a_drain_still_cancels(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise, "--drain-timeout", "30s")
    yielding = _long(db, "yield", "yield")
    waiting = _long(db, "wait", "wait")
    _started(db, "yield")
    _started(db, "wait")
    sup.signal(signal.SIGTERM)
    # ctx.stopping, not ctx.cancelled: the yielding handler snoozes, its attempt given back.
    row = wait_state(db, yielding, "available")
    wait_for(lambda: "saw-stopping" in _kinds(db, "yield"), message="the handler to see stopping")
    assert row["attempt"] == 0 and row["errors"] == []
    wait_for(lambda: _kinds(db, "wait")[-1] != "started", message="the other to see stopping")
    assert _kinds(db, "wait")[-1] == "cancelled=False stopping=True"
    assert wait_state(db, waiting, "complete")["state"] == "complete"
    assert sup.wait(30) == 0


def test_a_cancel_during_a_drain_ends_cancelled_not_released(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise, "--drain-timeout", "30s")
    job_id = _long(db, "obey", "obey")
    _started(db, "obey")
    sup.signal(signal.SIGTERM)
    wait_for(lambda: "draining" in sup.log(), message="the drain")
    db.execute("SELECT atlantis.cancel(%s)", (job_id,))
    row = wait_state(db, job_id, "cancelled")
    assert row["errors"][-1]["kind"] == "cancelled"
    assert sup.wait(30) == 0


# ---- history ----------------------------------------------------------------------------------

def test_every_attempt_is_kept_with_its_worker_and_child(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise)
    job_id = _long(db, "flaky", "flaky")
    wait_state(db, job_id, "complete")
    rows = db.execute("SELECT attempt, outcome, error_kind, host, pid, child_pid, started_at,"
                      " finished_at FROM atlantis.attempts WHERE job_id = %s ORDER BY id",
                      (job_id,)).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [(1, "failed", "exception"), (2, "complete", None)]
    for r in rows:
        assert r[3] and r[4] == sup.pid and r[5] and r[6] <= r[7]


def test_checkpoints_are_sampled_into_a_history(db: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    job_id = _long(db, "progress", "progress")
    wait_for(lambda: len(job_row(db, job_id)["progress_history"]) >= 2, message="two samples")
    wait_state(db, job_id, "complete")
    history = job_row(db, job_id)["progress_history"]
    assert 2 <= len(history) <= 200
    pcts = [h["pct"] for h in history]
    assert pcts == sorted(pcts)


# ---- logs -------------------------------------------------------------------------------------

def test_attempt_logs_are_kept_bounded_and_followed(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise, "--log-retention-bytes", "10KB")
    small = atlantis.enqueue(db, "ops.Talk", {"key": "small", "lines": 50})
    wait_state(db, small, "complete")
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.logs WHERE job_id = %s",
                                (small,)).fetchone() == (50,), message="50 lines")
    first = db.execute("SELECT stream, line FROM atlantis.logs WHERE job_id = %s ORDER BY id"
                       " LIMIT 1", (small,)).fetchone()
    assert first is not None and first[0] == "stdout" and first[1].startswith("talk 00000 ")
    # 2,000 lines of ~52 bytes: only the newest ~10 KB are kept, the rest counted.
    big = atlantis.enqueue(db, "ops.Talk", {"key": "big", "lines": 2000})
    follow = subprocess.Popen([str(BIN / "tide"), "--database-url", db_url, "job", "logs",
                               str(big), "--follow"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert "talk 01999" in out  # followed to the end of the attempt
    wait_state(db, big, "complete")
    counts = wait_for(lambda: db.execute("SELECT log_lines, log_dropped FROM atlantis.attempts"
                                         " WHERE job_id = %s", (big,)).fetchone())
    assert counts[0] == 2000

    def kept_lines() -> int:
        row = db.execute("SELECT count(*) FROM atlantis.logs WHERE job_id = %s", (big,)).fetchone()
        return int(row[0]) if row else 0

    # The last trim follows the last flush (every 250 ms), which may come after the outcome.
    wait_for(lambda: kept_lines() == counts[0] - counts[1], message="the last trim")
    kept = kept_lines()
    assert 100 <= kept <= 250
    newest = db.execute("SELECT line FROM atlantis.logs WHERE job_id = %s ORDER BY id DESC LIMIT 1",
                        (big,)).fetchone()
    assert newest is not None and newest[0].startswith("talk 01999")


@pytest.mark.parametrize("keep", [0, 2, 5, 9])
def test_a_trim_keeps_the_newest_lines_and_none_when_told_none(
        db: psycopg.Connection[Any], keep: int) -> None:
    """The trim the supervisor sends when an attempt's budget is spent. ``keep`` 0 happens
    when a flood passed the whole budget while its first batch was being written: every
    line of the database is then older than the budget (found as a flake of the test above,
    whose first 196 lines stayed forever beside the last 196)."""
    from atlantis.store.queries import Q

    other = atlantis.enqueue(db, "ops.Talk", {"key": "other", "lines": 1})
    mine = atlantis.enqueue(db, "ops.Talk", {"key": "mine", "lines": 1})
    for job_id in (other, mine):
        for n in range(5):
            db.execute("INSERT INTO atlantis.logs (job_id, run, attempt, at, stream, line)"
                       " VALUES (%s, 1, 1, now(), 'stdout', %s)", (job_id, f"line {n}"))
    db.execute(Q.log_trim, {"job_id": mine, "run": 1, "attempt": 1, "keep": keep})
    lines = [r[0] for r in db.execute("SELECT line FROM atlantis.logs WHERE job_id = %s"
                                      " ORDER BY id", (mine,)).fetchall()]
    assert lines == [f"line {n}" for n in range(5)][5 - min(keep, 5):]
    assert db.execute("SELECT count(*) FROM atlantis.logs WHERE job_id = %s",
                      (other,)).fetchone() == (5,)  # another job's lines are not touched


# ---- pause ------------------------------------------------------------------------------------

def test_pause_and_resume_with_two_supervisors(db: psycopg.Connection[Any], supervise: Any) -> None:
    # Both serve "probe" too, which stays unpaused: a job there shows that a claim was made.
    sups = [_start(supervise, concurrency=1, queues=("ops", "probe")) for _ in range(2)]
    running = _long(db, "wait", "wait")
    _started(db, "wait")
    db.execute("SELECT atlantis.pause('ops', 'upstream down')")
    wait_for(lambda: all("queue ops is paused" in s.log() for s in sups),
             message="both to hear the pause")
    waiting = _long(db, "flaky", "flaky")
    # Nothing is claimed from a paused queue. A job enqueued after it, of a lower priority,
    # starts on the idle supervisor: a claim that looked at the paused queue would have
    # taken the waiting job first (claims go by priority, then age).
    probe = atlantis.enqueue(db, "ops.Long", {"key": "probe", "mode": "obey"}, queue="probe",
                             priority=9)
    _started(db, "probe")
    assert job_row(db, waiting)["state"] == "available"
    assert job_row(db, running)["state"] == "running"  # running attempts continue
    atlantis.cancel(db, probe)  # the idle supervisor's one slot is free again
    wait_state(db, probe, "cancelled")
    db.execute("SELECT atlantis.resume('ops')")
    wait_state(db, waiting, "complete")
    for sup in sups:
        assert sup.proc.poll() is None


def test_watchers_hear_progress_and_ends_once_per_statement(
        db_url: str, db: psycopg.Connection[Any], supervise: Any) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN atlantis_progress")
        _start(supervise)
        job_id = _long(db, "progress", "progress")
        heard: list[list[int]] = []

        def ended() -> bool:
            for note in listener.notifies(timeout=0.2, stop_after=50):
                heard.append(orjson.loads(note.payload))
            return job_row(db, job_id)["state"] == "complete" and len(heard) >= 2

        wait_for(ended, message="progress and completion notifications")
    assert all(ids == [job_id] for ids in heard)
    # Samples at most once a second, plus the end: far fewer than the ten checkpoints.
    assert 2 <= len(heard) <= 6


def test_async_handlers_see_the_cancel_too(db: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(db, "ops.AsyncLong", {"key": "async"})
    _started(db, "async")
    atlantis.cancel(db, job_id)
    row = wait_state(db, job_id, "cancelled")
    assert _kinds(db, "async") == ["started", "saw-cancel"] and row["errors"][-1]["kind"] == "cancelled"
