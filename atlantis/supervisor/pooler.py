"""Connections that go through a pooler in transaction mode (PgBouncer): what changes.

Prepared statements: psycopg prepares a statement once a connection has run it
:data:`PREPARE_THRESHOLD` times, which spares PostgreSQL parsing and planning the claim,
renewal and finish statements again and again (measured with ``benchmarks.compare``, six
paired rounds: about 15% less server CPU per job; the jobs per second the same within
noise). Behind a pooler in transaction mode (PgBouncer 1.18, Debian's, has no prepared
statements there) the next transaction may run on a server connection that never saw the
statement: "prepared statement _pg3_0 does not exist". So a supervisor connection that goes
through one prepares nothing: when ``--pooled`` says so, or when :func:`behind_pooler`
finds it out.

LISTEN: notifications reach the server connection that listened, which a pooler in
transaction mode hands to other clients between transactions; they are lost. The LISTEN
connection goes to ``--listen-database-url`` (direct), or there is none (``--no-listen``),
and one found to go through a pooler all the same is given up for polling
(:mod:`atlantis.supervisor.control`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import psycopg

from atlantis.store import Q
from atlantis.store.database import redact

log = logging.getLogger("atlantis.supervisor")

PREPARE_THRESHOLD = 5
"""Executions of a statement on one connection before psycopg prepares it (its default)."""


async def behind_pooler(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn`` goes through a connection pooler rather than straight to PostgreSQL.

    A server process tells its client its own pid at start (with the key to cancel its
    statements); a pooler hands out keys of its own, since the server process behind a
    client changes, so the pid the client holds is not the one serving its statements.
    One round trip, once per connection.
    """
    cur = await conn.execute(Q.backend_pid, prepare=False)
    row = await cur.fetchone()
    return row is None or row[0] != conn.info.backend_pid


async def connect(url: str, role: str, budget: float, *, pooled: bool
                  ) -> tuple[psycopg.AsyncConnection[Any], bool]:
    """A supervisor's autocommit connection of ``role`` (budget: ``budget`` seconds), and
    whether it goes through a pooler, ``pooled`` (``--pooled``) or found so: then it prepares
    nothing, else it prepares what it runs :data:`PREPARE_THRESHOLD` times."""
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=max(2, math.ceil(budget)),
        application_name=f"atlantis-supervise:{role}",
        keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
        prepare_threshold=None,
    )
    try:
        found = pooled or await behind_pooler(conn)
    except BaseException:  # it answered the connection, not the question
        await conn.close()
        raise
    if not found:
        conn.prepare_threshold = PREPARE_THRESHOLD
    elif url not in _told:  # once per URL and process, not once per connection
        _told.add(url)
        log.info("%s goes through a connection pooler: no prepared statements", redact(url))
    return conn, found


_told: set[str] = set()
