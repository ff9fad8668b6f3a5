"""Handler steps (issue 34) against real supervisors, real child processes and real signals:
a step runs once across runs (kill -9 of the supervisor or of the child, SIGSTOP past the
lease, ``--isolation fresh``), a transaction step's writes commit exactly once, a durable
sleep spends no attempt and holds nothing, and every misuse is a clear error.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import atlantis
from tests.conftest import child_processes, events, job_row, run_tide, wait_for, wait_state
from tests.test_roles import login as login  # the fixture

APP = "tests.apps.durable:registry"
QUEUES = ("durable",)


def _start(supervise: Any, *args: str, concurrency: int = 2, session: bool = False) -> Any:
    return supervise(*args, queues=QUEUES, app=APP, concurrency=concurrency, session=session)


def _kinds(db: psycopg.Connection[Any], key: str) -> list[str]:
    return [e[2] for e in events(db, key)]


def _bodies(db: psycopg.Connection[Any], key: str) -> list[str]:
    return [k for k in _kinds(db, key) if k.startswith("body-")]


def _effects(db: psycopg.Connection[Any], key: str) -> list[int]:
    return [r[0] for r in db.execute(
        "SELECT page FROM durable_effects WHERE key = %s ORDER BY page, id", (key,))]


def _records(db: psycopg.Connection[Any], job_id: int) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in db.execute(
        "SELECT name, kind FROM atlantis.job_steps WHERE job_id = %s ORDER BY recorded_at",
        (job_id,))]


def _steps_job(db: psycopg.Connection[Any], key: str, n: int = 6, hold_at: int = 2) -> int:
    return atlantis.enqueue(db, "durable.Steps", {"key": key, "n": n, "hold_at": hold_at})


def _running_by_hand(db: psycopg.Connection[Any], job_id: int) -> Any:
    """Set ``job_id`` running under a new run id, as a claim would; returns the run id."""
    row = db.execute(
        "UPDATE atlantis.jobs SET state = 'running', attempt = 1, claimed_by = 'w', "
        "claimed_until = now() + interval '1 hour', started_at = now(), "
        "run_id = gen_random_uuid() WHERE id = %s RETURNING run_id", (job_id,)).fetchone()
    db.commit()
    assert row is not None
    return row[0]


# ---- memoization across runs ----------------------------------------------------------------

def test_steps_recorded_before_a_supervisor_kill_9_are_not_run_again(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    first = _start(supervise)
    job_id = _steps_job(ddb, "k9")
    wait_for(lambda: "held" in _kinds(ddb, "k9"), message="the first run to hold")
    first.signal(signal.SIGKILL)
    first.wait()
    _start(supervise)
    row = wait_state(ddb, job_id, "complete")
    assert row["result"] == sum(i * 2 for i in range(6))
    # Steps 0-2 ran in the first run only; 3-5 in the second only.
    assert _bodies(ddb, "k9") == [f"body-{i}" for i in range(6)]
    assert row["attempt"] == 2
    assert [name for name, _ in _records(ddb, job_id)] == [f"s-{i}" for i in range(6)]


def test_steps_survive_a_kill_9_of_the_child(ddb: psycopg.Connection[Any],
                                             supervise: Any) -> None:
    sup = _start(supervise)
    job_id = _steps_job(ddb, "child9")
    wait_for(lambda: "held" in _kinds(ddb, "child9"), message="the first run to hold")
    for pid in child_processes(sup.pid):
        os.kill(pid, signal.SIGKILL)
    row = wait_state(ddb, job_id, "complete")
    assert _bodies(ddb, "child9") == [f"body-{i}" for i in range(6)]
    assert row["errors"][-1]["kind"] == "crash"


def test_steps_survive_a_supervisor_stopped_past_its_lease(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    stopped = _start(supervise, session=True)
    job_id = _steps_job(ddb, "stop")
    wait_for(lambda: "held" in _kinds(ddb, "stop"), message="the first run to hold")
    os.killpg(stopped.pid, signal.SIGSTOP)
    try:
        _start(supervise)
        row = wait_state(ddb, job_id, "complete", timeout=60)
    finally:
        os.killpg(stopped.pid, signal.SIGCONT)
    assert _bodies(ddb, "stop") == [f"body-{i}" for i in range(6)]
    assert row["attempt"] == 2


def test_steps_with_isolation_fresh(ddb: psycopg.Connection[Any], supervise: Any) -> None:
    first = _start(supervise, "--isolation", "fresh")
    job_id = _steps_job(ddb, "fresh")
    wait_for(lambda: "held" in _kinds(ddb, "fresh"), message="the first run to hold")
    first.signal(signal.SIGKILL)
    first.wait()
    _start(supervise, "--isolation", "fresh")
    wait_state(ddb, job_id, "complete")
    assert _bodies(ddb, "fresh") == [f"body-{i}" for i in range(6)]


def test_async_handler_steps_are_awaited_and_kept_across_attempts(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.AsyncSteps", {"key": "async", "n": 3})
    row = wait_state(ddb, job_id, "complete", "dead")
    assert row["state"] == "complete", row["errors"]
    assert row["result"] == 2 * (0 + 1 + 2) + 1
    # The first attempt failed after its steps: the second ran none of their bodies again,
    # and the transaction step wrote once.
    assert _bodies(ddb, "async") == ["body-0", "body-1", "body-2"]
    assert _effects(ddb, "async") == [0]
    assert row["attempt"] == 2
    assert _attempt_kinds(ddb, job_id) == ["suspend", "exception", "complete"]


# ---- transaction steps --------------------------------------------------------------------

def test_transaction_steps_write_exactly_once_under_repeated_kill_9(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    job_id = atlantis.enqueue(ddb, "durable.Pages", {"key": "pages", "pages": 8, "hold_at": 2})
    for attempt in (1, 2, 3):
        sup = _start(supervise)
        page = 2 + attempt - 1
        held = f"held-{page}"
        wait_for(lambda: held in _kinds(ddb, "pages"), timeout=60,  # noqa: B023 - waited here
                 message=f"attempt {attempt} to hold in page {page}'s transaction")
        sup.signal(signal.SIGKILL)
        sup.wait()
    _start(supervise)
    row = wait_state(ddb, job_id, "complete", timeout=60)
    assert row["result"] == 8
    assert _effects(ddb, "pages") == list(range(8))
    assert [k for k, kind in _records(ddb, job_id) if kind == "transaction"] == [
        f"page-{p}" for p in range(8)]


def test_a_transaction_step_whose_run_lost_the_job_writes_nothing(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.Misuse", {"key": "lose", "mode": "lose"})
    wait_for(lambda: "wrote" in _kinds(ddb, "lose"), message="the step's body to write")
    wait_for(lambda: _attempt_kinds(ddb, job_id), message="the attempt to end")
    assert _effects(ddb, "lose") == []
    assert _records(ddb, job_id) == []
    assert "after" not in _kinds(ddb, "lose")  # the run stopped at the step


def _attempt_kinds(db: psycopg.Connection[Any], job_id: int) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT coalesce(error_kind, outcome) FROM atlantis.attempts WHERE job_id = %s",
        (job_id,))]


# ---- durable sleep --------------------------------------------------------------------------

def test_a_sleep_ends_the_run_spends_no_attempt_and_resumes_after_it(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.Nap", {"key": "nap", "seconds": 1.5})
    asleep = wait_for(lambda: _asleep(ddb, job_id), message="the job to sleep")
    assert asleep["suspended_for"] == "sleep:nap" and asleep["attempt"] == 0
    assert asleep["run_at"] > asleep["now"]
    row = wait_state(ddb, job_id, "complete")
    assert row["result"] == "woke" and row["attempt"] == 1 and row["max_attempts"] == 1
    assert _kinds(ddb, "nap") == ["before", "after"]
    assert [k for _, k in _records(ddb, job_id)] == ["step", "sleep", "step"]
    assert _attempt_kinds(ddb, job_id) == ["suspend", "complete"]


def _asleep(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    row = job_row(db, job_id)
    if row["state"] == "available" and row["suspended_for"]:
        row["now"] = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        return row
    return None


def test_cancel_ends_a_sleeping_job_at_once(ddb: psycopg.Connection[Any],
                                            supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.Nap", {"key": "cancel", "seconds": 600})
    wait_for(lambda: _asleep(ddb, job_id), message="the job to sleep")
    assert atlantis.cancel(ddb, job_id) == "cancelled"
    assert job_row(ddb, job_id)["state"] == "cancelled"


def test_a_sleeping_job_holds_no_concurrency_slot(ddb: psycopg.Connection[Any],
                                                  supervise: Any) -> None:
    _start(supervise)
    first = atlantis.enqueue(ddb, "durable.NapLimited", {"key": "lim1", "seconds": 600})
    wait_for(lambda: _asleep(ddb, first), message="the first job to sleep")
    second = atlantis.enqueue(ddb, "durable.NapLimited", {"key": "lim2", "seconds": 0})
    row = wait_state(ddb, second, "complete")
    assert row["result"] == "woke"
    assert job_row(ddb, first)["state"] == "available"


# ---- misuse ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "kind", "text"), [
    ("twice", "steps", "handler step 'a' was already used in this run"),
    ("swallow", "swallowed", "caught atlantis.Suspended"),
    ("nan", "result", "NaN or an infinity"),
    ("bad-sleep", "steps", "ctx.sleep needs a finite duration of at least 0 seconds"),
])
def test_misuse_fails_the_attempt_with_a_clear_error(
        ddb: psycopg.Connection[Any], supervise: Any, mode: str, kind: str, text: str) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.Misuse", {"key": mode, "mode": mode})
    row = wait_state(ddb, job_id, "dead")
    assert row["errors"][-1]["kind"] == kind, row["errors"]
    assert text in row["last_error"]


def test_a_handler_database_that_is_not_the_jobs_is_refused(
        ddb: psycopg.Connection[Any], db_url: str, admin_url: str, supervise: Any) -> None:
    _start(supervise, "--handler-database-url", admin_url)
    job_id = _steps_job(ddb, "elsewhere")
    def failed() -> dict[str, Any] | None:
        found = job_row(ddb, job_id)
        return found if found["errors"] else None

    row: dict[str, Any] = wait_for(failed, message="a failed attempt")
    error = row["errors"][0]
    assert error["kind"] == "steps"
    assert "handler steps need the handler's database to be the jobs' database" in error["message"]
    assert _bodies(ddb, "elsewhere") == []


# ---- operators: retry keeps the records, --fresh clears them --------------------------------

def test_retry_resumes_from_the_records_and_retry_fresh_starts_over(
        ddb: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.Steps", {"key": "again", "n": 3, "hold_at": -1})
    wait_state(ddb, job_id, "complete")
    # A finished job's records stay; make it dead to retry it (as an operator would find it).
    ddb.execute("UPDATE atlantis.jobs SET state = 'dead' WHERE id = %s", (job_id,))
    ddb.commit()
    run_tide(["--database-url", db_url, "job", "retry", str(job_id)])
    wait_state(ddb, job_id, "complete")
    assert _bodies(ddb, "again") == ["body-0", "body-1", "body-2"]
    ddb.execute("UPDATE atlantis.jobs SET state = 'dead' WHERE id = %s", (job_id,))
    ddb.commit()
    run_tide(["--database-url", db_url, "job", "retry", "--fresh", str(job_id)])
    wait_state(ddb, job_id, "complete")
    assert _bodies(ddb, "again") == ["body-0", "body-1", "body-2"] * 2


# ---- the handler's role ---------------------------------------------------------------------

def test_an_enqueuer_role_runs_steps_transactions_and_sleeps(
        ddb: psycopg.Connection[Any], supervise: Any,
        login: Callable[[str], str]) -> None:
    handler_url = login("atlantis_enqueuer")
    # The app's own tables, in this database only (dropped with it).
    ddb.execute("GRANT SELECT, INSERT ON test_events, durable_effects TO atlantis_enqueuer")
    ddb.execute("GRANT USAGE ON SEQUENCE test_events_id_seq, durable_effects_id_seq "
                "TO atlantis_enqueuer")
    ddb.commit()
    _start(supervise, "--handler-database-url", handler_url)
    pages = atlantis.enqueue(ddb, "durable.Pages", {"key": "role", "pages": 3, "hold_at": -9})
    nap = atlantis.enqueue(ddb, "durable.Nap", {"key": "role-nap", "seconds": 0.2})
    assert wait_state(ddb, pages, "complete", "dead")["state"] == "complete"
    assert wait_state(ddb, nap, "complete", "dead")["state"] == "complete"
    assert _effects(ddb, "role") == [0, 1, 2]
    assert _kinds(ddb, "role-nap") == ["before", "after"]


# ---- workflows and retention ----------------------------------------------------------------

def test_steps_in_a_workflows_step_and_its_compensation_run_once(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    wid = atlantis.start_workflow(ddb, "durable.Flow", {"key": "flow"})
    ddb.commit()

    def ended() -> str | None:
        row = ddb.execute("SELECT state FROM atlantis.workflows WHERE id = %s", (wid,)).fetchone()
        return row[0] if row and row[0] in ("failed", "compensation_failed", "complete") \
            else None

    # Its second step failed for good; the first one's compensation ran: the workflow failed.
    assert wait_for(ended, message="the workflow to end") == "failed"
    # Each failed its first attempt after its step: the bodies ran once all the same.
    assert _kinds(ddb, "flow") == ["step-a", "undo-u"]


def test_retention_prunes_the_records_with_their_job(ddb: psycopg.Connection[Any],
                                                     supervise: Any) -> None:
    _start(supervise)
    job_id = _steps_job(ddb, "pruned", n=3, hold_at=-1)
    wait_state(ddb, job_id, "complete")
    assert len(_records(ddb, job_id)) == 3
    ddb.execute("SELECT atlantis.prune('0 seconds')")
    ddb.commit()
    assert ddb.execute("SELECT count(*) FROM atlantis.jobs WHERE id = %s",
                       (job_id,)).fetchone() == (0,)
    assert _records(ddb, job_id) == []


def test_a_client_stalled_after_the_fence_does_not_hold_the_row(
        ddb: psycopg.Connection[Any], db_url: str) -> None:
    """The fence's row lock lasts until COMMIT: a step's client that stops between them
    (stopped, cut off) has its session ended by the server, so the supervisor's renewals of
    that row wait seconds at most."""
    job_id = _steps_job(ddb, "stall")
    run_id = _running_by_hand(ddb, job_id)
    stalled = psycopg.connect(db_url)
    pid = stalled.info.backend_pid
    stalled.execute("SELECT atlantis.step_fence(%s, %s)", (job_id, run_id))  # then stops

    def ended() -> bool:
        row = ddb.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                          (pid,)).fetchone()
        ddb.commit()
        return row == (0,)

    wait_for(ended, message="the server to end the stalled session")
    ddb.execute("SET lock_timeout = '5s'")
    ddb.execute("UPDATE atlantis.jobs SET claimed_until = now() WHERE id = %s", (job_id,))
    ddb.commit()
    stalled.close()


def test_a_child_keeps_its_step_connection_but_not_an_attempts_session_state(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    """One child runs the attempts one after another: the second reuses the first's step
    connection (the same backend), and what the first set on the session is gone."""
    _start(supervise, concurrency=1)
    first = atlantis.enqueue(ddb, "durable.Misuse", {"key": "set", "mode": "show"})
    first_row = wait_state(ddb, first, "complete")
    setter = atlantis.enqueue(ddb, "durable.Misuse", {"key": "set", "mode": "set"})
    assert wait_state(ddb, setter, "complete")["result"] == "64kB"
    shown = atlantis.enqueue(ddb, "durable.Misuse", {"key": "show", "mode": "show"})
    setting, backend = wait_state(ddb, shown, "complete")["result"]
    assert setting == first_row["result"][0] != "64kB"
    assert backend == first_row["result"][1]  # the same connection, kept


def test_a_fence_that_fails_at_commit_stops_the_run_as_lost_and_commits_nothing(
        ddb: psycopg.Connection[Any], db_url: str) -> None:
    """The record and the COMMIT go out together (one round trip): a fence that fails must
    abort the transaction before its COMMIT, and the run must stop as one that lost the job
    (LeaseLost), not as one whose COMMIT's outcome is unknown."""
    from atlantis.errors import LeaseLost
    from atlantis.protocol.fence import Fence
    from atlantis.steps import StepBook

    job_id = _steps_job(ddb, "fenced")
    run_id = _running_by_hand(ddb, job_id)
    book = StepBook(Fence(job_id=job_id, run_id=str(run_id), attempt=1), db_url)

    def write(conn: psycopg.Connection[Any], page: int) -> int:
        conn.execute("INSERT INTO durable_effects (key, page, attempt) VALUES ('fenced', %s, 1)",
                     (page,))
        return page

    assert book.transaction("kept", write, (1,), {}) == 1  # the run holds the job: committed

    def write_then_lose(conn: psycopg.Connection[Any]) -> int:
        write(conn, 2)
        with psycopg.connect(db_url, autocommit=True) as other:  # the lease ends meanwhile
            other.execute("UPDATE atlantis.jobs SET claimed_until = now() - interval '1s' "
                          "WHERE id = %s", (job_id,))
        return 2

    with pytest.raises(LeaseLost):
        book.transaction("lost", write_then_lose, (), {})
    assert _effects(ddb, "fenced") == [1]
    assert _records(ddb, job_id) == [("kept", "transaction")]
    with pytest.raises(Exception, match="no step may run"):  # the run has ended
        book.transaction("after", write, (3,), {})
    conn = book._conn  # closed, not kept for a next attempt of this process
    assert conn is not None
    conn.close()


def test_an_aborted_pipeline_is_told_by_the_records_own_error(
        ddb: psycopg.Connection[Any]) -> None:
    """When the record fails, psycopg may raise the COMMIT's ``PipelineAborted`` (an
    ``OperationalError``: a connection that failed during COMMIT, outcome unknown) with the
    record's error as its context: seen once in a full run, the fence's LeaseLost taken for
    an unknown COMMIT. The transaction step raises the record's own error instead."""
    from atlantis.store.steps import NO_SUCH_JOB, _cause

    def aborted_behind(statement: str) -> psycopg.errors.PipelineAborted:
        try:
            try:
                ddb.execute(statement)
            except psycopg.Error:
                raise psycopg.errors.PipelineAborted("pipeline aborted") from None
        except psycopg.errors.PipelineAborted as exc:
            return exc
        raise AssertionError(f"{statement} did not fail")

    fenced = aborted_behind("SELECT atlantis.step_fence(0, gen_random_uuid())")  # no such job
    cause = _cause(fenced)
    assert isinstance(cause, psycopg.DatabaseError) and cause.sqlstate == NO_SUCH_JOB
    bare = psycopg.errors.PipelineAborted("pipeline aborted")
    assert _cause(bare) is bare  # no record's error behind it: unknown, as before


def test_an_async_fence_that_fails_at_commit_stops_the_run_as_lost_and_commits_nothing(
        ddb: psycopg.Connection[Any], db_url: str) -> None:
    """As above, for an async handler's transaction step (its own pipelined COMMIT)."""
    import asyncio

    from atlantis.errors import LeaseLost
    from atlantis.protocol.fence import Fence
    from atlantis.steps_async import AsyncStepBook

    job_id = _steps_job(ddb, "afenced")
    run_id = _running_by_hand(ddb, job_id)

    async def write(conn: psycopg.AsyncConnection[Any], page: int, lose: bool) -> int:
        await conn.execute("INSERT INTO durable_effects (key, page, attempt) "
                           "VALUES ('afenced', %s, 1)", (page,))
        if lose:
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute("UPDATE atlantis.jobs SET claimed_until = now() - interval '1s' "
                              "WHERE id = %s", (job_id,))
        return page

    async def run() -> None:
        book = AsyncStepBook(Fence(job_id=job_id, run_id=str(run_id), attempt=1), db_url)
        try:
            assert await book.transaction("kept", write, (1, False), {}) == 1
            with pytest.raises(LeaseLost):
                await book.transaction("lost", write, (2, True), {})
        finally:
            await book.aclose()

    asyncio.run(run())
    assert _effects(ddb, "afenced") == [1]
    assert _records(ddb, job_id) == [("kept", "transaction")]
