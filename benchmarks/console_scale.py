"""The console on a big jobs table: how long each page and API read takes to render.

    python -m benchmarks.console_scale [--rows 1000000] [--repeat 5]

Builds a scratch database on the embedded PostgreSQL server, fills ``atlantis.jobs`` with
``--rows`` rows shaped like a busy installation (mostly complete jobs over the last week,
some dead ones with a few error fingerprints, cancelled ones, a backlog, running jobs with
progress, attempts and log lines for the running ones), runs VACUUM ANALYZE, then renders
every page and API read of the console in-process (Starlette's TestClient, no network)
``--repeat`` times and prints the median and the worst time of each. The database is
dropped at the end. The rows are written by SQL directly: the point is the size, not the
enqueue path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import psycopg

from atlantis.store.migrate import migrate
from benchmarks.scratch import scratch_database

# Every row the benchmark writes, as one INSERT ... SELECT per kind (the benchmark's own SQL:
# it fabricates a history no supervisor wrote).
FILL: list[tuple[str, float]] = [
    ("complete", 0.95),
    ("dead", 0.03),
    ("cancelled", 0.01),
    ("available", 0.01),
]

INSERT = """
INSERT INTO atlantis.jobs (queue, job, args, state, attempt, max_attempts, priority, run_at,
                           timeout, heartbeat, backoff, last_error, errors, created_at,
                           started_at, finished_at)
SELECT (ARRAY['contacts', 'billing', 'mail'])[1 + g %% 3],
       (ARRAY['contacts.Import', 'billing.Charge', 'mail.Send'])[1 + g %% 3],
       jsonb_build_object('account_id', 'acme-' || (g %% 500), 'n', g),
       %(state)s,
       CASE WHEN %(state)s = 'available' THEN 0 ELSE 1 END, 3, 0,
       now() - make_interval(secs => g %% 604800),
       interval '1 hour', interval '30 seconds', interval '10 seconds',
       CASE WHEN %(state)s = 'dead' THEN 'ValueError: bad row ' || (g %% 7) END,
       CASE WHEN %(state)s = 'dead'
            THEN jsonb_build_array(jsonb_build_object(
                     'kind', (ARRAY['exception', 'timeout', 'crash'])[1 + g %% 3],
                     'message', 'ValueError: bad row ' || (g %% 7), 'attempt', 1))
            ELSE '[]'::jsonb END,
       now() - make_interval(secs => g %% 604800),
       CASE WHEN %(state)s IN ('complete', 'dead') THEN now() - make_interval(secs => g %% 604800) END,
       CASE WHEN %(state)s <> 'available' THEN now() - make_interval(secs => g %% 604800) END
  FROM generate_series(1, %(count)s) g
"""

RUNNING = """
INSERT INTO atlantis.jobs (queue, job, args, state, attempt, max_attempts, priority, run_at,
                           timeout, heartbeat, backoff, claimed_by, claimed_until,
                           progress_pct, progress_msg, progress_at, created_at, started_at)
SELECT 'contacts', 'contacts.Import', jsonb_build_object('account_id', 'acme-' || g, 'n', g),
       'running', 1, 3, 0, now(), interval '1 hour', interval '30 seconds',
       interval '10 seconds', 'bench-host:' || g, now() + interval '1 minute',
       g %% 100, 'imported ' || g || ' rows', now(), now() - interval '5 minutes',
       now() - interval '5 minutes'
  FROM generate_series(1, %(count)s) g
RETURNING id
"""

PAGES = [
    ("overview", "/"),
    ("jobs", "/jobs"),
    ("jobs state=dead", "/jobs?state=dead"),
    ("jobs queue=mail", "/jobs?queue=mail"),
    ("jobs state=available queue=billing", "/jobs?state=available&queue=billing"),
    ("jobs args=account_id:acme-7", "/jobs?args=account_id:acme-7"),
    ("jobs args matching nothing (worst case)", "/jobs?args=account_id:nobody"),
    ("job detail (running)", "/jobs/{running}"),
    ("dead letters", "/dlq"),
    ("queues", "/queues"),
    ("workers", "/workers"),
    ("schedules", "/schedules"),
    ("GET /api/jobs", "/api/jobs"),
    ("GET /api/jobs?state=cancelled", "/api/jobs?state=cancelled"),
    ("GET /api/jobs/{id}", "/api/jobs/{running}"),
    ("GET /api/queues", "/api/queues"),
]


def fill(url: str, rows: int) -> int:
    """Write the rows; return the id of a running job (the detail page's)."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        running = max(10, rows // 20000)
        rest = rows - running
        for state, share in FILL:
            started = time.perf_counter()
            count = int(rest * share)
            conn.execute(INSERT, {"state": state, "count": count})
            print(f"  {count:>9,} {state} rows in {time.perf_counter() - started:.1f} s",
                  file=sys.stderr)
        ids = [r[0] for r in conn.execute(RUNNING, {"count": running})]
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE atlantis.jobs")
        print(f"  VACUUM ANALYZE in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        return int(ids[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()

    from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings

    with scratch_database("atl_console") as url:
        print(f"filling {opts.rows:,} rows", file=sys.stderr)
        running = fill(url, opts.rows)
        settings = Settings(url, allowed_hosts=None)
        times: dict[str, list[float]] = {}
        with TestClient(create_app(settings)) as client:
            for _ in range(opts.repeat):
                for name, path in PAGES:
                    started = time.perf_counter()
                    response = client.get(path.format(running=running))
                    elapsed = time.perf_counter() - started
                    if response.status_code != 200:
                        raise SystemExit(f"{path}: {response.status_code} {response.text[:200]}")
                    times.setdefault(name, []).append(elapsed * 1000)
    print(f"\n{opts.rows:,} rows in atlantis.jobs, {opts.repeat} renders each\n")
    print("| page | median ms | worst ms |")
    print("| --- | --- | --- |")
    for name, _ in PAGES:
        values = times[name]
        print(f"| {name} | {statistics.median(values):.1f} | {max(values):.1f} |")

if __name__ == "__main__":
    main()
