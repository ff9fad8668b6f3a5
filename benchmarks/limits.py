"""The no-op drain under ``concurrency 1 by account`` over 100 accounts, against the same
drain with no limit, in one run.

    python -m benchmarks.limits [--jobs 20000] [--rounds 2] [--concurrency 8] [--accounts 100]
    python -m benchmarks.limits --beside [--jobs 20000] [--rounds 4] [--concurrency 8]

Each round drains, with ONE supervisor (``--concurrency 8 --isolation reuse``, the target
table's reuse row, the same for both) on a scratch database of the embedded PostgreSQL
server, N no-op jobs enqueued before it starts:

- **free**: N ``bench.Noop`` (``benchmarks/bench.atl``, no limit), its app
  ``benchmarks.app:registry``, as every other benchmark here;
- **limited**: N ``bench.NoopPerAccount`` (``benchmarks/limited.atl``: ``concurrency 1 by
  account``), ``account`` taking 100 values in turn, its app ``benchmarks.app:limited``.
  Every row is marked limited (``jobs.limit_group``), so it is claimed by
  ``atlantis.claim_limited`` for idle children only (nothing ahead), and turns ``running``
  through the trigger ``jobs_limit_claim`` (an advisory try-lock on its key, a count of the
  key's running rows).

Both are measured as ``benchmarks/runs.py`` measures a drain: from the first poll that sees
a row picked up to the first that sees all done. The rounds take turns (free limited,
limited free, ...), as the paired rounds of ``benchmarks.compare --pairs`` do, because this
machine's speed drifts by minutes; the printed ratio is limited jobs/s over free jobs/s,
per round and their median (issue 21's target: at least 0.5x). Benchmarks, not tests:
nothing is asserted.

``--beside`` (issue 31: limits cost only the rows they limit) measures what a limit costs
the jobs it does not limit. Both drains are of N ``bench.Noop`` by one supervisor serving
the queues ``bench`` and ``bench-limited``; **free** with ``benchmarks.app:registry`` (no
limit anywhere), **limited** with ``benchmarks.app:beside``, which also declares
``bench.NoopLimitedBeside`` (``concurrency 1 by account``) on ``bench-limited``, synced,
with no row of it waiting. The printed ratio is the second over the first (target: at
least 0.9x; before issue 31, about 0.3x: a supervisor serving any limited job claimed no
row ahead).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import psycopg

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from benchmarks.runs import Env, Fill, header, insert_atlantis, prepare_atlantis, run_drain
from benchmarks.systems import Result, System, atlantis_system
from benchmarks.tables import cpu_total, fmt, fmt_rate, fmt_times, markdown, quotient

LIMITED_APP = "benchmarks.app:limited"
LIMITED_JOB = "bench.NoopPerAccount"
BESIDE_APP = "benchmarks.app:beside"
BESIDE_QUEUE = "bench-limited"


def limited_system(free: System) -> System:
    """The free system's settings, with the limited app: ``runs.start_worker`` passes
    ``--app benchmarks.app:registry`` first, and the last ``--app`` given wins."""
    return dataclasses.replace(free, key=f"{free.key}-limited",
                               worker_args=[*free.worker_args, "--app", LIMITED_APP])


def enqueue_limited(accounts: int) -> Fill:
    def fill(url: str, jobs: int) -> float:
        """Migrate and sync the limited app, then ``enqueue_many`` N rows, the accounts in
        turn, 1,000 a transaction: seconds of the inserts."""
        app = load_app(LIMITED_APP)
        with psycopg.connect(url) as conn:
            migrate(conn)
            sync(conn, list(app.decls.values()))
            conn.commit()
            started = time.perf_counter()
            for first in range(0, jobs, 1000):
                rows = [{"account": n % accounts, "n": n}
                        for n in range(first, min(first + 1000, jobs))]
                atlantis.enqueue_many(conn, LIMITED_JOB, rows)
                conn.commit()
            return time.perf_counter() - started
    return fill



def enqueue_beside(url: str, jobs: int) -> float:
    """As ``enqueue_atlantis``, with the beside app's limited job synced too (no row of it)."""
    prepare_atlantis(url)
    with psycopg.connect(url) as conn:
        sync(conn, list(load_app(BESIDE_APP).decls.values()))
        conn.commit()
    return insert_atlantis(url, jobs)


def run_round(env: Env, free: System, limited: System, jobs: int, accounts: int,
              order: tuple[str, ...], fill: Fill | None = None) -> tuple[Result, Result]:
    got: dict[str, Result] = {}
    for which in order:
        print(f"limits: {which} drain of {jobs:,} jobs ...", file=sys.stderr, flush=True)
        if which == "free":
            got[which] = run_drain(env, free, jobs, None, env.atl_version, track_rss=False)
        else:
            got[which] = run_drain(env, limited, jobs, None, env.atl_version, track_rss=False,
                                   fill=fill or enqueue_limited(accounts))
        split = got[which].cpu_ms()
        print(f"limits:   {fmt_rate(got[which])}" + (
            f"; CPU ms a job: supervisor {split.worker:.3f}, children {split.children:.3f},"
            f" PostgreSQL {split.store:.3f}" if split else ""), file=sys.stderr, flush=True)
        time.sleep(1.0)  # let the previous supervisor's processes and the server settle
    return got["free"], got["limited"]


def beside_systems(free: System) -> tuple[System, System]:
    """``--beside``'s two systems: ``free`` serving the beside queue too, and the same with
    the app that declares a limited job there."""
    served = [*free.worker_args, "--queue", BESIDE_QUEUE]
    free = dataclasses.replace(free, worker_args=served)
    return free, dataclasses.replace(free, key=f"{free.key}-beside",
                                     worker_args=[*served, "--app", BESIDE_APP])


def rounds(env: Env, concurrency: int, jobs: int, count: int, accounts: int = 100,
           beside: bool = False) -> list[tuple[Result, Result]]:
    """``count`` rounds taking turns (free limited, limited free, ...): the limited drain
    against the free one, or with ``beside`` the plain drain beside a limited job against
    the app without it. Each round's (free, limited)."""
    free = atlantis_system(concurrency)
    limited = limited_system(free)
    fill: Fill | None = None
    if beside:
        free, limited = beside_systems(free)
        fill = enqueue_beside
    return [run_round(env, free, limited, jobs, accounts,
                      ("free", "limited") if i % 2 == 0 else ("limited", "free"), fill)
            for i in range(count)]


def median_ratio(got: list[tuple[Result, Result]]) -> tuple[float, float, float] | None:
    """The median, lowest and highest of the rounds' limited ÷ free jobs/s."""
    ratios = [r for r in (quotient(b.jobs_per_s, a.jobs_per_s) for a, b in got)
              if r is not None]
    return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None


def rounds_table(pairs: list[tuple[Result, Result]]) -> str:
    rows = [["round", "free jobs/s", "limited jobs/s", "limited ÷ free",
             "CPU ms per job, free / limited (ratio)", "enqueue rows/s, free / limited",
             "note"]]
    for i, (free, limited) in enumerate(pairs, 1):
        ca, cb = cpu_total(free), cpu_total(limited)
        rows.append([
            f"{i} ({'free limited' if i % 2 else 'limited free'})",
            fmt(free.jobs_per_s, ",.0f", "—"), fmt(limited.jobs_per_s, ",.0f", "—"),
            fmt_times(quotient(limited.jobs_per_s, free.jobs_per_s)),
            f"{fmt(ca, '.3f', '—')} / {fmt(cb, '.3f', '—')} ({fmt_times(quotient(cb, ca))})",
            f"{fmt(free.jobs / free.enqueue_s if free.enqueue_s else None, ',.0f', '—')} / "
            f"{fmt(limited.jobs / limited.enqueue_s if limited.enqueue_s else None, ',.0f', '—')}",
            "; ".join(filter(None, [free.note, limited.note]))])
    got = median_ratio(pairs)
    rows.append(["median", "", "",
                 f"**{got[0]:.2f}x** (range {got[1]:.2f}–{got[2]:.2f}x)" if got else "—",
                 "", "", ""])
    return markdown(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=20000, help="no-op jobs a drain")
    parser.add_argument("--rounds", type=int, default=2, help="free and limited drains, in turn")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--accounts", type=int, default=100,
                        help="values of the limit's key, taken in turn")
    parser.add_argument("--beside", action="store_true",
                        help="plain jobs beside a limited job with no rows, against no limit")
    parser.add_argument("--poll", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=None)
    opts = parser.parse_args()
    if min(opts.jobs, opts.rounds, opts.concurrency, opts.accounts) < 1:
        parser.error("--jobs, --rounds, --concurrency and --accounts must be positive")
    env = Env(opts.poll, opts.timeout)
    what = (f"{opts.jobs:,} no-op jobs under `concurrency 1 by account` over "
            f"{opts.accounts:,} accounts against {opts.jobs:,} with no limit")
    if opts.beside:
        what = (f"{opts.jobs:,} no-op jobs, their app also declaring a limited job on another "
                f"served queue (no row of it), against the same app without it")
    try:
        got = rounds(env, opts.concurrency, opts.jobs, opts.rounds, opts.accounts, opts.beside)
        settings = got[0][0].system.settings if got else ""
        print("\n" + header(env, f"{what}, {settings}") + "\n")
        print(rounds_table(got))
        print(f"\nsupervisor logs: {env.logdir}")
    finally:
        env.close()


if __name__ == "__main__":
    main()
