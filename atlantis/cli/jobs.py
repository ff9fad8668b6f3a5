"""``tide job ...``: inspect and steer jobs."""

from __future__ import annotations

import sys
import time
from datetime import UTC
from typing import Any

import click
import orjson
import psycopg

import atlantis
from atlantis import operations
from atlantis.cli import render, tables
from atlantis.cli.common import (
    ATTEMPT,
    FOLLOW_GRACE,
    FOLLOW_INTERVAL,
    JOB_ID,
    LIMIT,
    PRIORITY,
    args_option,
    connection,
    duration_option,
    fail,
    job_or_fail,
    listing_rows,
    operator_name,
    print_json,
    show_rows,
)
from atlantis.cli.escape import safe
from atlantis.errors import (
    AtlantisError,
    JobEndedError,
    JobNotFoundError,
    UniqueKeyTakenError,
    ValidationError,
    WorkflowStateError,
)
from atlantis.presentation import (
    job_document,
    log_document,
    read_handler_steps,
    step_document,
)
from atlantis.store import admin, fleet, liveness, steps
from atlantis.store.typed_rows import as_dict
from atlantis.units import format_duration

# ---- job --------------------------------------------------------------------------------

@click.group()
def job() -> None:
    """Inspect and steer jobs."""


@job.command("status")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document: every column, plus rate, eta_seconds, stalled, attempts, "
                   "held, no_handler, warning, handler_steps (records, bytes, the last few), "
                   "suspended_for, suspended_until, and holder_silent, holder_silent_seconds "
                   "and lease_ends_in_seconds (a running job's supervisor silent or not).")
@click.pass_context
def job_status(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """State, attempts, progress with rate and ETA, lease, timings and last error of a job,
    what limit holds it when one does, its handler steps (how many records, their size, the
    last few) and, while it is asleep, which handler step it sleeps in and until when."""
    with connection(ctx) as conn:
        row = job_or_fail(conn, job_id)
        attempts = admin.job_attempts(conn, job_id)
        held = _held(conn, row)
        handler_steps = read_handler_steps(conn, row)
        holder = liveness.job_holder(conn, job_id) if row.running else None
        unserved = _no_handler(conn, row)
    if as_json:
        doc = job_document(row)
        doc["attempts"] = [as_dict(a) for a in attempts]
        doc["held"] = held
        doc["no_handler"] = unserved
        doc["warning"] = _warning(attempts)
        doc.update(handler_steps)
        doc.update(liveness.holder_document(holder))
        print_json(doc)
    else:
        click.echo(render.status_text(row, attempts, held=held, steps=handler_steps,
                                      holder=holder, notes=_notes(unserved, attempts)))


def _warning(attempts: list[admin.AttemptRow]) -> str | None:
    """The latest attempt's warning: what atlantis ended that it left running."""
    return next((f"attempt {a.attempt}: {a.warning}" for a in reversed(attempts)
                 if a.warning), None)


def _notes(unserved: str | None, attempts: list[admin.AttemptRow]) -> list[tuple[str, str]]:
    """The lines under a job's state a person should not miss: no handler, a warning."""
    warning = _warning(attempts)
    return ([("no handler", unserved)] if unserved else []) + (
        [("warning", warning)] if warning else [])


def _no_handler(conn: psycopg.Connection[Any], row: admin.JobRow) -> str | None:
    """Why a waiting job will not run: no live supervisor serves its queue and job type
    (None: one does, or the job is not waiting)."""
    if row.state != "available" or fleet.job_served(conn, row.queue, row.job):
        return None
    return (f"no running supervisor serves {row.job} in queue {row.queue} "
            f"(tide worker list)")


def _held(conn: psycopg.Connection[Any], row: admin.JobRow) -> str | None:
    """What limit holds a waiting job (None: none does, or it is not waiting)."""
    return fleet.limit_hold(conn, row.id) if row.state == "available" else None


@job.command("watch")
@click.argument("job_id", type=JOB_ID)
@click.option("--interval", default="1s", show_default=True)
@click.pass_context
def job_watch(ctx: click.Context, job_id: int, interval: str) -> None:
    """The status of a job, live, until it finishes."""
    pause = duration_option("--interval", interval)
    tty = sys.stdout.isatty()
    with connection(ctx, deadline=False) as conn:
        previous = 0
        while True:
            row = job_or_fail(conn, job_id)
            text = render.status_text(row, admin.job_attempts(conn, job_id),
                                      held=_held(conn, row),
                                      steps=read_handler_steps(conn, row))
            if tty and previous:
                click.echo(f"\x1b[{previous}F\x1b[J", nl=False)
            click.echo(text)
            previous = text.count("\n") + 1
            if row.finished:
                return
            time.sleep(pause)


@job.command("steps")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True,
              help="A JSON array of the records, each {name, kind, recorded_at, attempt, "
                   "bytes, value} with its value whole.")
@click.pass_context
def job_steps(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """A job's handler step records, oldest first.

    What its handler's ctx.run_step, ctx.transaction and ctx.sleep recorded: a later run
    of the job gets a step's record back instead of running the step again (tide job retry
    --fresh drops them). One row each: name, kind (step, transaction or sleep), when it was
    recorded, by which attempt, its size, and its value, cut to a line (--json has it whole;
    a sleep's is the time it wakes at).
    """
    with connection(ctx) as conn:
        row = job_or_fail(conn, job_id)
        records = steps.step_list(conn, job_id)
    if as_json:
        print_json([step_document(r) for r in records])
    elif not records:
        click.echo(f"tide: job {job_id} has no handler step records", err=True)
    else:
        tables.step_table(records, row.db_now)


@job.command("list")
@click.option("--queue", default=None)
@click.option("--state", default=None, type=click.Choice(admin.STATES))
@click.option("--stalled", is_flag=True, help="Only running jobs past their stall threshold.")
@click.option("--orphaned", is_flag=True,
              help="Only running jobs whose supervisor is silent (not seen for two of its "
                   "liveness intervals).")
@click.option("--limit", default=50, show_default=True, type=LIMIT)
@click.option("--json", "as_json", is_flag=True,
              help="Every column of each job, plus rate, eta_seconds and stalled.")
@click.pass_context
def job_list(ctx: click.Context, queue: str | None, state: str | None, stalled: bool,
             orphaned: bool, limit: int, as_json: bool) -> None:
    """Recent jobs, newest first."""
    rows = listing_rows(ctx, lambda conn: liveness.orphaned_jobs(conn, queue=queue, limit=limit)
                        if orphaned else admin.list_jobs(conn, queue=queue, state=state,
                                                         stalled=stalled, limit=limit),
                        queue=queue)
    show_rows(rows, as_json, job_document, tables.job_table)


@job.command("enqueue")
@click.argument("name")
@click.option("--args", "args_json", default="{}", help="The arguments as a JSON object.")
@click.option("--delay", default=None,
              help="Run no earlier than this from now (e.g. 10m; at most 36500d).")
@click.option("--priority", type=PRIORITY, default=None,
              help="Lower runs first: among jobs ready in a queue, the lowest priority is "
              "claimed first (default: the job's declared priority, 0 unless set).")
@click.option("--queue", default=None)
@click.pass_context
def job_enqueue(ctx: click.Context, name: str, args_json: str, delay: str | None,
                priority: int | None, queue: str | None) -> None:
    """Enqueue a job; prints its id alone on stdout."""
    args = args_option(args_json)
    seconds = duration_option("--delay", delay) if delay else None
    with connection(ctx, autocommit=False) as conn:
        try:
            job_id = atlantis.enqueue(conn, name, args, delay=seconds, priority=priority, queue=queue)
        except AtlantisError as exc:
            fail(str(exc))
        unheard = queue is not None and not fleet.queue_served(conn, queue)
        conn.commit()
    if unheard:
        click.echo(f"tide: warning: no declaration names queue {queue!r} and no supervisor has "
                   "served it; the job waits until one does (a typo?)", err=True)
    click.echo(job_id)


@job.command("retry")
@click.argument("job_id", type=JOB_ID)
@click.option("--fresh", is_flag=True,
              help="Drop the job's handler step records: its next run starts over instead "
                   "of resuming from them.")
@click.pass_context
def job_retry(ctx: click.Context, job_id: int, fresh: bool) -> None:
    """Put a dead or cancelled job back to available with a fresh attempt budget; its next
    run resumes from its handler step records unless --fresh."""
    with connection(ctx) as conn:
        try:
            retried = operations.retry(conn, job_id, by=operator_name(),
                                       fresh=fresh) is not None
        except (JobNotFoundError, UniqueKeyTakenError, WorkflowStateError) as exc:
            fail(str(exc))  # a workflow's row is retried with its workflow only
        if not retried:
            row = job_or_fail(conn, job_id)
            fail(f"job {job_id} is {row.state}; only dead or cancelled jobs can be retried")
    click.echo(f"job {job_id} is available again")


@job.command("cancel")
@click.argument("job_id", type=JOB_ID)
@click.pass_context
def job_cancel(ctx: click.Context, job_id: int) -> None:
    """Cancel a waiting job; a running attempt is told, then stopped after the grace."""
    with connection(ctx) as conn:
        try:
            after = operations.cancel(conn, job_id, by=operator_name())
        except JobNotFoundError as exc:
            fail(str(exc))
        row = job_or_fail(conn, job_id)
        if after is None:
            fail(f"job {job_id} is {row.state}; nothing to cancel")
        holder = liveness.job_holder(conn, job_id) if after == "running" else None
    if row.workflow_id is not None:
        what = "compensation of step" if row.compensation else "step"
        click.echo(f"job {job_id} is {what} {safe(row.step or '?')} of workflow "
                   f"{row.workflow_id}: the workflow is cancelled, with its compensations "
                   f"(tide workflow status {row.workflow_id})")
    elif after == "running":
        click.echo(render.cancel_running_text(job_id, holder))
    else:
        click.echo(f"job {job_id} cancelled")


@job.command("send-event")
@click.argument("job_id", type=JOB_ID)
@click.argument("event")
@click.option("--payload", metavar="JSON", help="The event's payload (JSON, at most 64 KiB).")
@click.pass_context
def job_send_event(ctx: click.Context, job_id: int, event: str, payload: str | None) -> None:
    """Send EVENT to a job: its handler's ctx.wait_for_event of that name receives it (kept
    until then; a job that waits for it already is woken)."""
    import orjson

    try:
        value = None if payload is None else orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        fail(f"--payload: not JSON ({exc})", code=2)
    with connection(ctx) as conn:
        try:
            sent = operations.send_event(conn, job_id, event, value, by=operator_name())
        except (JobNotFoundError, JobEndedError, ValidationError) as exc:
            fail(str(exc))
    click.echo(f"event {safe(event)} sent to job {job_id} (event {sent})")


@job.command("logs")
@click.argument("job_id", type=JOB_ID)
@click.option("--run", "run", type=ATTEMPT, default=None,
              help="Which run: 1, then one more after each retry (default: the latest).")
@click.option("--attempt", type=ATTEMPT, default=None,
              help="Which attempt of the run (default: the running one, else the latest with "
                   "output).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the attempt ends.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def job_logs(ctx: click.Context, job_id: int, run: int | None, attempt: int | None,
             follow: bool, as_json: bool) -> None:
    """What an attempt wrote to its stdout and stderr.

    A retry starts the job's next run, whose attempts count from 1 again; one attempt of one
    run is shown, by default of the latest run. For a job retried at least once, which run
    and attempt is said on stderr.
    """
    with connection(ctx, deadline=not follow) as conn:
        row = job_or_fail(conn, job_id)
        if run is None:
            run = row.run
        elif run > row.run:
            fail(f"job {job_id} has no run {run} (it has had {row.run})", kind="not_found")
        current = run == row.run
        if attempt is None:
            attempt = (row.attempt if current and row.running
                       else admin.latest_log_attempt(conn, job_id, run=run))
            if attempt is None:
                what = f"job {job_id}" if row.run == 1 else f"run {run} of job {job_id}"
                click.echo(f"tide: {what} has no log lines", err=True)
                return
        else:
            known = admin.run_attempts(conn, job_id, run)
            if current:
                known = max(known, row.attempt)
            if attempt > known:
                where = "" if row.run == 1 else f" in run {run}"
                fail(f"job {job_id} has no attempt {attempt}{where} (it has had {known})",
                     kind="not_found")
        which = (f"attempt {attempt} of job {job_id}" if row.run == 1
                 else f"run {run} attempt {attempt} of job {job_id}")
        if row.run > 1 and not as_json:
            click.echo(f"tide: {which} (it has had {row.run} runs; --run picks another)",
                       err=True)
        printed = _follow(conn, job_id, run, attempt, follow=follow, as_json=as_json)
    if not printed:
        click.echo(f"tide: {which} has no log lines", err=True)


def _follow(conn: psycopg.Connection[Any], job_id: int, run: int, attempt: int, *,
            follow: bool, as_json: bool) -> int:
    """Print the attempt's lines; with ``follow``, keep polling until the attempt has ended
    and its last lines are in. Returns how many lines were printed."""
    after = 0
    printed = 0
    ended_at: float | None = None
    while True:
        # Whether it still runs is read before the lines: what it wrote before ending is
        # then among them (or among those of the grace after the end).
        live = follow and _attempt_running(conn, job_id, run, attempt)
        while True:
            lines = admin.log_lines(conn, job_id, attempt, run=run, after=after)
            for line in lines:
                click.echo(_log_text(job_id, line, as_json))
            if lines:
                after = lines[-1].id
                printed += len(lines)
                sys.stdout.flush()
            if len(lines) < 1000:
                break
        if not follow:
            return printed
        if not live:
            now = time.monotonic()
            if ended_at is None:
                ended_at = now
            elif now - ended_at >= FOLLOW_GRACE:
                return printed
        time.sleep(FOLLOW_INTERVAL)


def _attempt_running(conn: psycopg.Connection[Any], job_id: int, run: int, attempt: int) -> bool:
    row = admin.get_job(conn, job_id)
    return row is not None and row.running and row.run == run and row.attempt == attempt


def _log_text(job_id: int, line: admin.LogLine, as_json: bool) -> str:
    if as_json:
        return orjson.dumps(log_document(line, job_id=job_id)).decode()
    stamp = line.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    stream = click.style(f"{safe(line.stream):<6}", fg="red" if line.stream == "stderr" else None)
    return f"{stamp} {stream} {safe(line.line)}"


@job.command("prune")
@click.option("--older-than", "older_than", required=True,
              help="Delete jobs that finished longer ago than this (e.g. 7d).")
@click.option("--state", "states", multiple=True, type=click.Choice(admin.FINISHED),
              help="Only jobs in this state (repeatable; default: every finished state).")
@click.pass_context
def job_prune(ctx: click.Context, older_than: str, states: tuple[str, ...]) -> None:
    """Delete finished jobs (with their attempts and logs); prints how many."""
    seconds = duration_option("--older-than", older_than)
    chosen = list(states or admin.FINISHED)
    with connection(ctx, deadline=False) as conn:
        deleted = admin.prune(conn, seconds, chosen)
    click.echo(f"tide: pruned {deleted} {'/'.join(chosen)} jobs finished more than "
               f"{format_duration(seconds)} ago", err=True)
    click.echo(deleted)


# ---- dlq, queue, worker -----------------------------------------------------------------
