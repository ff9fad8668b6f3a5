"""What ``tide`` and the console both show of the store's rows: one home for both.

The documents of ``tide ... --json`` and of the console's API (a job with its rate and ETA,
a supervisor with its memory, a log line), the rate and ETA themselves, and how values JSON
cannot carry are written. Pure functions of rows read by :mod:`atlantis.store.admin` and
:mod:`atlantis.store.fleet`; the estimate is :mod:`atlantis.progress`'s.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from atlantis import progress
from atlantis.store.admin import JobRow, LogLine
from atlantis.store.fleet import WorkerRow
from atlantis.store.typed_rows import as_dict


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
    """Rate (pct/min) and ETA of the job's attempt, from its checkpoint history."""
    return progress.estimate(job.progress_history, pct=job.progress_pct, at=job.progress_at,
                             now=job.db_now, running=job.running)


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
