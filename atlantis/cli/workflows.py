"""``tide workflow ...``: start, watch and steer workflows.

Starting, cancelling, retrying and dismissing go through the SQL functions every path
shares (``atlantis.start_workflow``, ``cancel_workflow``, ``retry_workflow``,
``dismiss_workflow``); the reads are
:mod:`atlantis.store.workflows`'s. Exit codes as for ``tide job``: an unknown id or a
change the database refuses is one line on stderr and exit 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
import orjson
import psycopg

import atlantis
from atlantis.cli.common import (
    JOB_ID,
    LIMIT,
    args_option,
    connection,
    fail,
    operator_name,
    print_json,
    show_rows,
)
from atlantis.cli.escape import safe
from atlantis.cli.render import STATE_STYLES, progress_bar, relative, short_duration, since
from atlantis.cli.tables import Cell, Column, print_table, styled
from atlantis.errors import AtlantisError
from atlantis.store.typed_rows import as_dict
from atlantis.store.workflows import (
    WORKFLOW_FINISHED,
    WORKFLOW_STATES,
    Workflow,
    WorkflowListRow,
    WorkflowStep,
    get_workflow,
    list_workflow_rows,
)

#: The colour of each workflow state, on a terminal.
WORKFLOW_STYLES = {"running": "blue", "compensating": "magenta", "complete": "green",
                   "failed": "red", "cancelled": "yellow", "compensation_failed": "bold red"}
#: How much of a step's result and message the status view shows.
SHORT = 40


@click.group()
def workflow() -> None:
    """Start, inspect and steer workflows (declared steps with compensations)."""


def workflow_or_fail(conn: psycopg.Connection[Any], workflow_id: int) -> Workflow:
    """The workflow with its steps; an unknown id ends the command with exit 1."""
    found = get_workflow(conn, workflow_id)
    if found is None:
        fail(f"no workflow with id {workflow_id}", kind="not_found")
    return found


@workflow.command("start")
@click.argument("name")
@click.option("--args", "args_json", default="{}", help="The arguments as a JSON object.")
@click.pass_context
def workflow_start(ctx: click.Context, name: str, args_json: str) -> None:
    """Start a workflow (NAME as declared: ns.Name); prints its id alone on stdout.

    A workflow declared ``unique`` whose key another one holds (running, compensating, or
    compensation_failed and not dismissed) gives that one's id."""
    args = args_option(args_json)
    with connection(ctx, autocommit=False) as conn:
        try:
            workflow_id = atlantis.start_workflow(conn, name, args)
        except AtlantisError as exc:
            fail(str(exc))
        conn.commit()
    click.echo(workflow_id)


@workflow.command("status")
@click.argument("workflow_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document: the workflow and its steps in dependency order, then "
                   "its compensations.")
@click.pass_context
def workflow_status(ctx: click.Context, workflow_id: int, as_json: bool) -> None:
    """Each step of a workflow in dependency order (state, attempt, progress, result,
    timing), then the compensations that ran."""
    with connection(ctx) as conn:
        found = workflow_or_fail(conn, workflow_id)
    if as_json:
        print_json(found.document())
    else:
        show_workflow(found)


@workflow.command("list")
@click.option("--state", default=None, type=click.Choice(WORKFLOW_STATES))
@click.option("--limit", default=50, show_default=True, type=LIMIT)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def workflow_list(ctx: click.Context, state: str | None, limit: int, as_json: bool) -> None:
    """Recent workflows, newest first."""
    with connection(ctx) as conn:
        rows = list_workflow_rows(conn, state=state, limit=limit)
    show_rows(rows, as_json, as_dict, _list_table)


@workflow.command("cancel")
@click.argument("workflow_id", type=JOB_ID)
@click.pass_context
def workflow_cancel(ctx: click.Context, workflow_id: int) -> None:
    """Cancel a workflow: running steps are stopped (after their grace), no new step starts,
    and the steps that started are compensated."""
    with connection(ctx) as conn:
        before = workflow_or_fail(conn, workflow_id).row.state
        if before in WORKFLOW_FINISHED:
            fail(f"workflow {workflow_id} is {before}; nothing to cancel")
        try:
            after = atlantis.cancel_workflow(conn, workflow_id, by=operator_name())
        except AtlantisError as exc:
            fail(str(exc))
    if before == "compensating":
        click.echo(f"workflow {workflow_id} is compensating; the cancel is recorded and the "
                   "compensations go on")
    elif after == "compensating":
        click.echo(f"workflow {workflow_id} cancelled; its running steps are being stopped "
                   "and the steps that ran compensated")
    else:
        click.echo(f"workflow {workflow_id} is {after}")


@workflow.command("retry")
@click.argument("workflow_id", type=JOB_ID)
@click.pass_context
def workflow_retry(ctx: click.Context, workflow_id: int) -> None:
    """Rerun the dead compensations of a compensation_failed workflow and carry on."""
    with connection(ctx) as conn:
        workflow_or_fail(conn, workflow_id)
        try:
            after = atlantis.retry_workflow(conn, workflow_id, by=operator_name())
        except AtlantisError as exc:
            fail(str(exc))
    click.echo(f"workflow {workflow_id} is {after} again")


@workflow.command("dismiss")
@click.argument("workflow_id", type=JOB_ID)
@click.pass_context
def workflow_dismiss(ctx: click.Context, workflow_id: int) -> None:
    """Give up the owed undo of a compensation_failed workflow: it stays compensation_failed,
    recorded as dismissed, and frees its unique key."""
    with connection(ctx) as conn:
        before = workflow_or_fail(conn, workflow_id).row
        try:
            atlantis.dismiss_workflow(conn, workflow_id, by=operator_name())
        except AtlantisError as exc:
            fail(str(exc))
    if before.dismissed_at is not None:
        click.echo(f"workflow {workflow_id} was dismissed already, by "
                   f"{safe(before.dismissed_by or '?')}")
    else:
        click.echo(f"workflow {workflow_id} dismissed: its undo is given up and its unique key "
                   "is free")


# ---- the views ---------------------------------------------------------------------------

def show_workflow(found: Workflow) -> None:
    """``tide workflow status``: the workflow's facts, its steps as the dependency graph,
    then its compensation trail."""
    w = found.row
    now = w.db_now
    style = WORKFLOW_STYLES.get(w.state, "").split()
    state = click.style(w.state, fg=style[-1] if style else None,
                        bold="bold" in style or not found.finished)
    click.echo(f"workflow {w.id}  {safe(w.workflow)}  {state}")

    def add(label: str, text: str) -> None:
        click.echo(f"  {label:<11}{text}")

    add("args", safe(orjson.dumps(w.args).decode()))
    if w.cause is not None:
        add("cause", safe(_cause(found)))
    if w.error:
        add("error", safe(w.error, multiline=True).replace("\n", "\n" + " " * 13))
    if w.cancel_requested_at is not None:
        add("cancel", f"requested {relative(w.cancel_requested_at, now)} by "
                      f"{safe(w.cancelled_by or '?')}")
    if w.dismissed_at is not None:
        add("dismissed", f"{relative(w.dismissed_at, now)} by {safe(w.dismissed_by or '?')}: "
                         "the undo is given up, the unique key free")
    add("created", relative(w.created_at, now))
    if w.deadline is not None and w.finished_at is None:
        add("deadline", relative(w.deadline, now))
    if w.finished_at is not None:
        took = short_duration((w.finished_at - w.created_at).total_seconds())
        add("finished", f"{relative(w.finished_at, now)} (took {took})")
    forward = [s for s in found.steps if not s.compensation]
    undo = [s for s in found.steps if s.compensation]
    click.echo("")
    click.echo("steps, in dependency order:")
    _steps_table(forward, now, graph=True, open_=not found.finished)
    click.echo("")
    if undo:
        click.echo("compensations, in the order they started:")
        _steps_table(undo, now, graph=False, open_=True)
    else:
        click.echo("no compensation has run")


def _cause(found: Workflow) -> str:
    w = found.row
    if w.cause == "failed":
        return f"step {w.failed_step or '?'} died"
    if w.cause == "timeout":
        return "the workflow's timeout passed"
    if w.cause == "cancelled":
        return f"cancelled by {w.cancelled_by or '?'}"
    return w.cause or ""


def _depths(steps: Sequence[WorkflowStep]) -> dict[str, int]:
    """Each step's depth in the graph: the longest chain of steps it waits for (steps come
    in dependency order, so its dependencies' depths are known when it is reached)."""
    depth: dict[str, int] = {}
    for s in steps:
        depth[s.step] = 1 + max((depth.get(a, 0) for a in s.after or ()), default=-1)
    return depth


def _steps_table(steps: Sequence[WorkflowStep], now: datetime, *, graph: bool,
                 open_: bool) -> None:
    columns = [Column("STEP" if graph else "UNDOES"), Column("JOB"), Column("STATE"), Column("ATTEMPT", right=True),
               Column("JOB ID", right=True), Column("PROGRESS"), Column("TIMING"),
               Column("RESULT", flexible=True), Column("AFTER / ERROR", flexible=True)]
    depth = _depths(steps) if graph else {}
    rows: list[list[Cell]] = []
    for s in steps:
        name = s.step
        level = depth.get(s.step, 0)
        if level:
            name = "   " * (level - 1) + "└─ " + name
        if s.state is None:
            state = styled("waiting" if open_ else "never ran", None)
        else:
            state = styled(s.state, STATE_STYLES.get(s.state))
        attempt = "" if s.attempt is None else f"{s.attempt}/{s.max_attempts}"
        progress = ""
        if s.progress_pct is not None:
            progress = progress_bar(s.progress_pct, 10)
        if s.progress_msg:
            progress = (progress + " " + _short(s.progress_msg)).strip()
        result = "" if s.result is None else _short(orjson.dumps(s.result).decode())
        notes = ""
        if graph and len(s.after or ()) > 1:
            notes = "after " + ", ".join(s.after)
        if s.last_error and s.state in ("dead", "available", "cancelled"):
            error = _short(s.last_error.splitlines()[-1] if s.last_error.strip() else "")
            notes = (notes + "; " if notes else "") + error
        rows.append([name, s.job, state, attempt, "" if s.job_id is None else str(s.job_id),
                     progress, _timing(s, now), result,
                     styled(notes, "red" if s.state == "dead" else None)])
    print_table(columns, rows)


def _timing(s: WorkflowStep, now: datetime) -> str:
    if s.state is None:
        return "-"
    if s.state == "running":
        return f"running {since(s.started_at, now)}"
    if s.finished_at is not None:
        ran = ""
        if s.started_at is not None and s.finished_at >= s.started_at:
            ran = f"ran {short_duration((s.finished_at - s.started_at).total_seconds())}, "
        return f"{ran}ended {relative(s.finished_at, now)}"
    return f"queued {since(s.created_at, now)}"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHORT else text[:SHORT - 1] + "…"


def _list_table(rows: Sequence[WorkflowListRow]) -> None:
    columns = [Column("ID", right=True), Column("WORKFLOW"), Column("STATE"),
               Column("STEPS", right=True), Column("CREATED"), Column("FINISHED"),
               Column("ERROR", flexible=True)]
    cells: list[list[Cell]] = []
    for w in rows:
        why = ""
        if w.cause == "failed" and w.failed_step:
            why = f"step {w.failed_step}: "
        elif w.cause == "timeout":
            why = "timeout: "
        elif w.cause == "cancelled":
            why = "cancelled"
        error = why + (" ".join((w.error or "").split()) if w.cause != "cancelled" else "")
        cells.append([str(w.id), w.workflow, styled(w.state, WORKFLOW_STYLES.get(w.state)),
                      f"{w.steps_complete}/{w.steps}", _stamp(w.created_at),
                      _stamp(w.finished_at), styled(error, "red" if error else None)])
    print_table(columns, cells)


def _stamp(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
