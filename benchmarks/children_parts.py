"""What the parts of ``python -m benchmarks.children`` share: a scratch database with one
supervisor serving ``benchmarks.children_app:registry``, the two runs the pairs compare
(a plain enqueue and drain, a fan-out and its join), the big fan-out, and the spawn floors.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any

import orjson
import psycopg

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.database import resolve_url
from benchmarks.children_app import MANY, value
from benchmarks.measure import CpuMeter, Snapshot
from benchmarks.runs import stop
from benchmarks.steps_harness import LOGS, ROOT, SUPERVISE, Poller, checkpoint, header

__all__ = ["LOGS", "Bench", "Run", "big_part", "header", "prepare", "say", "warm"]

APP = "benchmarks.children_app:registry"
IDLE_QUEUE = "bench-idle"  # no supervisor of the benchmark serves it
ENDED = ("complete", "dead", "cancelled")
PLAIN_DONE = ("SELECT count(*) FROM atlantis.jobs WHERE id = ANY(%s) "
              "AND state IN ('complete', 'dead', 'cancelled')")
PLAIN_TIMES = ("SELECT min(started_at), max(finished_at), count(*) FILTER (WHERE state = "
               "'complete') FROM atlantis.jobs WHERE id = ANY(%s)")
STATE = "SELECT state FROM atlantis.jobs WHERE id = %s"
FAN_TIMES = """
WITH s AS (SELECT min(recorded_at) FILTER (WHERE kind <> 'join') AS first,
                  max(recorded_at) FILTER (WHERE kind <> 'join') AS last,
                  min(recorded_at) FILTER (WHERE kind = 'join') AS joined,
                  count(*) FILTER (WHERE kind <> 'join') AS spawns
             FROM atlantis.job_steps WHERE job_id = %(p)s),
     c AS (SELECT max(finished_at) AS last_child, count(*) AS n,
                  count(*) FILTER (WHERE state = 'complete') AS complete,
                  count(DISTINCT (args->>'i')) AS distinct_i,
                  count(*) FILTER (WHERE finished_at <= (SELECT last FROM s)) AS done_by_last
             FROM atlantis.jobs WHERE parent_id = %(p)s)
SELECT s.first, s.last, s.joined, c.last_child, p.started_at, p.finished_at, c.done_by_last,
       p.state, p.attempt, p.result::text, c.n, c.complete, c.distinct_i, s.spawns
  FROM atlantis.jobs p, s, c WHERE p.id = %(p)s
"""
# The children that the parent's spawn records name as new: `{"job", "child"}` a ctx.spawn,
# `{"jobs", "children"}` a ctx.spawn_many (its count of new children must match).
SPAWNED_ONCE = """
SELECT count(DISTINCT c.id) FILTER (WHERE s.value ? 'job'
                                    OR (s.value->>'children')::int = jsonb_array_length(
                                        s.value->'jobs'))
  FROM atlantis.job_steps s
 CROSS JOIN LATERAL (SELECT (s.value->>'job')::bigint AS id
                      WHERE (s.value->>'child')::boolean
                     UNION ALL
                     SELECT j::bigint FROM jsonb_array_elements_text(
                         CASE WHEN s.value ? 'jobs' THEN s.value->'jobs' END) j) x
  JOIN atlantis.jobs c ON c.id = x.id AND c.parent_id = s.job_id
 WHERE s.job_id = %s AND s.kind = 'spawn'
"""


def say(text: str) -> None:
    import sys

    print(f"children: {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Run:
    """One measured run: seconds from just before the enqueue to the end, CPU, phases
    (seconds from the same moment), and what was wrong with its jobs ("" if nothing)."""

    seconds: float
    cpu: Snapshot
    phases: dict[str, float]
    note: str = ""
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def cpu_total(self) -> float:
        return self.cpu.worker + self.cpu.children + self.cpu.store


def prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        migrate(conn)
        app = load_app(APP)
        sync(conn, list(app.decls.values()), workflows=list(app.workflows.values()))
        conn.commit()


def start(url: str, concurrency: int) -> subprocess.Popen[bytes]:
    log = LOGS / f"children-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SUPERVISE), "--queue", "bench", "--app", APP, "--database-url", url,
             "--concurrency", str(concurrency), "--isolation", "reuse"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def since(t0: datetime, moment: datetime | None) -> float | None:
    return None if moment is None else (moment - t0).total_seconds()


class Bench:
    """A migrated scratch database and one supervisor serving it; an enqueuing connection
    (its backend counted with the supervisor's) and a polling one (not counted)."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url, self.concurrency = url, concurrency
        self.dbname = url.split("@/", 1)[1].split("?", 1)[0]

    def __enter__(self) -> Bench:
        prepare(self.url)
        self.conn = psycopg.connect(self.url)
        self.poller = Poller(self.url + ("&" if "?" in self.url else "?")
                             + "application_name=benchmarks")
        self.admin = psycopg.connect(resolve_url(None), autocommit=True)
        self.proc = start(self.url, self.concurrency)
        self.poller.until("SELECT count(*) FROM atlantis.workers", None, lambda n: n >= 1,
                          self.proc, timeout=60, poll=0.1)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        stop(self.proc)
        for conn in (self.conn, self.poller.conn, self.admin):
            conn.close()

    def backends(self) -> list[int]:
        return [int(r[0]) for r in self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND "
            "application_name NOT LIKE 'benchmarks%%'", (self.dbname,))]

    def measure(self, enqueue: Callable[[], list[int]], sql: str, params: Callable[
            [list[int]], Any], done: Callable[[Any], bool], timeout: float
                ) -> tuple[list[int], datetime, float, Snapshot]:
        """Enqueue (one transaction on the enqueuing connection) and poll until ``done``:
        (the ids, the moment just before the enqueue and seconds to its commit, by
        PostgreSQL's clock, and the CPU spent until ``done`` was seen)."""
        checkpoint()
        meter = CpuMeter(self.proc.pid, self.backends)
        meter.begin()
        row = self.conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        t0 = row[0]
        ids = enqueue()
        self.conn.commit()
        row = self.conn.execute("SELECT clock_timestamp()").fetchone()
        self.conn.commit()
        assert row is not None
        sampled = time.monotonic()
        deadline = sampled + timeout
        while not done(self.poller.one(sql, params(ids))):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the supervisor exited (logs: {LOGS})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s (logs: {LOGS})")
            if time.monotonic() - sampled > 0.25:
                meter.sample()
                sampled = time.monotonic()
            time.sleep(0.02)
        return ids, t0, (row[0] - t0).total_seconds(), meter.end()

    def plain(self, n: int) -> Run:
        """``n`` fan.Child put by one enqueue_many, drained: to the last one's end."""
        args = [{"i": i} for i in range(n)]
        ids, t0, enqueued, cpu = self.measure(
            lambda: atlantis.enqueue_many(self.conn, "fan.Child", args), PLAIN_DONE,
            lambda ids: (ids,), lambda got: int(got) >= n, max(120.0, n / 20))
        row = self.poller.conn.execute(PLAIN_TIMES, (ids,)).fetchone()
        assert row is not None
        first, last = since(t0, row[0]), since(t0, row[1])
        assert first is not None and last is not None
        note = "" if row[2] == n else f"plain: {n - row[2]} of {n} not complete"
        return Run(last, cpu, {"enqueued": enqueued, "first": first, "last": last,
                               "done": last}, note)

    def fan_out(self, n: int, job: str = "fan.Parent") -> Run:
        """One fan.Parent (or ``job``) spawning ``n`` children and joining them: to its
        end."""
        ids, t0, enqueued, cpu = self.measure(
            lambda: [atlantis.enqueue(self.conn, job, {"n": n})], STATE,
            lambda ids: (ids[0],), lambda got: got in ENDED, max(300.0, n / 10))
        row = self.poller.conn.execute(FAN_TIMES, {"p": ids[0]}).fetchone()
        assert row is not None
        (first, last, joined, last_child, resumed, finished, done_by_last, state, attempt,
         result, children, complete, distinct_i, spawns) = row
        got = orjson.loads(result) if result else None
        want = {"n": n, "sum": sum(value(i) for i in range(n)), "in_order": True}
        wrong = [f"parent {state}" if state != "complete" else "",
                 f"result {got} (expected {want})" if got != want else "",
                 f"{children} children" if children != n else "",
                 f"{children - complete} not complete" if complete != n else ""]
        # Claimed again after its join's record: it suspended there (else the join found
        # every child ended and returned in the first run).
        again = resumed if joined is not None and resumed > joined else None
        phases = {"enqueued": enqueued, "first_spawn": since(t0, first),
                  "last_spawn": since(t0, last), "joined": since(t0, joined),
                  "last_child": since(t0, last_child), "resumed": since(t0, again),
                  "done": since(t0, finished), "done_by_last_spawn": float(done_by_last)}
        done = phases["done"]
        assert done is not None
        facts = {"parent": ids[0], "attempt": attempt, "children": children,
                 "complete": complete, "distinct_i": distinct_i, "spawns": spawns,
                 "result": got, "want": want}
        return Run(done, cpu, {k: v for k, v in phases.items() if v is not None},
                   "; ".join(w for w in wrong if w), facts)


    def spawn_only(self, n: int) -> Run:
        """One fan.SpawnOnly of ``n`` (its children onto a queue nobody serves): to its end."""
        ids, t0, enqueued, cpu = self.measure(
            lambda: [atlantis.enqueue(self.conn, "fan.SpawnOnly",
                                      {"n": n, "queue": IDLE_QUEUE})], STATE,
            lambda ids: (ids[0],), lambda got: got in ENDED, max(300.0, n / 10))
        row = self.poller.conn.execute(FAN_TIMES, {"p": ids[0]}).fetchone()
        assert row is not None
        first, last, finished, state, result = row[0], row[1], row[5], row[7], row[9]
        done = since(t0, finished)
        assert done is not None
        note = "" if state == "complete" and result == str(n) else f"spawn-only: {state}"
        return Run(done, cpu, {"enqueued": enqueued, "first_spawn": since(t0, first) or 0.0,
                               "last_spawn": since(t0, last) or 0.0, "done": done}, note)


def warm(bench: Bench, n: int) -> None:
    """One small run of each, not counted: the children forked, the plans cached."""
    say(f"warming up: {n} plain, a fan-out of {n}, {n} spawns alone, spawn_many of {n} ...")
    bench.plain(n)
    bench.fan_out(n)
    bench.spawn_only(n)
    bench.fan_out(n, "fan.ParentMany")


def gap(p: dict[str, float], end: str, begin: str) -> str:
    return f"{p[end] - p[begin]:.3f} s" if end in p and begin in p else "–"


def big_rows(runs: list[Run], n: int, once: list[int]) -> list[list[str]]:
    """The big part's table: one column a run (``ctx.spawn`` each, ``ctx.spawn_many``)."""
    from benchmarks.steps_harness import verdict

    def rate(p: dict[str, float]) -> str:
        took = p["last_spawn"] - p["first_spawn"]
        return (f"**{(n - 1) / took:,.0f}/s** ({took:.2f} s, {took / (n - 1) * 1000:.3f} ms "
                "a spawn)" if took > 0 else f"{took:.3f} s")

    def cpu(run: Run) -> str:
        w, c, s = (x / n * 1000 for x in (run.cpu.worker, run.cpu.children, run.cpu.store))
        return f"{w + c + s:.3f} ({w:.3f} / {c:.3f} / {s:.3f})"

    def right(run: Run, spawns: int) -> bool:
        f = run.facts
        return (not run.note and f["children"] == n == f["complete"] == f["distinct_i"]
                and f["spawns"] == spawns and f["attempt"] == 1)

    fan, many = runs
    ps = [r.phases for r in runs]
    fs = [r.facts for r in runs]
    return [["measure", "`ctx.spawn` each (`fan.Parent`)",
             "`ctx.spawn_many` (`fan.ParentMany`)"],
            ["enqueue to the parent complete", *(f"**{r.seconds:.2f} s**" for r in runs)],
            ["spawns: first spawn's record to the last's (spawn_many: its calls)",
             rate(ps[0]), f"{ps[1]['last_spawn'] - ps[1]['first_spawn']:.3f} s "
             f"({-(-n // MANY)} call)"],
            ["enqueue to the first spawn (claim, dispatch, records read)",
             *(gap(p, "first_spawn", "enqueued") for p in ps)],
            ["children finished by the last spawn",
             *(f"{p['done_by_last_spawn']:,.0f} of {n:,}" for p in ps)],
            ["last spawn to the join's record", *(gap(p, "joined", "last_spawn") for p in ps)],
            ["join's record to the last child's end (negative: it found them all ended)",
             *(gap(p, "last_child", "joined") for p in ps)],
            ["the join suspended the parent", *("yes" if "resumed" in p else
                                                  "no (none was left)" for p in ps)],
            ["last child's end to the parent claimed again (wake, NOTIFY, claim)",
             *(gap(p, "resumed", "last_child") for p in ps)],
            ["then to complete (records read, spawns replayed, join read)",
             *(gap(p, "done", "resumed") for p in ps)],
            ["CPU ms a child job (supervisor / children / PostgreSQL)", *map(cpu, runs)],
            ["children (rows with this parent) / complete / distinct `i`",
             *(f"{f['children']:,} / {f['complete']:,} / {f['distinct_i']:,}" for f in fs)],
            ["spawn records / the children they name as new (each its own)",
             *(f"{f['spawns']:,} / {k:,}" for f, k in zip(fs, once, strict=True))],
            ["the join's result (the parent's)",
             *(f"`{orjson.dumps(f['result']).decode()}`" for f in fs)],
            ["the parent's attempt (a join's suspension spends none)",
             *(str(f["attempt"]) for f in fs)],
            ["completes, exactly once, result right", verdict(right(fan, n) and once[0] == n),
             verdict(right(many, -(-n // MANY)) and once[1] == n)]]


def big_part(n: int, concurrency: int) -> list[str]:
    from benchmarks.scratch import scratch_database
    from benchmarks.tables import markdown

    with scratch_database("atl_children") as url, Bench(url, concurrency) as bench:
        say(f"big: one parent spawning {n:,} children ...")
        fan = bench.fan_out(n)
        say(f"big: one parent, ctx.spawn_many of {n:,} children ...")
        many = bench.fan_out(n, "fan.ParentMany")
        once = [int(bench.poller.one(SPAWNED_ONCE, (r.facts["parent"],))) for r in (fan, many)]
    notes = [f"`--concurrency {concurrency} --isolation reuse`, one database, the "
             f"`ctx.spawn_many` run ({MANY:,} children a call) after the fan-out."]
    notes += [f"**Wrong:** {r.note}" for r in (fan, many) if r.note]
    return [f"### a fan-out of {n:,} children", markdown(big_rows([fan, many], n, once)),
            *notes]
