"""How long a supervisor takes to start: from its process start to its "serving" line.

    python -m benchmarks.supervisor_start [--starts 10]

On a scratch database of the embedded PostgreSQL server, migrated and synced once, it starts
``atlantis-supervise --queue bench --app benchmarks.app:registry`` (``--concurrency 2``) N
times, one after the other, and for each measures the seconds from ``Popen`` to the line
``supervisor ... serving queues ...`` on its stderr; it then stops it (SIGTERM) and waits for
its exit. It also times the migrate step alone (``atlantis.store.migrate`` on the same,
already migrated database, in this process, 30 times), the part of a start that issue 32
made skip the functions when they are unchanged. Each start finds the schema already migrated: what is measured is the start of a
supervisor on a live database, as on every deploy or restart. To compare with an older
release, copy this file into its checkout and run it there with its own virtualenv (its
own migrate then prepares the database). Prints every start and the median. A benchmark,
not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from atlantis.store import migrate
from benchmarks.runs import prepare_atlantis
from benchmarks.scratch import scratch_database

SERVING = b" serving queues "


def one_start(supervise: Path, url: str, cwd: Path) -> float:
    """Seconds from process start to its "serving" line."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(supervise), "--database-url", url, "--queue", "bench", "--app",
         "benchmarks.app:registry", "--concurrency", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd)})
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if SERVING in line:
                return time.monotonic() - started
        raise RuntimeError(f"the supervisor exited ({proc.wait()}) before serving")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def migrate_times(url: str, n: int) -> list[float]:
    """Seconds of each of ``n`` migrates of an already migrated database."""
    times = []
    with psycopg.connect(url) as conn:
        for _ in range(n):
            started = time.perf_counter()
            migrate(conn)
            conn.commit()
            times.append(time.perf_counter() - started)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.supervisor_start")
    parser.add_argument("--starts", type=int, default=10)
    args = parser.parse_args(argv)
    supervise = Path(sys.executable).parent / "atlantis-supervise"
    cwd = Path(__file__).resolve().parent.parent
    with scratch_database("atl_start") as url:
        prepare_atlantis(url)
        one_start(supervise, url, cwd)  # the first start may migrate: not counted
        times = [one_start(supervise, url, cwd) for _ in range(args.starts)]
        migrates = migrate_times(url, 30)
    print(f"migrate of a migrated database: median {statistics.median(migrates) * 1000:.1f} ms"
          f" (min {min(migrates) * 1000:.1f}) over {len(migrates)}")
    print("starts (s): " + " ".join(f"{t:.3f}" for t in times))
    print(f"median {statistics.median(times):.3f} s over {len(times)} starts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
