"""The console's database access and the documents it serves.

Every read and write is a function of the store layer run on a pooled connection in a
worker thread (the store is synchronous; the server is not). Documents are built here once
for the API, the pages and the event streams: the row's columns, the computed fields, and
args with the ``--args-redact`` keys hidden.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import anyio.to_thread
import orjson
import psycopg
from psycopg_pool import ConnectionPool

from atlantis.console.settings import REDACTED
from atlantis.presentation import job_document, json_default, read_handler_steps, suspension_text
from atlantis.store import admin, liveness
from atlantis.store import console_queries as store
from atlantis.store.typed_rows import as_dict
from atlantis.store.workflows import Workflow

T = TypeVar("T")
Conn = psycopg.Connection[Any]

#: How many of a job's children its page lists (then "and N more").
CHILDREN_SHOWN = 100


class Database:
    """A small pool of autocommit connections (each call is its own transaction)."""

    def __init__(self, url: str, *, max_size: int = 4) -> None:
        self.pool = ConnectionPool(url, min_size=1, max_size=max_size, open=False,
                                   kwargs={"autocommit": True,
                                           "application_name": "atlantis-console",
                                           # works through PgBouncer in transaction mode
                                           "prepare_threshold": None})

    def open(self) -> None:
        self.pool.open(wait=False)

    def close(self) -> None:
        self.pool.close()

    def call(self, fn: Callable[[Conn], T]) -> T:
        with self.pool.connection(timeout=10) as conn:
            return fn(conn)

    async def run(self, fn: Callable[[Conn], T]) -> T:
        return await anyio.to_thread.run_sync(self.call, fn)


def dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, default=json_default, option=orjson.OPT_NON_STR_KEYS)


def redact(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with the value of every object key in ``keys`` (at any depth) hidden."""
    if not keys:
        return value
    if isinstance(value, dict):
        return {k: (REDACTED if k in keys else redact(v, keys)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, keys) for v in value]
    return value


def redact_held(held: str | None, keys: frozenset[str]) -> str | None:
    """What holds a job (``atlantis.limit_hold``) with the value of every ``by`` field in
    ``keys`` hidden: ``concurrency 1 by account_id=[redacted]`` (a value runs up to the next
    ``, field=``, the label's closing backtick, ``: next start in`` or the next hold)."""
    if held is None:
        return None
    for key in keys:
        if f"{key}=" in held:
            # re.sub reads a template: a \ in it is kept as is.
            hidden = f"{key}={REDACTED}".replace("\\", "\\\\")
            held = re.sub(rf"(?<![\w.]){re.escape(key)}=.*?"
                          r"(?=, [A-Za-z_]\w*=|`|: next start in |; |$)", hidden, held)
    return held


def _seconds(a: datetime | None, b: datetime) -> float | None:
    return None if a is None else round((a - b).total_seconds(), 3)


def job_doc(row: admin.JobRow, keys: frozenset[str],
            attempts: list[admin.AttemptRow] | None = None) -> dict[str, Any]:
    """The API's job: every column, ``rate`` (pct/min), ``eta_seconds``, ``stalled``,
    ``stall_after``, and for reading ages without a clock of one's own: ``now`` (the
    database's clock), ``lease_expires_in``, ``since_checkpoint``, ``since_renewal`` (seconds)
    and ``holder`` (``{"host", "pid"}`` of the lease holder)."""
    doc = job_document(row)
    doc["args"] = redact(doc["args"], keys)
    doc["result"] = redact(doc.get("result"), keys)
    now = row.db_now
    doc["now"] = now
    running = row.running
    doc["lease_expires_in"] = _seconds(row.claimed_until, now) if running else None
    last = row.last_checkpoint
    doc["since_checkpoint"] = (None if last is None or not running
                               else round((now - last).total_seconds(), 3))
    renewal = row.last_renewal
    doc["since_renewal"] = (None if renewal is None or not running
                            else round((now - renewal).total_seconds(), 3))
    holder = row.holder
    doc["holder"] = None if holder is None else {"host": holder[0], "pid": holder[1]}
    if attempts is not None:
        doc["attempts"] = [as_dict(a) for a in attempts]
    return doc


def job_page_doc(conn: Conn, row: admin.JobRow, keys: frozenset[str],
                 attempts: list[admin.AttemptRow] | None = None) -> dict[str, Any]:
    """One job's document as its page, ``GET /api/jobs/{id}`` and its stream carry it:
    :func:`job_doc` and the job's handler steps (``handler_steps``, ``suspended_for``,
    ``suspended_until``, ``children``: ``tide job status --json``'s), and ``suspension``:
    what a suspended job waits for as the page says it (``{"label": "waiting", "text": "for
    event approved"}``, :func:`atlantis.presentation.suspension_text`; null unless
    suspended), which the page's live updates show as sent; and its holder's liveness
    (``holder_silent``, ``holder_silent_seconds``, ``lease_ends_in_seconds``:
    :func:`atlantis.store.liveness.holder_document`, ``tide job status --json``'s). Not in
    listings: queries more."""
    doc = job_doc(row, keys, attempts)
    doc.update(read_handler_steps(conn, row))
    doc.update(liveness.holder_document(
        liveness.job_holder(conn, row.id) if row.running else None))
    waits = doc["suspended_for"]
    if waits:
        label, text = suspension_text(waits)
        doc["suspension"] = {"label": label, "text": text}
    else:
        doc["suspension"] = None
    return doc


def children_of(conn: Conn, doc: dict[str, Any]) -> dict[str, Any]:
    """What the page lists of the children of the job of ``doc`` (:func:`job_page_doc`):
    ``rows``, the first :data:`CHILDREN_SHOWN` (``{"id", "job", "state"}``, oldest first),
    ``total``, ``more`` (how many are not listed), ``counts`` by state in the order of a
    job's life (``[(state, count)]``) and their :func:`counts_key`."""
    counts: dict[str, int] = doc["children"]
    rows = ([as_dict(c) for c in store.job_children(conn, doc["id"], limit=CHILDREN_SHOWN)]
            if counts else [])
    order = [s for s in admin.STATES if s in counts] + sorted(set(counts) - set(admin.STATES))
    total = sum(counts.values())
    return {"rows": rows, "more": max(total - len(rows), 0), "total": total,
            "counts": [(s, counts[s]) for s in order], "key": counts_key(counts)}


def counts_key(counts: dict[str, int]) -> str:
    """Children's counts as one string (``complete=5 running=2``) the page keeps, and its
    script writes the same way, to tell when they changed (then it reads the list again)."""
    return " ".join(f"{s}={n}" for s, n in sorted(counts.items()))


def workflow_doc(found: Workflow, keys: frozenset[str]) -> dict[str, Any]:
    """The API's workflow: ``tide workflow status --json``'s document with the args' hidden
    keys redacted, and ``now`` (the database's clock) to read the steps' ages against."""
    doc = found.document()
    doc["args"] = redact(doc["args"], keys)
    doc["now"] = found.row.db_now
    return doc


def sparkline(values: list[float], width: int = 120, height: int = 24,
              top: float | None = None) -> str:
    """SVG polyline points for ``values`` spread over ``width`` (empty: nothing to draw)."""
    if not values:
        return ""
    peak = top if top is not None else max(max(values), 1.0)
    step = width / max(len(values) - 1, 1)
    points = []
    for i, v in enumerate(values):
        y = height - (min(v, peak) / peak) * (height - 2) - 1
        points.append(f"{i * step:.1f},{y:.1f}")
    if len(points) == 1:
        points.append(f"{width:.1f},{points[0].split(',')[1]}")
    return " ".join(points)
