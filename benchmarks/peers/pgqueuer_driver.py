"""pgqueuer side of ``python -m benchmarks.compare``: runs inside the pgqueuer venv only.

    python pgqueuer_driver.py enqueue --dsn URL --jobs N [--spacing S]
    python pgqueuer_driver.py work --dsn URL [--batch-size B]
    python pgqueuer_driver.py latencies --dsn URL

``enqueue`` installs pgqueuer's schema (unless there) and inserts N jobs for the no-op entrypoint, 1,000 a
call of the batch ``Queries.enqueue`` (or one a call, ``--spacing`` seconds apart), and
prints ``{"seconds": ...}``: the time of the inserts alone. ``work`` runs one QueueManager
(asyncpg driver, continuous mode) until SIGTERM/SIGINT. ``latencies`` prints the pickup
latency of every picked job (ms, ``picked`` minus ``queued`` in ``pgqueuer_log``) as JSON.
Written against pgqueuer 1.6's documented API (QueueManager, Queries, AsyncpgDriver).
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import asyncpg  # type: ignore[import-not-found]
from driver_common import parse, print_latencies, print_seconds  # type: ignore[import-not-found]
from pgqueuer import AsyncpgDriver, Queries, QueueManager  # type: ignore[import-not-found]

ENTRYPOINT = "noop"
LATENCIES = """
SELECT extract(epoch FROM p.created - q.created) * 1000
FROM pgqueuer_log q JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked'
WHERE q.status = 'queued'
ORDER BY q.created, q.id
"""


async def enqueue(dsn: str, jobs: int, spacing: float) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if await conn.fetchval("SELECT to_regclass('pgqueuer')") is None:
            await queries.install()
        batch = 1 if spacing else 1000
        started = time.perf_counter()
        for start in range(0, jobs, batch):
            count = min(batch, jobs - start)
            await queries.enqueue(
                [ENTRYPOINT] * count,
                [str(start + i).encode() for i in range(count)],
                [0] * count,
            )
            if spacing:
                await asyncio.sleep(spacing)
        print_seconds(started)
    finally:
        await conn.close()


async def noop(job: Any) -> None:
    return None


async def work(dsn: str, batch_size: int | None) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        qm.entrypoint(ENTRYPOINT)(noop)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, qm.shutdown.set)
        if batch_size is None:
            await qm.run()  # the library's default batch size
        else:
            await qm.run(batch_size=batch_size)
    finally:
        await conn.close()


async def latencies(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(LATENCIES)
        print_latencies([float(r[0]) for r in rows])
    finally:
        await conn.close()


def main() -> None:
    opts = parse("dsn", batch_size=0)  # 0: the library's default
    if opts.command == "enqueue":
        asyncio.run(enqueue(opts.dsn, opts.jobs, opts.spacing))
    elif opts.command == "work":
        asyncio.run(work(opts.dsn, opts.batch_size or None))
    else:
        asyncio.run(latencies(opts.dsn))


if __name__ == "__main__":
    main()
