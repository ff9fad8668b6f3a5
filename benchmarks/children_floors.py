"""``python -m benchmarks.children --parts spawn``: what one ``ctx.spawn`` statement costs,
from this process, on a scratch database with no supervisor (nothing else running): a
``fan.Parent`` row set running by hand, and ``atlantis.step_spawn`` sent as a handler's
step connection sends it (autocommit, prepared after 5 runs), then variants that take the
commit's WAL flush, the commit, and the round trip away one by one."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import ClientCursor
from psycopg.types.json import Jsonb

import atlantis
from atlantis import children
from atlantis.store import steps as store
from atlantis.store.database import resolve_url
from benchmarks.children_parts import prepare, say
from benchmarks.scratch import scratch_database
from benchmarks.tables import markdown

RUNNING = ("UPDATE atlantis.jobs SET state = 'running', attempt = 1, "
           "run_id = gen_random_uuid(), claimed_by = 'benchmarks.children', "
           "claimed_until = now() + interval '1 hour', started_at = now() WHERE id = %s "
           "RETURNING run_id::text")
TWICE = """
CREATE FUNCTION pg_temp.enqueue_twice(parent bigint, args jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c bigint := (atlantis.enqueue_many('fan.Child', ARRAY[args]))[1];
BEGIN
    UPDATE atlantis.jobs x SET parent_id = parent WHERE x.id = c AND x.parent_id IS NULL;
    RETURN c;
END
$$
"""
TRACKED = ("SELECT funcname, calls, total_time, self_time FROM pg_stat_xact_user_functions "
           "WHERE schemaname = 'atlantis' ORDER BY total_time DESC")


def step_connection(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, **store.CONNECT_OPTIONS)
    conn.prepare_threshold = store.PREPARE_THRESHOLD  # as open_records sets it, direct
    return conn


def running_parent(url: str) -> store.Fence:
    with psycopg.connect(url, autocommit=True) as conn:
        job = atlantis.enqueue(conn, "fan.Parent", {"n": 0})
        row = conn.execute(RUNNING, (job,)).fetchone()
    assert row is not None
    return store.Fence(job, row[0], 1)


def spawns(conn: psycopg.Connection[Any], fence: store.Fence, prefix: str, n: int) -> float:
    """Seconds a spawn over ``n`` ``atlantis.step_spawn`` calls, names ``prefix-i``."""
    params = [children.spawn_params(f"{prefix}-{i}", "fan.Child", {"i": i}, {})
              for i in range(n)]
    started = time.perf_counter()
    for i, p in enumerate(params):
        store.spawn(conn, fence, f"{prefix}-{i}", p)
    return (time.perf_counter() - started) / n


def timed(n: int, call: Callable[[int], object]) -> float:
    started = time.perf_counter()
    for i in range(n):
        call(i)
    return (time.perf_counter() - started) / n


def explained(url: str, fence: store.Fence, n: int) -> float:
    """The median ``EXPLAIN ANALYZE`` execution time of one spawn (autocommit), seconds."""
    took = []
    with psycopg.connect(url, autocommit=True) as conn:
        cur = ClientCursor(conn)
        for i in range(n):
            p = {**children.spawn_params(f"x-{i}", "fan.Child", {"i": i}, {}),
                 "job_id": fence.job_id, "run_id": fence.run_id, "attempt": fence.attempt,
                 "name": f"x-{i}"}
            cur.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM atlantis.step_spawn("
                "%(job_id)s, %(run_id)s::uuid, %(name)s, %(attempt)s, %(job)s, %(args)s, "
                "%(run_at)s, %(priority)s, %(queue)s, %(delay)s, %(trace_context)s)", p)
            row = cur.fetchone()
            assert row is not None
            took.append(float(row[0][0]["Execution Time"]) / 1000)
    return statistics.median(took)


def in_one_transaction(conn: psycopg.Connection[Any], fence: store.Fence, n: int
                       ) -> tuple[float, list[tuple[str, int, float, float]]]:
    """``n`` spawns in one transaction (no commit between): seconds a spawn, and what
    ``track_functions`` saw (name, calls, total ms, self ms), when this role may set it."""
    tracked: list[tuple[str, int, float, float]] = []
    with conn.transaction():
        try:
            with conn.transaction():
                conn.execute("SET LOCAL track_functions = 'all'")
        except psycopg.Error:  # not a superuser: no split by function
            pass
        took = spawns(conn, fence, "t", n)
        tracked = [(str(r[0]), int(r[1]), float(r[2]), float(r[3]))
                   for r in conn.execute(TRACKED)]
    return took, tracked


class Wal:
    """WAL bytes written by the whole server between two reads (nothing else runs)."""

    def __init__(self) -> None:
        self.conn = psycopg.connect(resolve_url(None), autocommit=True)

    def lsn(self) -> str:
        row = self.conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def since(self, lsn: str) -> float:
        row = self.conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)",
                                (lsn,)).fetchone()
        assert row is not None
        return float(row[0])


def measured(wal: Wal, n: int, run: Callable[[], float]) -> tuple[float, float]:
    """(seconds a call as ``run`` says, WAL bytes a call) of ``n`` calls."""
    before = wal.lsn()
    took = run()
    return took, wal.since(before) / n


def spawn_part(n: int) -> list[str]:
    wal = Wal()
    with scratch_database("atl_children") as url:
        prepare(url)
        fence = running_parent(url)
        say(f"spawn: {n:,} spawns a variant from this process ...")
        with step_connection(url) as conn:
            spawns(conn, fence, "warm", 50)
            auto = measured(wal, n, lambda: spawns(conn, fence, "a", n))
            conn.execute("SET synchronous_commit = off")
            no_flush = measured(wal, n, lambda: spawns(conn, fence, "s", n))
            conn.execute("RESET synchronous_commit")
            before = wal.lsn()
            took, tracked = in_one_transaction(conn, fence, n)
            one_tx = (took, wal.since(before) / n)
            record = measured(wal, n, lambda: timed(
                n, lambda i: store.record(conn, fence, f"r-{i}", "step", "null")))
        explain = explained(url, fence, min(n, 200))
        with psycopg.connect(url, autocommit=True) as conn:
            single = measured(wal, n, lambda: timed(
                n, lambda i: atlantis.enqueue(conn, "fan.Child", {"i": i})))
            conn.execute(TWICE)
            twice = measured(wal, n, lambda: timed(n, lambda i: conn.execute(
                "SELECT pg_temp.enqueue_twice(%s, %s)", (fence.job_id, Jsonb({"i": i})))))
            with conn.transaction():
                many = measured(wal, n, lambda: timed(1, lambda _: atlantis.enqueue_many(
                    conn, "fan.Child", [{"i": i} for i in range(n)])) / n)
    wal.conn.close()

    def row(label: str, got: tuple[float, float] | float) -> list[str]:
        took, size = got if isinstance(got, tuple) else (got, None)
        return [label, f"{took * 1000:.3f} ms", f"{1 / took:,.0f}",
                "" if size is None else f"{size:,.0f}"]

    rows = [["one call, from this process", "time", "a second", "WAL bytes"],
            row("`atlantis.step_spawn`, autocommit (as a handler's `ctx.spawn` sends it)",
                auto),
            row("the same, `synchronous_commit = off` (no WAL flush waited for)", no_flush),
            row("the same, all in one transaction (no commit: statement and round trip)",
                one_tx),
            row("`EXPLAIN ANALYZE` execution time of one (server only, median)", explain),
            row("floor: `atlantis.record_step`, autocommit (a `ctx.run_step`'s record)",
                record),
            row("`atlantis.enqueue` of one job, autocommit", single),
            row("the same and the spawn's second write of the child (`UPDATE ... SET "
                "parent_id`), one statement", twice),
            row(f"`atlantis.enqueue_many` of {n:,} in one transaction, a row", many)]
    out = ["### one spawn's cost (no supervisor running)", markdown(rows)]
    if tracked:
        split = [["function (inside one transaction's spawns)", "calls", "total ms a call",
                  "self ms a call"]]
        split += [[f"`atlantis.{name}`", f"{calls:,}", f"{total / calls:.3f}",
                   f"{own / calls:.3f}"] for name, calls, total, own in tracked if calls]
        out.append(markdown(split))
    return out
