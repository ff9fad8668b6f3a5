"""The store's side of a drain, alone: claim + finish cycles on one connection, per job.

    python -m benchmarks.store_cycle [--jobs 10000] [--batches 10,50,200] [--rounds 1]
                                     [--extra-sql FILE] [--explain] [--stats]

For each batch size B, on a scratch database of its own (migrated, the benchmark app
synced): enqueue ``--jobs`` no-op rows, then claim B rows and finish them (complete), as
the supervisor does (``atlantis.store.supervision.claim`` and ``finish``, autocommit, the
claim in a transaction), until none is left. Reported per job: the CPU the PostgreSQL
backend serving the connection spent (``/proc/<pg_backend_pid()>/schedstat``,
before and after: robust to other load on the machine, unlike rows/s), rows/s, and the WAL
written (``pg_current_wal_lsn()`` before and after: cluster-wide, so run it on a server of
its own, e.g. a fresh ``ATLANTIS_HOME``). The server must run on this machine.

``--extra-sql``: a file run after the migrations (a candidate index or trigger change, to
measure before writing its migration). ``--explain``: EXPLAIN (ANALYZE, BUFFERS) of one
claim and one finish at the largest batch, on a half-drained table. ``--stats``: updates,
HOT updates and each index's size after the drain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import class_row

from atlantis.store import supervision
from atlantis.store.queries import Q
from benchmarks.runs import insert_atlantis, prepare_atlantis
from benchmarks.scratch import scratch_database

WORKER = "bench-cycle-1"
T = TypeVar("T")


class Conn:
    """The supervision door's connection (``supervision.Connection``) over one psycopg
    autocommit connection, as the supervisor's ``Db`` runs it, minus the timeouts."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def fetch(self, query: LiteralString, params: dict[str, Any] | None = None, *,
                    timeout: float = 30.0, transaction: bool = False) -> list[tuple[Any, ...]]:
        cur = self.conn.cursor()
        rows: list[tuple[Any, ...]] = await self._run(cur, query, params, transaction)
        return rows

    async def fetch_rows(self, row: type[T], query: LiteralString,
                         params: dict[str, Any] | None = None, *, timeout: float = 30.0,
                         transaction: bool = False) -> list[T]:
        cur = self.conn.cursor(row_factory=class_row(row))
        rows: list[T] = await self._run(cur, query, params, transaction)
        return rows

    async def _run(self, cur: Any, query: LiteralString, params: dict[str, Any] | None,
                   transaction: bool) -> Any:
        if not transaction:
            await cur.execute(query, params)
            return await cur.fetchall() if cur.description else []
        async with self.conn.transaction():
            await cur.execute(query, params)
            return await cur.fetchall() if cur.description else []


def backend_cpu(pid: int) -> float:
    """Seconds of CPU process ``pid`` has used: ``/proc/<pid>/schedstat`` (nanoseconds on
    a CPU, user and system), exact where ``/proc/<pid>/stat``'s utime + stime count in
    clock ticks (10 ms), too coarse for one statement."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def results(rows: list[supervision.ClaimedRow]) -> list[supervision.Result]:
    return [supervision.Result(job_id=r.id, attempt=r.attempt, state="complete", spent=True,
                               delay=0.0, error=None, progress=None, label="complete",
                               child_pid=4242, run=r.run) for r in rows]


async def cycle(db: Conn, batch: int, split: list[float] | None = None,
                pid: int = 0) -> int:
    """One claim of ``batch`` rows and one finish of them; ``split``: add the backend's CPU
    seconds of each (claim, finish) to it."""
    c0 = backend_cpu(pid) if split is not None else 0.0
    rows = await supervision.claim(db, WORKER, ["bench"], ["bench.Noop"], batch, 30)
    c1 = backend_cpu(pid) if split is not None else 0.0
    if rows:
        await supervision.finish(db, WORKER, results(rows), "bench-host", 4241, 30)
    if split is not None:
        split[0] += c1 - c0
        split[1] += backend_cpu(pid) - c1
    return len(rows)


def prepare(url: str, jobs: int, extra_sql: str | None) -> None:
    prepare_atlantis(url)
    if extra_sql:
        with psycopg.connect(url) as conn:
            conn.execute(extra_sql.encode())
    insert_atlantis(url, jobs)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE atlantis.jobs")


async def explain(db: Conn, batch: int) -> None:
    conn = db.conn
    params = {"queues": ["bench"], "jobs": ["bench.Noop"], "limit": batch, "worker": WORKER,
              "limited": [], "within": 5.0}
    async with conn.transaction():
        cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, VERBOSE OFF) " + Q.claim, params)
        print("\n-- claim, B =", batch)
        print("\n".join(r[0] for r in await cur.fetchall()))
        raise psycopg.Rollback()
    rows = await supervision.claim(db, WORKER, ["bench"], ["bench.Noop"], batch, 30)
    fparams = supervision.finish_params(WORKER, results(rows), "bench-host", 4241)
    cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, VERBOSE OFF) " + Q.finish, fparams)
    print("\n-- finish, B =", batch)
    print("\n".join(r[0] for r in await cur.fetchall()))


async def drain(url: str, batch: int, do_explain: bool, stats: bool) -> dict[str, float]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, options=os.environ.get("CYCLE_PGOPTIONS", ""))
    try:
        db = Conn(conn)
        pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone() or [0])[0]
        for _ in range(6):  # warm: plans prepared, caches filled (left out)
            await cycle(db, batch)
        if do_explain:
            await explain(db, batch)
        lsn0 = (await (await conn.execute("SELECT pg_current_wal_lsn()")).fetchone() or [0])[0]
        cpu0, t0 = backend_cpu(pid), time.perf_counter()
        done = 0
        split = [0.0, 0.0]
        while n := await cycle(db, batch, split, pid):
            done += n
        t1, cpu1 = time.perf_counter(), backend_cpu(pid)
        cur = await conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)",
                                 (str(lsn0),))
        wal = float((await cur.fetchone() or [0])[0])
        if stats:
            await print_stats(conn)
        return {"jobs": done, "cpu_ms": (cpu1 - cpu0) * 1000 / max(done, 1),
                "rate": done / (t1 - t0), "wal": wal / max(done, 1),
                "claim_ms": split[0] * 1000 / max(done, 1),
                "finish_ms": split[1] * 1000 / max(done, 1)}
    finally:
        await conn.close()


async def print_stats(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT 1")
    cur = await conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE relid = 'atlantis.jobs'::regclass")
    upd, hot = await cur.fetchone() or (0, 0)
    print(f"   jobs: {upd} updates, {hot} HOT")
    cur = await conn.execute(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid IN ('atlantis.jobs'::regclass, 'atlantis.attempts'::regclass)"
        " ORDER BY 1")
    for name, size in await cur.fetchall():
        print(f"   {name:32} {size // 8192:6} pages")
    cur = await conn.execute(
        "SELECT left(regexp_replace(statement, '\\s+', ' ', 'g'), 60), generic_plans,"
        " custom_plans FROM pg_prepared_statements ORDER BY 1")
    for text, generic, custom in await cur.fetchall():
        print(f"   prepared {text!r}: {generic} generic plans, {custom} custom")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--batches", default="10,50,200")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--extra-sql", type=Path)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--stats", action="store_true")
    opts = parser.parse_args()
    extra = opts.extra_sql.read_text() if opts.extra_sql else None
    batches = [int(b) for b in opts.batches.split(",")]
    for rnd in range(opts.rounds):
        for batch in batches:
            with scratch_database("atl_cycle") as url:
                prepare(url, opts.jobs, extra)
                r = asyncio.run(drain(url, batch, opts.explain and batch == max(batches),
                                      opts.stats))
            print(f"round {rnd + 1} B={batch:4}: {r['cpu_ms']:.4f} ms backend CPU/job "
                  f"(claim {r['claim_ms']:.4f}, finish {r['finish_ms']:.4f}), "
                  f"{r['rate']:8.0f} rows/s, {r['wal']:6.0f} WAL bytes/job ({r['jobs']:.0f} jobs)",
                  flush=True)


if __name__ == "__main__":
    main()
