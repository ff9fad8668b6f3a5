"""procrastinate side of ``python -m benchmarks.compare``: runs inside the procrastinate venv.

    python procrastinate_driver.py enqueue --dsn URL --jobs N [--spacing S]
    python procrastinate_driver.py work --dsn URL
    python procrastinate_driver.py latencies --dsn URL

``enqueue`` applies procrastinate's schema (unless there) and defers N no-op jobs (batch_defer_async, 1,000
a call, or one a call ``--spacing`` seconds apart); ``work`` runs one worker with its default
options (concurrency 1, LISTEN/NOTIFY) until SIGTERM/SIGINT, which procrastinate handles
itself; ``latencies`` prints each started job's pickup latency (ms, ``started`` minus
``deferred`` in ``procrastinate_events``) as JSON. Written against procrastinate 3.10's
documented API (App, PsycopgConnector, run_worker_async).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import procrastinate  # type: ignore[import-not-found]
import psycopg
from driver_common import parse, print_pg_latencies, print_seconds  # type: ignore[import-not-found]

QUEUE = "bench"
LATENCIES = """
SELECT extract(epoch FROM s.at - d.at) * 1000
FROM procrastinate_events d JOIN procrastinate_events s
  ON s.job_id = d.job_id AND s.type = 'started'
WHERE d.type = 'deferred'
ORDER BY d.at, d.id
"""


def make_app(dsn: str) -> Any:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    return app


async def noop(n: int) -> None:
    return None


async def schema_installed(dsn: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT to_regclass('procrastinate_jobs')")
        row = await cur.fetchone()
        return row is not None and row[0] is not None


async def enqueue(dsn: str, jobs: int, spacing: float) -> None:
    app = make_app(dsn)
    task = app.task(name="noop", queue=QUEUE)(noop)
    async with app.open_async():
        if not await schema_installed(dsn):
            await app.schema_manager.apply_schema_async()
        batch = 1 if spacing else 1000
        started = time.perf_counter()
        for start in range(0, jobs, batch):
            await task.batch_defer_async(
                *[{"n": i} for i in range(start, min(start + batch, jobs))])
            if spacing:
                await asyncio.sleep(spacing)
        print_seconds(started)


async def work(dsn: str) -> None:
    app = make_app(dsn)
    app.task(name="noop", queue=QUEUE)(noop)
    async with app.open_async():
        await app.run_worker_async(queues=[QUEUE])


def main() -> None:
    opts = parse("dsn")
    if opts.command == "enqueue":
        asyncio.run(enqueue(opts.dsn, opts.jobs, opts.spacing))
    elif opts.command == "work":
        asyncio.run(work(opts.dsn))
    else:
        print_pg_latencies(opts.dsn, LATENCIES)


if __name__ == "__main__":
    main()
