"""Drain N no-op jobs with one supervisor; print jobs/s.

    python -m benchmarks.throughput --jobs 5000 --concurrency 2 [--isolation fresh]

Uses the embedded PostgreSQL (or ATLANTIS_DATABASE_URL's server) and a scratch database
that it drops afterwards. Compare with the peers' figures in the same run on the same
machine (NOTES.md lists them).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.database import resolve_url

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.app:registry"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--isolation", default="reuse")
    opts = parser.parse_args()
    admin = resolve_url(None)
    name = f"atl_bench_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(admin, dbname=name)
    sup: subprocess.Popen[bytes] | None = None
    try:
        with psycopg.connect(url) as conn:
            migrate(conn)
            sync(conn, list(load_app(APP).decls.values()))
            for start in range(0, opts.jobs, 1000):
                atlantis.enqueue_many(conn, "bench.Noop",
                                      [{"n": i} for i in range(start, min(start + 1000, opts.jobs))])
            conn.commit()
        sup = subprocess.Popen(
            [str(Path(sys.executable).parent / "atlantis-supervise"), "--queue", "bench",
             "--app", APP, "--database-url", url, "--concurrency", str(opts.concurrency),
             "--isolation", opts.isolation],
            cwd=ROOT, stderr=subprocess.DEVNULL)
        with psycopg.connect(url, autocommit=True) as conn:
            first = last = None
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'complete'), min(started_at), "
                    "max(finished_at) FROM atlantis.jobs").fetchone()
                assert row is not None
                done, first, last = row
                if done == opts.jobs:
                    break
                time.sleep(0.2)
        seconds = (last - first).total_seconds()
        print(f"atlantis {opts.isolation} concurrency={opts.concurrency}: {opts.jobs} jobs in "
              f"{seconds:.2f}s = {opts.jobs / seconds:,.0f} jobs/s (first claim to last completion)")
    finally:
        if sup is not None:
            sup.send_signal(signal.SIGTERM)
            sup.wait(30)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
