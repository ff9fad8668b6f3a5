"""The app of ``python -m benchmarks.events`` (issue 35): ``events.atl``'s job on the queue
``bench``.

- ``events.Wait``: ``ctx.wait_for_event("go", "go")``, no timeout. Right after the wait
  returns, the run writes a row to ``bench_event_resumed``: PostgreSQL's
  ``clock_timestamp()`` (on a connection this process opened before the wait, so no connect
  is counted), ``time.time()`` just after the wait returned and at the run's first line.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

import atlantis

registry = atlantis.Registry.from_atl("events.atl")

RESUMED_DDL = """
CREATE TABLE IF NOT EXISTS bench_event_resumed (
    key text NOT NULL,
    resumed timestamptz NOT NULL,
    started double precision NOT NULL,
    returned double precision NOT NULL
)
"""

_conns: dict[str, psycopg.Connection[Any]] = {}


def _connection(url: str) -> psycopg.Connection[Any]:
    """This process's own autocommit connection to ``url`` (kept across runs)."""
    conn = _conns.get(url)
    if conn is None or conn.closed:
        conn = _conns[url] = psycopg.connect(url, autocommit=True)
    return conn


@registry.handler("events.Wait")
def wait(ctx: atlantis.JobContext, args: Any) -> Any:
    started = time.time()
    assert ctx.database_url is not None
    conn = _connection(ctx.database_url)  # opened before the wait: not in what is measured
    payload = ctx.wait_for_event("go", "go")  # raises atlantis.Suspended until "go" comes
    returned = time.time()
    conn.execute("INSERT INTO bench_event_resumed VALUES (%s, clock_timestamp(), %s, %s)",
                 (args.key, started, returned))
    return payload
