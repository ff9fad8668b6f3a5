"""Handler steps (issue 34, "Numbers"): what ``ctx.run_step``, ``ctx.transaction`` and
``ctx.sleep`` cost, with real supervisors on scratch databases of the embedded server.

    python -m benchmarks.steps [--steps 10000] [--hold-at 9000] [--accounts 8]
        [--contacts 5000] [--import-rounds 4] [--page-delays 0,0.01] [--sleepers 10000]
        [--jobs 20000] [--rounds 4] [--parts commits,resume,import,asleep]

Every part starts ``atlantis-supervise --queue bench --app benchmarks.steps_app:registry
--isolation reuse`` (``--concurrency 8``; the import ``--import-concurrency 4``) and stops it
by its pid; the handlers are ``benchmarks/steps_app.py``'s.

1. **commits**: a ``bench.NoopSteps`` job of N no-op steps, then one of 0 steps that waits
   as long, each alone in a supervisor's life: the database's committed transactions
   (``pg_stat_database.xact_commit``, read from another database once the supervisor's
   backends are gone, less this script's own). Commits a step = (commits of N − commits of
   0) / N (target: at most 1; the run's one read of its records adds 1, the supervisor's
   own commits a few either way). The same job's **steps/s** over its steps 1.. (by the
   handler's clock; target at least 1,000), their CPU in the child and in its backend, and
   two floors from this process: a step's record (``atlantis.record_step``, for a job row
   set running by hand) and a one-row INSERT, each an autocommit statement.
2. **resume**: a job of N steps whose first run holds after step ``--hold-at``; the
   supervisor is killed (SIGKILL, its pid), another started: seconds from the new run's
   start (the handler's first line) to step ``--hold-at`` returning (target: at most 1 s),
   split into the first step (connect, every record read) and the rest.
3. **import**: the guide's contact import (``examples/contacts``, a fake CRM in this process
   answering at once, ``--contacts`` a account, 100 a page) of ``--accounts`` accounts,
   written as the guide writes it (``bench.ImportState``: a state table) and with one
   transaction step a page (``bench.ImportSteps``); rounds taking turns, each on a fresh
   database: seconds from the first claim to the last finish (the jobs' own timestamps).
   Target: the steps at least as fast (ratio state ÷ steps at least 1). Once for each of
   ``--page-delays`` (default ``0,0.01``): a CRM answering at once (the run is bound by
   the CPU, the harshest case for the steps' fence and record) and one taking 10 ms a
   page, as the example's own fake CRM does by default (a slow upstream: the guide's
   subject). After the CPU-bound one, one page's writes (100 upserts) from this process, on
   a connection with psycopg's defaults and on one with the step connection's options
   (nothing prepared).
4. **asleep**: ``--sleepers`` ``bench.Asleep`` jobs put to sleep for an hour (a supervisor
   runs each once), then ``--jobs`` ``bench.Noop`` drained beside them against the same
   drain on a database without them; both databases kept across the rounds, which take
   turns, after a warm-up drain of N/4 on each (not counted). Rate = N over first claim to
   last finish. Target: at least 0.95x.

Benchmarks, not tests: nothing is asserted; a target not met is printed as **missed**.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from typing import Any

import psycopg

import atlantis
from atlantis.store.database import resolve_url
from benchmarks.runs import stop
from benchmarks.scratch import scratch_database
from benchmarks.steps_harness import (
    LOGS,
    Poller,
    header,
    prepare,
    say,
    start,
    supervising,
    verdict,
)
from benchmarks.steps_parts import asleep_part, import_part
from benchmarks.tables import markdown


def dbname(url: str) -> str:
    return url.split("@/", 1)[1].split("?", 1)[0]


def commits(url: str) -> int:
    """The database's committed transactions, once none of its backends is left (read
    from the admin database, so the reading adds none)."""
    name = dbname(url)
    with psycopg.connect(resolve_url(None), autocommit=True) as admin:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                (name,)).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.05)
        admin.execute("SELECT pg_stat_clear_snapshot()")
        row = admin.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                            (name,)).fetchone()
    assert row is not None
    return int(row[0])


def steps_job(url: str, key: str, steps: int, hold_at: int = -1, wait: float = 0.0) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return atlantis.enqueue(conn, "bench.NoopSteps",
                                {"key": key, "n": steps, "hold_at": hold_at, "wait": wait})


DONE = "SELECT state FROM atlantis.jobs WHERE id = %s"
RESULT = "SELECT result::text FROM atlantis.jobs WHERE id = %s"


def one_job(url: str, steps: int, concurrency: int, wait: float = 0.0
            ) -> tuple[int, dict[str, Any]]:
    """Run one job of ``steps`` no-op steps (then ``wait`` seconds) alone in a supervisor's
    life: (its commits less this script's polls and the handler's CPU probe, its result)."""
    import orjson

    before = commits(url)
    job = steps_job(url, f"commits-{steps}", steps, wait=wait)
    poller = Poller(url)
    with supervising(url, concurrency) as proc:
        poller.until(DONE, (job,), lambda s: s in ("complete", "dead"), proc,
                     timeout=max(120.0, steps / 50))
        result = poller.one(RESULT, (job,))
    poller.close()
    used = commits(url) - before - poller.statements - 1  # the enqueue's own commit
    return used - (1 if steps else 0), orjson.loads(result or "{}")


def floors(url: str, count: int = 2000) -> tuple[float, float]:
    """Seconds of one autocommit statement from this process, a commit each: a one-row
    INSERT, and a step's record (``atlantis.record_step``, as the child sends it) for a job
    row set running by hand."""
    from atlantis.store import steps as store

    job = steps_job(url, "floor", 0)
    with psycopg.connect(url, **store.CONNECT_OPTIONS) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (n int, v jsonb)")
        started = time.perf_counter()
        for n in range(count):
            conn.execute("INSERT INTO bench_floor VALUES (%s, 'null')", (n,))
        insert = (time.perf_counter() - started) / count
        row = conn.execute(
            "UPDATE atlantis.jobs SET state = 'running', attempt = 1, run_id = gen_random_uuid(),"
            " claimed_by = 'benchmarks.steps', claimed_until = now() + interval '1 hour', "
            "started_at = now() WHERE id = %s RETURNING run_id::text", (job,)).fetchone()
        assert row is not None
        fence = store.Fence(job, row[0], 1)
        started = time.perf_counter()
        for n in range(count):
            store.record(conn, fence, f"s-{n}", "step", "null")
        return insert, (time.perf_counter() - started) / count


def commits_part(steps: int, concurrency: int) -> list[str]:
    with scratch_database("atl_steps") as url:
        prepare(url)
        say(f"commits: a job of {steps:,} steps, then one of 0 steps that lasts as long ...")
        used, result = one_job(url, steps, concurrency)
        run = result["last"] - result["started"]
        base, _ = one_job(url, 0, concurrency, wait=run)
        insert, record = floors(url)
    per_step = (used - base) / steps
    loop = result["last"] - result["first_done"]
    rate = (steps - 1) / loop
    ms = loop / (steps - 1) * 1000
    child, backend = result["child_cpu"], result["backend_cpu"]
    split = (f"child {child / (steps - 1) * 1000:.3f} ms, its backend "
             + (f"{backend / (steps - 1) * 1000:.3f} ms" if backend is not None else "?"))
    rows = [["measure", "value", "target"],
            [f"commits, job of 0 steps lasting {run:.2f} s (the supervisor's life)",
             f"{base:,}", ""],
            [f"commits, job of {steps:,} steps", f"{used:,} ({used - base - steps:+,} beside "
             "one a step)", ""],
            ["commits a step", f"**{per_step:.4f}**",
             f"≤ 1, to 2 decimals: {verdict(round(per_step, 2) <= 1)}"],
            [f"steps/s, steps 1..{steps - 1:,}", f"**{rate:,.0f}** ({ms:.3f} ms a step)",
             f"≥ 1,000: {verdict(rate >= 1000)}"],
            ["CPU a step", split, ""],
            ["step 0 (connect, records read)",
             f"{(result['step0_done'] - result['first']) * 1000:.1f} ms", ""],
            ["floor: a step's record from this process (`atlantis.record_step`)",
             f"{record * 1000:.3f} ms ({1 / record:,.0f}/s)", ""],
            ["floor: a one-row INSERT from this process",
             f"{insert * 1000:.3f} ms ({1 / insert:,.0f}/s)", ""]]
    return ["### commits and steps/s", markdown(rows)]


def events(url: str, key: str) -> list[tuple[str, int, float, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [(str(r[0]), int(r[1]), float(r[2]), float(r[3])) for r in conn.execute(
            "SELECT event, attempt, started, at FROM bench_step_events WHERE key = %s "
            "ORDER BY at", (key,))]


def resume_part(steps: int, hold_at: int, concurrency: int) -> list[str]:
    import orjson

    with scratch_database("atl_steps") as url:
        prepare(url)
        job = steps_job(url, "resume", steps, hold_at)
        poller = Poller(url)
        held = "SELECT count(*) FROM bench_step_events WHERE key = 'resume' AND event = 'held'"
        first = start(url, concurrency, name="killed")
        try:
            poller.until(held, None, lambda n: n >= 1, first, timeout=max(120.0, steps / 50))
            say(f"resume: the first run holds after step {hold_at:,}: kill -9 the supervisor")
            os.kill(first.pid, signal.SIGKILL)
            first.wait(30)
            second_at = time.time()
            with supervising(url, concurrency) as proc:
                poller.until(DONE, (job,), lambda s: s in ("complete", "dead"), proc,
                             timeout=max(120.0, steps / 50))
                result = orjson.loads(poller.one(RESULT, (job,)) or "{}")
                records = poller.one("SELECT count(*) FROM atlantis.job_steps "
                                     "WHERE job_id = %s", (job,))
        finally:
            stop(first)
            with contextlib.suppress(ProcessLookupError):  # what the killed one left (its own group)
                os.killpg(first.pid, signal.SIGKILL)
            poller.close()
        reached = [e for e in events(url, "resume") if e[0] == "reached"]
    again = reached[-1]
    took = again[3] - again[2]
    opened = result["first_done"] - result["started"]
    rows = [["measure", "value", "target"],
            [f"new run's start to step {hold_at:,} again", f"**{took:.3f} s**",
             f"≤ 1 s: {verdict(took <= 1.0)}"],
            ["of which the first step (connect, every record read)", f"{opened:.3f} s", ""],
            [f"of which steps 1..{hold_at:,} from the records", f"{again[3] - result['first_done']:.3f} s",
             ""],
            ["new supervisor's start to the new run's start (lease expiry, rescue, claim)",
             f"{again[2] - second_at:.2f} s", ""],
            ["step bodies run by the new run", f"{result['bodies']:,} "
             f"(records: {records:,} of {steps:,} steps)", ""]]
    return ["### resume after kill -9", markdown(rows)]


PARTS = ("commits", "resume", "import", "asleep")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.steps",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--steps", type=int, default=10000, help="no-op steps of one job")
    parser.add_argument("--hold-at", type=int, default=None,
                        help="the step the resume's first run is killed after (default 90%%)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--accounts", type=int, default=8, help="imports of a round")
    parser.add_argument("--contacts", type=int, default=5000, help="contacts an account")
    parser.add_argument("--import-rounds", type=int, default=4)
    parser.add_argument("--import-concurrency", type=int, default=4)
    parser.add_argument("--page-delays", default="0,0.01",
                        help="seconds the fake CRM takes to answer a page, one import part "
                             "for each (0: bound by the CPU)")
    parser.add_argument("--sleepers", type=int, default=10000, help="jobs asleep beside")
    parser.add_argument("--jobs", type=int, default=20000, help="plain jobs a drain beside")
    parser.add_argument("--rounds", type=int, default=4, help="drains with and without")
    parser.add_argument("--parts", default=",".join(PARTS), help="of " + ",".join(PARTS))
    opts = parser.parse_args(argv)
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        parser.error(f"--parts: {', '.join(sorted(set(parts) - set(PARTS)))} is not one of "
                     + ", ".join(PARTS))
    hold_at = opts.hold_at if opts.hold_at is not None else opts.steps * 9 // 10
    if not 0 <= hold_at < opts.steps:
        parser.error("--hold-at must be a step of the job (0 <= hold-at < steps)")
    if opts.steps < 2 or min(opts.accounts, opts.contacts, opts.import_rounds, opts.sleepers,
                             opts.jobs, opts.rounds, opts.concurrency) < 1:
        parser.error("--steps must be at least 2, every other count at least 1")
    try:
        delays = [float(d) for d in opts.page_delays.split(",") if d.strip()]
    except ValueError:
        parser.error(f"--page-delays: {opts.page_delays!r} is not a list of seconds (0,0.01)")
    if not delays or min(delays) < 0:
        parser.error("--page-delays needs at least one delay, none negative")
    out: list[str] = []
    if "commits" in parts:
        out += commits_part(opts.steps, opts.concurrency)
    if "resume" in parts:
        out += resume_part(opts.steps, hold_at, opts.concurrency)
    if "import" in parts:
        for delay in delays:
            out += import_part(opts.accounts, opts.contacts, opts.import_rounds,
                               opts.import_concurrency, delay)
    if "asleep" in parts:
        out += asleep_part(opts.sleepers, opts.jobs, opts.rounds, opts.concurrency)
    print("\n" + header() + "\n")
    print("\n\n".join(out))
    print(f"\nsupervisor logs: {LOGS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
