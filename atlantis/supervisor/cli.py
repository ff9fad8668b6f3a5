"""``atlantis-supervise``: the command line of the supervisor."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import click
import psycopg
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from atlantis.app import load_app
from atlantis.declarations import JobDecl
from atlantis.errors import AtlantisError
from atlantis.store import connect, migrate, sync
from atlantis.store.database import ENV_URL, announce, redact, resolve_url
from atlantis.supervisor import logs
from atlantis.supervisor.config import SupervisorConfig
from atlantis.supervisor.supervisor import Supervisor
from atlantis.supervisor.systemd import Notifier
from atlantis.units import format_duration, parse_duration, parse_size

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2

log = logging.getLogger("atlantis.supervisor")


def _fail(message: str) -> None:
    """Exit 2 with one line on stderr (a multi-line message is folded onto it)."""
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    click.echo(f"atlantis-supervise: {message}", err=True)
    sys.exit(EXIT_USAGE)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--queue", "queues", multiple=True, required=True, help="Queue to serve (repeatable).")
@click.option("--app", envvar="ATLANTIS_APP", help="package.module:registry (or ATLANTIS_APP).")
@click.option("--concurrency", type=int, default=None, help="Children; default: number of CPUs.")
@click.option("--drain-timeout", default="30s", show_default=True)
@click.option("--kill-grace", default="10s", show_default=True)
@click.option("--isolation", type=click.Choice(["reuse", "fresh"]), default="reuse", show_default=True)
@click.option("--max-jobs-per-child", type=int, default=0, help="Recycle a child after N attempts.")
@click.option("--max-memory-per-child", default=None, help="e.g. 512MB, 2GB (powers of 1024).")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address for the metrics server (0.0.0.0 for remote scraping).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--database-url", default=None, help=f"libpq URL; default ${ENV_URL} or embedded.")
@click.option("--poll-interval", default="1s", show_default=True, hidden=True)
@click.option("--rescue-interval", default="5s", show_default=True, hidden=True)
@click.option("--startup-timeout", default="60s", show_default=True,
              help="How long to wait for an unreachable database at start before exiting 1.")
def main(
    queues: tuple[str, ...], app: str | None, concurrency: int | None, drain_timeout: str,
    kill_grace: str, isolation: str, max_jobs_per_child: int, max_memory_per_child: str | None,
    metrics_port: int | None, metrics_host: str, log_format: str, database_url: str | None, poll_interval: str,
    rescue_interval: str, startup_timeout: str,
) -> None:
    """Claim jobs from QUEUEs and run every attempt in a supervised child process."""
    # A stop signal that arrives while we start up is kept and honoured once the loop runs.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: early.append(signum))
    logs.setup(log_format)
    try:
        registry = load_app(app)
        config = SupervisorConfig(
            app=app or os.environ["ATLANTIS_APP"],
            database_url="",
            queues=queues,
            # 0 is a mistake to report, not a request for the default.
            concurrency=concurrency if concurrency is not None else os.cpu_count() or 1,
            drain_timeout=parse_duration(drain_timeout),
            kill_grace=parse_duration(kill_grace),
            isolation=isolation,
            max_jobs_per_child=max_jobs_per_child,
            max_memory_per_child=parse_size(max_memory_per_child) if max_memory_per_child else 0,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            log_format=log_format,
            poll_interval=parse_duration(poll_interval),
            rescue_interval=parse_duration(rescue_interval),
        ).validate()
        startup_budget = parse_duration(startup_timeout)
    except (AtlantisError, ValueError) as exc:
        _fail(str(exc))
        return
    if not registry.registrations:
        _fail(f"--app {config.app}: no handler is registered")
    explicit = database_url or os.environ.get(ENV_URL)
    try:
        url = resolve_url(explicit)
    except Exception as exc:  # the embedded server could not start
        _fail(f"cannot start the embedded PostgreSQL: {exc}")
        return
    if log_format == "json":
        # Every line on stderr is then JSON, this one included.
        kind = "database" if explicit else "embedded PostgreSQL"
        logging.getLogger("atlantis.supervisor").info("using %s %s", kind, redact(url))
    else:
        announce(url, embedded=not explicit)
    try:
        _prepare(url, list(registry.decls.values()), startup_budget, early)
    except psycopg.OperationalError as exc:
        if early:  # asked to stop while we waited: that is a clean stop
            sys.exit(0)
        click.echo(f"atlantis-supervise: database unreachable for {format_duration(startup_budget)}, "
                   f"giving up: {_first_line(exc)}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    except psycopg.Error as exc:
        _fail(f"cannot prepare the database: {_first_line(exc)}")
    config = SupervisorConfig(**{**config.__dict__, "database_url": url})
    code = asyncio.run(Supervisor(config, registry, early_signals=early).run())
    logging.shutdown()
    sys.exit(code)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _prepare(url: str, decls: list[JobDecl], budget: float, early: list[int]) -> None:
    """Migrate and sync the declarations, waiting up to ``budget`` for the database.

    Under systemd the supervisor may start before PostgreSQL accepts connections (both
    starting at boot, the database host rebooting): waiting with backoff avoids a restart
    loop. Past the budget it exits 1, and ``Restart=on-failure`` tries again later; the
    budget stays below systemd's default start timeout (90s) for ``Type=notify``. Only
    connection problems are waited for; any other database error is a configuration
    error (exit 2 at once). A stop signal ends the wait.
    """
    notifier = Notifier()

    def waiting(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        error = _first_line(exc) if exc is not None else "?"
        log.warning("waiting for the database (up to %s): %s", format_duration(budget), error)
        notifier.notify(f"STATUS=waiting for the database: {error}")

    try:
        for attempt in Retrying(
            stop=stop_after_delay(budget) | _StopSignalled(early),
            wait=wait_exponential_jitter(initial=0.1, max=5.0),
            retry=retry_if_exception_type(psycopg.OperationalError),
            before_sleep=waiting, reraise=True, sleep=_sleep_unless(early),
        ):
            with attempt, connect(url, connect_timeout=5) as conn:
                migrate(conn)
                sync(conn, decls)
    finally:
        notifier.close()


class _StopSignalled(stop_base):
    def __init__(self, early: list[int]) -> None:
        self.early = early

    def __call__(self, retry_state: RetryCallState) -> bool:
        return bool(self.early)


def _sleep_unless(early: list[int]) -> Callable[[float], None]:
    """Sleep in small steps, so that a stop signal received meanwhile ends the wait."""

    def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not early and time.monotonic() < end:
            time.sleep(min(0.1, end - time.monotonic()))

    return sleep
