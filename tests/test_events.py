"""Events (issue 35, part of it): ``ctx.wait_for_event`` suspends a job, holding nothing,
until ``atlantis.send_event`` (Python, SQL or ``tide job send-event``) sends it an event of
that name; one sent before the wait is kept for it; each is consumed once; a deadline ends
the wait with EventTimeout; an ended job refuses events. Real supervisors, real PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import atlantis
from tests.conftest import events, job_row, run_tide, wait_for, wait_state

APP = "tests.apps.durable:registry"


def _start(supervise: Any) -> Any:
    return supervise(queues=("durable",), app=APP, concurrency=2)


def _kinds(db: psycopg.Connection[Any], key: str) -> list[str]:
    return [e[2] for e in events(db, key)]


def _waiting(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    row = job_row(db, job_id)
    return row if row["state"] == "available" and row["suspended_for"] else None


def _wait_job(db: psycopg.Connection[Any], key: str, timeout: float | None = None) -> int:
    return atlantis.enqueue(db, "durable.Wait", {"key": key, "event": "approved",
                                                 "timeout": timeout})


def test_an_event_sent_to_a_waiting_job_resumes_it_with_its_payload(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    job_id = _wait_job(ddb, "after")
    asleep = wait_for(lambda: _waiting(ddb, job_id), message="the job to wait")
    assert asleep["suspended_for"] == "event:approved" and asleep["attempt"] == 0
    atlantis.send_event(ddb, job_id, "approved", {"by": "alice"})
    ddb.commit()
    row = wait_state(ddb, job_id, "complete")
    assert row["result"] == {"by": "alice"} and row["attempt"] == 1
    assert _kinds(ddb, "after") == ["before", "received"]
    consumed = ddb.execute("SELECT consumed_by FROM atlantis.job_events WHERE job_id = %s",
                           (job_id,)).fetchall()
    assert consumed == [("approval",)]


def test_an_event_sent_before_the_wait_is_kept_for_it(ddb: psycopg.Connection[Any],
                                                      supervise: Any) -> None:
    job_id = _wait_job(ddb, "before")
    atlantis.send_event(ddb, job_id, "approved", "early")
    atlantis.send_event(ddb, job_id, "approved", "second")  # kept for a later wait
    ddb.commit()
    _start(supervise)
    row = wait_state(ddb, job_id, "complete")
    assert row["result"] == "early"
    assert ddb.execute("SELECT payload, consumed_at IS NOT NULL FROM atlantis.job_events "
                       "WHERE job_id = %s ORDER BY id", (job_id,)).fetchall() == [
        ("early", True), ("second", False)]


def test_events_from_sql_and_from_tide(ddb: psycopg.Connection[Any], db_url: str,
                                       supervise: Any) -> None:
    _start(supervise)
    by_sql = _wait_job(ddb, "sql")
    by_tide = _wait_job(ddb, "tide")
    wait_for(lambda: _waiting(ddb, by_sql) and _waiting(ddb, by_tide),
             message="both jobs to wait")
    ddb.execute("SELECT atlantis.send_event(%s, 'approved', '[1, 2]'::jsonb)", (by_sql,))
    ddb.commit()
    sent = run_tide(["--database-url", db_url, "job", "send-event", str(by_tide), "approved",
                     "--payload", '{"ok": true}'])
    assert sent.stdout.startswith(f"event approved sent to job {by_tide}")
    assert wait_state(ddb, by_sql, "complete")["result"] == [1, 2]
    assert wait_state(ddb, by_tide, "complete")["result"] == {"ok": True}


def test_a_wait_past_its_deadline_raises_event_timeout(ddb: psycopg.Connection[Any],
                                                       supervise: Any) -> None:
    _start(supervise)
    job_id = _wait_job(ddb, "late", timeout=0.5)
    row = wait_state(ddb, job_id, "dead")
    assert row["errors"][-1]["kind"] == "exception"
    assert "EventTimeout" in row["last_error"] and "'approved'" in row["last_error"]
    assert _kinds(ddb, "late") == ["before", "timed-out"]


def test_cancel_ends_a_waiting_job_and_an_ended_job_refuses_events(
        ddb: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)
    job_id = _wait_job(ddb, "cancel")
    wait_for(lambda: _waiting(ddb, job_id), message="the job to wait")
    assert atlantis.cancel(ddb, job_id) == "cancelled"
    ddb.commit()
    with pytest.raises(atlantis.JobEndedError, match=f"job {job_id} is cancelled"):
        atlantis.send_event(ddb, job_id, "approved")
    ddb.rollback()
    refused = run_tide(["--database-url", db_url, "job", "send-event", str(job_id),
                        "approved"], check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().endswith(
        f"job {job_id} is cancelled: an event can no longer reach it")
    with pytest.raises(atlantis.JobNotFoundError):
        atlantis.send_event(ddb, 987654321, "approved")
    ddb.rollback()


def test_bad_events_are_refused_in_one_line(ddb: psycopg.Connection[Any], db_url: str) -> None:
    job_id = _wait_job(ddb, "bad")
    ddb.commit()
    with pytest.raises(atlantis.ValidationError, match="more than the limit of 65536"):
        atlantis.send_event(ddb, job_id, "approved", "x" * 70_000)
    ddb.rollback()
    with pytest.raises(atlantis.ValidationError, match="1 to 200 characters"):
        atlantis.send_event(ddb, job_id, "")
    ddb.rollback()
    bad = run_tide(["--database-url", db_url, "job", "send-event", str(job_id), "approved",
                    "--payload", "{nope"], check=False)
    assert bad.returncode == 2 and "--payload: not JSON" in bad.stderr


def test_tide_shows_what_a_job_waits_for(ddb: psycopg.Connection[Any], db_url: str,
                                        supervise: Any) -> None:
    _start(supervise)
    job_id = _wait_job(ddb, "shown")
    wait_for(lambda: _waiting(ddb, job_id), message="the job to wait")
    status = run_tide(["--database-url", db_url, "job", "status", str(job_id)]).stdout
    assert "waiting    for event approved" in status
    assert "9999" not in status.split("waiting", 1)[1].splitlines()[0]


def test_one_child_runs_many_waits_on_its_kept_connection(ddb: psycopg.Connection[Any],
                                                           supervise: Any) -> None:
    """One child, twelve jobs each waiting then resumed: the statements its kept step
    connection prepared (after five runs of one) stay valid across its attempts (a reset that
    dropped them under psycopg's cache failed the fourth job: "_pg3_0 does not exist")."""
    supervise(queues=("durable",), app=APP, concurrency=1)
    for n in range(12):
        job_id = _wait_job(ddb, f"many-{n}")
        ddb.commit()
        row = wait_for(lambda: (r := job_row(ddb, job_id))  # noqa: B023 - waited here
                       and (r["suspended_for"] or r["state"] == "dead") and r,
                       message=f"job {n} to wait")
        assert row["state"] != "dead", row["errors"]
        atlantis.send_event(ddb, job_id, "approved", n)
        ddb.commit()
        row = wait_state(ddb, job_id, "complete", "dead")
        assert (row["state"], row["result"]) == ("complete", n), row["errors"]
