"""``tide``: watch and steer jobs, manage the schema, generate code.

Exit codes: 0 done; 1 for what went wrong at run time (an unknown id, job or queue, a
refused change, a database that cannot be reached or an atlantis schema that is missing);
2 for bad usage: bad options, an app that cannot be loaded, a ``.atl`` file with errors (or
one ``tide gen`` cannot read), or a ``--database-url`` (or ``ATLANTIS_DATABASE_URL``) that
libpq cannot parse. A ``tide gen`` output that cannot be written (or, with ``--check``,
read) is a run-time failure: 1. Every failure is one line on stderr, without a traceback,
and no password ever appears in it.

Changes (cancel, retry, pause, resume, queue limits, prune) go through the SQL functions every path
shares (:mod:`atlantis.operations`); tide records the OS user as who made them.
"""

from __future__ import annotations

from pathlib import Path

import click

import atlantis
from atlantis import environ, operations
from atlantis.app import load_app
from atlantis.cli import tables
from atlantis.cli.common import (
    LIMIT,
    NO_LIMIT,
    QUEUE_LIMIT,
    check_queue,
    connection,
    duration_option,
    explicit_url,
    fail,
    listing_rows,
    operator_name,
    print_json,
    show_rows,
)
from atlantis.cli.doctor import doctor
from atlantis.cli.escape import safe
from atlantis.cli.job_wait import job_wait
from atlantis.cli.jobs import job
from atlantis.cli.roles import roles
from atlantis.cli.scaling import metrics, queue_signal
from atlantis.cli.schedules import schedule
from atlantis.cli.server import server
from atlantis.cli.workers import worker
from atlantis.cli.workflows import workflow
from atlantis.console.command import console
from atlantis.errors import AtlantisError
from atlantis.presentation import job_document
from atlantis.store import admin, fleet, migrate, sync
from atlantis.store.database import resolve_url
from atlantis.store.typed_rows import as_dict
from atlantis.usage import JsonErrorsGroup


@click.group(cls=JsonErrorsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", default=None,
              help=f"libpq URL; default ${environ.DATABASE_URL} or embedded.")
@click.option("--timeout", default=None, envvar=environ.TIDE_TIMEOUT, metavar="DURATION",
              help=f"How long to wait for the database, to connect and for each statement "
                   f"(default 5s to connect, 30s a statement; 0: no limit; "
                   f"${environ.TIDE_TIMEOUT}). "
                   "job watch, job logs --follow, db migrate, db sync and job prune wait as "
                   "long as their statements take.")
@click.pass_context
def main(ctx: click.Context, database_url: str | None, timeout: str | None) -> None:
    """Operate atlantis jobs."""
    ctx.obj = {"database_url": database_url,
               "timeout": None if timeout is None else duration_option("--timeout", timeout)}



main.add_command(job)
job.add_command(job_wait)
main.add_command(workflow)


@main.group()
def dlq() -> None:
    """The dead-letter queue."""


@dlq.command("list")
@click.option("--queue", default=None)
@click.option("--limit", default=50, show_default=True, type=LIMIT)
@click.option("--json", "as_json", is_flag=True,
              help="Every column of each job (args, errors, ...), plus computed fields.")
@click.pass_context
def dlq_list(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead jobs, newest first."""
    rows = listing_rows(ctx, lambda conn: admin.list_jobs(conn, queue=queue, state="dead",
                                                          limit=limit), queue=queue)
    show_rows(rows, as_json, job_document, tables.dlq_table)


@main.group()
def queue() -> None:
    """Queues: their counts, the scaling signal, pause and resume, concurrency limits."""


@queue.command("stats")
@click.option("--json", "as_json", is_flag=True,
              help="Every field of each queue, with concurrency_limit, limited_running, held.")
@click.pass_context
def queue_stats(ctx: click.Context, as_json: bool) -> None:
    """Per queue: counts by state, stalled jobs, oldest wait, limits and the jobs they hold,
    throughput, pause, supervisors."""
    with connection(ctx) as conn:
        rows = fleet.queue_stats(conn)
        limits = fleet.queue_limits(conn, [q.queue for q in rows])
    if as_json:
        print_json([{**as_dict(q), **as_dict(limits.get(q.queue, fleet.NO_LIMITS))}
                    for q in rows])
    else:
        tables.queue_table(rows, limits)


@queue.command("pause")
@click.argument("name")
@click.option("--reason", default=None, help="Why, for whoever looks at queue stats.")
@click.pass_context
def queue_pause(ctx: click.Context, name: str, reason: str | None) -> None:
    """Stop supervisors claiming from a queue; running attempts continue."""
    with connection(ctx) as conn:
        check_queue(conn, name)
        changed = operations.pause(conn, name, reason=reason, by=operator_name())
    click.echo(f"queue {safe(name)} paused"
               + ("" if changed else " (it was paused already)"))


@queue.command("resume")
@click.argument("name")
@click.pass_context
def queue_resume(ctx: click.Context, name: str) -> None:
    """Let supervisors claim from a paused queue again."""
    with connection(ctx) as conn:
        check_queue(conn, name)
        changed = operations.resume(conn, name, by=operator_name())
    shown = safe(name)
    click.echo(f"queue {shown} resumed" if changed else f"queue {shown} was not paused")


@queue.command("limit")
@click.argument("name")
@click.option("--concurrency", type=QUEUE_LIMIT, default=None, metavar="N|none",
              help="At most N attempts of the queue running at once, across every supervisor; "
                   "none removes the limit. Without it: show the limit.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def queue_limit(ctx: click.Context, name: str, concurrency: int | None, as_json: bool) -> None:
    """Set, remove or show a queue's concurrency limit, held by the database."""
    shown = safe(name)
    with connection(ctx) as conn:
        check_queue(conn, name)
        if concurrency is None:
            now = fleet.queue_limits(conn, [name]).get(name, fleet.NO_LIMITS)
        else:
            wanted = None if concurrency == NO_LIMIT else concurrency
            try:
                was = operations.set_queue_limit(conn, name, wanted, by=operator_name())
            except AtlantisError as exc:
                fail(str(exc))
    if concurrency is None:
        if as_json:
            print_json({"queue": name, **as_dict(now)})
            return
        what = ("no concurrency limit" if now.concurrency_limit is None
                else f"concurrency limit {now.concurrency_limit}")
        click.echo(f"queue {shown}: {what}; slots in use {now.limited_running}, held {now.held}")
        return
    if as_json:
        print_json({"queue": name, "concurrency": wanted, "was": was})
        return
    what = "no concurrency limit" if wanted is None else f"concurrency limit {wanted}"
    click.echo(f"queue {shown}: {what} (was {'none' if was is None else was})")


# ---- db, gen ----------------------------------------------------------------------------

@main.group()
def db() -> None:
    """The schema and the declarations stored in it."""


@db.command("migrate")
@click.option("--app", envvar=environ.APP, default=None,
              help="Also sync this app's declarations (package.module:registry).")
@click.pass_context
def db_migrate(ctx: click.Context, app: str | None) -> None:
    """Create or upgrade the atlantis schema."""
    registry = _load(app) if app else None
    with connection(ctx, autocommit=False, deadline=False) as conn:
        applied = migrate(conn)
        if registry is not None:
            sync(conn, list(registry.decls.values()), registry.workflows.values())
    click.echo(f"applied migrations {applied}" if applied else "schema is up to date", err=True)


@db.command("sync")
@click.option("--app", envvar=environ.APP, required=True)
@click.option("--prune", is_flag=True,
              help="Also remove the app's declarations it no longer declares (a dry run "
                   "without --yes).")
@click.option("--yes", is_flag=True, help="With --prune: remove them (else only say what).")
@click.option("--namespace", "namespaces", multiple=True, metavar="NS",
              help="With --prune: treat NS as the app's too (a namespace it no longer uses).")
@click.pass_context
def db_sync(ctx: click.Context, app: str, prune: bool, yes: bool,
            namespaces: tuple[str, ...]) -> None:
    """Store the app's declarations in the database (enqueues validate against them).

    With --prune, also remove the declarations the app no longer declares. An app's own
    declarations are those in the namespaces its jobs and workflows use (durable for
    "job Import in durable"; --namespace adds one): the database records no app, and a
    namespace belongs to one app. Without --yes it is a dry run: it prints one line per
    declaration, "would remove job NAME" or "kept job NAME: REASONS", and changes
    nothing (it does not sync either). With --yes it syncs, then removes the removable ones
    in one transaction, the declarations locked and the reasons checked again under the
    locks, and prints "removed ..." and "kept ..." lines.

    A job declaration is kept while it has waiting or running rows, a schedule (ship a
    release declaring it without its schedule first), a workflow declaration of any app
    whose steps or compensations use it, or a live supervisor serving it (an older release
    of a rolling deploy). A workflow declaration is kept while it has instances not ended
    (running, compensating, or compensation_failed and not dismissed). The kept ones never
    stop the others: with --yes the removable ones go. The exit status is 1 when anything
    was kept, so scripts notice; 0 otherwise.
    """
    if (yes or namespaces) and not prune:
        fail("--yes and --namespace go with --prune", code=2)
    registry = _load(app)
    if prune:
        from atlantis.cli.sync_prune import sync_prune

        sync_prune(ctx, registry, yes, namespaces)
        return
    with connection(ctx, autocommit=False, deadline=False) as conn:
        migrate(conn)
        sync(conn, list(registry.decls.values()), registry.workflows.values())
    click.echo(f"synced {len(registry.decls)} declarations", err=True)


@db.command("url")
@click.pass_context
def db_url(ctx: click.Context) -> None:
    """Print the database URL tide uses (--database-url, else ATLANTIS_DATABASE_URL, else the
    embedded PostgreSQL, started if needed), for your own code and tools such as psql."""
    try:
        url = resolve_url(explicit_url(ctx))
    except Exception as exc:
        fail(f"cannot start the embedded PostgreSQL: {exc}")
    click.echo(url)


@db.command("upgrade-home")
@click.pass_context
def db_upgrade_home(ctx: click.Context) -> None:
    """Move the embedded home (ATLANTIS_HOME) to the PostgreSQL major new homes get, with
    pg_upgrade; the old data folder is kept beside it. Stop supervisors and consoles first."""
    from atlantis.cli.doctor import embedded_home
    from atlantis.store import doctor as checks
    from atlantis.store import embedded, homes

    if embedded_home(ctx) is None:
        fail(f"upgrade-home moves the embedded home; {environ.DATABASE_URL} or --database-url "
             f"names another server: upgrade it with pg_upgrade, or dump and restore", code=2)
    home = embedded.atlantis_home().expanduser().absolute()
    data = home / "pgdata"
    try:
        major = embedded.home_major(data)
    except AtlantisError as exc:
        fail(str(exc))
    if major is None:
        fail(f"{home} has no embedded PostgreSQL yet (a new home gets "
             f"{embedded.DEFAULT_MAJOR})")
    if major >= embedded.DEFAULT_MAJOR:
        click.echo(f"{home} already runs PostgreSQL {major}", err=True)
        return
    if homes.running(data):
        with connection(ctx) as conn:
            others = checks.other_sessions(conn)
        if others:
            fail(f"{others} other session{'s are' if others != 1 else ' is'} connected to the "
                 f"embedded PostgreSQL: stop the supervisors, consoles and scripts using "
                 f"{home} first")
    click.echo(f"moving {home} from PostgreSQL {major} to {embedded.DEFAULT_MAJOR} "
               f"(pg_upgrade, copying the data)", err=True)
    try:
        homes.stop(data)
        moved = homes.upgrade_home(home)
    except AtlantisError as exc:
        fail(f"cannot move {home}: {exc} (the old data folder is as it was)")
    click.echo(f"moved {home} to PostgreSQL {moved.new_major}; the old data folder is kept "
               f"at {moved.kept}: remove it once the new one serves you", err=True)


def _load(app: str) -> atlantis.Registry:
    try:
        return load_app(app)
    except AtlantisError as exc:
        fail(str(exc), code=2, kind="app")


@main.command("gen")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--check", is_flag=True, help="Fail if OUTPUT is not what would be generated.")
def gen(source: Path, output: Path, check: bool) -> None:
    """Write a typed Python module for the jobs and workflows declared in SOURCE."""
    from atlantis.declarations import read_atl_file
    from atlantis.declarations.codegen import generate_module

    try:
        found = read_atl_file(source)
        text = generate_module(found.jobs, source.name, found.workflows)
    except OSError as exc:
        fail(f"cannot read {source}: {exc.strerror or exc}", code=2)
    except AtlantisError as exc:
        fail(str(exc), code=2)
    if check:
        try:
            current = output.read_text("utf-8") if output.exists() else None
        except UnicodeDecodeError:
            current = None  # not what gen writes: stale
        except OSError as exc:
            fail(f"cannot read {output}: {exc.strerror or exc}")
        if current != text:
            fail(f"{output} is stale; run: tide gen {source} -o {output}")
        return
    try:
        output.write_text(text, "utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    click.echo(f"wrote {output}", err=True)


# ---- schedule ----------------------------------------------------------------------------

main.add_command(schedule)
main.add_command(worker)
main.add_command(console)
queue.add_command(queue_signal)
main.add_command(metrics)
db.add_command(doctor)
db.add_command(roles)
db.add_command(server)
