"""The target table of ``python -m benchmarks.compare --targets``: every row measured in one run.

Runs, one after the other on the same embedded PostgreSQL server:

1. the side-by-side drains of N no-op jobs (default 20,000) of every system, each followed
   by its idle pickup-latency run (``benchmarks/runs.py``);
2. four paired rounds of atlantis reuse c8, pgqueuer batch 10 and pgqueuer batch 200
   taking turns (A B C, C B A, ...), N jobs each: the reuse and CPU targets take the median
   of the per-round ratios together with the side-by-side run's;
3. two paired rounds of atlantis fresh c4 and RQ's four fork-per-job workers (A B, B A),
   5,000 jobs each (RQ runs ~85 jobs/s here): the fresh target takes the median of their
   ratios and the side-by-side run's;
4. the many-leases run: 500 sleeping jobs (``bench.Sleep``, heartbeat 3 s, so a renewal
   tick every second) at concurrency 500 (200 when free memory is short, ~25 MB a child),
   then over a 30 s steady state: the supervisor's CPU, its renewal statements per tick
   (its ``atlantis_lease_renewals_total``, scraped from ``--metrics-port`` on 127.0.0.1),
   and the scratch database's transactions and ``atlantis.jobs`` row updates per tick
   (``pg_stat_database``, ``pg_stat_user_tables``; the embedded server has no
   ``pg_stat_statements``);
5. the limits' paired rounds (``benchmarks/limits.py``), two of each, taking turns: the
   limited drain (``concurrency 1 by account`` over 100 accounts, 10,000 jobs) against the
   free one, and plain jobs beside a limited job with no row against the app without it
   (N jobs);
6. the standing targets of earlier rounds (left out with ``--no-standing``): the backlog
   sweep (atlantis reuse c8 with 10,000, 100,000 and 200,000 waiting) and the memory run
   (a 200,000-job drain at concurrency 16, the supervisor's RSS and one reused child's
   sampled against the drain's progress, first quarter vs last quarter);

then prints the tables, issue 38's target table (measured; rung and aim, each with its
verdict), the standing targets, and the rows of the performance table of benchmarks/README.md
(its "Latest side-by-side" section), between its marker lines. Benchmarks, not tests: the
verdicts are printed, never asserted.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import statistics
import sys
import time
import urllib.request
from typing import Any

import psutil
import psycopg

from benchmarks import limits
from benchmarks.measure import cpu_seconds, percentile
from benchmarks.runs import (
    Env,
    compare,
    enqueue_atlantis,
    header,
    paired,
    run_drain,
    start_worker,
    stop,
)
from benchmarks.systems import FORKS, TRIO, Result, Round, atlantis_system
from benchmarks.tables import (
    cpu_total,
    enqueue_rate,
    fmt_times,
    markdown,
    paired_table,
    quotient,
    ratios,
    readme_table,
    round_ratios,
    table,
)

#: Paired rounds of atlantis reuse c8, pgqueuer batch 10 and batch 200 (see runs.paired).
TRIO_ROUNDS = 4
#: Paired rounds of atlantis fresh c4 and RQ, and their jobs: RQ drains ~85 jobs/s here, so
#: 20,000 would take 4 minutes a drain.
FORK_ROUNDS = 2
FORK_JOBS = 5_000
#: Paired rounds of each limits comparison, and the limited drain's jobs (it runs ~1,000
#: jobs/s here).
LIMIT_ROUNDS = 2
LIMITED_JOBS = 10_000
CHILD_MB = 25  # what one reused child costs, about
HEARTBEAT = 3.0  # bench.Sleep's heartbeat (benchmarks/bench.atl); a renewal every third


def backlog_sizes(quick: bool) -> list[int]:
    return [2_000, 5_000, 10_000] if quick else [10_000, 100_000, 200_000]


def backlog(env: Env, sizes: list[int], concurrency: int = 8,
            track_rss: bool = True) -> list[Result]:
    system = atlantis_system(concurrency)
    results = []
    for jobs in sizes:
        print(f"compare: atlantis {system.settings}: drain of {jobs:,} ...", flush=True,
              file=sys.stderr)
        results.append(run_drain(env, system, jobs, None, env.atl_version, track_rss))
        time.sleep(1.0)
    return results


@dataclasses.dataclass
class Leases:
    concurrency: int
    running: int = 0
    window_s: float = 0.0
    supervisor_pct: float | None = None
    xacts_per_tick: float | None = None
    rows_per_tick: float | None = None
    renewals_per_tick: float | None = None
    """Renewal statements per tick, from the supervisor's own counter (metrics)."""
    note: str = ""


def sleeping(env: Env, quick: bool) -> Leases:
    """The many-leases run (see the module's doc)."""
    want = 20 if quick else 500
    free_mb = psutil.virtual_memory().available / 2**20
    leases = Leases(want if free_mb > want * CHILD_MB * 1.5 else min(want, 200))
    if leases.concurrency < want:
        leases.note = (f"{leases.concurrency} jobs, not {want}: {free_mb:,.0f} MB free "
                       f"< {want * CHILD_MB * 1.5:,.0f} MB")
    window = 10.0 if quick else 30.0
    system = atlantis_system(leases.concurrency)
    log = env.logdir / f"{env.runs + 1}-sleep.log"
    print(f"compare: atlantis {leases.concurrency} sleeping jobs ...", flush=True,
          file=sys.stderr)
    proc = None
    try:
        with env.scratch(system) as url, psycopg.connect(url, autocommit=True) as conn:
            enqueue_atlantis(url, leases.concurrency, "bench.Sleep", {"seconds": 600})
            port = _free_port()
            system = dataclasses.replace(system, worker_args=[
                *system.worker_args, "--metrics-port", str(port), "--metrics-host", "127.0.0.1"])
            proc = start_worker(env, system, None, url, log)
            deadline = time.monotonic() + 120 + leases.concurrency
            while leases.running < leases.concurrency and time.monotonic() < deadline:
                time.sleep(0.5)
                row = conn.execute("SELECT count(*) FROM atlantis.jobs "
                                   "WHERE state = 'running'").fetchone()
                leases.running = int(row[0]) if row else 0
                if proc.poll() is not None:
                    leases.note = f"supervisor exited with {proc.returncode}; log: {log}"
                    return leases
            if leases.running < leases.concurrency:
                leases.note = f"only {leases.running} running after the ramp; log: {log}"
            time.sleep(HEARTBEAT)  # one heartbeat of steady state before the window
            supervisor = psutil.Process(proc.pid)
            renewals0 = _renewals(port)
            cpu0, stats0, t0 = cpu_seconds(supervisor, False), _stats(conn), time.monotonic()
            time.sleep(window)
            cpu1, stats1, t1 = cpu_seconds(supervisor, False), _stats(conn), time.monotonic()
            renewals1 = _renewals(port)
            leases.window_s = t1 - t0
            ticks = leases.window_s / (HEARTBEAT / 3)
            leases.supervisor_pct = 100 * (cpu1 - cpu0) / leases.window_s
            leases.xacts_per_tick = (stats1[0] - stats0[0] - 1) / ticks  # -1: our own read
            leases.rows_per_tick = (stats1[1] - stats0[1]) / ticks
            if renewals0 is not None and renewals1 is not None:
                leases.renewals_per_tick = (renewals1 - renewals0) / ticks
            leases.note = "; ".join(filter(None, [leases.note, stop(proc, grace=60)]))
            proc = None
    except (OSError, psycopg.Error, psutil.Error) as exc:
        leases.note = f"failed: {exc}; log: {log}"
    finally:
        if proc is not None:
            stop(proc, grace=60)
    return leases


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _renewals(port: int) -> float | None:
    """The supervisor's ``atlantis_lease_renewals_total`` (renewal statements so far)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = re.search(r"^atlantis_lease_renewals_total (\S+)$", text, re.M)
    return float(found[1]) if found else None


def _stats(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Transactions of the scratch database and row updates of atlantis.jobs, so far."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "        WHERE datname = current_database()), "
        "       (SELECT n_tup_upd FROM pg_stat_user_tables "
        "        WHERE relid = 'atlantis.jobs'::regclass)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# -- the tables -------------------------------------------------------------------------

ISSUE_HEAD = ("target", "measured", "rung (must be met)", "rung verdict", "aim", "aim verdict")


@dataclasses.dataclass
class Run:
    """Everything one ``--targets`` run measured."""

    jobs: int
    side: list[Result]
    trio: list[Round]
    forks: list[Round]
    fork_jobs: int
    leases: Leases
    limited: list[tuple[Result, Result]] = dataclasses.field(default_factory=list)
    beside: list[tuple[Result, Result]] = dataclasses.field(default_factory=list)
    sweep: list[Result] = dataclasses.field(default_factory=list)
    memory: Result | None = None

    def side_by_key(self, key: str) -> Result | None:
        return next((r for r in self.side if r.system.key == key), None)


def verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def median_of(side_ratio: float | None, rounds: list[float]) -> float | None:
    """The median of a side-by-side ratio and the paired rounds' (one ratio of two drains
    minutes apart is at the mercy of the machine's drift)."""
    got = [*([side_ratio] if side_ratio is not None else []), *rounds]
    return statistics.median(got) if got else None


def _median_text(side_ratio: float | None, rounds: list[float], what: str) -> str:
    """"**0.86x** what (range 0.82–1.04x)": the median of the side-by-side ratio and the
    rounds'."""
    median = median_of(side_ratio, rounds)
    if median is None:
        return f"— {what}"
    got = [*([side_ratio] if side_ratio is not None else []), *rounds]
    return f"**{median:.2f}x** {what} (range {min(got):.2f}–{max(got):.2f}x)"


def rate_of(result: Result | None) -> float | None:
    return result.jobs_per_s if result else None


def issue_rows(run: Run) -> list[list[str]]:
    """Issue 38's target table: measured, then the rung and the aim, each with its verdict."""
    rows = [list(ISSUE_HEAD)]
    atl, b10, b200 = (run.side_by_key(k) for k in TRIO)
    a, k10, k200 = TRIO
    rate = rate_of(atl)

    s10, s200 = quotient(rate, rate_of(b10)), quotient(rate, rate_of(b200))
    r10 = round_ratios(run.trio, a, k10)
    r200 = round_ratios(run.trio, a, k200)
    m10, m200 = median_of(s10, r10), median_of(s200, r200)
    rows.append([
        "reuse c8 drain vs pgqueuer batch 200",
        f"side by side ({run.jobs:,} jobs): {_n(rate)} jobs/s = {fmt_times(s200)} batch 200 "
        f"({_n(rate_of(b200))}), {fmt_times(s10)} batch 10 ({_n(rate_of(b10))}); "
        + f"median of this and {len(r200)} rounds: " + _median_text(s200, r200, "batch 200")
        + ", " + _median_text(s10, r10, "batch 10"),
        "≥ 0.6x batch 200, and ≥ 1.2x batch 10",
        verdict(None if m10 is None or m200 is None else m200 >= 0.6 and m10 >= 1.2),
        "≥ 1.0x batch 200", verdict(None if m200 is None else m200 >= 1.0)])

    ours = atl.cpu_ms() if atl else None
    ours_t = cpu_total(atl) if atl else None
    theirs_t = cpu_total(b200) if b200 else None
    sc = quotient(ours_t, theirs_t)
    rc = round_ratios(run.trio, a, k200, cpu_total)
    mc = median_of(sc, rc)
    rows.append([
        "CPU per job, all processes (worker + children + store)",
        (f"side by side: {_f(ours_t, '.3f')} ms ({_f(ours.worker, '.3f')} + "
         f"{_f(ours.children, '.3f')} + {_f(ours.store, '.3f')})" if ours else "side by side: —")
        + f" = {fmt_times(sc)} pgqueuer batch 200's {_f(theirs_t, '.3f')} ms; "
        f"median of this and {len(rc)} rounds: " + _median_text(sc, rc, "batch 200"),
        "≤ 3x pgqueuer batch 200", verdict(None if mc is None else mc <= 3.0),
        "≤ 2x", verdict(None if mc is None else mc <= 2.0)])

    rows.extend(limit_rows(run))

    fresh, rq = (run.side_by_key(k) for k in FORKS)
    sf = quotient(rate_of(fresh), rate_of(rq))
    rf = round_ratios(run.forks, *FORKS)
    mf = median_of(sf, rf)
    rows.append([
        "fresh c4 vs RQ fork workers (4 workers), same concurrency",
        f"side by side ({run.jobs:,} jobs): {_n(rate_of(fresh))} jobs/s = {fmt_times(sf)} RQ "
        f"({_n(rate_of(rq))}); rounds of {run.fork_jobs:,} jobs: "
        + (", ".join(fmt_times(x) for x in rf) or "—")
        + f"; median of this and {len(rf)} rounds: " + _median_text(sf, rf, "RQ")
        + (f"; RQ: {rq.note}" if rq and rq.note else ""),
        "≥ 3x", verdict(None if mf is None else mf >= 3.0),
        "≥ 4x", verdict(None if mf is None else mf >= 4.0)])

    lat = atl.latencies if atl else []
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    ok = verdict(None if p50 is None or p99 is None else p50 <= 5 and p99 <= 25)
    rows.append(["pickup latency, idle (reuse c8)",
                 f"p50 {_ms(p50)}, p99 {_ms(p99)} ({len(lat)} jobs enqueued one at a time, "
                 "20 ms apart)", "p50 ≤ 5 ms, p99 ≤ 25 ms", ok, "unchanged", ok])

    rows.append(leases_row(run.leases))
    return rows


def leases_row(leases: Leases) -> list[str]:
    pct = leases.supervisor_pct
    return [f"{leases.concurrency} sleeping jobs, supervisor CPU",
            f"{_f(pct)}% of a core over {leases.window_s:.0f} s "
            f"({leases.running} running, heartbeat 3 s)"
            + (f"; {leases.note}" if leases.note else ""),
            "≤ 5% of a core", verdict(None if pct is None else pct <= 5),
            "≤ 2%", verdict(None if pct is None else pct <= 2)]


def limit_rows(run: Run) -> list[list[str]]:
    """The limits' rows: plain jobs beside a limited job, and the limited drain, each the
    median of its paired rounds (limited ÷ free jobs/s)."""
    rows = []
    for got, what, rung, aim in (
            (run.beside, "plain jobs beside a limited job (no row of it) vs the app without "
             "limits", 0.9, 1.0),
            (run.limited, "limited drain (`concurrency 1 by account` over 100 keys) vs "
             "unlimited", 0.6, 0.8)):
        m = limits.median_ratio(got)
        each = ", ".join(f"{_n(b.jobs_per_s)} vs {_n(a.jobs_per_s)}" for a, b in got)
        jobs = got[0][0].jobs if got else 0
        rows.append([what,
                     (f"**{m[0]:.2f}x** (range {m[1]:.2f}–{m[2]:.2f}x), {len(got)} rounds of "
                      f"{jobs:,} jobs taking turns: {each} jobs/s" if m else "—"),
                     f"≥ {rung}x", verdict(None if m is None else m[0] >= rung),
                     f"≥ {aim}x", verdict(None if m is None else m[0] >= aim)])
    return rows


def renewals_row(leases: Leases) -> list[str]:
    return [f"{leases.concurrency} concurrent sleeping jobs, heartbeat 3 s "
            f"({leases.running} running), the same run",
            f"{_f(leases.renewals_per_tick, '.2f')} renewal statements per tick "
            f"(the supervisor's counter), {_f(leases.rows_per_tick, '.0f')} job rows renewed "
            f"per tick, {_f(leases.xacts_per_tick)} transactions of the database per tick in "
            "all (the polls included)",
            "one renewal statement per tick",
            verdict(None if leases.renewals_per_tick is None
                    else leases.renewals_per_tick <= 1.1)]


def standing_rows(run: Run) -> list[list[str]]:
    """The targets of earlier rounds: the backlog sweep and the memory run (when run), the
    enqueue rate against pgqueuer's batch enqueue, one renewal statement per tick."""
    rows = [["workload", "measured", "target", "verdict"]]
    if run.sweep:
        first, last = run.sweep[0], run.sweep[-1]
        flat = quotient(rate_of(last), rate_of(first))
        rows.append([f"reuse c8 with {last.jobs:,} waiting",
                     " / ".join(f"{_n(r.jobs_per_s)} at {r.jobs:,}" for r in run.sweep)
                     + f" jobs/s: {fmt_times(flat)}",
                     f"≥ 0.8x the rate at {first.jobs:,}",
                     verdict(None if flat is None else flat >= 0.8)])
    if run.memory is not None:
        memory = run.memory
        rss = memory.rss
        peak = rss.peak_mb() if rss else None
        sup_q = rss.quarters(1) if rss else None
        kid_q = rss.quarters(2) if rss else None
        rows.append([f"supervisor memory, concurrency 16, {memory.jobs:,}-job drain"
                     + (f"; {memory.note}" if memory.note else ""),
                     f"supervisor peak {_f(peak, '.0f')} MB, {_q(sup_q)}; "
                     f"a reused child {_q(kid_q)}",
                     "≤ 80 MB RSS, flat within ±10%; a reused child flat too",
                     verdict(None if peak is None or sup_q is None or kid_q is None
                             else peak <= 80 and _flat(sup_q) and _flat(kid_q))])

    atl, b10 = run.side_by_key(TRIO[0]), run.side_by_key(TRIO[1])
    ea = enqueue_rate(atl) if atl else None
    ep = enqueue_rate(b10) if b10 else None
    se = quotient(ea, ep)
    re_ = round_ratios(run.trio, TRIO[0], TRIO[1], enqueue_rate)
    me = median_of(se, re_)
    rows.append([f"`enqueue_many` (validated), {run.jobs:,} rows, 1,000 a transaction",
                 f"side by side: {_n(ea)} rows/s = {fmt_times(se)} pgqueuer's batch enqueue "
                 f"({_n(ep)}); median of this and {len(re_)} rounds: "
                 + _median_text(se, re_, "pgqueuer"),
                 "≥ 1.0x pgqueuer's batch enqueue (asyncpg)",
                 verdict(None if me is None else me >= 1.0)])
    rows.append(renewals_row(run.leases))
    return rows


def _n(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def _f(v: float | None, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f} ms"


def _q(q: tuple[float, float] | None) -> str:
    if q is None:
        return "—"
    return f"{q[0]:.0f} → {q[1]:.0f} MB first to last quarter ({(q[1] / q[0] - 1) * 100:+.0f}%)"


def _flat(q: tuple[float, float]) -> bool:
    return abs(q[1] / q[0] - 1) <= 0.10


def leases_only(env: Env, quick: bool) -> None:
    leases = sleeping(env, quick)
    print("\n" + header(env, "The many-leases run") + "\n")
    print(markdown([list(ISSUE_HEAD), leases_row(leases)]))
    print()
    print(markdown([["workload", "measured", "target", "verdict"], renewals_row(leases)]))


def main(env: Env, jobs: int, latency: int, quick: bool, standing: bool = True) -> None:
    phases: dict[str, float] = {}

    def timed(name: str, started: float) -> None:
        phases[name] = time.monotonic() - started

    t = time.monotonic()
    side = compare(env, {"atlantis", "pgqueuer", "procrastinate", "chancy", "rq", "celery"},
                   jobs, latency, 0.02)
    timed("side by side", t)
    t = time.monotonic()
    trio = paired(env, TRIO, jobs, TRIO_ROUNDS if not quick else 2)
    timed("rounds", t)
    fork_jobs = min(jobs, FORK_JOBS if not quick else 500)
    t = time.monotonic()
    forks = paired(env, FORKS, fork_jobs, FORK_ROUNDS)
    timed("fresh/RQ rounds", t)
    t = time.monotonic()
    run = Run(jobs, side, trio, forks, fork_jobs, sleeping(env, quick))
    timed("leases", t)
    t = time.monotonic()
    run.limited = limits.rounds(env, 8, min(jobs, LIMITED_JOBS), LIMIT_ROUNDS)
    run.beside = limits.rounds(env, 8, jobs, LIMIT_ROUNDS, beside=True)
    timed("limits rounds", t)
    if standing:
        t = time.monotonic()
        run.sweep = backlog(env, backlog_sizes(quick))
        run.memory = backlog(env, [10_000 if quick else 200_000], concurrency=16,
                             track_rss=True)[0]
        timed("backlog and memory", t)
    total = sum(phases.values())
    took = ", ".join(f"{name} {seconds / 60:.1f}" for name, seconds in phases.items())

    print("\n" + header(env, f"Target table ({total / 60:.0f} min: {took})"))
    print(f"\n### Side by side: {jobs:,} no-op jobs, one worker\n")
    print(table(side))
    print("\njobs/s of atlantis ÷ each peer's:\n")
    print(ratios(side))
    print(f"\n### Paired rounds, {jobs:,} jobs each (taking turns)\n")
    print(paired_table(trio, TRIO))
    print(f"\n### Paired rounds, {fork_jobs:,} jobs each (taking turns)\n")
    print(paired_table(forks, FORKS))
    if standing:
        print("\n### atlantis reuse c8 by backlog, and the memory run (c16)\n")
        print(table([*run.sweep, *([run.memory] if run.memory else [])]))
    print("\n### The limited drain (`concurrency 1 by account` over 100 accounts) against "
          "the free one, taking turns\n")
    print(limits.rounds_table(run.limited))
    print("\n### Plain jobs beside a limited job with no row (\"limited\") against the app "
          "without it (\"free\"), taking turns\n")
    print(limits.rounds_table(run.beside))
    print("\n### Targets (issue 38)\n")
    print(markdown(issue_rows(run)))
    print("\n### Standing targets from earlier rounds\n")
    if not standing:
        print("(backlog sweep and memory run left out: --no-standing)\n")
    print(markdown(standing_rows(run)))
    print(readme_section(side))
    print(f"\nworker logs: {env.logdir}")


def readme_section(side: list[Result]) -> str:
    """The rows of the performance table of benchmarks/README.md, between two marker lines, to
    paste into its "Latest side-by-side" section."""
    return ("\n### Performance table (paste into benchmarks/README.md, \"## Latest side-by-side\","
            " between the markers)\n\n"
            "<!-- README performance table: begin -->\n" + readme_table(side)
            + "\n<!-- README performance table: end -->")
