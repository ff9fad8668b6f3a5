"""Step transitions per second of 3-step workflows, against the plain no-op drain, in one run.

    python -m benchmarks.workflows [--workflows 4000] [--rounds 2] [--concurrency 8]

Each round drains, with ONE supervisor (``--concurrency 8 --isolation reuse``, the
target table's reuse row) on a scratch database of the embedded PostgreSQL server:

- **plain**: 3 x W no-op jobs (``bench.Noop``) enqueued before the supervisor starts;
- **chain**: W workflows ``bench.Chain`` (``a -> b -> c``, every step ``bench.Noop``)
  started before it starts. Only the W ``a`` rows exist then; each step's completion makes
  the next step's row (the workflow trigger, in the finish's transaction) and the last one
  completes the workflow, so every one of the 3 x W step rows is one transition.

Both are measured as ``benchmarks/runs.py`` measures a drain: from the first poll that sees
a row picked up to the first that sees all done (for the chains: every workflow
``complete``). The rounds take turns (plain chain, chain plain, ...), as the paired rounds
of ``benchmarks.compare --pairs`` do, because this machine's speed drifts by minutes; the
printed ratio is step transitions/s over plain jobs/s, per round and their median (issue
20's target: at least 0.5x). Benchmarks, not tests: nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import psycopg

import atlantis
from benchmarks.runs import Env, header, prepare_atlantis, run_drain
from benchmarks.systems import Result, System, atlantis_system
from benchmarks.tables import cpu_total, fmt, fmt_rate, fmt_times, markdown, quotient

WORKFLOW = "bench.Chain"
STEPS = 3
#: (rows not picked up yet, steps of the workflows complete): a step row counts as picked up
#: once it left ``available``, and the rows of later steps appear only as the chains advance.
CHAIN_SQL = ("SELECT %(jobs)s - count(*) FILTER (WHERE state <> 'available'), "
             "3 * (SELECT count(*) FROM atlantis.workflow_instances "
             "WHERE state = 'complete') FROM atlantis.jobs")


def start_chains(url: str, steps: int) -> float:
    """Migrate and sync, then start ``steps / 3`` chains, 1,000 a transaction: seconds of
    the starts."""
    prepare_atlantis(url)
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        for first in range(0, steps // STEPS, 1000):
            for n in range(first, min(first + 1000, steps // STEPS)):
                atlantis.start_workflow(conn, WORKFLOW, {"n": n})
            conn.commit()
        return time.perf_counter() - started


def chain_system(plain: System) -> System:
    return dataclasses.replace(plain, key=f"{plain.key}-chain", progress_sql=CHAIN_SQL)


def run_round(env: Env, plain: System, chain: System, steps: int,
              order: tuple[str, ...]) -> tuple[Result, Result]:
    got: dict[str, Result] = {}
    for which in order:
        print(f"workflows: {which} drain of {steps:,} rows ...", file=sys.stderr, flush=True)
        if which == "plain":
            got[which] = run_drain(env, plain, steps, None, env.atl_version, track_rss=False)
        else:
            got[which] = run_drain(env, chain, steps, None, env.atl_version, track_rss=False,
                                   fill=start_chains)
        print(f"workflows:   {fmt_rate(got[which])}", file=sys.stderr, flush=True)
        time.sleep(1.0)  # let the previous supervisor's processes and the server settle
    return got["plain"], got["chain"]


def rounds_table(rounds: list[tuple[Result, Result]]) -> str:
    rows = [["round", "plain jobs/s", "step transitions/s", "workflows/s",
             "transitions ÷ plain", "CPU ms per job / per step (ratio)",
             "enqueue rows/s / workflow starts/s", "note"]]
    for i, (plain, chain) in enumerate(rounds, 1):
        ca, cb = cpu_total(plain), cpu_total(chain)
        starts = chain.jobs / STEPS / chain.enqueue_s if chain.enqueue_s else None
        rows.append([
            f"{i} ({'plain chain' if i % 2 else 'chain plain'})",
            fmt(plain.jobs_per_s, ",.0f", "—"), fmt(chain.jobs_per_s, ",.0f", "—"),
            fmt(chain.jobs_per_s / STEPS if chain.jobs_per_s else None, ",.0f", "—"),
            fmt_times(quotient(chain.jobs_per_s, plain.jobs_per_s)),
            f"{fmt(ca, '.3f', '—')} / {fmt(cb, '.3f', '—')} ({fmt_times(quotient(cb, ca))})",
            f"{fmt(plain.jobs / plain.enqueue_s if plain.enqueue_s else None, ',.0f', '—')} / "
            f"{fmt(starts, ',.0f', '—')}",
            "; ".join(filter(None, [plain.note, chain.note]))])
    got = [r for r in (quotient(c.jobs_per_s, p.jobs_per_s) for p, c in rounds) if r is not None]
    rows.append(["median", "", "", "",
                 f"**{statistics.median(got):.2f}x** (range {min(got):.2f}–{max(got):.2f}x)"
                 if got else "—", "", "", ""])
    return markdown(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--workflows", type=int, default=4000,
                        help="chains a round (3 step rows each; the plain drain gets 3x as many "
                        "jobs)")
    parser.add_argument("--rounds", type=int, default=2, help="plain and chain drains, in turn")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=None)
    opts = parser.parse_args()
    if opts.workflows < 1 or opts.rounds < 1 or opts.concurrency < 1:
        parser.error("--workflows, --rounds and --concurrency must be positive")
    env = Env(opts.poll, opts.timeout)
    plain = atlantis_system(opts.concurrency)
    chain = chain_system(plain)
    steps = STEPS * opts.workflows
    try:
        rounds = [run_round(env, plain, chain, steps,
                            ("plain", "chain") if i % 2 == 0 else ("chain", "plain"))
                  for i in range(opts.rounds)]
        print("\n" + header(env, f"{opts.workflows:,} 3-step chains ({steps:,} no-op steps) "
                            f"against {steps:,} plain no-op jobs, {plain.settings}") + "\n")
        print(rounds_table(rounds))
        print(f"\nsupervisor logs: {env.logdir}")
    finally:
        env.close()


if __name__ == "__main__":
    main()
