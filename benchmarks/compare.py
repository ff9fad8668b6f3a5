"""Drain N no-op jobs with atlantis and its peers, side by side, in one run; print one table.

    python -m benchmarks.compare --jobs 5000 [--systems atlantis,pgqueuer,procrastinate]

Every system gets the same embedded PostgreSQL server (``resolve_url(None)``, unix socket),
a fresh scratch database (dropped afterwards), N jobs enqueued before its worker starts,
and ONE worker process, stopped by its pid when the queue is drained.

Throughput is the same measure for every system, taken by this script polling the
database (every ``--poll`` seconds, default 20 ms): from the first poll that sees any job
picked up to the first poll that sees all N done ("first pickup to last completion").
The table also shows the wall time from starting the worker process to all done, which
adds each system's start-up (interpreter, imports, connecting, children).

The peers run in their own virtualenvs under ``~/.cache/atlantis-bench`` (or
``$ATLANTIS_BENCH_CACHE``), created on first use with ``python3 -m venv`` + ``pip install``
of the pinned versions below; they are never installed into the project's environment.
Their drivers are the standalone scripts in ``benchmarks/peers/``. Not part of the tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.database import resolve_url

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).resolve().parent / "peers"
APP = "benchmarks.app:registry"

PINS: dict[str, list[str]] = {
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg==0.32.0", "psycopg[binary]==3.3.9"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]==3.3.9",
                      "psycopg-pool==3.3.3"],
}
"""What each peer's venv gets; the first line is the peer itself."""


@dataclasses.dataclass
class System:
    name: str
    model: str
    settings: str
    peer: str | None  # None: atlantis, from this environment
    worker_args: list[str]
    progress_sql: str
    """One row: (jobs not yet picked up, jobs done); may use the parameter %(jobs)s."""


def systems() -> list[System]:
    atl_sql = ("SELECT count(*) FILTER (WHERE state = 'available'), "
               "count(*) FILTER (WHERE state = 'complete') FROM atlantis.jobs")
    # pgqueuer deletes a job when it completes (and logs it in pgqueuer_log).
    pgq_sql = ("SELECT count(*) FILTER (WHERE status = 'queued'), %(jobs)s - count(*) "
               "FROM pgqueuer")
    pro_sql = ("SELECT count(*) FILTER (WHERE status = 'todo'), "
               "count(*) FILTER (WHERE status = 'succeeded') FROM procrastinate_jobs")
    reuse = "supervisor + reused child processes"
    return [
        System("atlantis", reuse, "--concurrency 2 (reuse)", None,
               ["--concurrency", "2", "--isolation", "reuse"], atl_sql),
        System("atlantis", reuse, "--concurrency 8 (reuse)", None,
               ["--concurrency", "8", "--isolation", "reuse"], atl_sql),
        System("atlantis", "supervisor + a new child per attempt (zygote fork)",
               "--isolation fresh --concurrency 4", None,
               ["--concurrency", "4", "--isolation", "fresh"], atl_sql),
        System("pgqueuer", "in-process asyncio, batched dequeue/ack",
               "default (batch_size=10)", "pgqueuer", [], pgq_sql),
        System("pgqueuer", "in-process asyncio, batched dequeue/ack",
               "batch_size=200", "pgqueuer", ["--batch-size", "200"], pgq_sql),
        System("procrastinate", "in-process asyncio, one job a fetch",
               "default worker (concurrency 1)", "procrastinate", [], pro_sql),
    ]


# -- peer virtualenvs -------------------------------------------------------------------


def cache_dir() -> Path:
    raw = os.environ.get("ATLANTIS_BENCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "atlantis-bench")
    return Path(raw)


def installed_version(python: Path, dist: str) -> str | None:
    try:
        out = subprocess.run(
            [str(python), "-c",
             f"import importlib.metadata as m; print(m.version({dist!r}))"],
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def peer_python(peer: str) -> tuple[Path | None, str]:
    """The peer venv's python (creating/updating the venv if needed), or None and why."""
    venv = cache_dir() / f"{peer}-venv"
    python = venv / "bin" / "python"
    pins = PINS[peer]
    want = pins[0].split("==")[1]
    if installed_version(python, peer) == want:
        return python, want
    print(f"compare: preparing {venv} ({' '.join(pins)})", file=sys.stderr)
    try:
        if not python.exists():
            venv.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True,
                       timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"pip install failed: {exc}"
    got = installed_version(python, peer)
    if got != want:
        return None, f"pip install gave {peer} {got}, not {want}"
    return python, want


# -- one system -------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    system: System
    version: str
    jobs_per_s: float | None = None
    drain_s: float | None = None
    wall_s: float | None = None
    note: str = ""


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


def enqueue_atlantis(url: str, jobs: int) -> None:
    with psycopg.connect(url) as conn:
        migrate(conn)
        sync(conn, list(load_app(APP).decls.values()))
        for start in range(0, jobs, 1000):
            atlantis.enqueue_many(conn, "bench.Noop",
                                  [{"n": i} for i in range(start, min(start + 1000, jobs))])
        conn.commit()


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


def measure(conn: psycopg.Connection[Any], system: System, jobs: int,
            proc: subprocess.Popen[bytes], poll: float, timeout: float,
            started: float) -> tuple[float | None, float | None, str]:
    """Poll until all jobs are done: (drain seconds, wall seconds from worker start, note)."""
    first: float | None = None
    deadline = started + timeout
    done = 0
    while True:
        row = conn.execute(system.progress_sql, {"jobs": jobs}).fetchone()
        now = time.monotonic()
        assert row is not None
        waiting, done = int(row[0]), int(row[1])
        if first is None and waiting < jobs:
            first = now
        if done >= jobs:
            assert first is not None
            return now - first, now - started, ""
        if proc.poll() is not None:
            return None, None, f"worker exited with {proc.returncode} ({done}/{jobs} done)"
        if now > deadline:
            return None, None, f"timed out after {timeout:.0f}s ({done}/{jobs} done)"
        time.sleep(poll)


def run_one(admin: str, system: System, version: str, python: Path | None, jobs: int,
            poll: float, timeout: float, logdir: Path, index: int) -> Result:
    result = Result(system, version)
    dbname = f"atl_cmp_{os.getpid()}_{index}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {dbname}")
    url = url_for(admin, dbname)
    log = logdir / f"{index}-{system.name}.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        if python is None:
            enqueue_atlantis(make_conninfo(admin, dbname=dbname), jobs)
            cmd = [str(Path(sys.executable).parent / "atlantis-supervise"), "--queue", "bench",
                   "--app", APP, "--database-url", url, *system.worker_args]
        else:
            driver = str(PEERS / f"{system.peer}_driver.py")
            with open(log.with_suffix(".enqueue.log"), "wb") as out:
                subprocess.run([str(python), driver, "enqueue", "--dsn", url, "--jobs",
                                str(jobs)], check=True, timeout=timeout, cwd=PEERS,
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            cmd = [str(python), driver, "work", "--dsn", url, *system.worker_args]
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # start every system with no dirty buffers
        with psycopg.connect(url, autocommit=True) as conn, open(log, "wb") as out:
            started = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=ROOT if python is None else PEERS,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            drain, wall, note = measure(conn, system, jobs, proc, poll, timeout, started)
        result.drain_s, result.wall_s, result.note = drain, wall, note
        if drain:
            result.jobs_per_s = jobs / drain
        if note:
            result.note += f"; log: {log}"
    except (OSError, subprocess.SubprocessError, psycopg.Error) as exc:
        result.note = f"failed: {exc}"
    finally:
        if proc is not None:
            lingering = stop(proc)
            if lingering:
                result.note = "; ".join(filter(None, [result.note, lingering]))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
    return result


# -- the table --------------------------------------------------------------------------


def table(results: list[Result], jobs: int) -> str:
    def fmt(value: float | None, spec: str) -> str:
        return "" if value is None else format(value, spec)

    rows = [["system", "model", "settings", "jobs/s", "drain s", "start→done s", "note"]]
    for r in results:
        rows.append([f"{r.system.name} {r.version}", r.system.model, r.system.settings,
                     fmt(r.jobs_per_s, ",.0f") or "—", fmt(r.drain_s, ".2f"),
                     fmt(r.wall_s, ".2f"), r.note])
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "| " + " | ".join("---" for _ in rows[0]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--systems", default="atlantis,pgqueuer,procrastinate",
                        help="comma-separated subset")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="give up on a system after this many seconds")
    parser.add_argument("--poll", type=float, default=0.02)
    opts = parser.parse_args()
    wanted = {s.strip() for s in opts.systems.split(",") if s.strip()}

    admin = resolve_url(None)
    pythons: dict[str, tuple[Path | None, str]] = {}
    results: list[Result] = []
    logdir = Path(tempfile.mkdtemp(prefix="atl-compare-"))
    server_version = ""
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        server_version = str(row[0]) if row else "?"
    atl_version = installed_version(Path(sys.executable), "atlantis-jobs") or "?"
    for index, system in enumerate(systems()):
        if system.name not in wanted:
            continue
        python: Path | None = None
        version = atl_version
        if system.peer is not None:
            if system.peer not in pythons:
                pythons[system.peer] = peer_python(system.peer)
            python, version = pythons[system.peer]
            if python is None:
                results.append(Result(system, "", note=version))
                continue
        print(f"compare: {system.name} {system.settings} ...", file=sys.stderr, flush=True)
        result = run_one(admin, system, version, python, opts.jobs, opts.poll, opts.timeout,
                         logdir, index)
        print(f"compare:   {fmt_rate(result)}", file=sys.stderr, flush=True)
        results.append(result)
        time.sleep(1.0)  # let the previous worker's processes and the server settle

    print(f"\n{opts.jobs} no-op jobs, one worker, PostgreSQL {server_version} (embedded, unix "
          f"socket); {dt.date.today().isoformat()}, {platform.python_implementation()} "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}")
    print("jobs/s = N / (first pickup seen to all done seen, polled every "
          f"{opts.poll * 1000:.0f} ms)\n")
    print(table(results, opts.jobs))


def fmt_rate(result: Result) -> str:
    if result.jobs_per_s is None:
        return result.note or "no result"
    return f"{result.jobs_per_s:,.0f} jobs/s ({result.drain_s:.2f}s drain)"


if __name__ == "__main__":
    main()
