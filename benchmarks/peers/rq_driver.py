"""RQ side of ``python -m benchmarks.compare``: runs inside the RQ venv only.

    python rq_driver.py enqueue --redis URL --jobs N [--spacing S]
    python rq_driver.py work --redis URL [--workers 4]
    python rq_driver.py latencies --redis URL

``enqueue`` puts N no-op jobs on the queue (``Queue.enqueue_many``, 1,000 a call, or one
``enqueue`` each ``--spacing`` seconds); ``work`` becomes ``rq worker-pool`` with
``--workers`` workers, each of which forks a work horse per job (RQ's default Worker);
``latencies`` prints the pickup latencies the jobs recorded (ms) as JSON. Each job pushes
its pickup latency (now minus the enqueue time it was given) to the list ``bench:done``,
which is also how the harness counts finished jobs. Written against RQ 3.0's documented API.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from driver_common import parse, print_latencies, print_seconds  # type: ignore[import-not-found]
from redis import Redis  # type: ignore[import-not-found]
from rq import Queue, get_current_job  # type: ignore[import-not-found]

QUEUE = "bench"
DONE = "bench:done"


def noop(enqueued: float) -> None:
    picked = time.time()
    job = get_current_job()
    job.connection.rpush(DONE, f"{(picked - enqueued) * 1000:.3f}")


def enqueue(url: str, jobs: int, spacing: float) -> None:
    queue = Queue(QUEUE, connection=Redis.from_url(url))
    func = "rq_driver.noop"
    started = time.perf_counter()
    if spacing:
        for _ in range(jobs):
            queue.enqueue(func, time.time())
            time.sleep(spacing)
    else:
        for start in range(0, jobs, 1000):
            now = time.time()
            queue.enqueue_many([Queue.prepare_data(func, args=(now,))
                                for _ in range(min(1000, jobs - start))])
    print_seconds(started)


def work(url: str, workers: int) -> None:
    rq = str(Path(sys.executable).parent / "rq")
    here = str(Path(__file__).resolve().parent)
    os.execv(rq, [rq, "worker-pool", "--url", url, "--num-workers", str(workers),
                  "--path", here, "--logging-level", "WARNING", QUEUE])


def main() -> None:
    opts = parse("redis", workers=4)
    if opts.command == "enqueue":
        enqueue(opts.redis, opts.jobs, opts.spacing)
    elif opts.command == "work":
        work(opts.redis, opts.workers)
    else:
        print_latencies([float(x) for x in Redis.from_url(opts.redis).lrange(DONE, 0, -1)])


if __name__ == "__main__":
    main()
