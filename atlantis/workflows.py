"""Start, cancel, retry and dismiss workflows on the caller's connection.

A workflow (a ``workflow`` block of a ``.atl`` file) is a graph of steps, each an ordinary
job, with compensations that undo the steps that ran when a later one fails for good, the
workflow times out, or it is cancelled. Everything a workflow does after its start happens
in the database (store/live/workflows.sql: ``atlantis.start_workflow``, the trigger that
advances it when a step's row changes; store/live/workflow_operators.sql:
``atlantis.cancel_workflow``, ``atlantis.retry_workflow``, ``atlantis.dismiss_workflow``), so
SQL callers, ``tide workflow`` and the console get the same rules as these functions.

Like :func:`atlantis.enqueue`, nothing here commits: a start rolled back with the caller's
transaction leaves nothing, and a refused call leaves that transaction usable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, LiteralString

import psycopg

from atlantis import operations
from atlantis.enqueue import args_json, trace_context
from atlantis.enqueue import translate as enqueue_translate
from atlantis.errors import WorkflowNotFoundError
from atlantis.store.queries import Q


def _translate(exc: psycopg.Error) -> BaseException:
    if exc.sqlstate == operations.NO_SUCH_JOB:
        return WorkflowNotFoundError(exc.diag.message_primary or str(exc))
    translated = enqueue_translate(exc)
    return operations.translate(exc) if translated is exc else translated


def _start_params(name: str, args: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"name": name, "args": args_json(name, args or {}), "trace_context": trace_context()}


def _one(conn: psycopg.Connection[Any], query: LiteralString, params: dict[str, Any]) -> Any:
    return operations.call(conn, query, params, errors=_translate)


async def _one_async(conn: psycopg.AsyncConnection[Any], query: LiteralString,
                     params: dict[str, Any]) -> Any:
    return await operations.call_async(conn, query, params, errors=_translate)


def start_workflow(conn: psycopg.Connection[Any], name: str,
                   args: Mapping[str, Any] | None = None) -> int:
    """Start workflow ``name`` (``"onboarding.Onboard"``) with ``args``; returns its id.

    The args are checked as :func:`atlantis.enqueue` checks a job's, and so are the args
    each step and compensation takes from them (:class:`~atlantis.ValidationError` naming
    the field; :class:`~atlantis.UnknownJobError` for a workflow the database does not
    know). A workflow declared ``unique (...)`` returns the id of the one that holds the
    key, whatever its state: a workflow holds its key while it runs, while it compensates,
    and while it is ``compensation_failed`` until :func:`dismiss_workflow`. The steps
    without ``after`` become runnable when the caller commits.
    """
    found: int = _one(conn, Q.workflow_start, _start_params(name, args))
    return found


async def start_workflow_async(conn: psycopg.AsyncConnection[Any], name: str,
                               args: Mapping[str, Any] | None = None) -> int:
    """The twin of :func:`start_workflow` for psycopg's ``AsyncConnection``."""
    found: int = await _one_async(conn, Q.workflow_start, _start_params(name, args))
    return found


def cancel_workflow(conn: psycopg.Connection[Any], workflow_id: int, *,
                    by: str | None = None) -> str:
    """Cancel a workflow; returns its state afterwards.

    Running steps are cancelled as :func:`atlantis.cancel` cancels a job (``ctx.cancelled``,
    then a stop after the cancel grace), none starts, and the steps that started are
    compensated: the workflow is ``compensating``, then ``cancelled``. During a compensation
    the cancel is recorded and the compensations go on; a finished workflow is left as it
    is. Raises :class:`~atlantis.WorkflowNotFoundError` for an unknown id.
    """
    state: str = _one(conn, Q.workflow_cancel, {"id": operations.row_id(workflow_id, "workflow_id"), "by": by})
    return state


async def cancel_workflow_async(conn: psycopg.AsyncConnection[Any], workflow_id: int, *,
                                by: str | None = None) -> str:
    """The twin of :func:`cancel_workflow` for psycopg's ``AsyncConnection``."""
    state: str = await _one_async(conn, Q.workflow_cancel,
                                  {"id": operations.row_id(workflow_id, "workflow_id"), "by": by})
    return state


def retry_workflow(conn: psycopg.Connection[Any], workflow_id: int, *,
                   by: str | None = None) -> str:
    """Rerun the dead compensations of a ``compensation_failed`` workflow, each with a fresh
    attempt budget, and carry on with the ones after them; returns the state afterwards
    (``compensating``). Any other state is refused with
    :class:`~atlantis.WorkflowStateError`. A dismissed workflow takes its unique key back:
    while another workflow holds it, the retry is refused with
    :class:`~atlantis.UniqueKeyTakenError` naming that workflow.
    """
    state: str = _one(conn, Q.workflow_retry, {"id": operations.row_id(workflow_id, "workflow_id"), "by": by})
    return state


def dismiss_workflow(conn: psycopg.Connection[Any], workflow_id: int, *,
                     by: str | None = None) -> str:
    """Give up the owed undo of a ``compensation_failed`` workflow; returns its state
    (``compensation_failed``: the state set does not grow).

    The dismissal is recorded (``dismissed_at``, ``dismissed_by``) and frees the workflow's
    unique key, so that a workflow of the same key may start; dismissing again changes
    nothing. Any other state is refused with :class:`~atlantis.WorkflowStateError`, an
    unknown id with :class:`~atlantis.WorkflowNotFoundError`.
    """
    state: str = _one(conn, Q.workflow_dismiss,
                      {"id": operations.row_id(workflow_id, "workflow_id"), "by": by})
    return state
