"""Drain N no-op jobs with atlantis and its peers, side by side, in one run; print the tables.

    python -m benchmarks.compare [--jobs 20000] [--systems atlantis,pgqueuer,...]
    python -m benchmarks.compare --backlog      # atlantis reuse c8 at 10k/100k/200k waiting
    python -m benchmarks.compare --targets      # the whole target table (benchmarks/targets.py)
    python -m benchmarks.compare --pairs 4      # reuse c8, pgqueuer b10 and b200, taking turns
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
import shlex

from benchmarks import targets
from benchmarks.runs import Env, compare, header, paired
from benchmarks.systems import TRIO, pick
from benchmarks.tables import paired_table, ratios, table

ALL = "atlantis,pgqueuer,procrastinate,chancy,rq,celery"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=None, help="default 20000 (2000 --quick)")
    parser.add_argument("--systems", default=None,
                        help=f"comma-separated subset (names or keys such as atlantis-reuse-c8; "
                        f"default {ALL}; with --pairs, default {','.join(TRIO)})")
    parser.add_argument("--timeout", type=float, default=None,
                        help="give up on a drain after this many seconds (default max(180, "
                        "jobs/20): RQ runs ~45 jobs/s here)")
    parser.add_argument("--poll", type=float, default=0.02)
    parser.add_argument("--latency-jobs", type=int, default=None,
                        help="jobs of each idle latency run (default 300, 50 --quick; 0: none)")
    parser.add_argument("--backlog", action="store_true",
                        help="atlantis reuse c8 drains with 10k, 100k and 200k waiting")
    parser.add_argument("--targets", action="store_true", help="run the whole target table")
    parser.add_argument("--no-standing", action="store_true",
                        help="--targets without the backlog sweep and the memory run (the "
                        "standing targets of earlier rounds; about 4 minutes)")
    parser.add_argument("--leases", action="store_true",
                        help="only the many-leases run (500 sleeping jobs) of the target table")
    parser.add_argument("--pairs", type=int, default=0, metavar="N",
                        help="only N paired rounds of the --systems (default "
                        f"{','.join(TRIO)}), taking turns: A B C, C B A, ... (the ratios that "
                        "the machine's drift spares)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--atlantis-args", default="",
                        help='extra atlantis-supervise options, e.g. "--claim-ahead 8"')
    opts = parser.parse_args()

    jobs = opts.jobs or (2000 if opts.quick else 20000)
    latency = opts.latency_jobs if opts.latency_jobs is not None else (50 if opts.quick else 300)
    env = Env(opts.poll, opts.timeout)
    env.atlantis_args = shlex.split(opts.atlantis_args)
    try:
        if opts.targets:
            targets.main(env, jobs, latency, opts.quick, standing=not opts.no_standing)
            return
        if opts.leases:
            targets.leases_only(env, opts.quick)
            return
        if opts.pairs:
            keys = [s.key for s in pick(_split(opts.systems))] if opts.systems else list(TRIO)
            rounds = paired(env, keys, jobs, opts.pairs)
            print("\n" + header(env, f"{jobs:,} no-op jobs, paired rounds") + "\n")
            print(paired_table(rounds, keys))
            return
        if opts.backlog:
            results = targets.backlog(env, targets.backlog_sizes(opts.quick))
            print("\n" + header(env, "atlantis reuse c8 by backlog") + "\n")
            print(table(results))
            return
        results = compare(env, set(_split(opts.systems or ALL)), jobs, latency, 0.02)
        print("\n" + header(env, f"{jobs:,} no-op jobs, one worker") + "\n")
        print(f"jobs/s = N / (first pickup seen to all done seen, polled every "
              f"{opts.poll * 1000:.0f} ms); CPU = psutil over that window; pickup latency "
              f"from a separate idle run of {latency} jobs enqueued one at a time, 20 ms "
              "apart\n")
        print(table(results))
        print("\n" + ratios(results))
        print(targets.readme_section(results))
        print(f"\nworker logs: {env.logdir}")
    finally:
        env.close()


def _split(systems: str) -> list[str]:
    return [s.strip() for s in systems.split(",") if s.strip()]


if __name__ == "__main__":
    main()
