"""Celery side of ``python -m benchmarks.compare``: runs inside the Celery venv only.

    python celery_driver.py enqueue --redis URL --jobs N [--spacing S]
    python celery_driver.py work --redis URL [--concurrency 8]
    python celery_driver.py latencies --redis URL

The broker is Redis (``--redis``, passed on to the worker as ``BENCH_REDIS_URL``); no result backend, acks
as default (early). ``enqueue`` sends N no-op tasks (``apply_async``, one a call, every
``--spacing`` seconds when given); ``work`` becomes ``celery worker -P prefork -c N``;
``latencies`` prints the pickup latencies the tasks recorded (ms) as JSON. Each task pushes
its pickup latency (now minus the send time it was given) to the list ``bench:done``, which
is also how the harness counts finished tasks. Written against Celery 5.7's documented API.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery  # type: ignore[import-not-found]
from driver_common import parse, print_latencies, print_seconds  # type: ignore[import-not-found]
from redis import Redis  # type: ignore[import-not-found]

DONE = "bench:done"
URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("celery_driver", broker=URL)
_redis: list[Any] = []  # one connection per pool process, made on its first task


@app.task(name="noop")  # type: ignore[untyped-decorator]
def noop(enqueued: float) -> None:
    picked = time.time()
    if not _redis:
        _redis.append(Redis.from_url(URL))
    _redis[0].rpush(DONE, f"{(picked - enqueued) * 1000:.3f}")


def enqueue(jobs: int, spacing: float) -> None:
    started = time.perf_counter()
    for _ in range(jobs):
        noop.apply_async((time.time(),))
        if spacing:
            time.sleep(spacing)
    print_seconds(started)


def work(concurrency: int) -> None:
    celery = str(Path(sys.executable).parent / "celery")
    os.chdir(Path(__file__).resolve().parent)
    os.execv(celery, [celery, "-A", "celery_driver", "worker", "-P", "prefork", "-c",
                      str(concurrency), "--loglevel", "WARNING"])


def main() -> None:
    opts = parse("redis", concurrency=8)
    # The worker imports this module afresh (celery -A), so the URL travels in the environment.
    os.environ["BENCH_REDIS_URL"] = opts.redis
    app.conf.broker_url = opts.redis
    if opts.command == "enqueue":
        enqueue(opts.jobs, opts.spacing)
    elif opts.command == "work":
        work(opts.concurrency)
    else:
        print_latencies([float(x) for x in Redis.from_url(opts.redis).lrange(DONE, 0, -1)])


if __name__ == "__main__":
    main()
