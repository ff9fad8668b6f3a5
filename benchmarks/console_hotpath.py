"""Does a watching console cost the supervisors anything? Drains with and without one.

    python -m benchmarks.console_hotpath [--jobs 10000] [--rounds 2] [--concurrency 8]

Each round drains ``--jobs`` no-op jobs with one supervisor twice, alternately: once with
no console, once with ``tide console`` running and two live streams open on it, as a
browser would have them: ``/api/events`` (what list pages refresh on) and
``/api/jobs/{id}/stream`` of a job. It prints, per run, jobs/s (first claim to last
completion, from the rows), the CPU the supervisor and its children used per job, the CPU
of the console process, and how many refresh events the console sent. The supervisors
send their NOTIFYs either way (one per statement); what a console adds is one LISTEN
connection, so the hot path should not change beyond the run-to-run noise.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import psycopg

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from benchmarks.scratch import scratch_database

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.app:registry"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_of(proc: psutil.Process) -> float:
    """CPU seconds of a process and its living descendants (children that exited and were
    reaped are counted by the parent's children_* times)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


class Streams:
    """Reads two SSE streams of the console in threads, counting events."""

    def __init__(self, base: str, job_id: int) -> None:
        self.events = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._read, args=(f"{base}{path}",), daemon=True)
                        for path in ("/api/events", f"/api/jobs/{job_id}/stream")]
        for t in self.threads:
            t.start()

    def _read(self, url: str) -> None:
        try:
            with httpx.Client(timeout=None) as client, client.stream("GET", url) as response:
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        self.events += 1
                    if self.stop.is_set():
                        return
        except httpx.HTTPError:
            return


def drain(url: str, jobs: int, concurrency: int, console: bool) -> dict[str, float]:
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM atlantis.jobs")
        watched = atlantis.enqueue(conn, "bench.Noop", {"n": -1}, delay=3600)
        for start in range(0, jobs, 1000):
            atlantis.enqueue_many(conn, "bench.Noop",
                                  [{"n": i} for i in range(start, min(start + 1000, jobs))])
        conn.commit()
        conn.execute("CHECKPOINT")
    console_proc: subprocess.Popen[bytes] | None = None
    streams: Streams | None = None
    if console:
        port = free_port()
        console_proc = subprocess.Popen(
            [str(BIN / "tide"), "--database-url", url, "console", "--port", str(port)],
            cwd=ROOT, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/api/queues", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit("the console did not start") from None
                time.sleep(0.1)
        streams = Streams(base, watched)
        time.sleep(0.5)
    sup = subprocess.Popen(
        [str(BIN / "atlantis-supervise"), "--queue", "bench", "--app", APP, "--database-url",
         url, "--concurrency", str(concurrency)], cwd=ROOT, stderr=subprocess.DEVNULL)
    proc = psutil.Process(sup.pid)
    console_ps = psutil.Process(console_proc.pid) if console_proc else None
    console_cpu0 = cpu_of(console_ps) if console_ps else 0.0
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'complete'), min(started_at), "
                    "max(finished_at) FROM atlantis.jobs").fetchone()
                assert row is not None
                if row[0] >= jobs:
                    break
                time.sleep(0.1)
        sup_cpu = cpu_of(proc)
        console_cpu = (cpu_of(console_ps) - console_cpu0) if console_ps else 0.0
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(30)
        if streams is not None:
            streams.stop.set()
        if console_proc is not None:
            console_proc.send_signal(signal.SIGTERM)
            console_proc.wait(30)
    seconds = (row[2] - row[1]).total_seconds()
    return {"jobs_s": jobs / seconds, "sup_ms": sup_cpu * 1000 / jobs,
            "console_ms": console_cpu * 1000 / jobs,
            "events": float(streams.events if streams else 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    opts = parser.parse_args()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with scratch_database("atl_hot") as url:
        with psycopg.connect(url) as conn:
            migrate(conn)
            sync(conn, list(load_app(APP).decls.values()))
            conn.commit()
        for _ in range(opts.rounds):
            for console in (False, True):
                results[console].append(drain(url, opts.jobs, opts.concurrency, console))
                print(f"  console={console}: {results[console][-1]}", file=sys.stderr)
    print(f"\n{opts.jobs:,} no-op jobs, --concurrency {opts.concurrency}, "
          f"{opts.rounds} runs each (median), {os.cpu_count()} cores\n")
    print("| console | jobs/s | supervisor+children CPU ms/job | console CPU ms/job | "
          "events streamed |")
    print("| --- | --- | --- | --- | --- |")
    for console in (False, True):
        runs = results[console]

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return float(statistics.median(r[key] for r in runs))

        print(f"| {'watching (2 streams)' if console else 'none'} | {med('jobs_s'):,.0f} | "
              f"{med('sup_ms'):.3f} | {med('console_ms'):.3f} | {med('events'):.0f} |")


if __name__ == "__main__":
    main()
