"""The app of ``python -m benchmarks.steps`` (issue 34): ``bench.atl``'s jobs and
``steps.atl``'s, all on the queue ``bench``.

- ``bench.NoopSteps``: ``n`` no-op ``ctx.run_step`` calls (``s-0`` ..); returns when its
  run started, when its first step began and returned (and the CPU probe after it) and its
  last ended (``time.time()``), how many step bodies this run ran, and (with ``hold_at``
  -1) the CPU seconds of its steps 1.. in the child and in its step connection's backend
  (found after step 0 on a connection of its own: one commit more); then it waits
  ``wait`` seconds. A run whose
  body of step ``hold_at`` ran (the first run to get there) writes ``held`` to
  ``bench_step_events`` and waits there to be killed; every run that gets past step
  ``hold_at`` writes ``reached`` with its start and that moment.
- ``bench.Asleep``: a durable sleep of ``seconds``.
- ``bench.ImportState``: the guide's contact import as the guide writes it
  (``examples.contacts.app.import_contacts``: a state table, one transaction per page).
- ``bench.ImportSteps``: the same import as the example writes it with one
  ``ctx.transaction`` per page (``examples.contacts.durable``: fetch, upsert the page's
  contacts, return the next cursor and the counters; no state table).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

import atlantis
from benchmarks.app import noop, sleep
from examples.contacts.app import import_contacts
from examples.contacts.durable import import_contacts_durable

registry = atlantis.Registry.from_atl("bench.atl", "steps.atl")

EVENTS_DDL = """
CREATE TABLE IF NOT EXISTS bench_step_events (
    key text NOT NULL,
    event text NOT NULL,
    attempt int NOT NULL,
    started double precision NOT NULL,
    at double precision NOT NULL
)
"""

registry.handler("bench.Noop")(noop)
registry.handler("bench.Sleep")(sleep)
registry.handler("bench.ImportState")(import_contacts)
registry.handler("bench.ImportSteps")(import_contacts_durable)


def _event(ctx: atlantis.JobContext, key: str, event: str, started: float, at: float) -> None:
    assert ctx.database_url is not None
    with psycopg.connect(ctx.database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO bench_step_events VALUES (%s, %s, %s, %s, %s)",
                     (key, event, ctx.attempt, started, at))


def _backend_cpu(ctx: atlantis.JobContext) -> tuple[str, float] | None:
    """The CPU seconds so far of this run's step connection's backend (its schedstat), or
    None where that cannot be read."""
    assert ctx.database_url is not None
    with psycopg.connect(ctx.database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                            "current_database() AND application_name = "
                            "'atlantis handler steps'").fetchall()
    if len(rows) != 1:
        return None
    path = f"/proc/{rows[0][0]}/schedstat"
    try:
        with open(path) as f:
            return path, int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _cpu_since(mark: tuple[str, float] | None) -> float | None:
    if mark is None:
        return None
    try:
        with open(mark[0]) as f:
            return int(f.read().split()[0]) / 1e9 - mark[1]
    except (OSError, ValueError, IndexError):
        return None


@registry.handler("bench.NoopSteps")
def noop_steps(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    started = time.time()
    ran = [0]
    first: float | None = None
    first_done: float | None = None
    step0_done: float | None = None
    mark: tuple[str, float] | None = None
    cpu = 0.0

    def body() -> None:
        ran[0] += 1

    for i in range(args.n):
        if first is None:
            first = time.time()
        before = ran[0]
        ctx.run_step(f"s-{i}", body)
        if i == 0:
            first_done = step0_done = time.time()
            if args.hold_at < 0:  # the commits part: where the time goes, from step 1 on
                mark, cpu = _backend_cpu(ctx), time.process_time()
                first_done = time.time()
        if i == args.hold_at:
            _event(ctx, args.key, "reached", started, time.time())
            if ran[0] > before:  # this run ran the body of step hold_at: wait to be killed
                _event(ctx, args.key, "held", started, time.time())
                end = time.monotonic() + 300
                while time.monotonic() < end and not ctx.cancelled:
                    time.sleep(0.05)
    last = time.time()
    time.sleep(args.wait)
    return {"started": started, "first": first, "step0_done": step0_done,
            "first_done": first_done, "last": last,
            "bodies": ran[0], "child_cpu": time.process_time() - cpu if mark else None,
            "backend_cpu": _cpu_since(mark)}


@registry.handler("bench.Asleep")
def asleep(ctx: atlantis.JobContext, args: Any) -> None:
    ctx.sleep("nap", args.seconds)
