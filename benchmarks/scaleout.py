"""Scale-out: 1, 2 and 4 supervisors (concurrency 8 each) drain one queue of one database.

``python -m benchmarks.scaleout [--jobs 20000] [--supervisors 1,2,4]``

For each count: enqueue N no-op jobs, start the supervisors together, and over the drain
report the rate, CPU per job (supervisors, their children, PostgreSQL backends), how busy
the machine's CPUs were, and what PostgreSQL's active backends were doing, sampled every
20 ms from ``pg_stat_activity``: which statement (by name, from ``atlantis/store``) and
which wait event. Benchmarks, not tests: nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from typing import Any

import psutil
import psycopg

from atlantis.store.queries import Q
from benchmarks.measure import cpu_seconds
from benchmarks.runs import Env, enqueue_atlantis, header, start_worker, stop
from benchmarks.systems import atlantis_system
from benchmarks.tables import markdown


def statement_names() -> list[tuple[str, str]]:
    """(a statement's text up to its first parameter, at most 80 characters; its name) for
    every named statement: ``pg_stat_activity`` shows ``$1`` where psycopg wrote ``%(x)s``."""
    heads = []
    for name, text in vars(Q).items():
        if isinstance(text, str):
            cut = text.find("%(")
            heads.append(((text if cut < 0 else text[:cut])[:80], name))
    return sorted(heads, key=lambda h: -len(h[0]))  # the longest (most specific) first


def name_of(query: str, names: list[tuple[str, str]]) -> str:
    for head, name in names:
        if query.startswith(head):
            return name
    return " ".join(query.split())[:40]


def tree_cpu(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds of these processes, of their living descendants)."""
    own = kids = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            own += cpu_seconds(proc, False)
            for child in proc.children(recursive=True):
                try:
                    kids += cpu_seconds(child, False)
                except psutil.Error:
                    continue
        except psutil.Error:
            continue
    return own, kids


def backends_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(psutil.Process(pid), False)
        except psutil.Error:
            continue
    return total


def run(env: Env, jobs: int, supervisors: int) -> dict[str, Any]:
    system = atlantis_system(8)
    names = statement_names()
    out: dict[str, Any] = {"supervisors": supervisors}
    procs: list[subprocess.Popen[bytes]] = []
    print(f"scaleout: {supervisors} supervisor(s), {jobs:,} jobs ...", file=sys.stderr, flush=True)
    try:
        with env.scratch(system) as url:
            enqueue_atlantis(url, jobs)
            with psycopg.connect(env.admin, autocommit=True) as conn:
                conn.execute("CHECKPOINT")
            with psycopg.connect(url, autocommit=True) as conn:
                for i in range(supervisors):
                    procs.append(start_worker(env, system, None, url,
                                              env.logdir / f"scaleout-{supervisors}-{i}.log"))
                pids = [p.pid for p in procs]
                while conn.execute("SELECT count(*) FROM atlantis.jobs WHERE state = 'available'"
                                   ).fetchone() == (jobs,):
                    time.sleep(0.005)
                t0 = time.monotonic()
                machine0 = psutil.cpu_times()
                sup0, kids0 = tree_cpu(pids)
                backends = [int(r[0]) for r in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()").fetchall()]
                pg0 = backends_cpu(backends)
                statements: collections.Counter[str] = collections.Counter()
                waits: collections.Counter[str] = collections.Counter()
                samples = 0
                kids1 = kids0
                while True:
                    rows = conn.execute(
                        "SELECT query, coalesce(wait_event_type || ':' || wait_event, 'CPU') "
                        "FROM pg_stat_activity WHERE datname = current_database() "
                        "AND state = 'active' AND pid <> pg_backend_pid()").fetchall()
                    samples += 1
                    for query, wait in rows:
                        statements[name_of(query, names)] += 1
                        waits[wait] += 1
                    if samples % 12 == 0:  # a count over the table is not free: ~4 a second
                        done = conn.execute("SELECT count(*) FROM atlantis.jobs "
                                            "WHERE state = 'complete'").fetchone()
                        if done is not None and done[0] >= jobs:
                            break
                    if samples % 25 == 0:  # children are reused: read them while they live
                        kids1 = tree_cpu(pids)[1]
                    if any(p.poll() is not None for p in procs):
                        out["note"] = "a supervisor exited"
                        return out
                    time.sleep(0.02)
                t1 = time.monotonic()
                machine1 = psutil.cpu_times()
                sup1, kids_end = tree_cpu(pids)
                kids1 = max(kids1, kids_end)
                pg1 = backends_cpu(backends)
            busy0 = sum(machine0) - machine0.idle - getattr(machine0, "iowait", 0.0)
            busy1 = sum(machine1) - machine1.idle - getattr(machine1, "iowait", 0.0)
            secs = t1 - t0
            out.update(
                jobs_per_s=jobs / secs,
                sup_ms=1000 * (sup1 - sup0) / jobs,
                kids_ms=1000 * (kids1 - kids0) / jobs,
                pg_ms=1000 * (pg1 - pg0) / jobs,
                busy_pct=100 * (busy1 - busy0) / (secs * (psutil.cpu_count() or 1)),
                samples=samples,
                statements=statements.most_common(4),
                waits=waits.most_common(4),
            )
    finally:
        for p in procs:
            stop(p)
    return out


def share(counter: list[tuple[str, int]], samples: int) -> str:
    return ", ".join(f"{name} {n / samples:.2f}" for name, n in counter) or "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--supervisors", default="1,2,4")
    opts = parser.parse_args()
    env = Env(0.02, None)
    try:
        results = [run(env, opts.jobs, int(k)) for k in opts.supervisors.split(",")]
    finally:
        env.close()
    rows = [["supervisors (c8 each)", "jobs/s", "CPU ms/job supervisors / children / PostgreSQL",
             "machine CPU busy", "active backends per sample, by statement",
             "by wait event (CPU = running)"]]
    for r in results:
        if "jobs_per_s" not in r:
            rows.append([str(r["supervisors"]), "—", "—", "—", r.get("note", ""), ""])
            continue
        rows.append([str(r["supervisors"]), f"{r['jobs_per_s']:,.0f}",
                     f"{r['sup_ms']:.3f} / {r['kids_ms']:.3f} / {r['pg_ms']:.3f}",
                     f"{r['busy_pct']:.0f}%", share(r["statements"], r["samples"]),
                     share(r["waits"], r["samples"])])
    print("\n" + header(env, f"Scale-out: {opts.jobs:,} no-op jobs, one database") + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
