"""One drain and one idle latency run of one system, on a scratch database of its own.

The harness every benchmark table builds on (``compare.py``, ``targets.py``,
``scaleout.py``): the shared environment (admin URL, peer virtualenvs, redis-server, log
folder), enqueueing, starting and stopping ONE worker by its pid, and polling the store
until the queue is drained.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.database import resolve_url
from benchmarks.measure import CpuMeter, RssSampler
from benchmarks.peerenv import RedisServer, installed_version, peer_python, redis_binary
from benchmarks.scratch import url_for
from benchmarks.systems import ATL_LATENCY, Result, Round, System, pick, systems
from benchmarks.tables import fmt_rate

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).resolve().parent / "peers"
APP = "benchmarks.app:registry"
WARMUP = 5  # latency runs: jobs run (and left out) before the measured ones


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
    app = load_app(APP)
    with psycopg.connect(url) as conn:
        migrate(conn)
        sync(conn, list(app.decls.values()), workflows=list(app.workflows.values()))
        conn.commit()


def enqueue_atlantis(url: str, jobs: int, job: str = "bench.Noop",
                     args: dict[str, Any] | None = None) -> float:
    """Migrate, then ``enqueue_many`` N jobs, 1,000 a transaction: seconds of the inserts."""
    prepare_atlantis(url)
    return insert_atlantis(url, jobs, job, args)


def insert_atlantis(url: str, jobs: int, job: str = "bench.Noop",
                    args: dict[str, Any] | None = None) -> float:
    """``enqueue_many`` N jobs into a prepared database, 1,000 a transaction: seconds."""
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


Fill = Callable[[str, int], "float | None"]
"""Puts the work of N jobs in a scratch database (its URL) another way than ``enqueue``
(``benchmarks/workflows.py`` starts workflows): seconds of the inserts."""


def run_drain(env: Env, system: System, jobs: int, python: Path | None, version: str,
              track_rss: bool = True, fill: Fill | None = None) -> Result:
    """Enqueue N (or ``fill``), start one worker, measure its drain (jobs/s, CPU, RSS),
    stop it."""
    result = Result(system, version, jobs)
    log = env.logdir / f"{env.runs + 1}-{system.key}.log"
    proc: subprocess.Popen[bytes] | None = None
    poll = max(env.poll, jobs / 1_000_000)  # a count(*) over 200,000 rows is not free
    try:
        with env.scratch(system) as url:
            result.enqueue_s = (fill(url, jobs) if fill is not None else
                                enqueue(env, system, python, url, jobs,
                                        log=log.with_suffix(".enqueue.log")))
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


def header(env: Env, what: str) -> str:
    with psycopg.connect(env.admin, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    server = str(row[0]) if row else "?"
    load = os.getloadavg()[0]
    return (f"{what}; PostgreSQL {server} (embedded, unix socket); "
            f"{dt.date.today().isoformat()}, {platform.python_implementation()} "
            f"{platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}, "
            f"load average {load:.1f} at the end")


def compare(env: Env, wanted: set[str], jobs: int, latency: int,
            spacing: float) -> list[Result]:
    return [run_system(env, s, jobs, latency, spacing) for s in systems()
            if s.name in wanted or s.key in wanted]


def paired(env: Env, keys: Sequence[str], jobs: int, rounds: int) -> list[Round]:
    """``rounds`` rounds, each a drain of every system of ``keys``, taking turns: in the
    order given, then reversed (A B C, C B A, A B C, ...), so that each system runs as often
    early as late. This machine's speed drifts by minutes (whole runs here differ by 2x and
    more, every process alike), so a ratio is only as good as the two drains it divides are
    close in time: compare within a round."""
    chosen = pick(list(keys))
    return [{s.key: run_system(env, s, jobs, 0, 0.02)
             for s in (chosen if i % 2 == 0 else chosen[::-1])} for i in range(rounds)]
