"""``tide``: watch and steer jobs, manage the schema, generate code.

Exit codes: 0 done; 1 for what went wrong at run time (an unknown id, job or queue, a
refused change, a database that cannot be reached or an atlantis schema that is missing);
2 for bad usage: bad options, an app that cannot be loaded, a ``.atl`` file with errors, or
a ``--database-url`` (or ``ATLANTIS_DATABASE_URL``) that libpq cannot parse. Every failure
is one line on stderr, without a traceback, and no password ever appears in it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import orjson
import psycopg

import atlantis
from atlantis.app import load_app
from atlantis.cli.render import status_text
from atlantis.errors import AtlantisError
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
from atlantis.units import parse_duration

_Row = TypeVar("_Row")


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", default=None, help=f"libpq URL; default ${ENV_URL} or embedded.")
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Operate atlantis jobs."""
    ctx.obj = {"database_url": database_url}


@contextmanager
def _connect(ctx: click.Context, *, autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the database; any failure to reach it ends the command with one line.

    A URL libpq cannot parse exits 2, a database that cannot be reached (or is lost while
    the command runs) exits 1; neither message quotes the URL's password.
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
        except psycopg.errors.UndefinedTable:
            _fail("the atlantis schema is missing; run `tide db migrate`")
        except (psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedFunction):
            _fail("the atlantis schema is out of date; run `tide db migrate`")
        except psycopg.OperationalError as exc:
            _fail(f"lost the database: {describe_db_error(exc, url)}")


def _get_job(conn: psycopg.Connection[Any], job_id: int) -> admin.JobRow:
    row = admin.get_job(conn, job_id)
    if row is None:
        _fail(f"no job with id {job_id}")
    return row


def _check_queue(conn: psycopg.Connection[Any], queue: str | None) -> None:
    """A queue nothing is declared on and no job ever used is a typo: say so."""
    if queue is not None and not admin.queue_known(conn, queue):
        _fail(f"unknown queue {queue!r}: no declaration or job uses it")


# ---- job --------------------------------------------------------------------------------

@main.group()
def job() -> None:
    """Inspect and steer jobs."""


@job.command("status")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON document of the row's columns.")
@click.pass_context
def job_status(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """State, attempts, progress, lease, timings and last error of a job."""
    with _connect(ctx) as conn:
        row = _get_job(conn, job_id)
    if as_json:
        _dump(row.document())
    else:
        click.echo(status_text(row))


@job.command("watch")
@click.argument("job_id", type=int)
@click.option("--interval", default="1s", show_default=True)
@click.pass_context
def job_watch(ctx: click.Context, job_id: int, interval: str) -> None:
    """The status of a job, live, until it finishes."""
    try:
        pause = parse_duration(interval)
    except ValueError as exc:
        _fail(f"--interval: {exc}", code=2)
    tty = sys.stdout.isatty()
    with _connect(ctx) as conn:
        previous = 0
        while True:
            row = _get_job(conn, job_id)
            text = status_text(row)
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
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def job_list(ctx: click.Context, queue: str | None, state: str | None, limit: int, as_json: bool) -> None:
    """Recent jobs, newest first."""
    rows = _rows(ctx, lambda conn: admin.list_jobs(conn, queue=queue, state=state, limit=limit),
                 queue=queue)
    _show(rows, as_json, ["id", "job", "queue", "state", "attempt", "progress_pct",
                          "progress_msg", "last_error"])


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
        conn.commit()
    click.echo(job_id)


@job.command("retry")
@click.argument("job_id", type=int)
@click.pass_context
def job_retry(ctx: click.Context, job_id: int) -> None:
    """Put a dead or cancelled job back to available with a fresh attempt budget."""
    with _connect(ctx) as conn:
        row = _get_job(conn, job_id)
        if not admin.retry_job(conn, job_id):
            _fail(f"job {job_id} is {row.state}; only dead or cancelled jobs can be retried")
    click.echo(f"job {job_id} is available again")


@job.command("cancel")
@click.argument("job_id", type=int)
@click.pass_context
def job_cancel(ctx: click.Context, job_id: int) -> None:
    """Cancel a waiting job; a running attempt is told, then killed after the grace."""
    with _connect(ctx) as conn:
        row = _get_job(conn, job_id)
        after = admin.cancel_job(conn, job_id)
        if after is None:
            _fail(f"job {job_id} is {row.state}; nothing to cancel")
    if after == "running":
        click.echo(f"job {job_id} is running; its supervisor is stopping it")
    else:
        click.echo(f"job {job_id} cancelled")


# ---- dlq, queue, worker -----------------------------------------------------------------

@main.group()
def dlq() -> None:
    """The dead-letter queue."""


@dlq.command("list")
@click.option("--queue", default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dlq_list(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead jobs, newest first."""
    rows = _rows(ctx, lambda conn: admin.list_jobs(conn, queue=queue, state="dead", limit=limit),
                 queue=queue)
    _show(rows, as_json, ["id", "job", "queue", "attempt", "finished_at", "last_error"])


@main.group()
def queue() -> None:
    """Queues."""


@queue.command("stats")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def queue_stats(ctx: click.Context, as_json: bool) -> None:
    """Per queue: counts by state, oldest waiting age, completions in the last minute."""
    _show(_rows(ctx, admin.queue_stats), as_json,
          ["queue", "available", "running", "complete", "dead", "cancelled",
           "oldest_waiting_seconds", "completed_last_minute"])


@main.group()
def worker() -> None:
    """Supervisors."""


@worker.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def worker_list(ctx: click.Context, as_json: bool) -> None:
    """Live supervisors: host, pid, queues, in-flight."""
    _show(_rows(ctx, admin.list_workers), as_json, ["id", "host", "pid", "queues", "concurrency",
                                               "in_flight", "status", "seen_at"])


def _rows(ctx: click.Context, read: Callable[[psycopg.Connection[Any]], list[_Row]], *,
          queue: str | None = None) -> list[_Row]:
    """The rows of one listing; an unknown ``queue`` ends the command with exit 1."""
    with _connect(ctx) as conn:
        _check_queue(conn, queue)
        return read(conn)


def _show(rows: Sequence[Any], as_json: bool, columns: list[str]) -> None:
    """One JSON document of the rows (all their columns), or a table of ``columns``."""
    docs = [admin.as_dict(row) for row in rows]
    if as_json:
        _dump(docs)
    else:
        _table(docs, columns)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns, box=None, pad_edge=False)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row[c]) for c in columns))
    Console(soft_wrap=True).print(table)


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
