"""``tide``: watch and steer jobs, manage the schema, generate code.

Exit codes: 0 done; 1 for what went wrong at run time (an unknown id, job or queue, a
refused change, a database that cannot be reached or an atlantis schema that is missing);
2 for bad usage: bad options, an app that cannot be loaded, a ``.atl`` file with errors, or
a ``--database-url`` (or ``ATLANTIS_DATABASE_URL``) that libpq cannot parse. Every failure
is one line on stderr, without a traceback, and no password ever appears in it.

Changes (cancel, retry, pause, resume, prune) go through the SQL functions every path
shares (:mod:`atlantis.operations`); tide records the OS user as who made them.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import orjson
import psycopg
from psycopg.pq import TransactionStatus

import atlantis
from atlantis.app import load_app
from atlantis.cli import render
from atlantis.cli.schedules import schedule
from atlantis.cli.usage import OneLineGroup
from atlantis.errors import AtlantisError, JobNotFoundError, UniqueKeyTakenError
from atlantis.store import admin, migrate, sync
from atlantis.store.database import (
    ENV_URL,
    DatabaseUrlError,
    announce,
    check_url,
    describe_db_error,
    redact,
    resolve_url,
)
from atlantis.store.migrate import migrations
from atlantis.units import format_duration, parse_duration

_Row = TypeVar("_Row")

#: How often ``job logs --follow`` looks for new lines.
FOLLOW_INTERVAL = 0.5
#: How long ``job logs --follow`` keeps looking after the attempt ended: supervisors write
#: output in batches (every 250 ms by default), so the last lines may land just after.
FOLLOW_GRACE = 1.0

_SCHEMA_ERRORS = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn,
                  psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName)


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"tide: {message}", err=True)
    sys.exit(code)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError


def _dump(doc: Any) -> None:
    click.echo(orjson.dumps(doc, default=_json_default, option=orjson.OPT_INDENT_2).decode())


def _operator() -> str | None:
    """Who runs tide (recorded as who cancelled, retried, paused); None: the database role."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", default=None, help=f"libpq URL; default ${ENV_URL} or embedded.")
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Operate atlantis jobs."""
    ctx.obj = {"database_url": database_url}


@contextmanager
def _connect(ctx: click.Context, *, autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the database; any failure to reach it ends the command with one line.

    A URL libpq cannot parse exits 2, a database that cannot be reached (or is lost while
    the command runs) exits 1, and so does a schema that is missing or older than this
    tide; no message quotes the URL's password.
    """
    explicit = ctx.find_root().obj["database_url"] or os.environ.get(ENV_URL)
    try:
        url = resolve_url(explicit)
    except Exception as exc:
        _fail(f"cannot start the embedded PostgreSQL: {exc}")
    try:
        check_url(url)
    except DatabaseUrlError as exc:
        _fail(str(exc), code=2)
    try:
        conn = psycopg.connect(url, autocommit=autocommit, application_name="tide")
    except (psycopg.Error, OSError) as exc:
        _fail(f"cannot connect to {redact(url)}: {describe_db_error(exc, url)}")
    announce(url, embedded=not explicit)
    with conn:
        try:
            yield conn
        except _SCHEMA_ERRORS:
            _fail(_schema_problem(conn))
        except psycopg.OperationalError as exc:
            _fail(f"lost the database: {describe_db_error(exc, url)}")
        except psycopg.Error as exc:
            _fail(f"database error: {describe_db_error(exc, url)}")


def _schema_problem(conn: psycopg.Connection[Any]) -> str:
    """What is wrong with the schema, after a statement found something missing."""
    try:
        if conn.info.transaction_status == TransactionStatus.INERROR:
            conn.rollback()
        version = admin.schema_version(conn)
    except psycopg.Error:
        return "the atlantis schema is missing; run `tide db migrate`"
    latest = migrations()[-1][0]
    if version is None:
        return "the atlantis schema is missing; run `tide db migrate`"
    if version < latest:
        return (f"the atlantis schema is at version {version}, this tide needs {latest}; "
                "run `tide db migrate`")
    return "the atlantis schema lacks something this tide needs; run `tide db migrate`"


def _get_job(conn: psycopg.Connection[Any], job_id: int) -> admin.JobRow:
    row = admin.get_job(conn, job_id)
    if row is None:
        _fail(f"no job with id {job_id}")
    return row


def _check_queue(conn: psycopg.Connection[Any], queue: str | None) -> None:
    """A queue nothing names (no declaration, job, pause or supervisor) is a typo: say so."""
    if queue is not None and not admin.queue_known(conn, queue):
        _fail(f"unknown queue {queue!r}: no declaration, job or supervisor uses it")


def _duration(option: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


# ---- job --------------------------------------------------------------------------------

@main.group()
def job() -> None:
    """Inspect and steer jobs."""


@job.command("status")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document: every column, plus rate, eta_seconds, stalled, attempts.")
@click.pass_context
def job_status(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """State, attempts, progress with rate and ETA, lease, timings and last error of a job."""
    with _connect(ctx) as conn:
        row = _get_job(conn, job_id)
        attempts = admin.job_attempts(conn, job_id)
    if as_json:
        doc = row.document()
        doc["attempts"] = [admin.as_dict(a) for a in attempts]
        _dump(doc)
    else:
        click.echo(render.status_text(row, attempts))


@job.command("watch")
@click.argument("job_id", type=int)
@click.option("--interval", default="1s", show_default=True)
@click.pass_context
def job_watch(ctx: click.Context, job_id: int, interval: str) -> None:
    """The status of a job, live, until it finishes."""
    pause = _duration("--interval", interval)
    tty = sys.stdout.isatty()
    with _connect(ctx) as conn:
        previous = 0
        while True:
            row = _get_job(conn, job_id)
            text = render.status_text(row, admin.job_attempts(conn, job_id))
            if tty and previous:
                click.echo(f"\x1b[{previous}F\x1b[J", nl=False)
            click.echo(text)
            previous = text.count("\n") + 1
            if row.finished:
                return
            time.sleep(pause)


@job.command("list")
@click.option("--queue", default=None)
@click.option("--state", default=None, type=click.Choice(admin.STATES))
@click.option("--stalled", is_flag=True, help="Only running jobs past their stall threshold.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True,
              help="Every column of each job, plus rate, eta_seconds and stalled.")
@click.pass_context
def job_list(ctx: click.Context, queue: str | None, state: str | None, stalled: bool,
             limit: int, as_json: bool) -> None:
    """Recent jobs, newest first."""
    rows = _rows(ctx, lambda conn: admin.list_jobs(conn, queue=queue, state=state,
                                                   stalled=stalled, limit=limit), queue=queue)
    if as_json:
        _dump([r.document() for r in rows])
    else:
        render.job_table(rows)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


@job.command("enqueue")
@click.argument("name")
@click.option("--args", "args_json", default="{}", help="The arguments as a JSON object.")
@click.option("--delay", default=None, help="Run no earlier than this from now (e.g. 10m).")
@click.option("--priority", type=int, default=None)
@click.option("--queue", default=None)
@click.pass_context
def job_enqueue(ctx: click.Context, name: str, args_json: str, delay: str | None,
                priority: int | None, queue: str | None) -> None:
    """Enqueue a job; prints its id alone on stdout."""
    try:
        # Exact numbers: a 30-digit numeric must not pass through a float on its way.
        args = json.loads(args_json, parse_float=Decimal, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        _fail(f"--args is not JSON: {exc}")
    if not isinstance(args, dict):
        _fail("--args must be a JSON object")
    try:
        seconds = parse_duration(delay) if delay else None
    except ValueError as exc:
        _fail(str(exc))
    with _connect(ctx, autocommit=False) as conn:
        try:
            job_id = atlantis.enqueue(conn, name, args, delay=seconds, priority=priority, queue=queue)
        except AtlantisError as exc:
            _fail(str(exc))
        unheard = queue is not None and not admin.queue_served(conn, queue)
        conn.commit()
    if unheard:
        click.echo(f"tide: warning: no declaration names queue {queue!r} and no supervisor has "
                   "served it; the job waits until one does (a typo?)", err=True)
    click.echo(job_id)


@job.command("retry")
@click.argument("job_id", type=int)
@click.pass_context
def job_retry(ctx: click.Context, job_id: int) -> None:
    """Put a dead or cancelled job back to available with a fresh attempt budget."""
    with _connect(ctx) as conn:
        try:
            retried = admin.retry_job(conn, job_id, by=_operator())
        except (JobNotFoundError, UniqueKeyTakenError) as exc:
            _fail(str(exc))
        if not retried:
            row = _get_job(conn, job_id)
            _fail(f"job {job_id} is {row.state}; only dead or cancelled jobs can be retried")
    click.echo(f"job {job_id} is available again")


@job.command("cancel")
@click.argument("job_id", type=int)
@click.pass_context
def job_cancel(ctx: click.Context, job_id: int) -> None:
    """Cancel a waiting job; a running attempt is told, then stopped after the grace."""
    with _connect(ctx) as conn:
        try:
            after = admin.cancel_job(conn, job_id, by=_operator())
        except JobNotFoundError as exc:
            _fail(str(exc))
        if after is None:
            row = _get_job(conn, job_id)
            _fail(f"job {job_id} is {row.state}; nothing to cancel")
    if after == "running":
        click.echo(f"job {job_id} is running; its supervisor is stopping it")
    else:
        click.echo(f"job {job_id} cancelled")


@job.command("logs")
@click.argument("job_id", type=int)
@click.option("--attempt", type=click.IntRange(min=1), default=None,
              help="Which attempt (default: the running one, else the latest with output).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the attempt ends.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def job_logs(ctx: click.Context, job_id: int, attempt: int | None, follow: bool,
             as_json: bool) -> None:
    """What an attempt wrote to its stdout and stderr."""
    with _connect(ctx) as conn:
        row = _get_job(conn, job_id)
        latest = admin.latest_log_attempt(conn, job_id)
        if attempt is None:
            attempt = row.attempt if row.running else latest
            if attempt is None:
                click.echo(f"tide: job {job_id} has no log lines", err=True)
                return
        else:
            known = max([row.attempt, latest or 0]
                        + [a.attempt for a in admin.job_attempts(conn, job_id)])
            if attempt > known:
                _fail(f"job {job_id} has no attempt {attempt} (it has had {known})")
        printed = _follow(conn, job_id, attempt, follow=follow, as_json=as_json)
    if not printed:
        click.echo(f"tide: attempt {attempt} of job {job_id} has no log lines", err=True)


def _follow(conn: psycopg.Connection[Any], job_id: int, attempt: int, *, follow: bool,
            as_json: bool) -> int:
    """Print the attempt's lines; with ``follow``, keep polling until the attempt has ended
    and its last lines are in. Returns how many lines were printed."""
    after = 0
    printed = 0
    ended_at: float | None = None
    while True:
        # Whether it still runs is read before the lines: what it wrote before ending is
        # then among them (or among those of the grace after the end).
        live = follow and _attempt_running(conn, job_id, attempt)
        while True:
            lines = admin.log_lines(conn, job_id, attempt, after=after)
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


def _attempt_running(conn: psycopg.Connection[Any], job_id: int, attempt: int) -> bool:
    row = admin.get_job(conn, job_id)
    return row is not None and row.running and row.attempt == attempt


def _log_text(job_id: int, line: admin.LogLine, as_json: bool) -> str:
    if as_json:
        doc = {"id": line.id, "job_id": job_id, "attempt": line.attempt,
               "at": line.at.isoformat(), "stream": line.stream, "line": line.line}
        return orjson.dumps(doc).decode()
    stamp = line.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    stream = click.style(f"{line.stream:<6}", fg="red" if line.stream == "stderr" else None)
    return f"{stamp} {stream} {line.line}"


@job.command("prune")
@click.option("--older-than", "older_than", required=True,
              help="Delete jobs that finished longer ago than this (e.g. 7d).")
@click.option("--state", "states", multiple=True, type=click.Choice(admin.FINISHED),
              help="Only jobs in this state (repeatable; default: every finished state).")
@click.pass_context
def job_prune(ctx: click.Context, older_than: str, states: tuple[str, ...]) -> None:
    """Delete finished jobs (with their attempts and logs); prints how many."""
    seconds = _duration("--older-than", older_than)
    chosen = list(states or admin.FINISHED)
    with _connect(ctx) as conn:
        deleted = admin.prune(conn, seconds, chosen)
    click.echo(f"tide: pruned {deleted} {'/'.join(chosen)} jobs finished more than "
               f"{format_duration(seconds)} ago", err=True)
    click.echo(deleted)


# ---- dlq, queue, worker -----------------------------------------------------------------

@main.group()
def dlq() -> None:
    """The dead-letter queue."""


@dlq.command("list")
@click.option("--queue", default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True,
              help="Every column of each job (args, errors, ...), plus computed fields.")
@click.pass_context
def dlq_list(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead jobs, newest first."""
    rows = _rows(ctx, lambda conn: admin.list_jobs(conn, queue=queue, state="dead", limit=limit),
                 queue=queue)
    if as_json:
        _dump([r.document() for r in rows])
    else:
        render.dlq_table(rows)


@main.group()
def queue() -> None:
    """Queues: their counts, pause and resume."""


@queue.command("stats")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def queue_stats(ctx: click.Context, as_json: bool) -> None:
    """Per queue: counts by state, stalled jobs, oldest wait, throughput, pause, supervisors."""
    rows = _rows(ctx, admin.queue_stats)
    if as_json:
        _dump([admin.as_dict(r) for r in rows])
    else:
        render.queue_table(rows)


@queue.command("pause")
@click.argument("name")
@click.option("--reason", default=None, help="Why, for whoever looks at queue stats.")
@click.pass_context
def queue_pause(ctx: click.Context, name: str, reason: str | None) -> None:
    """Stop supervisors claiming from a queue; running attempts continue."""
    with _connect(ctx) as conn:
        _check_queue(conn, name)
        changed = admin.pause_queue(conn, name, reason=reason, by=_operator())
    click.echo(f"queue {name} paused" + ("" if changed else " (it was paused already)"))


@queue.command("resume")
@click.argument("name")
@click.pass_context
def queue_resume(ctx: click.Context, name: str) -> None:
    """Let supervisors claim from a paused queue again."""
    with _connect(ctx) as conn:
        _check_queue(conn, name)
        changed = admin.resume_queue(conn, name, by=_operator())
    click.echo(f"queue {name} resumed" if changed else f"queue {name} was not paused")


@main.group()
def worker() -> None:
    """Supervisors."""


@worker.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def worker_list(ctx: click.Context, as_json: bool) -> None:
    """Live supervisors: host, pid, queues, in-flight jobs and their children's memory."""
    rows = _rows(ctx, admin.list_workers)
    if as_json:
        _dump([r.document() for r in rows])
    else:
        render.worker_table(rows)


def _rows(ctx: click.Context, read: Callable[[psycopg.Connection[Any]], list[_Row]], *,
          queue: str | None = None) -> list[_Row]:
    """The rows of one listing; an unknown ``queue`` ends the command with exit 1."""
    with _connect(ctx) as conn:
        _check_queue(conn, queue)
        return read(conn)


# ---- db, gen ----------------------------------------------------------------------------

@main.group()
def db() -> None:
    """The schema and the declarations stored in it."""


@db.command("migrate")
@click.option("--app", envvar="ATLANTIS_APP", default=None,
              help="Also sync this app's declarations (package.module:registry).")
@click.pass_context
def db_migrate(ctx: click.Context, app: str | None) -> None:
    """Create or upgrade the atlantis schema."""
    registry = _load(app) if app else None
    with _connect(ctx, autocommit=False) as conn:
        applied = migrate(conn)
        if registry is not None:
            sync(conn, list(registry.decls.values()))
    click.echo(f"applied migrations {applied}" if applied else "schema is up to date", err=True)


@db.command("sync")
@click.option("--app", envvar="ATLANTIS_APP", required=True)
@click.pass_context
def db_sync(ctx: click.Context, app: str) -> None:
    """Store the app's declarations in the database (enqueues validate against them)."""
    registry = _load(app)
    with _connect(ctx, autocommit=False) as conn:
        migrate(conn)
        sync(conn, list(registry.decls.values()))
    click.echo(f"synced {len(registry.decls)} declarations", err=True)


def _load(app: str) -> atlantis.Registry:
    try:
        return load_app(app)
    except AtlantisError as exc:
        _fail(str(exc), code=2)


@main.command("gen")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--check", is_flag=True, help="Fail if OUTPUT is not what would be generated.")
def gen(source: Path, output: Path, check: bool) -> None:
    """Write a typed Python module for the declarations in SOURCE."""
    from atlantis.declarations import parse_atl_file
    from atlantis.declarations.codegen import generate_module

    try:
        decls = parse_atl_file(source)
    except OSError as exc:
        _fail(f"cannot read {source}: {exc.strerror}", code=2)
    except AtlantisError as exc:
        _fail(str(exc), code=2)
    text = generate_module(decls, source.name)
    if check:
        current = output.read_text("utf-8") if output.exists() else None
        if current != text:
            _fail(f"{output} is stale; run: tide gen {source} -o {output}")
        return
    output.write_text(text, "utf-8")
    click.echo(f"wrote {output}", err=True)


# ---- schedule ----------------------------------------------------------------------------

main.add_command(schedule)
