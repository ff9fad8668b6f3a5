"""The scaling signal (issue 37): how long ``atlantis.queue_signal`` takes with 1,000,000
waiting rows, on a scratch database of the embedded server, no supervisor running.

    python -m benchmarks.queue_signal [--rows 1000000] [--finished 0] [--calls 25]

The rows go straight into ``atlantis.jobs`` (one ``INSERT ... SELECT generate_series``: the
enqueue functions would take minutes), in queue ``bench`` of ``benchmarks/bench.atl`` and
``benchmarks/limited.atl``, spread as a busy queue's are: 70 % due (``bench.Noop``, three
priorities, run_at over the last ``rows / 1000`` seconds), 20 % delayed (run_at an hour
ahead and later), 5 % suspended (a durable sleep of a day), 5 % due rows of
``bench.NoopPerAccount`` (``concurrency 1 by account``) over 1,000 accounts, half of them
holding a running row; ``--finished`` complete rows beside them (the history a table keeps
until retention prunes it).

Timed, client side (psycopg over the unix socket), three times: before ``ANALYZE`` (a burst
autovacuum has not seen yet: statistics that say the table is nearly empty, from which the
functions' generic plans are made), right after the insert once analyzed (no page is
all-visible yet: every index entry the counts read costs a visit of its heap page), and
after ``VACUUM``: ``queue_signal('bench')`` and ``queue_signal()`` (every queue), each once on
a fresh connection (the function's plans made on the way) and then ``--calls`` times on one
connection (median and max). Target: at most 50 ms. The counts are shown beside the true
ones (an exact ``count(*)`` of each part): above 1,000 a count is an estimate.

Benchmarks, not tests: nothing is asserted; a target not met is printed as **missed**.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import psycopg

from atlantis.app import load_app
from atlantis.store import migrate, sync
from benchmarks.scratch import scratch_database
from benchmarks.tables import markdown

TARGET_MS = 50.0
COLUMNS = ("claimable", "oldest_claimable_seconds", "running", "delayed", "limit_held",
           "suspended", "paused", "exact")

# 1,000 accounts and the limit_group each gets (atlantis.limit_group, as enqueue sets it).
ACCOUNTS = """
CREATE TEMP TABLE bench_accounts AS
SELECT a, atlantis.limit_group((SELECT t FROM atlantis.job_types t
                                 WHERE t.job = 'bench.NoopPerAccount'),
                                jsonb_build_object('account', a, 'n', 0), false) AS g
  FROM generate_series(0, 999) a
"""
# Row i of the waiting rows: i % 20 in 0..13 due, 14..17 delayed, 18 suspended, 19 limited.
WAITING = """
INSERT INTO atlantis.jobs (job, queue, args, max_attempts, timeout, heartbeat, backoff,
                           run_at, priority, limit_group, suspended_for)
SELECT CASE WHEN i %% 20 = 19 THEN 'bench.NoopPerAccount' ELSE 'bench.Noop' END, 'bench',
       CASE WHEN i %% 20 = 19 THEN jsonb_build_object('account', a.a, 'n', 0)
            ELSE jsonb_build_object('n', i) END,
       1, '1 minute', '30 seconds', '1 second',
       CASE WHEN i %% 20 < 14 OR i %% 20 = 19 THEN now() - make_interval(secs => i / 1000.0)
            WHEN i %% 20 < 18 THEN now() + interval '1 hour' + make_interval(secs => i / 1000.0)
            ELSE now() + interval '1 day' END,
       CASE WHEN i %% 20 < 14 THEN i %% 3 ELSE 0 END,
       CASE WHEN i %% 20 = 19 THEN a.g END,
       CASE WHEN i %% 20 = 18 THEN 'sleep:nap' END
  FROM generate_series(1, %(rows)s) i
  JOIN bench_accounts a ON a.a = (i / 20) %% 1000
"""
RUNNING = """
INSERT INTO atlantis.jobs (job, queue, args, max_attempts, timeout, heartbeat, backoff, state,
                           attempt, claimed_by, claimed_until, started_at, limit_group)
SELECT 'bench.NoopPerAccount', 'bench', jsonb_build_object('account', a, 'n', 0), 1,
       '1 minute', '30 seconds', '1 second', 'running', 1, 'bench-worker',
       now() + interval '1 hour', now(), g
  FROM bench_accounts WHERE a % 2 = 0
"""
FINISHED = """
INSERT INTO atlantis.jobs (job, queue, args, max_attempts, timeout, heartbeat, backoff, state,
                           attempt, run_at, started_at, finished_at)
SELECT 'bench.Noop', 'bench', jsonb_build_object('n', i), 1, '1 minute', '30 seconds',
       '1 second', 'complete', 1, now() - interval '2 hours', now() - interval '2 hours',
       now() - interval '2 hours'
  FROM generate_series(1, %(rows)s) i
"""
# The true counts, by reading every row (seconds, not milliseconds).
TRUTH = """
SELECT count(*) FILTER (WHERE state = 'available' AND run_at <= now() AND limit_group IS NULL)
           AS free_due,
       count(*) FILTER (WHERE state = 'available' AND run_at <= now()
                          AND limit_group IS NOT NULL) AS limited_due,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'available' AND run_at > now() AND suspended_for IS NULL)
           AS delayed,
       count(*) FILTER (WHERE state = 'available' AND run_at > now()
                          AND suspended_for IS NOT NULL) AS suspended
  FROM atlantis.jobs WHERE queue = 'bench'
"""
SIGNAL = "SELECT * FROM atlantis.queue_signal(%s)"


def say(text: str) -> None:
    print(f"queue_signal: {text}", file=sys.stderr, flush=True)


def fill(url: str, rows: int, finished: int) -> None:
    with psycopg.connect(url) as conn:
        migrate(conn)
        for app in ("benchmarks.app:registry", "benchmarks.app:limited"):
            registry = load_app(app)
            sync(conn, list(registry.decls.values()), list(registry.workflows.values()))
        conn.commit()
        started = time.monotonic()
        conn.execute(ACCOUNTS)
        conn.execute(WAITING, {"rows": rows})
        conn.execute(RUNNING)
        if finished:
            conn.execute(FINISHED, {"rows": finished})
        conn.commit()
        say(f"{rows:,} waiting rows (+ 500 running, {finished:,} complete) inserted in "
            f"{time.monotonic() - started:.1f} s")


def timed(conn: psycopg.Connection[Any], queue: str | None) -> tuple[float, list[Any]]:
    started = time.perf_counter()
    found = conn.execute(SIGNAL, (queue,)).fetchall()
    return (time.perf_counter() - started) * 1000, found


def measure(url: str, calls: int, label: str) -> list[list[str]]:
    rows = []
    for queue in ("bench", None):
        with psycopg.connect(url, autocommit=True) as conn:
            first, _ = timed(conn, queue)
            times = [timed(conn, queue)[0] for _ in range(calls)]
        median = statistics.median(times)
        verdict = "met" if max(first, median) <= TARGET_MS else "**missed**"
        rows.append([label, f"queue_signal({queue!r})" if queue else "queue_signal()",
                     f"{first:.1f}", f"{median:.1f}", f"{max(times):.1f}", verdict])
    return rows


def compare(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        got = cur.execute(SIGNAL, ("bench",)).fetchone()
        truth = cur.execute(TRUTH).fetchone()
    assert got is not None and truth is not None
    held_true = "limited rows of the 500 busy accounts"
    lines = [["count", "queue_signal('bench')", "true"],
             ["claimable", f"{got['claimable']:,}",
              f"{truth['free_due']:,} free + up to 500 limited (one per idle account)"],
             ["oldest_claimable_seconds", f"{got['oldest_claimable_seconds']:.0f}", ""],
             ["running", f"{got['running']:,}", f"{truth['running']:,}"],
             ["delayed", f"{got['delayed']:,}", f"{truth['delayed']:,}"],
             ["limit_held", f"{got['limit_held']:,}",
              f"{truth['limited_due']:,} limited due, less one per idle account ({held_true})"],
             ["suspended", f"{got['suspended']:,}", f"{truth['suspended']:,}"],
             ["exact", str(got["exact"]).lower(), ""]]
    return markdown(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--finished", type=int, default=0)
    parser.add_argument("--calls", type=int, default=25)
    args = parser.parse_args()
    with scratch_database("bench_signal") as url:
        fill(url, args.rows, args.finished)
        table = [["pages", "call", "first call, new connection (ms)", "median (ms)", "max (ms)",
                  f"<= {TARGET_MS:.0f} ms"]]
        # A burst autovacuum has not analyzed yet: statistics that say the table is nearly
        # empty (generic plans are made from them).
        table += measure(url, args.calls, "before ANALYZE")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE atlantis.jobs")
        table += measure(url, args.calls, "right after the insert")
        counts = compare(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE atlantis.jobs")
        table += measure(url, args.calls, "after VACUUM")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{args.rows:,} waiting rows, {args.finished:,} complete; {args.calls} calls each; "
          f"load average at the end {load}\n")
    print(markdown(table))
    print("\nThe counts against the true ones (right after the insert):\n")
    print(counts)


if __name__ == "__main__":
    main()
