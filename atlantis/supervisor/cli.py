"""``atlantis-supervise``: the command line of the supervisor."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import click
import psycopg

from atlantis.app import load_app
from atlantis.errors import AtlantisError
from atlantis.store import connect, migrate, sync
from atlantis.store.database import ENV_URL, announce, resolve_url
from atlantis.supervisor import logs
from atlantis.supervisor.config import SupervisorConfig
from atlantis.supervisor.supervisor import Supervisor
from atlantis.units import parse_duration, parse_size

EXIT_USAGE = 2


def _fail(message: str) -> None:
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
@click.option("--metrics-port", type=int, default=None)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--database-url", default=None, help=f"libpq URL; default ${ENV_URL} or embedded.")
@click.option("--poll-interval", default="1s", show_default=True, hidden=True)
@click.option("--rescue-interval", default="5s", show_default=True, hidden=True)
def main(
    queues: tuple[str, ...], app: str | None, concurrency: int | None, drain_timeout: str,
    kill_grace: str, isolation: str, max_jobs_per_child: int, max_memory_per_child: str | None,
    metrics_port: int | None, log_format: str, database_url: str | None, poll_interval: str,
    rescue_interval: str,
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
            concurrency=concurrency or os.cpu_count() or 1,
            drain_timeout=parse_duration(drain_timeout),
            kill_grace=parse_duration(kill_grace),
            isolation=isolation,
            max_jobs_per_child=max_jobs_per_child,
            max_memory_per_child=parse_size(max_memory_per_child) if max_memory_per_child else 0,
            metrics_port=metrics_port,
            log_format=log_format,
            poll_interval=parse_duration(poll_interval),
            rescue_interval=parse_duration(rescue_interval),
        ).validate()
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
    announce(url, embedded=not explicit)
    try:
        with connect(url) as conn:
            migrate(conn)
            sync(conn, list(registry.decls.values()))
    except psycopg.Error as exc:
        _fail(f"cannot prepare the database: {str(exc).strip()}")
    config = SupervisorConfig(**{**config.__dict__, "database_url": url})
    code = asyncio.run(Supervisor(config, registry, early_signals=early).run())
    logging.shutdown()
    sys.exit(code)
