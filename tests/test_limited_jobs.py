"""Limits under real supervisors (tests/apps/limited.atl): what runs at once and what starts
in a window, from the intervals the handlers record with PostgreSQL's clock. The same
transitions driven by SQL: tests/test_limit_store.py."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psutil
import psycopg
from psycopg.types.json import Jsonb

import atlantis
from tests.conftest import wait_for, wait_state

APP = "tests.apps.limited:registry"


def enqueue(db: psycopg.Connection[Any], job: str, args: list[dict[str, Any]]) -> list[int]:
    row = db.execute("SELECT atlantis.enqueue_many(%s, %s::jsonb[])",
                     (job, [Jsonb(a) for a in args])).fetchone()
    assert row is not None
    return list(row[0])


def intervals(db: psycopg.Connection[Any]) -> list[tuple[str, int, Any, Any]]:
    """(key, job_id, started, ended) of every attempt that ended."""
    return [tuple(r) for r in db.execute(
        "SELECT s.key, s.job_id, s.at, e.at FROM test_events s JOIN test_events e"
        " ON e.job_id = s.job_id AND e.attempt = s.attempt AND e.event = 'ended'"
        " WHERE s.event = 'started' ORDER BY s.at").fetchall()]


def overlap(a: tuple[str, int, Any, Any], b: tuple[str, int, Any, Any]) -> bool:
    return bool(a[2] < b[3] and b[2] < a[3])


def value(db: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> Any:
    """The one value of a query's one row."""
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def complete(db: psycopg.Connection[Any], ids: list[int], timeout: float = 60.0) -> None:
    """Wait until every row of ``ids`` is complete."""
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.jobs WHERE id = ANY(%s)"
                                " AND state = 'complete'", (ids,)).fetchone() == (len(ids),),
             timeout=timeout, message=f"{len(ids)} jobs to complete")


def one_at_a_time_per_key(seen: list[tuple[str, int, Any, Any]]) -> None:
    """No two intervals of one key overlap (each key's, in order of start)."""
    last: dict[str, tuple[str, int, Any, Any]] = {}
    for iv in sorted(seen, key=lambda iv: (iv[0], iv[2])):
        if iv[0] in last:
            assert not overlap(last[iv[0]], iv), (last[iv[0]], iv)
        last[iv[0]] = iv


def most_at_once(seen: list[tuple[str, int, Any, Any]]) -> int:
    """The most intervals open at one instant (one that ends as another starts: not both)."""
    edges = sorted([(iv[2], 1) for iv in seen] + [(iv[3], -1) for iv in seen],
                   key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@contextmanager
def sampled_running(db_url: str, job: str) -> Iterator[list[int]]:
    """Count the running rows of ``job``, again and again on a connection of its own, until
    the block ends; the counts come in the list yielded."""
    counts: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute("SELECT count(*) FROM atlantis.jobs"
                                   " WHERE state = 'running' AND job = %s", (job,)).fetchone()
                assert row is not None
                counts.append(int(row[0]))
                stop.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join(10)


def supervisors(supervise: Any, n: int, concurrency: int) -> list[Any]:
    return [supervise(queues=("limited",), app=APP, concurrency=concurrency) for _ in range(n)]


def test_one_per_key_across_supervisors(db: psycopg.Connection[Any], supervise: Any) -> None:
    ids = enqueue(db, "limited.PerKey", [{"key": f"k{i % 3}", "hold": 0.1} for i in range(18)])
    for _ in range(2):
        supervise(queues=("limited",), app=APP, concurrency=3)
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.jobs WHERE id = ANY(%s)"
                                " AND state = 'complete'", (ids,)).fetchone() == (18,),
             timeout=60)
    seen = intervals(db)
    assert len(seen) == 18
    for i, a in enumerate(seen):
        for b in seen[i + 1:]:
            if a[0] == b[0]:
                assert not overlap(a, b), (a, b)
    assert any(overlap(a, b) for a in seen for b in seen if a[0] != b[0])


# Each test below was checked to fail with the behaviour broken, in scratch runs never
# committed: the trigger disabled (ALTER TABLE atlantis.jobs DISABLE TRIGGER jobs_limit_claim
# in the test's database), or a function of atlantis/store/live (or the claim of
# queries.sql) edited as each test's comment says, with the template rebuilt from it.

def test_four_supervisors_200_jobs_over_5_keys_one_at_a_time_per_key(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    # Trigger disabled: intervals of one key overlap at once.
    ids = enqueue(db, "limited.PerKey",
                  [{"key": f"k{i % 5}", "hold": 0.02 + 0.01 * (i % 4)} for i in range(200)])
    supervisors(supervise, 4, concurrency=1)  # four children: four keys at most at once
    complete(db, ids, timeout=90)
    seen = intervals(db)
    assert sorted(iv[1] for iv in seen) == sorted(ids)  # each ran once, and finished
    one_at_a_time_per_key(seen)
    assert any(overlap(a, b) for a in seen for b in seen if a[0] != b[0])


def test_global_concurrency_3_never_exceeded_and_reached(
    db: psycopg.Connection[Any], db_url: str, supervise: Any
) -> None:
    # Trigger disabled: six run at once (both supervisors' children), sampled and recorded.
    ids = enqueue(db, "limited.Global", [{"key": f"g{i}", "hold": 0.3} for i in range(24)])
    with sampled_running(db_url, "limited.Global") as counts:
        supervisors(supervise, 2, concurrency=3)
        complete(db, ids)
    assert counts and 1 <= max(counts) <= 3, max(counts)
    seen = intervals(db)
    assert len(seen) == 24
    assert most_at_once(seen) == 3


def test_rate_20_per_5s_no_window_holds_more_than_20_starts(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    # Trigger disabled: the 50 start within a second or two.
    enqueue(db, "limited.Rated", [{"key": f"r{i}"} for i in range(50)])

    def starts() -> list[Any]:
        """When each attempt that ran started: attempts ended, and rows running now."""
        return [r[0] for r in db.execute(
            "SELECT a.started_at FROM atlantis.attempts a JOIN atlantis.jobs j ON j.id = a.job_id"
            " WHERE j.job = 'limited.Rated'"
            " UNION ALL SELECT started_at FROM atlantis.jobs"
            " WHERE job = 'limited.Rated' AND state = 'running' ORDER BY 1").fetchall()]

    # 30 starts: 20 at once, and 10 more once the first window frees; the 5 s from each of
    # the first ten starts are checked with the limit binding (the 50 would take 10 s more).
    sups = supervisors(supervise, 2, concurrency=2)
    wait_for(lambda: len(starts()) >= 30, timeout=40, message="30 attempts started")
    for sup in sups:
        sup.stop()  # rows claimed and not started are given back unspent (refunded)
    at = starts()
    assert len(at) >= 30
    for i in range(len(at) - 20):
        assert at[i + 20] - at[i] >= timedelta(seconds=5), (i, at[i], at[i + 20])


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kill_9_of_a_supervisor_holding_a_slot_frees_it_when_the_lease_expires(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    (long_id,) = enqueue(db, "limited.Lease", [{"key": "k", "hold": 60.0, "retry_hold": 0.05}])
    sups = supervisors(supervise, 2, concurrency=1)
    # The worker id names its supervisor's pid (host:pid:random).
    (worker,) = wait_for(lambda: db.execute("SELECT claimed_by FROM atlantis.jobs WHERE id = %s"
                                            " AND state = 'running'", (long_id,)).fetchone(),
                         message="the long attempt to be claimed")
    # Enqueued once the long attempt holds the slot: enqueued with it, `after` could be
    # claimed first by the other supervisor (its claim skips the row the first one has
    # locked), and run and end before the long one starts. Trigger disabled, the second
    # supervisor would run `after` at once, beside the long attempt.
    (after,) = enqueue(db, "limited.Lease", [{"key": "k", "hold": 0.05}])
    (holder,) = [s for s in sups if worker.split(":")[1] == str(s.pid)]
    (second,) = [s for s in sups if s is not holder]
    wait_for(lambda: value(db, "SELECT count(*) FROM test_events WHERE job_id = %s",
                           (long_id,)), message="the long attempt to start")
    # The second supervisor claims: a job no limit holds runs on it (the holder's only
    # child is busy), while `after` waits for the slot the long attempt holds.
    (free,) = enqueue(db, "limited.Free", [{"key": "free"}])
    wait_state(db, free, "complete")
    other_worker = value(db, "SELECT worker FROM atlantis.attempts WHERE job_id = %s", (free,))
    assert other_worker.split(":")[1] == str(second.pid)
    # On a failure, say whether the long attempt lost its lease before the kill (a
    # supervisor starved past its 2 s heartbeat frees the slot as the kill would).
    long_attempts = db.execute("SELECT attempt, outcome, error_kind, warning FROM "
                               "atlantis.attempts WHERE job_id = %s", (long_id,)).fetchall()
    assert db.execute("SELECT state, attempt, atlantis.limit_hold(id) FROM atlantis.jobs"
                      " WHERE id = %s", (after,)).fetchone() == (
        "available", 0, f"waiting for a slot of `concurrency 1 by key=k`: job {long_id} running"
    ), long_attempts
    child_pid = value(db, "SELECT pid FROM test_events WHERE job_id = %s AND attempt = 1"
                      " AND event = 'started'", (long_id,))
    holder.signal(signal.SIGKILL)
    holder.wait()
    # Nothing renews the lease now. Once it has ended (claimed_until < now()), the second
    # supervisor's rescue takes the row out of `running`, which frees the slot in the same
    # transaction; `after` is claimed then.
    wait_state(db, after, "complete")
    wait_state(db, long_id, "complete")
    assert second.proc.poll() is None
    wait_for(lambda: _gone(child_pid), timeout=10, message="the killed supervisor's child to die")
    after_start = value(db, "SELECT at FROM test_events WHERE job_id = %s AND event = 'started'",
                        (after,))
    rescue = value(db, "SELECT errors->0 FROM atlantis.jobs WHERE id = %s", (long_id,))
    assert rescue["kind"] == "lease_expired" and rescue["worker"] == worker
    assert rescue["rescued_by"] == other_worker
    assert after_start >= datetime.fromisoformat(rescue["at"])
    assert db.execute("SELECT worker FROM atlantis.attempts WHERE job_id = %s",
                      (after,)).fetchall() == [(other_worker,)]
    # The killed attempt did nothing once the next of its key started (the child dies before
    # its lease ends, see docs/guarantees.md "Leases"), and never ended.
    killed = db.execute("SELECT max(at), count(*) FILTER (WHERE event = 'ended')"
                        " FROM test_events WHERE job_id = %s AND attempt = 1", (long_id,)).fetchone()
    assert killed is not None and killed[0] < after_start and killed[1] == 0
    assert value(db, "SELECT attempt FROM atlantis.jobs WHERE id = %s", (long_id,)) == 2
    one_at_a_time_per_key(intervals(db))


def test_a_one_job_key_beside_a_2000_job_key_is_claimed_within_3_claim_rounds(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    # Groups not rotating across claims (claim_limited ignoring `after`, each call starting
    # from the first group): a claim for one idle child takes a row of "big" every time, and
    # "small" waited 10 rounds (the other child came free at once once in a while).
    # One claim round is one atlantis.claim_limited statement, in a transaction of its own:
    # its rows share that transaction's time as started_at (a job without a rate limit starts
    # at now()), and another round has another time. So the rounds that claimed something
    # until "small" was claimed are the distinct started_at up to its own. A round claims for
    # idle children only, so at most `concurrency` rows: within 3 rounds, "small" is also
    # among the first 3 x concurrency attempts started.
    concurrency = 2
    enqueue(db, "limited.Fair", [{"key": "big"}] * 2000)
    (small,) = enqueue(db, "limited.Fair", [{"key": "small"}])
    sup = supervise(queues=("limited",), app=APP, concurrency=concurrency)
    wait_state(db, small, "complete")
    sup.stop()  # every attempt started is written to atlantis.attempts
    rounds, before = db.execute(
        "SELECT count(DISTINCT a.started_at), count(*) FILTER (WHERE a.started_at < s.at)"
        " FROM atlantis.attempts a JOIN atlantis.jobs j ON j.id = a.job_id"
        " CROSS JOIN (SELECT started_at AS at FROM atlantis.attempts WHERE job_id = %s) s"
        " WHERE j.job = 'limited.Fair' AND a.started_at <= s.at", (small,)).fetchone() or (0, 0)
    assert 1 <= rounds <= 3, (rounds, before)
    assert before < 3 * concurrency


def test_a_later_job_of_a_key_does_not_block_its_due_jobs(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    # A row scheduled for later holding its key's slot (the trigger's count of a key's rows,
    # atlantis.limit_claim, counting `available` rows whose run_at is ahead as well as
    # running ones): the due rows never run.
    (later,) = atlantis.enqueue_many(db, "limited.PerKey", [{"key": "k", "hold": 0.02}],
                                     delay=3600, priority=-10)
    due = enqueue(db, "limited.PerKey", [{"key": "k", "hold": 0.02}] * 6)
    supervise(queues=("limited",), app=APP, concurrency=1)
    complete(db, due)
    one_at_a_time_per_key(intervals(db))
    assert db.execute("SELECT state, attempt, atlantis.limit_hold(id) FROM atlantis.jobs"
                      " WHERE id = %s", (later,)).fetchone() == ("available", 0, None)


def test_two_limits_on_one_job_hold_both_and_never_deadlock(
    db: psycopg.Connection[Any], db_url: str, supervise: Any
) -> None:
    # Trigger disabled: one key's intervals overlap, and more than two run at once.
    ids = enqueue(db, "limited.Both", [{"key": f"b{i % 3}", "hold": 0.15} for i in range(24)])
    with sampled_running(db_url, "limited.Both") as counts:
        supervisors(supervise, 3, concurrency=2)
        complete(db, ids)
    assert counts and 1 <= max(counts) <= 2, max(counts)
    seen = intervals(db)
    assert len(seen) == 24
    one_at_a_time_per_key(seen)
    assert most_at_once(seen) == 2


def test_steps_of_a_workflow_obey_their_jobs_limit(db: psycopg.Connection[Any], supervise: Any) -> None:
    # Trigger disabled: the two steps after `first` (and the workflows of one key) overlap.
    flows = [atlantis.start_workflow(db, "limited.Flow", {"key": key, "hold": 0.1})
             for key in ("w", "w", "w", "v", "v")]
    supervisors(supervise, 2, concurrency=2)
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.workflows WHERE id = ANY(%s)"
                                " AND state = 'complete'", (flows,)).fetchone() == (5,),
             timeout=60, message="the workflows to complete")
    seen = intervals(db)
    assert len(seen) == 15
    one_at_a_time_per_key(seen)


def test_a_full_key_does_not_block_the_work_behind_it(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    # claim_limited stopping at the first refused row (instead of skipping its group): the
    # rows of "full", first by priority, hold back "other"'s; the claim of jobs without
    # limits taking limited rows too (queries.sql `claim` without `limit_group IS NULL`):
    # the same rows hold back the Free jobs; the trigger disabled: "full"'s rows run. Each
    # time, the rest ran only once the long attempt's timeout (30 s) freed the key, and the
    # checks after the wait failed.
    (long_id,) = enqueue(db, "limited.PerKey", [{"key": "full", "hold": 60.0}])
    supervise(queues=("limited",), app=APP, concurrency=2)
    wait_state(db, long_id, "running")
    row = db.execute("SELECT atlantis.enqueue_many('limited.PerKey', %s::jsonb[], priority => -5)",
                     ([Jsonb({"key": "full", "hold": 0.0})] * 6,)).fetchone()
    assert row is not None
    held: list[int] = list(row[0])
    free = enqueue(db, "limited.Free", [{"key": f"f{i}"} for i in range(10)])
    other = enqueue(db, "limited.PerKey", [{"key": "other", "hold": 0.0}] * 3)
    complete(db, free + other)
    assert db.execute("SELECT state FROM atlantis.jobs WHERE id = %s", (long_id,)).fetchone() == (
        "running",)
    assert db.execute("SELECT DISTINCT state, attempt FROM atlantis.jobs WHERE id = ANY(%s)",
                      (held,)).fetchall() == [("available", 0)]


def _claimed_ahead(db: psycopg.Connection[Any], ids: list[int],
                   ran: list[tuple[str, int, Any, Any]]) -> dict[int, int]:
    """The rows of ``ids`` that waited for a child after their claim: another handler of
    ``ran`` ended between the row's claim (its started_at) and its own handler's start.
    Each maps to that other row's id."""
    starts = {job_id: s for _, job_id, s, _ in ran}
    found: dict[int, int] = {}
    for job_id, claimed in db.execute("SELECT id, started_at FROM atlantis.jobs"
                                      " WHERE id = ANY(%s)", (ids,)).fetchall():
        between = [other for _, other, _, e in ran if claimed < e <= starts[job_id]]
        if between:
            found[job_id] = between[0]
    return found


def test_plain_rows_are_claimed_ahead_beside_limited_rows_which_never_are(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    """Limits cost only the rows they limit (issue 31). One child runs a long PerKey row
    whose key's other rows wait, held back by the limit; one child is left for the rest.
    Free rows (no limit) come, then PerKey rows of other keys, which the limit lets run.
    Every handler records its start and end (PostgreSQL's clock), and a row's started_at
    is when it was claimed: a row whose child ran another handler between its claim and
    its start was claimed ahead. Free rows are (on e52f596, a supervisor serving any
    limited job claimed nothing ahead: none was); PerKey rows never are."""
    (long_id,) = enqueue(db, "limited.PerKey", [{"key": "busy", "hold": 60.0}])
    supervise(queues=("limited",), app=APP, concurrency=2)
    wait_state(db, long_id, "running")
    blocked = enqueue(db, "limited.PerKey", [{"key": "busy", "hold": 0.0}] * 5)
    free = enqueue(db, "limited.Free", [{"key": f"f{i}"} for i in range(300)])
    others = enqueue(db, "limited.PerKey", [{"key": f"k{i}", "hold": 0.02} for i in range(20)])
    complete(db, free + others)
    ran = [iv for iv in intervals(db) if iv[0] != "busy"]
    assert len(ran) == len(free) + len(others)
    ahead = _claimed_ahead(db, free, ran)
    assert len(ahead) >= len(free) // 2, f"only {len(ahead)} Free rows claimed ahead"
    assert _claimed_ahead(db, others, ran) == {}
    assert db.execute("SELECT DISTINCT state, attempt FROM atlantis.jobs WHERE id = ANY(%s)",
                      (blocked,)).fetchall() == [("available", 0)]
