"""The scaling signal (issue 37): ``atlantis.queue_signal`` puts each waiting row of a queue
in one part (claimable, held by a limit, delayed, suspended) under delays, limits, pauses,
durable sleeps and waits, across several queues; the reader role may call it; ``tide queue
signal`` shows it (table and ``--json``). Real PostgreSQL, no supervisor. The Prometheus side
(``tide metrics serve``, the console's ``/metrics``, the alert rules): tests/test_scaling_metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg.rows import dict_row

import atlantis
from atlantis import operations
from atlantis.store import sync
from tests.conftest import run_tide
from tests.docs import bad_input_text
from tests.test_roles import login

__all__ = ["login"]  # a fixture used here

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix

PARTS = ("claimable", "running", "delayed", "limit_held", "suspended", "paused", "exact")


def signal(conn: psycopg.Connection[Any], queue: str | None = None) -> dict[str, dict[str, Any]]:
    rows = conn.cursor(row_factory=dict_row).execute(
        "SELECT * FROM atlantis.queue_signal(%s)", (queue,)).fetchall()
    return {r["queue"]: r for r in rows}


def parts(conn: psycopg.Connection[Any], queue: str) -> dict[str, Any]:
    """The counts of ``queue`` (its oldest claimable's age left out: it grows)."""
    row = signal(conn, queue)[queue]
    return {k: row[k] for k in PARTS}


def free(db: psycopg.Connection[Any], queue: str, n: int = 1, **options: Any) -> list[int]:
    """``n`` jobs no limit applies to (limited.Free), on ``queue``."""
    return atlantis.enqueue_many(db, "limited.Free", [{"key": f"k{i}"} for i in range(n)],
                                 queue=queue, **options)


def run(db: psycopg.Connection[Any], job_id: int) -> None:
    """Row ``job_id`` running, as a claim leaves it (the limits' trigger decides for a
    limited row: it must have room)."""
    db.execute("UPDATE atlantis.jobs SET state = 'running', attempt = attempt + 1,"
               " claimed_by = 'w-test', claimed_until = now() + interval '1 hour',"
               " started_at = now() WHERE id = %s", (job_id,))
    assert db.execute("SELECT state FROM atlantis.jobs WHERE id = %s",
                      (job_id,)).fetchone() == ("running",)


def one(conn: psycopg.Connection[Any], sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def counts(claimable: int = 0, running: int = 0, delayed: int = 0, limit_held: int = 0,
           suspended: int = 0, paused: bool = False, exact: bool = True) -> dict[str, Any]:
    return {"claimable": claimable, "running": running, "delayed": delayed,
            "limit_held": limit_held, "suspended": suspended, "paused": paused, "exact": exact}


def test_each_waiting_row_is_in_one_part_across_several_queues(
        db: psycopg.Connection[Any]) -> None:
    free(db, "sig-a", 3)
    free(db, "sig-a", 1, priority=7)
    free(db, "sig-a", 2, delay=timedelta(hours=1))  # waiting for a time: not claimable
    running = free(db, "sig-a", 2)
    run(db, running[0])
    free(db, "sig-b", 1, run_at=one(db, "SELECT now() - interval '90 seconds'"))
    free(db, "sig-b", 1)
    got = signal(db)
    assert parts(db, "sig-a") == counts(claimable=5, running=1, delayed=2)
    assert parts(db, "sig-b") == counts(claimable=2)
    assert got["sig-b"]["oldest_claimable_seconds"] >= 90
    assert got["sig-a"]["oldest_claimable_seconds"] >= 0
    # Every queue anything names, by name: declared ones with nothing to do have zeros.
    assert list(got) == sorted(got)
    assert {"sig-a", "sig-b", "limited", "tests"} <= set(got)
    assert {k: got["limited"][k] for k in PARTS} == counts()
    assert got["limited"]["oldest_claimable_seconds"] is None
    # A queue nothing names: its row of zeros, never an error (a scaler asks before the
    # first job is enqueued).
    assert parts(db, "nobody-names-it") == counts()
    # The delayed rows come due: claimable.
    db.execute("UPDATE atlantis.jobs SET run_at = now() WHERE queue = 'sig-a' AND run_at > now()")
    assert parts(db, "sig-a") == counts(claimable=7, running=1)


def test_a_limit_holds_rows_and_its_room_is_claimable(db: psycopg.Connection[Any]) -> None:
    """limited.PerKey (concurrency 1 by key), limited.Global (concurrency 3), limited.Both
    (1 by key and 2 in all), limited.Rated (20 starts in 5 s): tests/apps/limited.atl."""
    a1, a2, a3 = (atlantis.enqueue(db, "limited.PerKey", {"key": "a"}) for _ in range(3))
    atlantis.enqueue(db, "limited.PerKey", {"key": "b"})
    run(db, a1)
    atlantis.enqueue_many(db, "limited.Global", [{"key": k} for k in "vwxyz"])
    free(db, "limited", 2)
    # a: one running, two held; b: one claimable; Global: three of five; Free: both.
    assert parts(db, "limited") == counts(claimable=6, running=1, limit_held=4)
    # One slot of Global taken: two of its four waiting rows are claimable.
    run(db, one(db, "SELECT min(id) FROM atlantis.jobs WHERE job = 'limited.Global'"
                    " AND state = 'available'"))
    assert parts(db, "limited") == counts(claimable=5, running=2, limit_held=4)
    # A queue's own limit (tide queue limit): 3 in all, 2 running, so 1 claimable of 9.
    db.execute("SELECT atlantis.set_queue_limit('limited', 3)")
    assert parts(db, "limited") == counts(claimable=1, running=2, limit_held=8)
    db.execute("SELECT atlantis.set_queue_limit('limited', NULL)")
    assert parts(db, "limited") == counts(claimable=5, running=2, limit_held=4)

    # Two limits on one job, one of them shared by every key: counted once.
    atlantis.enqueue_many(db, "limited.Both", [{"key": k} for k in ("p", "q", "r", "r")],
                          queue="sig-both")
    assert parts(db, "sig-both") == counts(claimable=2, limit_held=2)
    # A rate: 20 starts in any 5 seconds, none made yet.
    atlantis.enqueue_many(db, "limited.Rated", [{"key": str(i)} for i in range(25)],
                          queue="sig-rated")
    assert parts(db, "sig-rated") == counts(claimable=20, limit_held=5)
    # The oldest claimable row: held rows are not claimable, however old.
    old = one(db, "SELECT now() - interval '1 hour'")
    blocker = atlantis.enqueue(db, "limited.PerKey", {"key": "c"}, queue="sig-old")
    run(db, blocker)
    atlantis.enqueue(db, "limited.PerKey", {"key": "c"}, queue="sig-old", run_at=old)
    atlantis.enqueue(db, "limited.PerKey", {"key": "d"}, queue="sig-old")
    got = signal(db, "sig-old")["sig-old"]
    assert (got["claimable"], got["limit_held"]) == (1, 1)
    assert got["oldest_claimable_seconds"] < 1800  # d's, not the held c's hour
    del a2, a3


def test_a_paused_queue_has_nothing_claimable(db: psycopg.Connection[Any]) -> None:
    free(db, "sig-p", 3)
    free(db, "sig-p", 1, delay=60)
    run(db, free(db, "sig-p", 1)[0])
    atlantis.enqueue(db, "limited.Global", {"key": "x"}, queue="sig-p")
    assert parts(db, "sig-p") == counts(claimable=4, running=1, delayed=1)
    operations.pause(db, "sig-p", reason="maintenance")
    got = signal(db, "sig-p")["sig-p"]
    assert {k: got[k] for k in PARTS} == counts(running=1, delayed=1, paused=True)
    assert got["oldest_claimable_seconds"] is None
    operations.resume(db, "sig-p")
    assert parts(db, "sig-p") == counts(claimable=4, running=1, delayed=1)


def test_suspended_jobs_are_apart_until_they_wake(ddb: psycopg.Connection[Any],
                                                  db_url: str) -> None:
    """A durable sleep and a wait for an event, suspended by the real handlers of
    tests/apps/durable.py (atlantis.testing.run_inline: each on a queue of its own)."""
    from atlantis.testing import run_inline, wake

    nap = run_inline("tests.apps.durable:registry", "durable.Nap",
                     {"key": "sig", "seconds": 600}, db=db_url)
    wait = run_inline("tests.apps.durable:registry", "durable.Wait",
                      {"key": "sig", "event": "go"}, db=db_url)
    assert nap.suspended and wait.suspended
    assert parts(ddb, nap.queue) == counts(suspended=1)
    assert parts(ddb, wait.queue) == counts(suspended=1)
    free(ddb, nap.queue, 1, delay=600)  # a delayed row beside it stays delayed
    assert parts(ddb, nap.queue) == counts(suspended=1, delayed=1)
    # Woken (the sleep over, the event sent): due, so claimable (its resume is a claim).
    wake(ddb, nap.job_id)
    atlantis.send_event(ddb, wait.job_id, "go")
    assert parts(ddb, nap.queue) == counts(claimable=1, delayed=1)
    assert parts(ddb, wait.queue) == counts(claimable=1)


def test_counts_above_the_cap_are_estimates(db: psycopg.Connection[Any]) -> None:
    """Up to 1,000 a count is exact; above, an estimate, never 1,000 or less, and `exact`
    is false. 60 groups of a limit (more than the 50 judged): the rest is extrapolated."""
    db.execute("INSERT INTO atlantis.jobs (job, queue, args, max_attempts, timeout, heartbeat,"
               " backoff, run_at)"
               " SELECT 'limited.Free', 'sig-big', jsonb_build_object('key', i::text), 1,"
               "        '1 minute', '1 minute', '1 second',"
               "        CASE WHEN i <= 1200 THEN now() ELSE now() + interval '1 hour' END"
               "   FROM generate_series(1, 2300) i")
    db.execute("ANALYZE atlantis.jobs")
    got = parts(db, "sig-big")
    assert got["claimable"] > 1000 and got["delayed"] > 1000 and not got["exact"]
    assert abs(got["claimable"] + got["delayed"] - 2300) <= 2
    table = run_tide(["--database-url", db.info.dsn, "queue", "signal", "sig-big"]).stdout
    assert f"≈{got['claimable']}" in table  # an estimate is marked
    atlantis.enqueue_many(db, "limited.PerKey", [{"key": f"g{i}"} for i in range(60)],
                          queue="sig-groups")
    many = parts(db, "sig-groups")
    assert 50 <= many["claimable"] <= 60 and many["claimable"] + many["limit_held"] == 60
    assert not many["exact"]


def test_a_reader_reads_the_signal(db: psycopg.Connection[Any],
                                   login: Callable[[str], str]) -> None:
    """Every limit's path (a group's, one the whole job shares, a rate, a queue's) under
    atlantis_reader, in SQL and with tide."""
    run(db, atlantis.enqueue(db, "limited.Both", {"key": "a"}))
    atlantis.enqueue_many(db, "limited.Both", [{"key": k} for k in "abc"])
    atlantis.enqueue_many(db, "limited.Rated", [{"key": "r"}] * 2)
    db.execute("SELECT atlantis.set_queue_limit('limited', 5)")
    url = login("atlantis_reader")
    with psycopg.connect(url, autocommit=True) as conn:
        got = parts(conn, "limited")
        # a: its key's slot is taken; b: one; c: none, the job's two slots being a's running
        # row and b's; Rated: both, within its rate and the queue's 5.
        assert got == counts(claimable=3, running=1, limit_held=2) == parts(db, "limited")
        assert "limited" in signal(conn)
        # The contract's name for the argument: queue => ...
        named = conn.execute("SELECT claimable FROM atlantis.queue_signal(queue => 'limited')"
                             ).fetchone()
        assert named == (3,)
    out = run_tide(["--database-url", url, "queue", "signal", "--json"])
    assert {q["queue"]: q["claimable"] for q in orjson.loads(out.stdout)}["limited"] == 3


def test_tide_shows_the_signal_as_a_table_and_as_json(db: psycopg.Connection[Any],
                                                      db_url: str) -> None:
    free(db, "sig-t", 2)
    free(db, "sig-t", 1, delay=3600)
    operations.pause(db, "sig-p2")
    table = run_tide(["--database-url", db_url, "queue", "signal"]).stdout.splitlines()
    assert table[0].split() == ["QUEUE", "CLAIMABLE", "OLDEST", "RUNNING", "DELAYED", "HELD",
                                "SUSPENDED", "STATUS"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["sig-t"][1] == "2" and rows["sig-t"][-1] == "ok"
    assert rows["sig-p2"][-1] == "paused"
    doc = orjson.loads(run_tide(["--database-url", db_url, "queue", "signal", "sig-t",
                                 "--json"]).stdout)
    assert len(doc) == 1 and doc[0]["oldest_claimable_seconds"] >= 0
    assert {k: doc[0][k] for k in PARTS} == counts(claimable=2, delayed=1)
    assert list(doc[0]) == ["queue", "claimable", "oldest_claimable_seconds", "running",
                            "delayed", "limit_held", "suspended", "paused", "exact"]
    # A queue nothing names is a typo here (the SQL function answers zeros for it).
    unknown = run_tide(["--database-url", db_url, "queue", "signal", "nope"], check=False)
    assert unknown.returncode == 1 and unknown.stdout == ""
    line = "tide: unknown queue 'nope': no declaration, job or supervisor uses it"
    assert unknown.stderr.splitlines()[-1] == line
    assert "`tide queue signal NAME` of a queue nothing names" in bad_input_text()


def test_declarations_alone_name_queues(db: psycopg.Connection[Any], tmp_path: Path) -> None:
    """A queue a declaration names gets its row before any job: the series a scaler reads
    exist from the start (scale from zero)."""
    source = tmp_path / "sigdecl.atl"
    source.write_text('job Later in sigdecl {\n  args { n int }\n  queue "sig-declared"\n}\n')
    sync(db, list(atlantis.Registry.from_atl(source).decls.values()))
    db.commit()
    assert parts(db, "sig-declared") == counts()
    assert "sig-declared" in signal(db)
