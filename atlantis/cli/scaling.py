"""The scaling signal in ``tide`` (issue 37): ``tide queue signal [QUEUE] [--json]`` shows
it, ``tide metrics serve`` serves it to Prometheus; neither needs a supervisor running.

``metrics serve`` keeps one connection (made again after a failure) and reads the database
at every scrape (:mod:`atlantis.scaling`); a scrape that cannot read it serves
``atlantis_database_up 0`` alone, and the first such scrape and the first after it are said
on stderr. SIGTERM or SIGINT stops it (exit 0).
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Sequence
from socketserver import ThreadingMixIn
from types import FrameType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import click
from prometheus_client import make_wsgi_app

from atlantis import scaling
from atlantis.cli.common import check_queue, connection, explicit_url, fail, print_json
from atlantis.cli.escape import safe
from atlantis.cli.render import short_duration
from atlantis.cli.tables import Cell, Column, print_table
from atlantis.store import scaling as store_scaling
from atlantis.store.database import DatabaseUrlError, check_url, describe_db_error, resolve_url
from atlantis.store.deadline import DeadlineConnection, connect_timeout
from atlantis.store.scaling import QueueSignal
from atlantis.store.typed_rows import as_dict

#: ``tide metrics serve``'s port when none is given.
DEFAULT_PORT = 9465
#: How long a scrape waits for the database (to connect, then for its statements) unless
#: ``tide --timeout`` says otherwise: below Prometheus's default scrape timeout (10 s).
SCRAPE_DEADLINE = 8.0
#: Counts above this are estimates when a row is not ``exact`` (atlantis.queue_signal's cap).
EXACT_UP_TO = 1000


@click.command("signal")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Every field of each queue, as JSON.")
@click.pass_context
def queue_signal(ctx: click.Context, name: str | None, as_json: bool) -> None:
    """Per queue, what to scale and alert on: jobs claimable now and how long the oldest has
    been due, running, delayed, held by a limit, suspended, paused. Read from the database
    alone: no supervisor needs to run. NAME: that queue only."""
    with connection(ctx) as conn:
        check_queue(conn, name)
        rows = store_scaling.queue_signal(conn, name)
    if as_json:
        print_json([as_dict(r) for r in rows])
    else:
        signal_table(rows)


def signal_table(rows: Sequence[QueueSignal]) -> None:
    """``tide queue signal``: counts above 1,000 that are estimates start with ``≈``."""
    columns = [Column("QUEUE"), Column("CLAIMABLE", right=True), Column("OLDEST", right=True),
               Column("RUNNING", right=True), Column("DELAYED", right=True),
               Column("HELD", right=True), Column("SUSPENDED", right=True),
               Column("STATUS", flexible=True)]
    table: list[list[Cell]] = []
    for r in rows:
        def count(n: int, exact: bool = r.exact) -> str:
            return f"≈{n}" if not exact and n > EXACT_UP_TO else str(n)

        oldest = (short_duration(r.oldest_claimable_seconds)
                  if r.oldest_claimable_seconds is not None else "")
        table.append([r.queue, count(r.claimable), oldest, count(r.running),
                      count(r.delayed), count(r.limit_held), count(r.suspended),
                      "paused" if r.paused else "ok"])
    print_table(columns, table)


# ---- tide metrics serve ---------------------------------------------------------------------

@click.group()
def metrics() -> None:
    """Prometheus metrics of the queues, served by a process that runs no job."""


@metrics.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for scrapes from elsewhere).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port to listen on (0: any free port, said on stderr).")
@click.pass_context
def metrics_serve(ctx: click.Context, host: str, port: int) -> None:
    """Serve the scaling gauges (atlantis_queue_claimable,
    atlantis_queue_oldest_claimable_seconds, ..., atlantis_workers_silent) on
    http://HOST:PORT/metrics, read from the database at each scrape (waiting at most 8s for
    it; tide --timeout sets that). A scrape that cannot read it serves atlantis_database_up
    0 alone. Runs until SIGTERM or SIGINT."""
    with connection(ctx) as conn:  # the database and its schema, checked once at start
        scaling.read(conn)
    chosen: float | None = ctx.find_root().obj.get("timeout")
    source = _Source(_url(ctx), SCRAPE_DEADLINE if chosen is None else chosen)
    server = _listen(host, port, make_wsgi_app(scaling.registry(source, source.failed)))
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"tide: metrics: serving http://{safe(shown)}:{server.server_port}/metrics",
               err=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
    try:
        server.serve_forever()
    except _Stopped:
        pass
    finally:
        server.server_close()
        source.close()
    click.echo("tide: metrics: stopped", err=True)


class _Stopped(BaseException):
    """SIGTERM or SIGINT: serve_forever ends. Raised in the main thread wherever it is, which
    may be inside the server's taking of a request, where socketserver logs any
    ``Exception`` and serves on: a ``BaseException``, as KeyboardInterrupt is."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


def _url(ctx: click.Context) -> str:
    url = resolve_url(explicit_url(ctx))  # connection() above has started or found it
    try:
        check_url(url)
    except DatabaseUrlError as exc:  # pragma: no cover - connection() refused it already
        fail(str(exc), code=2)
    return url


class _Source:
    """What each scrape reads: one connection kept across scrapes (one scrape at a time),
    made again after any failure."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self._conn: DeadlineConnection | None = None
        self._lock = threading.Lock()
        self._failing = False

    def __call__(self) -> scaling.Reading:
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                conn = DeadlineConnection.connect(
                    self.url, autocommit=True, application_name="atlantis-metrics",
                    prepare_threshold=None, connect_timeout=connect_timeout(self.timeout))
                conn.statement_deadline = self.timeout or None  # --timeout 0: no deadline
                self._conn = conn
            try:
                found = scaling.read(conn)
            except BaseException:
                self._conn = None
                conn.close()
                raise
            if self._failing:
                self._failing = False
                click.echo("tide: metrics: the database answers again", err=True)
            return found

    def failed(self, exc: Exception) -> None:
        if not self._failing:
            self._failing = True
            click.echo(f"tide: metrics: cannot read the database: "
                       f"{safe(describe_db_error(exc, self.url))}", err=True)

    def close(self) -> None:
        """Close the kept connection, unless a scrape still holds it (waiting for the
        database, up to its deadline): the process is ending, and its exit closes it."""
        if self._lock.acquire(timeout=0.5):
            try:
                if self._conn is not None:
                    self._conn.close()
            finally:
                self._lock.release()


class _Server(ThreadingMixIn, WSGIServer):
    # A scrape still answering (or a client that connected and never asked) does not hold
    # up the stop: its thread ends with the process.
    daemon_threads = True
    block_on_close = False


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape."""


def _listen(host: str, port: int, app: Any) -> WSGIServer:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as exc:
        fail(f"--host {host}: cannot resolve it: {getattr(exc, 'strerror', None) or exc}",
             code=2)
    server_class = type("Server", (_Server,), {"address_family": family})
    try:
        return make_server(host, port, app, server_class=server_class, handler_class=_Quiet)
    except (OSError, OverflowError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        fail(f"--port {port}: cannot listen on {host}:{port}: {why}", code=2)
