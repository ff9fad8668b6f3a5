"""What ``tide`` and the console both show of the store's rows: one home for both.

The documents of ``tide ... --json`` and of the console's API (a job with its rate and ETA,
its handler steps and what it sleeps for, a supervisor with its memory, a log line, a handler
step's record), the rate and ETA themselves, and how values JSON cannot carry are written.
Pure functions of rows read by :mod:`atlantis.store.admin`, :mod:`atlantis.store.fleet` and
:mod:`atlantis.store.steps` (:func:`read_handler_steps` reads a job's for both); the estimate
is :mod:`atlantis.progress`'s.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import psycopg

from atlantis import progress
from atlantis.store import steps
from atlantis.store.admin import JobRow, LogLine
from atlantis.store.fleet import WorkerRow
from atlantis.store.typed_rows import as_dict

#: How many of a job's latest handler step records its status shows (``tide job steps``
#: lists them all).
LAST_STEPS = 5


def json_default(value: Any) -> Any:
    """What orjson cannot write itself, as tide and the console show it: times in ISO 8601,
    durations in seconds, decimals as numbers, sets and tuples as lists."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def job_estimate(job: JobRow) -> progress.Estimate:
    """Rate (pct/min) and ETA of the job's running attempt, from its checkpoint history
    since it started (none for a job not running)."""
    return progress.estimate(job.progress_history, pct=job.progress_pct, at=job.progress_at,
                             now=job.db_now, running=job.running, since=job.started_at)


def job_document(job: JobRow) -> dict[str, Any]:
    """Every column by name (``db_now`` left out) and the computed ``stalled``,
    ``stall_after``, ``rate`` (pct/min) and ``eta_seconds``, for ``--json`` and the API."""
    doc = as_dict(job)
    del doc["db_now"]
    guess = job_estimate(job)
    doc["rate"] = guess.rate
    doc["eta_seconds"] = guess.eta_seconds
    return doc


def worker_document(worker: WorkerRow) -> dict[str, Any]:
    """Every column by name (``db_now`` left out) and ``memory``, for ``--json`` and the API."""
    doc = as_dict(worker)
    del doc["db_now"]
    doc["memory"] = worker.memory
    return doc


def log_document(line: LogLine, *, job_id: int | None = None) -> dict[str, Any]:
    """A line an attempt wrote: ``id``, ``job_id`` (when given), ``run``, ``attempt``, ``at``,
    ``stream`` and ``line``."""
    doc: dict[str, Any] = {"id": line.id}
    if job_id is not None:
        doc["job_id"] = job_id
    doc.update(run=line.run, attempt=line.attempt, at=line.at, stream=line.stream,
               line=line.line)
    return doc


def handler_steps_document(summary: steps.StepSummary, asleep: steps.Suspension | None,
                           children: dict[str, int] | None = None) -> dict[str, Any]:
    """A job's handler steps, the fields ``tide job status --json`` and the console's job
    add: ``handler_steps`` (``{"records", "bytes", "last": [{"name", "kind", "bytes",
    "at"}]}``, the last few records oldest first), ``suspended_for`` (what an ``available``
    job that suspended itself waits for: ``sleep:<step>``; null otherwise) and
    ``suspended_until`` (when it runs again: its ``run_at``; null unless suspended, and for
    a wait for an event with no deadline), and ``children``: the jobs its handler spawned
    (``ctx.spawn``) by state (``{}`` when it has none)."""
    last = [{"name": r.get("name"), "kind": r.get("kind"), "bytes": r.get("bytes"),
             "at": _instant(r.get("at"))} for r in summary.last if isinstance(r, dict)]
    return {"handler_steps": {"records": summary.records, "bytes": summary.bytes,
                              "last": last},
            "suspended_for": asleep.suspended_for if asleep is not None else None,
            "suspended_until": (asleep.until if asleep is not None and asleep.until.year < 9999
                                else None),
            "children": dict(children or {})}


def read_handler_steps(conn: psycopg.Connection[Any], job: JobRow) -> dict[str, Any]:
    """:func:`handler_steps_document` of ``job``: its records' summary read (one statement),
    its suspension taken from the row (``suspended_for`` and ``run_at``, while available)."""
    asleep = (steps.Suspension(job.suspended_for, job.run_at)
              if job.state == "available" and job.suspended_for else None)
    return handler_steps_document(steps.step_summary(conn, job.id, LAST_STEPS), asleep,
                                  steps.children(conn, job.id))


def step_document(row: steps.StepRow) -> dict[str, Any]:
    """One handler step record (``tide job steps --json``): ``name``, ``kind`` (``step``,
    ``transaction`` or ``sleep``), ``recorded_at``, ``attempt``, ``bytes`` and ``value``,
    the recorded JSON value whole (a sleep's is ``{"until": wake time}``)."""
    return {"name": row.name, "kind": row.kind, "recorded_at": row.recorded_at,
            "attempt": row.attempt, "bytes": row.bytes, "value": orjson.loads(row.value)}


def sleep_step(suspended_for: str | None) -> str | None:
    """The handler step a job sleeps in (``suspended_for`` ``sleep:<step>``), else None."""
    if suspended_for is None or not suspended_for.startswith("sleep:"):
        return None
    return suspended_for[len("sleep:"):]


def suspension_text(suspended_for: str) -> tuple[str, str]:
    """What a suspended job waits for, as a person reads it: ``("asleep", "in handler step
    nap")`` for ``sleep:nap``; ``("waiting", "for event approved")`` for ``event:approved``;
    ``("waiting", "for the jobs of join all to end")`` for ``join:all``; ``("suspended",
    "for <what>")`` for anything else."""
    step = sleep_step(suspended_for)
    if step is not None:
        return "asleep", f"in handler step {step}"
    if suspended_for.startswith("event:"):
        return "waiting", f"for event {suspended_for[len('event:'):]}"
    if suspended_for.startswith("join:"):
        return "waiting", f"for the jobs of join {suspended_for[len('join:'):]} to end"
    return "suspended", f"for {suspended_for}"


def _instant(value: Any) -> Any:
    """A time the database wrote into JSON, as a datetime (left as it is if it is not one)."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).astimezone(UTC)
        except ValueError:
            return value
    return value
