"""Drain N no-op jobs with atlantis and its peers, side by side, in one run; print the tables.

    python -m benchmarks.compare [--jobs 20000] [--systems atlantis,pgqueuer,...]
    python -m benchmarks.compare --backlog      # atlantis reuse c8 at 10k/100k/200k waiting
    python -m benchmarks.compare --targets      # the whole target table (benchmarks/targets.py)
    python -m benchmarks.compare --quick ...    # small sizes, a smoke run

Every system gets the same embedded PostgreSQL server (``resolve_url(None)``, unix socket),
a fresh scratch database (dropped afterwards), N jobs enqueued before its worker starts,
and ONE worker process, stopped by its pid when the queue is drained. RQ and Celery use a
redis-server this script starts on 127.0.0.1 (``benchmarks/peerenv.py``) and are skipped,
with a line saying why, when Debian's redis-server cannot be had.

Throughput is the same measure for every system, taken by this script polling the store:
from the first poll that sees any job picked up to the first poll that sees all N done
("first pickup to last completion"). CPU per job and RSS come from psutil over the same
window (``benchmarks/measure.py``). Pickup latency comes from a second, idle run of each
system: 300 jobs enqueued one at a time, 20 ms apart, after a warm-up; each system's own
timestamps (or, for the Redis peers, the job's own record) give picked minus enqueued.
Benchmarks, not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.database import resolve_url
from benchmarks.measure import CpuMeter, RssSampler, Snapshot, percentile
from benchmarks.peerenv import RedisServer, installed_version, peer_python, redis_binary

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).resolve().parent / "peers"
APP = "benchmarks.app:registry"
WARMUP = 5  # latency runs: jobs run (and left out) before the measured ones

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


def atlantis_system(concurrency: int, isolation: str = "reuse") -> System:
    model = ("supervisor + reused child processes" if isolation == "reuse"
             else "supervisor + a new child per attempt (zygote fork)")
    return System(f"atlantis-{isolation}-c{concurrency}", "atlantis", model,
                  f"concurrency {concurrency}, --isolation {isolation}", None,
                  ["--concurrency", str(concurrency), "--isolation", isolation], ATL_SQL)


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
               "asyncpg", "pgqueuer", [], pgq_sql),
        System("pgqueuer-b200", "pgqueuer", pgq, "unbounded (asyncio), batch_size=200, asyncpg",
               "pgqueuer", ["--batch-size", "200"], pgq_sql),
        System("procrastinate", "procrastinate", "in-process asyncio, one job a fetch",
               "concurrency 1 (default worker)", "procrastinate", [], pro_sql),
        System("chancy", "chancy", "worker + process pool executor (default executor)",
               "concurrency 8, process executor, eager_polling", "chancy", ["--concurrency", "8"],
               chancy_sql),
        System("rq", "rq", "worker-pool, a forked work horse per job (default Worker)",
               "concurrency 4 (4 workers)", "rq", ["--workers", "4"],
               redis_queue="rq:queue:bench"),
        System("celery", "celery", "prefork pool, Redis broker, early acks (default)",
               "concurrency 8, -P prefork", "celery", ["--concurrency", "8"],
               redis_queue="celery"),
    ]


# -- one system -------------------------------------------------------------------------


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


def url_for(admin: str, dbname: str) -> str:
    """A libpq URL (which asyncpg also reads) for ``dbname`` on the admin URL's server."""
    params = conninfo_to_dict(admin)
    user = quote(str(params.get("user") or "postgres"))
    password = params.get("password")
    auth = f"{user}:{quote(str(password))}" if password else user
    query = []
    if params.get("host"):
        query.append(f"host={quote(str(params['host']), safe='')}")
    if params.get("port"):
        query.append(f"port={params['port']}")
    return f"postgresql://{auth}@/{dbname}" + ("?" + "&".join(query) if query else "")


class Env:
    """What every run shares: the admin URL, peer venvs, the redis-server, the log folder."""

    def __init__(self, poll: float, timeout: float | None) -> None:
        self.admin = resolve_url(None)
        self.poll = poll
        self.timeout = timeout
        self.logdir = Path(tempfile.mkdtemp(prefix="atl-compare-"))
        self.pythons: dict[str, tuple[Path | None, str]] = {}
        self.redis: RedisServer | None = None
        self.redis_missing = ""
        self.runs = 0
        self.atlantis_args: list[str] = []
        """Extra ``atlantis-supervise`` options for every atlantis run (``--atlantis-args``)."""
        self.atl_version = installed_version(Path(sys.executable), "atlantis-jobs") or "?"

    def prepare(self, system: System) -> tuple[Path | None, str, str]:
        """(peer python or None for atlantis, version, why it cannot run or "")."""
        if system.peer is None:
            return None, self.atl_version, ""
        if system.redis_queue and self.redis is None:
            if self.redis_missing:
                return None, "", self.redis_missing
            binary, why = redis_binary()
            if binary is None:
                self.redis_missing = f"skipped: {why}"
                print(f"compare: {system.name}: {self.redis_missing}", file=sys.stderr)
                return None, "", self.redis_missing
            self.redis = RedisServer(binary)
        if system.peer not in self.pythons:
            self.pythons[system.peer] = peer_python(system.peer)
        python, version = self.pythons[system.peer]
        return python, version, "" if python else version

    def close(self) -> None:
        if self.redis is not None:
            self.redis.stop()

    def timeout_for(self, jobs: int) -> float:
        return self.timeout if self.timeout is not None else max(180.0, jobs / 20)

    @contextlib.contextmanager
    def scratch(self, system: System) -> Iterator[str]:
        """A fresh database (and an empty Redis for the Redis peers): its URL."""
        self.runs += 1
        dbname = f"atl_cmp_{os.getpid()}_{self.runs}"
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {dbname}")
        if system.redis_queue and self.redis is not None:
            self.redis.flush()
        try:
            yield url_for(self.admin, dbname)
        finally:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def driver_cmd(env: Env, system: System, python: Path, command: str, url: str) -> list[str]:
    target = (["--redis", env.redis.url] if system.redis_queue and env.redis
              else ["--dsn", url])
    return [str(python), str(PEERS / f"{system.peer}_driver.py"), command, *target]


def prepare_atlantis(url: str) -> None:
    with psycopg.connect(url) as conn:
        migrate(conn)
        sync(conn, list(load_app(APP).decls.values()))
        conn.commit()


def enqueue_atlantis(url: str, jobs: int, job: str = "bench.Noop",
                     args: dict[str, Any] | None = None) -> float:
    """Migrate, then ``enqueue_many`` N jobs, 1,000 a transaction: seconds of the inserts."""
    prepare_atlantis(url)
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        for start in range(0, jobs, 1000):
            rows = [args or {"n": i} for i in range(start, min(start + 1000, jobs))]
            atlantis.enqueue_many(conn, job, rows)
            conn.commit()
        return time.perf_counter() - started


def enqueue(env: Env, system: System, python: Path | None, url: str, jobs: int,
            spacing: float = 0.0, log: Path | None = None) -> float | None:
    """Enqueue N jobs (``spacing`` seconds apart, one a call, when given): insert seconds."""
    if python is None:
        if not spacing:
            return enqueue_atlantis(url, jobs)
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(jobs):
                atlantis.enqueue(conn, "bench.Noop", {"n": i})
                time.sleep(spacing)
        return None
    cmd = [*driver_cmd(env, system, python, "enqueue", url), "--jobs", str(jobs)]
    if spacing:
        cmd += ["--spacing", str(spacing)]
    out = subprocess.run(cmd, check=True, timeout=env.timeout_for(jobs), cwd=PEERS,
                         capture_output=True, stdin=subprocess.DEVNULL)
    if log is not None:
        log.write_bytes(out.stdout + out.stderr)
    lines = out.stdout.decode().strip().splitlines()
    return float(json.loads(lines[-1])["seconds"]) if lines else None


def start_worker(env: Env, system: System, python: Path | None, url: str,
                 log: Path) -> subprocess.Popen[bytes]:
    if python is None:
        cmd = [str(Path(sys.executable).parent / "atlantis-supervise"), "--queue", "bench",
               "--app", APP, "--database-url", url, *system.worker_args, *env.atlantis_args]
    else:
        cmd = [*driver_cmd(env, system, python, "work", url), *system.worker_args]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT if python is None else PEERS, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> str:
    """SIGTERM the worker by its pid, then SIGKILL its process group if it lingers."""
    if proc.poll() is not None:
        return ""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
        return ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: pgid == pid
        proc.wait(10)
        return f"did not stop within {grace:.0f}s of SIGTERM (killed)"


class Progress:
    """(waiting, done) of one system, from its store."""

    def __init__(self, env: Env, system: System, conn: psycopg.Connection[Any], jobs: int):
        self.env, self.system, self.conn, self.jobs = env, system, conn, jobs

    def read(self) -> tuple[int, int]:
        if self.system.redis_queue:
            assert self.env.redis is not None
            waiting = self.env.redis.command("LLEN", self.system.redis_queue)
            done = self.env.redis.command("LLEN", "bench:done")
            return int(str(waiting)), int(str(done))
        row = self.conn.execute(self.system.progress_sql, {"jobs": self.jobs}).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def store_pids(self) -> list[int]:
        if self.system.redis_queue:
            return [self.env.redis.pid] if self.env.redis else []
        rows = self.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                                 "current_database() AND pid <> pg_backend_pid()").fetchall()
        return [int(r[0]) for r in rows]


def wait_done(progress: Progress, proc: subprocess.Popen[bytes], poll: float, timeout: float,
              started: float, meter: CpuMeter | None = None, rss: RssSampler | None = None
              ) -> tuple[float | None, float | None, str]:
    """Poll until all jobs are done: (drain seconds, wall seconds from worker start, note)."""
    first: float | None = None
    deadline = started + timeout
    jobs = progress.jobs
    next_sample = 0.0
    while True:
        waiting, done = progress.read()
        now = time.monotonic()
        if first is None and waiting < jobs:
            first = now
            if meter is not None:
                meter.begin()
        if done >= jobs:
            assert first is not None
            return now - first, now - started, ""
        if proc.poll() is not None:
            return None, None, f"worker exited with {proc.returncode} ({done}/{jobs} done)"
        if now > deadline:
            return None, None, f"timed out after {timeout:.0f}s ({done}/{jobs} done)"
        if first is not None and now >= next_sample:
            next_sample = now + 0.25
            if meter is not None:
                meter.sample()
            if rss is not None:
                rss.sample(done / jobs)
        time.sleep(poll)


def run_drain(env: Env, system: System, jobs: int, python: Path | None, version: str,
              track_rss: bool = True) -> Result:
    """Enqueue N, start one worker, measure its drain (jobs/s, CPU, RSS), stop it."""
    result = Result(system, version, jobs)
    log = env.logdir / f"{env.runs + 1}-{system.key}.log"
    proc: subprocess.Popen[bytes] | None = None
    poll = max(env.poll, jobs / 1_000_000)  # a count(*) over 200,000 rows is not free
    try:
        with env.scratch(system) as url:
            result.enqueue_s = enqueue(env, system, python, url, jobs,
                                       log=log.with_suffix(".enqueue.log"))
            with psycopg.connect(env.admin, autocommit=True) as conn:
                conn.execute("CHECKPOINT")  # start every system with no dirty buffers
            with psycopg.connect(url, autocommit=True) as conn:
                progress = Progress(env, system, conn, jobs)
                started = time.monotonic()
                proc = start_worker(env, system, python, url, log)
                meter = CpuMeter(proc.pid, progress.store_pids)
                rss = RssSampler(proc.pid) if track_rss else None
                drain, wall, note = wait_done(progress, proc, poll, env.timeout_for(jobs),
                                              started, meter, rss)
                if drain:
                    result.cpu = meter.end()
                    if meter.gone_backends:
                        result.add_note(f"{meter.gone_backends} backend(s) exited mid-run "
                                        "(counted at their last sample)")
                result.rss = rss
                result.drain_s, result.wall_s = drain, wall
                result.add_note(note)
                if drain:
                    result.jobs_per_s = jobs / drain
                if note:
                    result.add_note(f"log: {log}")
                lingering = stop(proc)
                result.add_note(lingering)
                proc = None
    except (OSError, subprocess.SubprocessError, psycopg.Error) as exc:
        result.add_note(f"failed: {exc}; log: {log}")
    finally:
        if proc is not None:
            result.add_note(stop(proc))
    return result


def run_latency(env: Env, system: System, python: Path | None, count: int,
                spacing: float) -> tuple[list[float], str]:
    """An idle worker gets ``count`` jobs one at a time: their pickup latencies (ms)."""
    log = env.logdir / f"{env.runs + 1}-{system.key}-latency.log"
    total = WARMUP + count
    proc: subprocess.Popen[bytes] | None = None
    try:
        with env.scratch(system) as url:
            if python is None:
                prepare_atlantis(url)
            else:  # the peer's schema, and nothing waiting
                enqueue(env, system, python, url, 0)
            with psycopg.connect(url, autocommit=True) as conn:
                proc = start_worker(env, system, python, url, log)
                for batch in (WARMUP, total):
                    enqueue(env, system, python, url, batch - (WARMUP if batch == total else 0),
                            spacing=spacing)
                    progress = Progress(env, system, conn, batch)
                    _, _, note = wait_done(progress, proc, env.poll, env.timeout_for(total),
                                           time.monotonic())
                    if note:
                        return [], f"{note}; log: {log}"
                if python is None:
                    rows = conn.execute(ATL_LATENCY).fetchall()
                    values = [float(r[0]) for r in rows]
                else:
                    out = subprocess.run(driver_cmd(env, system, python, "latencies", url),
                                         check=True, timeout=60, cwd=PEERS,
                                         capture_output=True, stdin=subprocess.DEVNULL)
                    values = [float(v) for v in json.loads(out.stdout)]
                return values[WARMUP:], stop(proc)
    except (OSError, subprocess.SubprocessError, psycopg.Error, ValueError) as exc:
        return [], f"latency run failed: {exc}; log: {log}"
    finally:
        if proc is not None:
            stop(proc)


def run_system(env: Env, system: System, jobs: int, latency: int, spacing: float) -> Result:
    python, version, why = env.prepare(system)
    if why:
        return Result(system, version, jobs, note=why)
    print(f"compare: {system.name} {system.settings}: drain of {jobs:,} ...", file=sys.stderr,
          flush=True)
    result = run_drain(env, system, jobs, python, version)
    print(f"compare:   {fmt_rate(result)}", file=sys.stderr, flush=True)
    time.sleep(1.0)  # let the previous worker's processes and the server settle
    if latency:
        values, note = run_latency(env, system, python, latency, spacing)
        result.latencies = values
        result.add_note(note)
        time.sleep(1.0)
    return result


# -- the tables -------------------------------------------------------------------------


def fmt(value: float | None, spec: str, empty: str = "") -> str:
    return empty if value is None else format(value, spec)


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "| " + " | ".join("---" for _ in rows[0]) + " |")
    return "\n".join(lines)


def table(results: list[Result]) -> str:
    rows = [["system", "model", "settings", "jobs/s", "drain s", "start→done s",
             "CPU ms/job worker", "children", "store", "total", "pickup p50 / p99 ms (idle)",
             "worker RSS MB", "enqueue rows/s", "note"]]
    for r in results:
        cpu = r.cpu_ms()
        parts = [cpu.worker, cpu.children, cpu.store,
                 cpu.worker + cpu.children + cpu.store] if cpu else [None] * 4
        p50, p99 = percentile(r.latencies, 50), percentile(r.latencies, 99)
        rows.append([
            f"{r.system.name} {r.version}", r.system.model, r.system.settings,
            fmt(r.jobs_per_s, ",.0f", "—"), fmt(r.drain_s, ".2f"), fmt(r.wall_s, ".2f"),
            *[fmt(part, ".3f") for part in parts],
            f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "",
            fmt(r.rss.peak_mb() if r.rss else None, ".0f"),
            fmt(r.jobs / r.enqueue_s if r.enqueue_s else None, ",.0f"), r.note])
    return markdown(rows)


def ratios(results: list[Result]) -> str:
    """jobs/s of each atlantis row divided by each peer row's."""
    ours = [r for r in results if r.system.peer is None and r.jobs_per_s]
    peers = [r for r in results if r.system.peer is not None and r.jobs_per_s]
    if not ours or not peers:
        return ""
    rows = [["atlantis ÷", *[f"{p.system.key}" for p in peers]]]
    for r in ours:
        rows.append([r.system.key, *[f"{(r.jobs_per_s or 0) / (p.jobs_per_s or 1):.2f}x"
                                     for p in peers]])
    return markdown(rows)


def header(env: Env, what: str) -> str:
    with psycopg.connect(env.admin, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    server = str(row[0]) if row else "?"
    load = os.getloadavg()[0]
    return (f"{what}; PostgreSQL {server} (embedded, unix socket); "
            f"{dt.date.today().isoformat()}, {platform.python_implementation()} "
            f"{platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}, "
            f"load average {load:.1f} at the end")


def fmt_rate(result: Result) -> str:
    if result.jobs_per_s is None:
        return result.note or "no result"
    return f"{result.jobs_per_s:,.0f} jobs/s ({result.drain_s:.2f}s drain)"


def compare(env: Env, wanted: set[str], jobs: int, latency: int,
            spacing: float) -> list[Result]:
    return [run_system(env, s, jobs, latency, spacing) for s in systems()
            if s.name in wanted or s.key in wanted]


#: The headline pair: atlantis's reuse target against pgqueuer's default.
PAIR = ("atlantis-reuse-c8", "pgqueuer-b10")


def paired(env: Env, keys: tuple[str, str], jobs: int,
           rounds: int) -> list[tuple[Result, Result]]:
    """``rounds`` drains of each of two systems, taking turns (A B, B A, A B, ...): this
    machine's speed drifts by minutes (whole runs here differ by 2x and more, every process
    alike), so a ratio is only as good as the two drains it divides are close in time."""
    a, b = (next(s for s in systems() if s.key == k) for k in keys)
    pairs = []
    for i in range(rounds):
        got = {s.key: run_system(env, s, jobs, 0, 0.02) for s in ((a, b) if i % 2 == 0 else (b, a))}
        pairs.append((got[a.key], got[b.key]))
    return pairs


def jobs_rate(result: Result) -> float | None:
    return result.jobs_per_s


def cpu_total(result: Result) -> float | None:
    """CPU ms per job of the worker, its children and the store together."""
    c = result.cpu_ms()
    return None if c is None else c.worker + c.children + c.store


def enqueue_rate(result: Result) -> float | None:
    return result.jobs / result.enqueue_s if result.enqueue_s else None


def quotient(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


#: What a paired round compares: drain rate, CPU per job, enqueue rate (each round
#: enqueues its drain's jobs first).
Measure = Callable[[Result], "float | None"]


def pair_ratios(pairs: list[tuple[Result, Result]], measure: Measure = jobs_rate) -> list[float]:
    """Per round: A's ``measure`` ÷ B's (rounds where either is missing left out)."""
    got = [quotient(measure(x), measure(y)) for x, y in pairs]
    return [r for r in got if r is not None]


def paired_table(pairs: list[tuple[Result, Result]]) -> str:
    if not pairs:
        return ""
    a, b = pairs[0][0].system.key, pairs[0][1].system.key
    rows = [["round", f"{a} jobs/s", f"{b} jobs/s", f"{a} ÷ {b}", "CPU ms/job A / B (ratio)",
             "enqueue rows/s A / B (ratio)"]]
    for i, (x, y) in enumerate(pairs, 1):
        r = quotient(x.jobs_per_s, y.jobs_per_s)
        ca, cb = cpu_total(x), cpu_total(y)
        ea, eb = enqueue_rate(x), enqueue_rate(y)
        rows.append([f"{i} ({'A B' if i % 2 else 'B A'})", fmt(x.jobs_per_s, ",.0f", "—"),
                     fmt(y.jobs_per_s, ",.0f", "—"), fmt_times(r),
                     f"{fmt(ca, '.3f', '—')} / {fmt(cb, '.3f', '—')} ({fmt_times(quotient(ca, cb))})",
                     f"{fmt(ea, ',.0f', '—')} / {fmt(eb, ',.0f', '—')} ({fmt_times(quotient(ea, eb))})"])
    medians = ["median", "", ""]
    for got in (pair_ratios(pairs, m) for m in (jobs_rate, cpu_total, enqueue_rate)):
        medians.append(f"**{statistics.median(got):.2f}x** (range {min(got):.2f}–{max(got):.2f}x)"
                       if got else "—")
    rows.append(medians)
    return markdown(rows)


def fmt_times(r: float | None) -> str:
    """A ratio as ``1.23x``; a dash when there is none."""
    return "—" if r is None else f"{r:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=None, help="default 20000 (2000 --quick)")
    parser.add_argument("--systems", default="atlantis,pgqueuer,procrastinate,chancy,rq,celery",
                        help="comma-separated subset (names or keys such as atlantis-reuse-c8)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="give up on a drain after this many seconds (default max(180, "
                        "jobs/20): RQ runs ~45 jobs/s here)")
    parser.add_argument("--poll", type=float, default=0.02)
    parser.add_argument("--latency-jobs", type=int, default=None,
                        help="jobs of each idle latency run (default 300, 50 --quick; 0: none)")
    parser.add_argument("--backlog", action="store_true",
                        help="atlantis reuse c8 drains with 10k, 100k and 200k waiting")
    parser.add_argument("--targets", action="store_true", help="run the whole target table")
    parser.add_argument("--leases", action="store_true",
                        help="only the many-leases run (500 sleeping jobs) of the target table")
    parser.add_argument("--pairs", type=int, default=0, metavar="N",
                        help="only N paired rounds of atlantis-reuse-c8 and pgqueuer-b10, "
                        "taking turns (the ratio that the machine's drift spares)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--atlantis-args", default="",
                        help='extra atlantis-supervise options, e.g. "--claim-ahead 8"')
    opts = parser.parse_args()
    from benchmarks import targets  # the target table builds on this module

    jobs = opts.jobs or (2000 if opts.quick else 20000)
    latency = opts.latency_jobs if opts.latency_jobs is not None else (50 if opts.quick else 300)
    env = Env(opts.poll, opts.timeout)
    env.atlantis_args = shlex.split(opts.atlantis_args)
    try:
        if opts.targets:
            targets.main(env, jobs, latency, opts.quick)
            return
        if opts.leases:
            targets.leases_only(env, opts.quick)
            return
        if opts.pairs:
            pairs = paired(env, PAIR, jobs, opts.pairs)
            print("\n" + header(env, f"{jobs:,} no-op jobs, paired rounds") + "\n")
            print(paired_table(pairs))
            return
        if opts.backlog:
            results = targets.backlog(env, targets.backlog_sizes(opts.quick))
            print("\n" + header(env, "atlantis reuse c8 by backlog") + "\n")
            print(table(results))
            return
        wanted = {s.strip() for s in opts.systems.split(",") if s.strip()}
        results = compare(env, wanted, jobs, latency, 0.02)
        print("\n" + header(env, f"{jobs:,} no-op jobs, one worker") + "\n")
        print(f"jobs/s = N / (first pickup seen to all done seen, polled every "
              f"{opts.poll * 1000:.0f} ms); CPU = psutil over that window; pickup latency "
              f"from a separate idle run of {latency} jobs enqueued one at a time, 20 ms "
              "apart\n")
        print(table(results))
        print("\n" + ratios(results))
        print(f"\nworker logs: {env.logdir}")
    finally:
        env.close()


if __name__ == "__main__":
    main()
