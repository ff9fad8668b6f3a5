"""The systems ``python -m benchmarks.compare`` drains, and what one drain of one measured.

Shared by the side-by-side table (``compare.py``), the target table (``targets.py``) and
the scale-out run (``scaleout.py``).
"""

from __future__ import annotations

import dataclasses

from benchmarks.measure import RssSampler, Snapshot

ATL_SQL = ("SELECT count(*) FILTER (WHERE state = 'available'), "
           "count(*) FILTER (WHERE state = 'complete') FROM atlantis.jobs")
ATL_LATENCY = ("SELECT extract(epoch FROM started_at - created_at) * 1000 FROM atlantis.jobs "
               "WHERE started_at IS NOT NULL ORDER BY created_at, id")


@dataclasses.dataclass


class System:
    key: str
    name: str
    model: str
    settings: str
    """How it runs, starting with its concurrency."""
    peer: str | None  # None: atlantis, from this environment
    worker_args: list[str]
    progress_sql: str = ""
    """PostgreSQL systems: one row (jobs not yet picked up, jobs done); may use %(jobs)s."""
    redis_queue: str = ""
    """Redis systems: the list holding the waiting jobs (done ones are in ``bench:done``)."""
    readme_model: str = ""
    """The model as the performance table of benchmarks/README.md words it (after the name and
    version)."""
    readme_settings: str = ""
    """The settings as the performance table of benchmarks/README.md words them."""


def atlantis_system(concurrency: int, isolation: str = "reuse") -> System:
    reuse = isolation == "reuse"
    model = ("supervisor + reused child processes" if reuse
             else "supervisor + a new child per attempt (zygote fork)")
    return System(f"atlantis-{isolation}-c{concurrency}", "atlantis", model,
                  f"concurrency {concurrency}, --isolation {isolation}", None,
                  ["--concurrency", str(concurrency), "--isolation", isolation], ATL_SQL,
                  readme_model=("reused children" if reuse
                                else "a new child per attempt (zygote fork)"),
                  readme_settings=f"`--concurrency {concurrency}"
                  + ("`" if reuse else f" --isolation {isolation}`"))


def systems() -> list[System]:
    # pgqueuer deletes a job when it completes (and logs it in pgqueuer_log).
    pgq_sql = ("SELECT count(*) FILTER (WHERE status = 'queued'), %(jobs)s - count(*) "
               "FROM pgqueuer")
    pro_sql = ("SELECT count(*) FILTER (WHERE status = 'todo'), "
               "count(*) FILTER (WHERE status = 'succeeded') FROM procrastinate_jobs")
    chancy_sql = ("SELECT count(*) FILTER (WHERE state = 'pending'), "
                  "count(*) FILTER (WHERE state = 'succeeded') FROM chancy_jobs")
    pgq = "in-process asyncio, batched dequeue/ack"
    return [
        atlantis_system(2),
        atlantis_system(8),
        atlantis_system(4, "fresh"),
        System("pgqueuer-b10", "pgqueuer", pgq, "unbounded (asyncio), batch_size=10 (default), "
               "asyncpg", "pgqueuer", [], pgq_sql, readme_model="in-process asyncio",
               readme_settings="batch 10 (default)"),
        System("pgqueuer-b200", "pgqueuer", pgq, "unbounded (asyncio), batch_size=200, asyncpg",
               "pgqueuer", ["--batch-size", "200"], pgq_sql, readme_model="in-process asyncio",
               readme_settings="batch 200"),
        System("procrastinate", "procrastinate", "in-process asyncio, one job a fetch",
               "concurrency 1 (default worker)", "procrastinate", [], pro_sql,
               readme_model="in-process asyncio", readme_settings="default worker"),
        System("chancy", "chancy", "worker + process pool executor (default executor)",
               "concurrency 8, process executor, eager_polling", "chancy", ["--concurrency", "8"],
               chancy_sql, readme_model="process pool executor",
               readme_settings="concurrency 8"),
        System("rq", "rq", "worker-pool, a forked work horse per job (default Worker)",
               "concurrency 4 (4 workers)", "rq", ["--workers", "4"],
               redis_queue="rq:queue:bench", readme_model="a forked work horse per job",
               readme_settings="4 workers"),
        System("celery", "celery", "prefork pool, Redis broker, early acks (default)",
               "concurrency 8, -P prefork", "celery", ["--concurrency", "8"],
               redis_queue="celery", readme_model="prefork pool, Redis",
               readme_settings="concurrency 8"),
    ]


def pick(wanted: list[str]) -> list[System]:
    """The systems named by ``wanted`` (keys such as ``atlantis-reuse-c8``, or names such as
    ``pgqueuer`` for all of its rows), in the order given, each once."""
    chosen: list[System] = []
    for want in wanted:
        for system in systems():
            if want in (system.key, system.name) and system.key not in {s.key for s in chosen}:
                chosen.append(system)
    return chosen


#: The paired rounds of the reuse target: atlantis reuse c8 against pgqueuer's default batch
#: and its batch of 200, the three taking turns (A B C, C B A, ...).
TRIO = ("atlantis-reuse-c8", "pgqueuer-b10", "pgqueuer-b200")
#: The paired rounds of the fresh target: a new process per attempt against RQ's fork per job.
FORKS = ("atlantis-fresh-c4", "rq")


@dataclasses.dataclass


class Result:
    system: System
    version: str
    jobs: int = 0
    jobs_per_s: float | None = None
    drain_s: float | None = None
    wall_s: float | None = None
    enqueue_s: float | None = None
    cpu: Snapshot | None = None
    """CPU seconds over the drain, per component."""
    rss: RssSampler | None = None
    latencies: list[float] = dataclasses.field(default_factory=list)
    note: str = ""

    def cpu_ms(self) -> Snapshot | None:
        if self.cpu is None or not self.jobs:
            return None
        k = 1000 / self.jobs
        return Snapshot(self.cpu.worker * k, self.cpu.children * k, self.cpu.store * k)

    def add_note(self, note: str) -> None:
        self.note = "; ".join(filter(None, [self.note, note]))


Round = dict[str, Result]
"""One paired round: each system's drain by its key, in the order they ran."""
