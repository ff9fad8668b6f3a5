"""What every ``tide`` command shares: the connection, one-line failures, JSON output."""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, NoReturn, TypeVar

import click
import orjson
import psycopg
from psycopg.pq import TransactionStatus

from atlantis import environ
from atlantis.cli.escape import safe
from atlantis.presentation import json_default
from atlantis.store import admin, fleet
from atlantis.store.database import (
    DatabaseUrlError,
    announce,
    check_url,
    describe_db_error,
    redact,
    resolve_url,
)
from atlantis.store.deadline import (
    CONNECT_DEADLINE,
    STATEMENT_DEADLINE,
    DeadlineConnection,
    StatementDeadline,
    connect_timeout,
)
from atlantis.store.migrate import schema_problem
from atlantis.units import format_duration, int_problem, parse_duration
from atlantis.usage import error_json, json_errors_wanted

_Row = TypeVar("_Row")

#: How often ``job logs --follow`` looks for new lines.
FOLLOW_INTERVAL = 0.5
#: How long ``job logs --follow`` keeps looking after the attempt ended: supervisors write
#: output in batches (every 250 ms by default), so the last lines may land just after.
FOLLOW_GRACE = 1.0

_SCHEMA_ERRORS = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn,
                  psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName)


def fail(message: str, code: int = 1, kind: str | None = None) -> NoReturn:
    """End the command with one line on stderr (``tide: ...``, escaped) and exit ``code``.

    Under ``--json`` the line is a JSON object on stdout instead, ``{"error": message,
    "kind": kind}``, with the same exit status. ``kind``: ``usage`` (the default for exit
    2), ``app``, ``not_found``, ``database`` or ``refused`` (the default for exit 1).
    """
    kind = kind or ("usage" if code == 2 else "refused")
    if json_errors_wanted():
        click.echo(error_json(message, kind))
    else:
        click.echo(f"tide: {safe(message)}", err=True)
    sys.exit(code)


def print_json(doc: Any) -> None:
    """``--json`` output: ``doc`` as indented JSON on stdout."""
    click.echo(orjson.dumps(doc, default=json_default, option=orjson.OPT_INDENT_2).decode())


def show_rows(rows: Sequence[_Row], as_json: bool, document: Callable[[_Row], Any],
              table: Callable[[Sequence[_Row]], None]) -> None:
    """A listing: each row's document as JSON with ``--json``, else the table."""
    if as_json:
        print_json([document(r) for r in rows])
    else:
        table(rows)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def args_option(text: str) -> dict[str, Any]:
    """``--args``: a JSON object; anything else ends the command with one line (exit 1)."""
    try:
        # Exact numbers: a 30-digit numeric must not pass through a float on its way.
        args = json.loads(text, parse_float=Decimal, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        fail(f"--args is not JSON: {exc}")
    if not isinstance(args, dict):
        fail("--args must be a JSON object")
    return args


def operator_name() -> str | None:
    """Who runs tide (recorded as who cancelled, retried, paused); None: the database role."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


def _too_slow(seconds: float) -> str:
    return (f"no answer within {format_duration(seconds)}; wait longer with --timeout or "
            f"{environ.TIDE_TIMEOUT}")


def explicit_url(ctx: click.Context) -> str | None:
    """The database URL the command was given (``--database-url``, else
    ``ATLANTIS_DATABASE_URL``); None: the embedded PostgreSQL."""
    url: str | None = ctx.find_root().obj["database_url"] or os.environ.get(environ.DATABASE_URL)
    return url


@contextmanager
def connection(ctx: click.Context, *, autocommit: bool = True,
               deadline: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the database; any failure to reach it ends the command with one line.

    A URL libpq cannot parse exits 2, a database that cannot be reached (or is lost while
    the command runs) exits 1, and so does a schema that is missing or older than this
    tide; no message quotes the URL's password.

    Connecting waits at most 5 s, and each statement 30 s (``--timeout`` sets both; 0: no
    deadline), then the command exits 1 with one line: a stopped server or a silent peer
    never hangs a command. ``deadline=False`` (commands that wait by nature: watch,
    ``logs --follow``, migrate waiting for its lock, prune) keeps only the connect deadline.
    """
    root = ctx.find_root().obj
    explicit = explicit_url(ctx)
    chosen: float | None = root.get("timeout")
    try:
        url = resolve_url(explicit)
    except Exception as exc:
        fail(f"cannot start the embedded PostgreSQL: {exc}", kind="database")
    try:
        check_url(url)
    except DatabaseUrlError as exc:
        fail(str(exc), code=2)
    waits: dict[str, Any] = {}
    connect_s = CONNECT_DEADLINE if chosen is None else chosen
    if chosen is not None or "connect_timeout" not in (_conninfo(url) or {}):
        waits["connect_timeout"] = connect_timeout(connect_s)
    try:
        # No prepared statements: through PgBouncer in transaction mode a statement
        # prepared in one transaction is gone in the next (tide job watch repeats one).
        conn = DeadlineConnection.connect(url, autocommit=autocommit, application_name="tide",
                                          prepare_threshold=None, **waits)
    except psycopg.errors.ConnectionTimeout:
        fail(f"cannot connect to {redact(url)}: {_too_slow(connect_timeout(connect_s))}",
             kind="database")
    except (psycopg.Error, OSError) as exc:
        fail(f"cannot connect to {redact(url)}: {describe_db_error(exc, url)}", kind="database")
    statement_s = STATEMENT_DEADLINE if chosen is None else chosen
    if deadline and statement_s > 0:
        conn.statement_deadline = statement_s
    announce(url, embedded=not explicit)
    try:
        with conn:
            try:
                yield conn
            except _SCHEMA_ERRORS:
                fail(_schema_problem(conn), kind="database")
            except psycopg.OperationalError as exc:
                if conn.deadline_passed is not None:  # cancelled by its deadline
                    fail(f"the database gave {_too_slow(conn.deadline_passed)}", kind="database")
                fail(f"lost the database: {describe_db_error(exc, url)}", kind="database")
            except psycopg.Error as exc:
                fail(f"database error: {describe_db_error(exc, url)}", kind="database")
    except StatementDeadline as exc:
        fail(f"the database gave {_too_slow(exc.seconds)}", kind="database")


def _schema_problem(conn: psycopg.Connection[Any]) -> str:
    """What is wrong with the schema, after a statement found something missing."""
    try:
        if conn.info.transaction_status == TransactionStatus.INERROR:
            conn.rollback()
        problem = schema_problem(conn, who="tide", hint="")
    except psycopg.Error:
        return "the atlantis schema is missing; run `tide db migrate`"
    return problem or "the atlantis schema lacks something this tide needs; run `tide db migrate`"


def job_or_fail(conn: psycopg.Connection[Any], job_id: int) -> admin.JobRow:
    """The job's row; an unknown id ends the command with exit 1."""
    row = admin.get_job(conn, job_id)
    if row is None:
        fail(f"no job with id {job_id}", kind="not_found")
    return row


def check_queue(conn: psycopg.Connection[Any], queue: str | None) -> None:
    """A queue nothing names (no declaration, job, pause or supervisor) is a typo: say so."""
    if queue is not None and not fleet.queue_known(conn, queue):
        fail(f"unknown queue {queue!r}: no declaration, job or supervisor uses it",
             kind="not_found")


class DatabaseInt(click.ParamType[int]):
    """A whole number the database holds as ``kind`` (``int`` or ``bigint``), at least
    ``low``: one out of range is a usage error naming the argument, never a database error
    blamed on the schema."""

    name = "integer"

    def __init__(self, kind: str, *, low: int | None = None) -> None:
        self.kind = kind
        self.base: click.ParamType[int] = click.INT if low is None else click.IntRange(min=low)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        number: int = self.base.convert(value, param, ctx)
        problem = int_problem(number, self.kind)
        if problem is not None:
            self.fail(problem, param, ctx)
        return number


#: A job id (``bigint``); unknown ones in range are the command's to report.
JOB_ID = DatabaseInt("bigint")
#: A row count such as ``--limit`` (PostgreSQL's LIMIT is a ``bigint``).
LIMIT = DatabaseInt("bigint", low=0)
#: An attempt number (``int``).
ATTEMPT = DatabaseInt("int", low=1)
#: A job's priority (``int``).
PRIORITY = DatabaseInt("int")


class QueueLimit(click.ParamType[int]):
    """``--concurrency N|none`` of ``tide queue limit``: a whole number, 1 or more, that an
    ``int`` holds, or ``none`` (read as :data:`NO_LIMIT`). Anything else is a usage error
    naming the option."""

    name = "N|none"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.lower() == "none":
            return NO_LIMIT
        if not _WHOLE.fullmatch(text):
            self.fail(f"expected a whole number (1 or more) or none, not {value!r}", param, ctx)
        number = int(Decimal(text))  # int(str) refuses more than 4300 digits
        problem = int_problem(number, "int")
        if problem is not None:
            self.fail(problem, param, ctx)
        if number < 1:
            self.fail(f"a concurrency limit must be 1 or more, not {number} (none removes it)",
                      param, ctx)
        return number


_WHOLE = re.compile(r"[+-]?[0-9]+")
#: What ``--concurrency none`` reads as: remove the limit.
NO_LIMIT = 0
#: ``tide queue limit --concurrency``.
QUEUE_LIMIT = QueueLimit()


def duration_option(option: str, text: str) -> float:
    """``text`` as seconds; a bad duration is a usage error naming ``option``."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None



def listing_rows(ctx: click.Context, read: Callable[[psycopg.Connection[Any]], list[_Row]],
                 *, queue: str | None = None) -> list[_Row]:
    """The rows of one listing; an unknown ``queue`` ends the command with exit 1."""
    with connection(ctx) as conn:
        check_queue(conn, queue)
        return read(conn)


def _conninfo(url: str) -> dict[str, Any] | None:
    from psycopg.conninfo import conninfo_to_dict

    try:
        return conninfo_to_dict(url)
    except (psycopg.Error, ValueError):
        return None
