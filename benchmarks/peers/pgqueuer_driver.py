"""pgqueuer side of ``python -m benchmarks.compare``: runs inside the pgqueuer venv only.

    python pgqueuer_driver.py enqueue --dsn URL --jobs N
    python pgqueuer_driver.py work --dsn URL [--batch-size B]

``enqueue`` installs pgqueuer's schema and inserts N jobs for the no-op entrypoint;
``work`` runs one QueueManager (asyncpg driver, continuous mode) until SIGTERM/SIGINT.
Written against pgqueuer 1.6's documented API (QueueManager, Queries, AsyncpgDriver).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

import asyncpg  # type: ignore[import-not-found]
from pgqueuer import AsyncpgDriver, Queries, QueueManager  # type: ignore[import-not-found]

ENTRYPOINT = "noop"


async def enqueue(dsn: str, jobs: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        for start in range(0, jobs, 1000):
            count = min(1000, jobs - start)
            await queries.enqueue(
                [ENTRYPOINT] * count,
                [str(start + i).encode() for i in range(count)],
                [0] * count,
            )
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["enqueue", "work"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=None)
    opts = parser.parse_args()
    if opts.command == "enqueue":
        asyncio.run(enqueue(opts.dsn, opts.jobs))
    else:
        asyncio.run(work(opts.dsn, opts.batch_size))


if __name__ == "__main__":
    main()
