"""``atlantis-supervise``: the command line of the supervisor."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

import click
import psycopg
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
)
from tenacity.stop import stop_base

from atlantis import environ
from atlantis.app import load_app
from atlantis.declarations import JobDecl, WorkflowDecl
from atlantis.errors import AtlantisError
from atlantis.store import connect, migrate, sync
from atlantis.store.database import (
    ENV_URL,
    announce,
    check_url,
    describe_db_error,
    redact,
    resolve_url,
)
from atlantis.store.embedded import check_embedded
from atlantis.supervisor import logformat, policy
from atlantis.supervisor.init import stay_init_if_pid1
from atlantis.supervisor.metrics import MetricsUnavailable
from atlantis.supervisor.readiness import ReadinessUnavailable
from atlantis.supervisor.settings import from_options
from atlantis.supervisor.settings import options as settings_options
from atlantis.supervisor.supervisor import Supervisor
from atlantis.supervisor.systemd import Notifier
from atlantis.units import format_duration
from atlantis.usage import OneLineCommand

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2

log = logging.getLogger("atlantis.supervisor")


def _fail(message: str) -> NoReturn:
    """Exit 2 with one line on stderr (a multi-line message is folded onto it)."""
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    click.echo(f"atlantis-supervise: {message}", err=True)
    sys.exit(EXIT_USAGE)


# Usage errors are one line on stderr and exit 2, like every other failure here.
@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@settings_options
def main(**values: Any) -> None:
    """Claim jobs from QUEUEs and run every attempt in a supervised child process."""
    # A stop signal that arrives while we start up is kept and honoured once the loop runs.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: early.append(signum))
    # A reload before the loop runs has nothing to replace: the children, started later,
    # import the app afresh. Without a handler, SIGHUP's default action would end us (a
    # handler, not SIG_IGN, which children would inherit).
    signal.signal(signal.SIGHUP, lambda signum, frame: None)
    stay_init_if_pid1()  # as PID 1: supervise from a child, with these handlers
    logformat.setup(values.get("log_format") or "text")
    try:  # first: a container with no URL says only that (ATLANTIS_EMBEDDED=never)
        check_embedded(url_given=bool(values.get("database_url") or os.environ.get(ENV_URL)))
        settings = from_options(values)
        registry = load_app(settings.app or None)
        if not settings.app:
            settings = replace(settings, app=os.environ[environ.APP])
    except (AtlantisError, ValueError) as exc:
        _fail(str(exc))
    if not registry.registrations:
        _fail(f"--app {settings.app}: no handler is registered")
    explicit = settings.database_url or os.environ.get(ENV_URL)
    try:
        url = resolve_url(explicit)
    except Exception as exc:  # the embedded server could not start
        _fail(f"cannot start the embedded PostgreSQL: {exc}")
    try:
        check_url(url)
        if settings.handler_database_url:
            check_url(settings.handler_database_url)
    except ValueError as exc:  # the message is already free of any password
        _fail(f"--database-url: {exc}" if url == explicit else str(exc))
    try:
        if settings.listen_database_url:
            check_url(settings.listen_database_url)
    except ValueError as exc:
        _fail(f"--listen-database-url: {exc}")
    if settings.log_format == "json":
        # Every line on stderr is then JSON, this one included.
        kind = "database" if explicit else "embedded PostgreSQL"
        logging.getLogger("atlantis.supervisor").info("using %s %s", kind, redact(url))
    else:
        announce(url, embedded=not explicit)
    try:
        _prepare(url, list(registry.decls.values()), settings.startup_timeout, early,
                 workflows=list(registry.workflows.values()))
    except psycopg.OperationalError as exc:
        if early:  # asked to stop while we waited: that is a clean stop
            sys.exit(0)
        click.echo(f"atlantis-supervise: database unreachable for "
                   f"{format_duration(settings.startup_timeout)}, giving up: "
                   f"{_first_line(exc, url)}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    except psycopg.Error as exc:
        _fail(f"cannot prepare the database: {_first_line(exc, url)}")
    settings = replace(settings, database_url=url)
    try:
        code = asyncio.run(Supervisor(settings, registry, early_signals=early).run())
    except (MetricsUnavailable, ReadinessUnavailable) as exc:  # before any child or claim
        _fail(str(exc))
    logging.shutdown()
    sys.exit(code)


def _first_line(exc: BaseException, url: str = "") -> str:
    """The error on one line, with nothing of the database URL's password in it."""
    return describe_db_error(exc, url)


def _prepare(url: str, decls: list[JobDecl], budget: float, early: list[int], *,
             workflows: list[WorkflowDecl]) -> None:
    """Migrate and sync the declarations, waiting up to ``budget`` for the database.

    Under systemd the supervisor may start before PostgreSQL accepts connections (both
    starting at boot, the database host rebooting): waiting with backoff avoids a restart
    loop. Past the budget it exits 1, and ``Restart=on-failure`` tries again later; the
    budget stays below systemd's default start timeout (90s) for ``Type=notify``. Only
    connection problems are waited for; any other database error is a configuration
    error (exit 2 at once). A stop signal ends the wait.

    It migrates only when its role may (a superuser, or the schema's owner); a role such
    as ``atlantis_worker`` checks the schema version instead, and a schema behind this
    package's migrations is one line and exit 2. A schema ahead of it (the previous release
    during a rolling upgrade) is used as it is, with a warning.
    """
    from atlantis.store.migrate import may_migrate, schema_ahead, schema_problem

    notifier = Notifier()
    problem: list[str] = []

    def waiting(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        error = _first_line(exc, url) if exc is not None else "?"
        log.warning("waiting for the database (up to %s): %s", format_duration(budget), error)
        notifier.notify(f"STATUS=waiting for the database: {error}")

    try:
        for attempt in Retrying(
            stop=stop_after_delay(budget) | _StopSignalled(early),
            wait=policy.backoff_wait(0.1, 5.0),
            retry=retry_if_exception_type(psycopg.OperationalError),
            before_sleep=waiting, reraise=True, sleep=_sleep_unless(early),
        ):
            with attempt, connect(url, connect_timeout=5) as conn:
                if may_migrate(conn):
                    migrate(conn)
                else:
                    found = schema_problem(conn)
                    if found is not None:
                        problem.append(found)
                        return
                    log.info("not migrating: role %s does not own the atlantis schema",
                             conn.info.user)
                ahead = schema_ahead(conn)
                if ahead is not None:
                    log.warning("%s", ahead)
                sync(conn, decls, workflows)
    finally:
        notifier.close()
        if problem:
            _fail(problem[0])


class _StopSignalled(stop_base):
    def __init__(self, early: list[int]) -> None:
        self.early = early

    def __call__(self, retry_state: RetryCallState) -> bool:
        return bool(self.early)


def _sleep_unless(early: list[int]) -> Callable[[float], None]:
    """Sleep in small steps, so that a stop signal received meanwhile ends the wait."""

    def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not early and (left := end - time.monotonic()) > 0:
            time.sleep(min(0.1, left))  # one reading of the clock: never a negative sleep

    return sleep
