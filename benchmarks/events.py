"""Events (issue 35): how fast ``atlantis.send_event`` resumes a job suspended in
``ctx.wait_for_event``, and what jobs waiting for events cost while they wait, with one real
supervisor on scratch databases of the embedded server.

    python -m benchmarks.events [--jobs 200] [--waiting 10000] [--idle 30]
        [--parts latency,idle]

Every part starts ``atlantis-supervise --queue bench --app benchmarks.events_app:registry
--isolation reuse --concurrency 8`` (``--isolation fresh`` with that option) and stops it
by its pid; the handler is
``benchmarks/events_app.py``'s ``events.Wait`` (waits for the event ``go``, then writes the
moment its wait returned).

1. **latency**: ``--jobs`` jobs (and 5 more first, not counted) put to sleep in their wait;
   then, one at a time: ``send_event`` and commit, ``clock_timestamp()`` read just after the
   commit on the same connection, and the time to the resumed handler's
   ``clock_timestamp()`` right after its wait returned (a connection the handler's process
   opened before the wait). Each job is let finish before the next event. p50 and p99
   (targets: p50 at most 20 ms, p99 at most 100 ms), split by the handler's clock into
   send → the new run's first line (wake, NOTIFY, claim, dispatch) and first line → wait
   returned (the step's read and the event's consumption).
2. **idle**: the supervisor's CPU (psutil: the supervisor, its children, and the database's
   backends serving the scratch database) over ``--idle`` seconds with no job, then
   ``--waiting`` jobs put to sleep in their wait (the rate at which they suspended: from the
   enqueue's commit to the last wait's record), then the same window again with them all
   waiting. The two should be alike: waiting jobs cost nothing.

Benchmarks, not tests: nothing is asserted; a target not met is printed as **missed**.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import psycopg

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.database import resolve_url
from benchmarks.measure import CpuMeter, percentile
from benchmarks.runs import stop
from benchmarks.scratch import scratch_database
from benchmarks.steps_harness import LOGS, ROOT, SUPERVISE, Poller, checkpoint, header, verdict
from benchmarks.tables import markdown

APP = "benchmarks.events_app:registry"
WARMUP = 5
SUSPENDED = ("SELECT count(*) FILTER (WHERE state = 'available' AND suspended_for = "
             "'event:go'), count(*) FILTER (WHERE state = 'dead') FROM atlantis.jobs")
DONE = "SELECT state FROM atlantis.jobs WHERE id = %s"
RESUMED = ("SELECT coalesce((SELECT 'resumed' FROM bench_event_resumed WHERE key = %s), "
           "(SELECT state FROM atlantis.jobs WHERE id = %s AND state = 'dead'))")
SETTLED = ("SELECT count(*) FROM atlantis.jobs WHERE state = 'dead' OR (state = 'available' "
           "AND suspended_for = 'event:go')")
ERRORS = ("SELECT count(*), min(last_error) FROM atlantis.jobs WHERE state = 'dead' "
          "AND id = ANY(%s)")


def say(text: str) -> None:
    import sys

    print(f"events: {text}", file=sys.stderr, flush=True)


def prepare(url: str) -> None:
    from benchmarks.events_app import RESUMED_DDL

    with psycopg.connect(url) as conn:
        migrate(conn)
        app = load_app(APP)
        sync(conn, list(app.decls.values()), workflows=list(app.workflows.values()))
        conn.execute(RESUMED_DDL)
        conn.commit()


def start(url: str, concurrency: int, isolation: str) -> subprocess.Popen[bytes]:
    log = LOGS / f"events-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SUPERVISE), "--queue", "bench", "--app", APP, "--database-url", url,
             "--concurrency", str(concurrency), "--isolation", isolation],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def put_to_sleep(url: str, poller: Poller, proc: subprocess.Popen[bytes], prefix: str,
                 count: int) -> tuple[list[int], float]:
    """Enqueue ``count`` jobs and wait until each waits for its event (or is dead): (their
    ids, seconds from the enqueue's commit to the last wait's record, by PostgreSQL's
    clock)."""
    row = poller.conn.execute(SUSPENDED).fetchone()
    assert row is not None
    before = row[0] + row[1]
    with psycopg.connect(url) as conn:
        ids = atlantis.enqueue_many(conn, "events.Wait",
                                    [{"key": f"{prefix}-{i}"} for i in range(count)])
        conn.commit()
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    poller.until(SETTLED, None,
                 lambda n: n >= before + count, proc, timeout=max(120.0, count / 20), poll=0.1)
    last = poller.one("SELECT max(recorded_at) FROM atlantis.job_steps WHERE job_id = ANY(%s)",
                      (ids,))
    return ids, (last - row[0]).total_seconds()


def resume_each(url: str, poller: Poller, proc: subprocess.Popen[bytes], ids: list[int],
                prefix: str) -> dict[str, tuple[float, float]]:
    """Send ``go`` to each job in turn and let it finish: key -> (the send's commit by
    PostgreSQL's clock, and by this process's clock)."""
    sent: dict[str, tuple[float, float]] = {}
    with psycopg.connect(url) as conn:
        for i, job in enumerate(ids):
            key = f"{prefix}-{i}"
            try:
                atlantis.send_event(conn, job, "go", {"i": i})
            except atlantis.JobEndedError:  # it died putting itself to sleep
                conn.rollback()
                continue
            conn.commit()
            wall = time.time()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            conn.commit()
            assert row is not None
            sent[key] = (float(row[0]), wall)
            poller.until(RESUMED, (key, job), lambda r: r is not None, proc, timeout=60,
                         poll=0.002)
            poller.until(DONE, (job,), lambda s: s in ("complete", "dead"), proc, timeout=60,
                         poll=0.002)
    return sent


def ms(value: float | None) -> str:
    return "?" if value is None else f"{value * 1000:.1f} ms"


def dead(poller: Poller, ids: list[int]) -> str:
    row = poller.conn.execute(ERRORS, (ids,)).fetchone()
    assert row is not None
    return "none" if not row[0] else f"**{row[0]:,}** (e.g. `{str(row[1])[:90]}`)"


def latency_part(jobs: int, concurrency: int, isolation: str) -> list[str]:
    with scratch_database("atl_events") as url:
        prepare(url)
        checkpoint()
        poller = Poller(url)
        proc = start(url, concurrency, isolation)
        try:
            ids, took = put_to_sleep(url, poller, proc, "lat", WARMUP + jobs)
            asleep = dead(poller, ids)
            say(f"latency: {len(ids)} jobs waiting ({len(ids) / took:,.0f}/s); "
                "sending their events one at a time ...")
            sent = resume_each(url, poller, proc, ids, "lat")
            died = dead(poller, ids)
        finally:
            stop(proc)
            poller.close()
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute("SELECT key, extract(epoch FROM resumed)::float8, started, "
                                "returned FROM bench_event_resumed").fetchall()
    counted = {f"lat-{i}" for i in range(WARMUP, WARMUP + jobs)}
    db, wall, wake, consume = [], [], [], []
    for key, resumed, started, returned in rows:
        if key in counted:
            db.append(resumed - sent[key][0])
            wall.append(returned - sent[key][1])
            wake.append(started - sent[key][1])
            consume.append(returned - started)
    p50, p99 = percentile(db, 50), percentile(db, 99)
    table = [["measure", "p50", "p99", "max", "target"],
             [f"send's commit → resumed wait returned (PostgreSQL's clock, {len(db)} jobs)",
              f"**{ms(p50)}**", f"**{ms(p99)}**", ms(max(db, default=None)),
              f"p50 ≤ 20 ms: {verdict(p50 is not None and p50 <= 0.020)}; "
              f"p99 ≤ 100 ms: {verdict(p99 is not None and p99 <= 0.100)}"],
             ["the same by the handler's clock (`time.time()`)", ms(percentile(wall, 50)),
              ms(percentile(wall, 99)), ms(max(wall, default=None)), ""],
             ["of which send → the new run's first line (wake, NOTIFY, claim, dispatch)",
              ms(percentile(wake, 50)), ms(percentile(wake, 99)), ms(max(wake, default=None)),
              ""],
             ["of which first line → wait returned (step read, event consumed)",
              ms(percentile(consume, 50)), ms(percentile(consume, 99)),
              ms(max(consume, default=None)), ""]]
    notes = [f"`--isolation {isolation}`. Jobs dead while putting them to sleep: {asleep}; "
             f"dead in all, by the end: {died}."]
    return ["### event → resume latency", markdown(table), *notes]


def idle_cpu(proc: subprocess.Popen[bytes], url: str, seconds: float) -> tuple[float, float,
                                                                               float]:
    """CPU seconds over ``seconds`` of the supervisor, its children, and the scratch
    database's backends (sampled each second from the admin database)."""
    name = url.split("@/", 1)[1].split("?", 1)[0]
    with psycopg.connect(resolve_url(None), autocommit=True) as admin:
        def backends() -> list[int]:
            return [int(r[0]) for r in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND "
                "application_name NOT LIKE 'benchmarks%%'", (name,))]

        meter = CpuMeter(proc.pid, backends)
        meter.begin()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            meter.sample()
        used = meter.end()
    return used.worker, used.children, used.store


def idle_part(waiting: int, seconds: float, settle: float, concurrency: int,
              isolation: str) -> list[str]:
    with scratch_database("atl_events") as url:
        prepare(url)
        checkpoint()
        poller = Poller(url + ("&" if "?" in url else "?") + "application_name=benchmarks")
        proc = start(url, concurrency, isolation)
        try:
            poller.until("SELECT count(*) FROM atlantis.workers", None, lambda n: n >= 1,
                         proc, timeout=60, poll=0.1)
            time.sleep(settle)
            say(f"idle: {seconds:.0f} s with no job ...")
            none = idle_cpu(proc, url, seconds)
            say(f"idle: putting {waiting:,} jobs to sleep in their wait ...")
            ids, took = put_to_sleep(url, poller, proc, "idle", waiting)
            died = dead(poller, ids)
            time.sleep(settle)
            say(f"idle: {seconds:.0f} s with {waiting:,} jobs waiting ...")
            busy = idle_cpu(proc, url, seconds)
        finally:
            stop(proc)
            poller.close()

    def row(label: str, cpu: tuple[float, float, float]) -> list[str]:
        total = sum(cpu)
        return [label, *(f"{c * 1000:.0f} ms" for c in cpu), f"**{total * 1000:.0f} ms**",
                f"{total / seconds * 100:.2f} %"]

    grew = sum(busy) - sum(none)
    table = [["idle window", "supervisor", "children", "its backends", "total CPU",
              "of one core"],
             row(f"{seconds:.0f} s, no job", none),
             row(f"{seconds:.0f} s, {waiting:,} jobs waiting for events", busy)]
    notes = [f"Putting them to sleep: {waiting:,} jobs suspended in {took:.1f} s "
             f"(**{waiting / took:,.0f} jobs/s**, enqueue's commit to the last wait's record). "
             f"Waiting jobs' extra CPU: {grew * 1000:+.0f} ms over {seconds:.0f} s "
             f"({grew / seconds * 100:+.2f} % of a core). `--isolation {isolation}`; jobs "
             f"dead instead of waiting: {died}."]
    return ["### idle with jobs waiting for events", markdown(table), *notes]


PARTS = ("latency", "idle")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.events",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=200, help="events sent, one at a time")
    parser.add_argument("--waiting", type=int, default=10000, help="jobs waiting, idle part")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of each idle window")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds let pass before each idle window")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--isolation", choices=("reuse", "fresh"), default="reuse")
    parser.add_argument("--parts", default=",".join(PARTS), help="of " + ",".join(PARTS))
    opts = parser.parse_args(argv)
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        parser.error(f"--parts: {', '.join(sorted(set(parts) - set(PARTS)))} is not one of "
                     + ", ".join(PARTS))
    if min(opts.jobs, opts.waiting, opts.concurrency) < 1 or opts.idle <= 0:
        parser.error("every count must be at least 1, --idle more than 0")
    out: list[str] = []
    if "latency" in parts:
        out += latency_part(opts.jobs, opts.concurrency, opts.isolation)
    if "idle" in parts:
        out += idle_part(opts.waiting, opts.idle, opts.settle, opts.concurrency,
                         opts.isolation)
    print("\n" + header() + "\n")
    print("\n\n".join(out))
    print(f"\nsupervisor logs: {LOGS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
