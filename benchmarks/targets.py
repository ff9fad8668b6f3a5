"""The target table of ``python -m benchmarks.compare --targets``: every row measured in one run.

Runs, one after the other on the same embedded PostgreSQL server:

1. the side-by-side drains of N no-op jobs (default 20,000) of every system, each followed
   by its idle pickup-latency run (``benchmarks/runs.py``);
2. the backlog sweep: atlantis reuse at concurrency 8 with 10,000, 100,000 and 200,000
   waiting;
3. the memory run: a 200,000-job drain at concurrency 16, the supervisor's RSS and one
   reused child's sampled against the drain's progress (first quarter vs last quarter);
4. the many-leases run: 500 sleeping jobs (``bench.Sleep``, heartbeat 3 s, so a renewal
   tick every second) at concurrency 500 (200 when free memory is short, ~25 MB a child),
   then over a 30 s steady state: the supervisor's CPU, its renewal statements per tick
   (its ``atlantis_lease_renewals_total``, scraped from ``--metrics-port`` on 127.0.0.1),
   and the scratch database's transactions and ``atlantis.jobs`` row updates per tick
   (``pg_stat_database``, ``pg_stat_user_tables``; the embedded server has no
   ``pg_stat_statements``).

then prints the tables and the target table (measured, target, met/missed). Benchmarks,
not tests: the verdicts are printed, never asserted.
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
from benchmarks.systems import PAIR, Result, atlantis_system
from benchmarks.tables import (
    Measure,
    cpu_total,
    enqueue_rate,
    fmt_times,
    jobs_rate,
    markdown,
    pair_ratios,
    paired_table,
    quotient,
    ratios,
    table,
)

#: Extra paired drains of atlantis reuse c8 and pgqueuer batch 10 (see runs.paired).
PAIRED_ROUNDS = 4
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


# -- the table --------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def with_pairs(ratio: float | None, pairs: list[tuple[Result, Result]],
               measure: Measure) -> tuple[float | None, str]:
    """The median of the side-by-side ``ratio`` and the paired rounds' (one ratio of two
    runs minutes apart is at the mercy of the machine's drift), and its text."""
    got = [*([ratio] if ratio is not None else []), *pair_ratios(pairs, measure)]
    median = statistics.median(got) if got else None
    text = (f"median over this and {len(pairs)} paired rounds: {fmt_times(median)}"
            + (f" (range {min(got):.2f}–{max(got):.2f}x)" if got else ""))
    return median, text


def rate_of(result: Result | None) -> float | None:
    return result.jobs_per_s if result else None


def by_key(results: list[Result], key: str) -> Result | None:
    return next((r for r in results if r.system.key == key), None)


def target_rows(side: list[Result], sweep: list[Result], memory: Result,
                leases: Leases, jobs: int,
                pairs: list[tuple[Result, Result]]) -> list[list[str]]:
    rows = [["workload", "measured", "target", "verdict"]]
    atl, fresh = by_key(side, "atlantis-reuse-c8"), by_key(side, "atlantis-fresh-c4")
    pgq, pgq200 = by_key(side, "pgqueuer-b10"), by_key(side, "pgqueuer-b200")
    rq = by_key(side, "rq")
    rate = atl.jobs_per_s if atl else None

    r10 = quotient(rate, pgq.jobs_per_s if pgq else None)
    r200 = quotient(rate, pgq200.jobs_per_s if pgq200 else None)
    median, median_text = with_pairs(r10, pairs, jobs_rate)
    rows.append([f"drain {jobs:,} no-op jobs, one supervisor, `--isolation reuse` "
                 "(concurrency 8)",
                 f"{_n(rate)} jobs/s = {fmt_times(r10)} pgqueuer batch 10 ({_n(rate_of(pgq))}),"
                 f" {fmt_times(r200)} batch 200 ({_n(rate_of(pgq200))}); {median_text}",
                 "≥ 1.0x pgqueuer's default (batch 10); aim ≥ 1.0x batch 200",
                 verdict(None if median is None else median >= 1.0)
                 + ("" if r200 is None else f" (aim: {verdict(r200 >= 1.0)})")])

    first, last = (sweep[0], sweep[-1]) if sweep else (None, None)
    flat = quotient(rate_of(last), rate_of(first))
    rows.append([f"the same with {last.jobs if last else 0:,} waiting",
                 " / ".join(f"{_n(r.jobs_per_s)} at {r.jobs:,}" for r in sweep)
                 + f" jobs/s: {fmt_times(flat)}",
                 f"≥ 0.8x the rate at {first.jobs if first else 0:,}",
                 verdict(None if flat is None else flat >= 0.8)])

    rf = quotient(rate_of(fresh), rate_of(rq))
    rows.append(["`--isolation fresh` (concurrency 4)",
                 f"{_n(rate_of(fresh))} jobs/s = {fmt_times(rf)} RQ, 4 fork-per-job "
                 f"workers ({_n(rate_of(rq))})" + (f"; RQ: {rq.note}" if rq and
                                                            rq.note else ""),
                 "≥ 4x RQ at the same concurrency (Redis on 127.0.0.1)",
                 verdict(None if rf is None else rf >= 4.0)])

    lat = atl.latencies if atl else []
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    rows.append([f"pickup latency, idle supervisor (reuse c8), {len(lat)} jobs enqueued one at "
                 "a time 20 ms apart",
                 f"p50 {_ms(p50)}, p99 {_ms(p99)}", "p50 ≤ 5 ms, p99 ≤ 25 ms",
                 verdict(None if p50 is None or p99 is None else p50 <= 5 and p99 <= 25)])

    rows.append(leases_row(leases))

    rss = memory.rss
    peak = rss.peak_mb() if rss else None
    sup_q = rss.quarters(1) if rss else None
    kid_q = rss.quarters(2) if rss else None
    rows.append([f"supervisor memory, concurrency 16, {memory.jobs:,}-job drain"
                 + (f"; {memory.note}" if memory.note else ""),
                 f"supervisor peak {_f(peak, '.0f')} MB, {_q(sup_q)}; a reused child {_q(kid_q)}",
                 "≤ 80 MB RSS, flat within ±10%; a reused child flat too",
                 verdict(None if peak is None or sup_q is None or kid_q is None
                         else peak <= 80 and _flat(sup_q) and _flat(kid_q))])

    # CPU per job and the enqueue rate drift with the machine as the drain rate does: their
    # verdicts, too, take the median of the side-by-side ratio and the paired rounds'.
    ours = atl.cpu_ms() if atl else None
    ours_t = cpu_total(atl) if atl else None
    theirs_t = cpu_total(pgq) if pgq else None
    rc = quotient(ours_t, theirs_t)
    mc, mc_text = with_pairs(rc, pairs, cpu_total)
    rows.append([f"CPU per job (supervisor + children + PostgreSQL), {jobs:,}-job drain",
                 (f"{_f(ours_t, '.3f')} ms ({_f(ours.worker, '.3f')} + "
                  f"{_f(ours.children, '.3f')} + {_f(ours.store, '.3f')})" if ours else "—")
                 + f" = {fmt_times(rc)} pgqueuer batch 10's {_f(theirs_t, '.3f')} ms; {mc_text}",
                 "≤ 2x pgqueuer's (worker + PostgreSQL)",
                 verdict(None if mc is None else mc <= 2.0)])

    ea = enqueue_rate(atl) if atl else None
    ep = enqueue_rate(pgq) if pgq else None
    re_ = quotient(ea, ep)
    me, me_text = with_pairs(re_, pairs, enqueue_rate)
    rows.append([f"`enqueue_many` (validated), {jobs:,} rows, 1,000 a transaction",
                 f"{_n(ea)} rows/s = {fmt_times(re_)} pgqueuer's batch enqueue ({_n(ep)}); "
                 f"{me_text}",
                 "≥ 1.0x pgqueuer's batch enqueue (asyncpg)",
                 verdict(None if me is None else me >= 1.0)])
    return rows


def leases_row(leases: Leases) -> list[str]:
    return [f"{leases.concurrency} concurrent sleeping jobs, heartbeat 3 s "
            f"({leases.running} running)" + (f"; {leases.note}" if leases.note else ""),
            f"{_f(leases.renewals_per_tick, '.2f')} renewal statements per tick "
            f"(the supervisor's counter), {_f(leases.rows_per_tick, '.0f')} job rows renewed "
            f"per tick, {_f(leases.xacts_per_tick)} transactions of the database per tick in "
            f"all (the polls included); supervisor {_f(leases.supervisor_pct)}% of a core "
            f"over {leases.window_s:.0f} s",
            "one renewal statement per tick, supervisor ≤ 5% of a core",
            verdict(None if leases.renewals_per_tick is None or leases.supervisor_pct is None
                    else leases.renewals_per_tick <= 1.1 and leases.supervisor_pct <= 5)]


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
    print(markdown([["workload", "measured", "target", "verdict"], leases_row(leases)]))


def main(env: Env, jobs: int, latency: int, quick: bool) -> None:
    started = time.monotonic()
    side = compare(env, {"atlantis", "pgqueuer", "procrastinate", "chancy", "rq", "celery"},
                   jobs, latency, 0.02)
    pairs = paired(env, PAIR, jobs, PAIRED_ROUNDS if not quick else 2)
    sweep = backlog(env, backlog_sizes(quick))
    memory = backlog(env, [10_000 if quick else 200_000], concurrency=16, track_rss=True)[0]
    leases = sleeping(env, quick)
    minutes = (time.monotonic() - started) / 60

    print("\n" + header(env, f"Target table ({minutes:.0f} min)"))
    print(f"\n### Side by side: {jobs:,} no-op jobs, one worker\n")
    print(table(side))
    print("\njobs/s of atlantis ÷ each peer's:\n")
    print(ratios(side))
    print(f"\n### {PAIR[0]} and {PAIR[1]}, paired rounds (taking turns)\n")
    print(paired_table(pairs))
    print("\n### atlantis reuse c8 by backlog, and the memory run (c16)\n")
    print(table([*sweep, memory]))
    print("\n### Targets\n")
    print(markdown(target_rows(side, sweep, memory, leases, jobs, pairs)))
    print(f"\nworker logs: {env.logdir}")
