"""procrastinate side of ``python -m benchmarks.compare``: runs inside the procrastinate venv.

    python procrastinate_driver.py enqueue --dsn URL --jobs N
    python procrastinate_driver.py work --dsn URL

``enqueue`` applies procrastinate's schema and defers N no-op jobs (batch_defer_async);
``work`` runs one worker with its default options (concurrency 1, LISTEN/NOTIFY) until
SIGTERM/SIGINT, which procrastinate handles itself. Written against procrastinate 3.10's
documented API (App, PsycopgConnector, run_worker_async).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import procrastinate  # type: ignore[import-not-found]

QUEUE = "bench"


def make_app(dsn: str) -> Any:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    return app


async def noop(n: int) -> None:
    return None


async def enqueue(dsn: str, jobs: int) -> None:
    app = make_app(dsn)
    task = app.task(name="noop", queue=QUEUE)(noop)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, 1000):
            await task.batch_defer_async(
                *[{"n": i} for i in range(start, min(start + 1000, jobs))])


async def work(dsn: str) -> None:
    app = make_app(dsn)
    app.task(name="noop", queue=QUEUE)(noop)
    async with app.open_async():
        await app.run_worker_async(queues=[QUEUE])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["enqueue", "work"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=0)
    opts = parser.parse_args()
    if opts.command == "enqueue":
        asyncio.run(enqueue(opts.dsn, opts.jobs))
    else:
        asyncio.run(work(opts.dsn))


if __name__ == "__main__":
    main()
