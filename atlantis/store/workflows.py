"""Workflows as operators' tools (``tide workflow``, the console, the metrics) read them.

A workflow's document is its row of the view ``atlantis.workflows`` with its steps: first
the forward steps of its graph (stored when it started) in dependency order, each with its
job row once it has one (a step gets its row when it becomes runnable; one that never did
has ``job_id`` and ``state`` null), then the rows of its compensations in the order they
were created. Starting, cancelling and retrying workflows are the SQL functions' (through
:mod:`atlantis.enqueue`'s public API); every statement here is a named query of
``workflows.sql`` and nothing here commits.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from atlantis.store.queries import Q
from atlantis.store.typed_rows import all_rows, as_dict, one_row

Conn = psycopg.Connection[Any]

#: The states a workflow can be in (``atlantis.workflows.state``).
WORKFLOW_STATES = ("running", "compensating", "complete", "failed", "cancelled",
                   "compensation_failed")
#: The states a workflow never leaves by itself (``compensation_failed`` waits for an
#: operator's ``tide workflow retry``, and holds its unique key until ``tide workflow
#: dismiss``).
WORKFLOW_FINISHED = ("complete", "failed", "cancelled", "compensation_failed")

#: Counts of workflows by state stop at this many (a count costs at most this many index
#: entries): the metrics read them every few seconds.
COUNT_CAP = 100_000

#: The fields of each step in a workflow's document, in order.
STEP_FIELDS = ("step", "job", "job_id", "compensation", "state", "attempt", "max_attempts",
               "progress_pct", "progress_msg", "result", "after", "started_at",
               "finished_at", "last_error")


@dataclass(frozen=True, slots=True)
class WorkflowStep:
    """A forward step of a workflow (``compensation`` False) or a compensation's row.

    ``job_id`` and the row's fields (``state`` ...) are None for a forward step that never
    became runnable. ``step`` of a compensation is the step it undoes; ``after`` is the
    steps a forward step waits for (empty for a compensation), ``compensate`` the job that
    would undo it. ``position``: the step's place in the declaration (0 for compensations).
    """

    step: str
    position: int
    job: str
    after: list[str]
    compensate: str | None
    job_id: int | None
    compensation: bool
    state: str | None
    attempt: int | None
    max_attempts: int | None
    progress_pct: int | None
    progress_msg: str | None
    result: Any
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None

    def document(self) -> dict[str, Any]:
        doc = as_dict(self)
        doc["after"] = list(self.after or ())
        return {name: doc[name] for name in STEP_FIELDS}


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """One row of ``atlantis.workflows`` with the database's clock (``db_now``)."""

    id: int
    workflow: str
    args: dict[str, Any]
    state: str
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    failed_step: str | None
    cause: str | None
    deadline: datetime | None
    cancel_requested_at: datetime | None
    cancelled_by: str | None
    dismissed_at: datetime | None
    dismissed_by: str | None
    db_now: datetime


@dataclass(frozen=True, slots=True)
class Workflow:
    """A workflow with its steps: forward ones in dependency order, then compensations."""

    row: WorkflowRow
    steps: list[WorkflowStep]

    @property
    def finished(self) -> bool:
        return self.row.state in WORKFLOW_FINISHED

    def document(self) -> dict[str, Any]:
        """``tide workflow status --json`` and the console's ``GET /api/workflows/{id}``."""
        doc = as_dict(self.row)
        del doc["db_now"]
        doc["steps"] = [s.document() for s in self.steps]
        return doc


@dataclass(frozen=True, slots=True)
class WorkflowListRow:
    """A workflow in a listing, with ``steps`` (how many) and ``steps_complete``."""

    id: int
    workflow: str
    args: dict[str, Any]
    state: str
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    failed_step: str | None
    cause: str | None
    steps: int
    steps_complete: int


@dataclass(frozen=True, slots=True)
class _Count:
    state: str
    count: int


def dependency_order(steps: list[WorkflowStep]) -> list[WorkflowStep]:
    """``steps`` (forward ones) so that each comes after every step it waits for; among
    the steps free to come next, the one declared first. A graph the declaration checker
    would refuse (a cycle, an unknown name) keeps its leftovers in declaration order."""
    by_name = {s.step: s for s in steps}
    waiting = {s.step: {a for a in (s.after or ()) if a in by_name} for s in steps}
    dependents: dict[str, list[str]] = {s.step: [] for s in steps}
    for s in steps:
        for a in waiting[s.step]:
            dependents[a].append(s.step)
    ready = [(s.position, s.step) for s in steps if not waiting[s.step]]
    heapq.heapify(ready)
    out: list[WorkflowStep] = []
    while ready:
        _, name = heapq.heappop(ready)
        out.append(by_name[name])
        for d in dependents[name]:
            waiting[d].discard(name)
            if not waiting[d]:
                heapq.heappush(ready, (by_name[d].position, d))
    placed = {s.step for s in out}
    out.extend(s for s in sorted(steps, key=lambda s: s.position) if s.step not in placed)
    return out


def get_workflow(conn: Conn, workflow_id: int) -> Workflow | None:
    """The workflow with this id and its steps, or None."""
    row = one_row(conn, WorkflowRow, Q.workflow_get, {"id": workflow_id})
    if row is None:
        return None
    forward = all_rows(conn, WorkflowStep, Q.workflow_forward_steps, {"id": workflow_id})
    undo = all_rows(conn, WorkflowStep, Q.workflow_compensation_steps, {"id": workflow_id})
    return Workflow(row, dependency_order(forward) + undo)


def workflow_document(conn: Conn, workflow_id: int) -> dict[str, Any] | None:
    """The workflow's document (:meth:`Workflow.document`), or None for an unknown id."""
    found = get_workflow(conn, workflow_id)
    return None if found is None else found.document()


def list_workflow_rows(conn: Conn, *, state: str | None = None, before: int | None = None,
                       limit: int = 50) -> list[WorkflowListRow]:
    """The newest ``limit`` workflows (in ``state``; with ids below ``before``)."""
    return all_rows(conn, WorkflowListRow, Q.workflow_list,
                    {"state": state, "before": before, "limit": limit})


def list_workflows(conn: Conn, state: str | None = None, limit: int = 50, *,
                   before: int | None = None) -> list[dict[str, Any]]:
    """:func:`list_workflow_rows` as documents (``--json`` and the API)."""
    return [as_dict(r) for r in list_workflow_rows(conn, state=state, before=before,
                                                   limit=limit)]


def counts_params(cap: int = COUNT_CAP) -> dict[str, Any]:
    """The parameters of ``workflow_counts``: every state, each count at most ``cap``."""
    return {"states": list(WORKFLOW_STATES), "cap": cap}


def workflow_counts(conn: Conn, *, cap: int = COUNT_CAP) -> dict[str, int]:
    """How many workflows are in each state (every state named, 0 when none is in it), each
    count at most ``cap``."""
    return {r.state: r.count for r in all_rows(conn, _Count, Q.workflow_counts,
                                               counts_params(cap))}


def counts_from_rows(rows: list[tuple[Any, ...]]) -> dict[str, int]:
    """``workflow_counts`` rows (state, count) read by a caller of its own (the
    supervisor's connection) as the same mapping as :func:`workflow_counts`."""
    return {str(state): int(count) for state, count in rows}

