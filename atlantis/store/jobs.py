"""The supervisor's rows, typed: what a claim, a renewal, a finish and a rescue return.

Read through ``psycopg.rows.class_row``: columns by name, never by position. The statements
themselves are in ``queries.sql``; the parameters of the batched ones are built here, so
that the column order of each ``unnest`` lives next to its statement's reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    job: str
    queue: str
    args: str
    """The row's args as JSON text, passed to the child untouched."""
    attempt: int
    max_attempts: int
    cancel_requested: bool
    timeout: float
    heartbeat: float
    backoff: float
    deadline: datetime
    run: int = 1
    """The job's run (1, then one more after each retry): with ``attempt``, which attempt
    this is; every write made for it is fenced on both."""


@dataclass(frozen=True, slots=True)
class RenewedRow:
    id: int
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class FinishedRow:
    id: int
    state: str


@dataclass(frozen=True, slots=True)
class RescuedRow:
    id: int
    state: str
    queue: str


@dataclass(frozen=True, slots=True)
class ReleasedRow:
    id: int


@dataclass(frozen=True, slots=True)
class AttemptStateRow:
    state: str
    attempt: int
    claimed_by: str | None
    run: int


@dataclass(frozen=True, slots=True)
class Progress:
    pct: float
    msg: str


@dataclass(frozen=True, slots=True)
class Renewal:
    job_id: int
    attempt: int
    progress: Progress | None
    run: int = 1


@dataclass(frozen=True, slots=True)
class Result:
    """One attempt's outcome as the finish statement writes it."""

    job_id: int
    attempt: int
    state: str
    spent: bool
    delay: float
    error: dict[str, Any] | None
    progress: Progress | None
    label: str = ""
    """How the attempt ended (atlantis.attempts.outcome): complete, failed, snooze, ..."""
    child_pid: int | None = None
    log_lines: int = 0
    log_dropped: int = 0
    run: int = 1
    """The run of the attempt (``ClaimedRow.run``): the write is fenced on it."""


def touch_params(worker: str, batch: Sequence[Renewal]) -> dict[str, Any]:
    return {
        "ids": [r.job_id for r in batch],
        "runs": [r.run for r in batch],
        "attempts": [r.attempt for r in batch],
        "has_progress": [r.progress is not None for r in batch],
        "pcts": [r.progress.pct if r.progress else None for r in batch],
        "msgs": [r.progress.msg if r.progress else None for r in batch],
        "worker": worker,
    }


def finish_params(worker: str, batch: Sequence[Result], host: str | None = None,
                  pid: int | None = None) -> dict[str, Any]:
    """The finish statement's parameters. The results go as one JSON array (orjson: fast,
    and it refuses lone surrogates rather than writing invalid JSON: TypeError)."""
    return {
        "results": orjson.dumps([{
            "id": r.job_id, "run": r.run, "attempt": r.attempt, "state": r.state, "spent": r.spent,
            "delay": r.delay, "error": r.error, "has_progress": r.progress is not None,
            "pct": r.progress.pct if r.progress else None,
            "msg": r.progress.msg if r.progress else None,
            "label": r.label or r.state, "child_pid": r.child_pid,
            "log_lines": r.log_lines, "log_dropped": r.log_dropped,
        } for r in batch]).decode(),
        "host": host,
        "pid": pid,
        "worker": worker,
    }
