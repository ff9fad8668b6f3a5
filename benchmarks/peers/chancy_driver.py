"""chancy side of ``python -m benchmarks.compare``: runs inside the chancy venv only.

    python chancy_driver.py enqueue --dsn URL --jobs N [--spacing S]
    python chancy_driver.py work --dsn URL [--concurrency 8]
    python chancy_driver.py latencies --dsn URL

``enqueue`` runs chancy's migrations and pushes N no-op jobs (``push_many``, 1,000 a batch,
or one ``push`` each ``--spacing`` seconds); ``work`` declares the queue with the process
executor (chancy's default: a process pool) at ``--concurrency``, ``eager_polling``, and runs one Worker until
SIGTERM/SIGINT, which the Worker handles itself; ``latencies`` prints each started job's
pickup latency (ms, ``started_at`` minus ``created_at``) as JSON. Written against chancy
0.26's documented API (Chancy, Queue, Job, Worker).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from typing import Any

from chancy import Chancy, Job, Queue, Worker  # type: ignore[import-not-found]
from driver_common import parse, print_pg_latencies, print_seconds  # type: ignore[import-not-found]

QUEUE = "bench"
LATENCIES = ("SELECT extract(epoch FROM started_at - created_at) * 1000 FROM chancy_jobs "
             "WHERE started_at IS NOT NULL ORDER BY created_at, id")


def noop(n: int = 0) -> None:
    return None


def job_func() -> Any:
    """``noop`` by an importable name (not ``__main__``), for the pool's processes."""
    return importlib.import_module("chancy_driver").noop


def quiet_logger() -> logging.Logger:
    """Warnings only: chancy logs every job at INFO, which would dominate a no-op drain."""
    log = logging.getLogger("chancy-bench")
    log.setLevel(logging.WARNING)
    log.addHandler(logging.StreamHandler())
    return log


async def enqueue(dsn: str, jobs: int, spacing: float) -> None:
    async with Chancy(dsn, log=quiet_logger()) as chancy:
        await chancy.migrate()
        job = Job.from_func(job_func(), queue=QUEUE)
        started = time.perf_counter()
        if spacing:
            for i in range(jobs):
                await chancy.push(job.with_kwargs(n=i))
                await asyncio.sleep(spacing)
        else:
            async for _ in chancy.push_many([job.with_kwargs(n=i) for i in range(jobs)],
                                            batch_size=1000):
                pass
        print_seconds(started)


async def work(dsn: str, concurrency: int) -> None:
    async with Chancy(dsn, log=quiet_logger()) as chancy:
        # eager_polling: fetch again as soon as a job ends. Without it a worker fetches at
        # most ``concurrency`` jobs per polling_interval (5 s): ~1.6 jobs/s at 8.
        await chancy.declare(Queue(QUEUE, concurrency=concurrency,
                                   executor=Chancy.Executor.Process, eager_polling=True),
                             upsert=True)
        async with Worker(chancy) as worker:
            await worker.wait_for_shutdown()


def main() -> None:
    opts = parse("dsn", concurrency=8)
    if opts.command == "enqueue":
        asyncio.run(enqueue(opts.dsn, opts.jobs, opts.spacing))
    elif opts.command == "work":
        asyncio.run(work(opts.dsn, opts.concurrency))
    else:
        print_pg_latencies(opts.dsn, LATENCIES)


if __name__ == "__main__":
    main()
