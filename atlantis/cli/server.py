"""``tide db server status|stop``: the embedded PostgreSQL under ``ATLANTIS_HOME``.

``tide`` adds the group to its ``db`` group. ``status`` says whether the server runs, and
its pid, data folder, socket folder and port, and version; it never starts one. ``stop``
stops it (a fast shutdown: sessions are ended), but refuses, exit 1, while supervisors use
it (the rows of ``atlantis.workers`` that have not expired, in any of its databases),
naming them, unless ``--force``. With ``--database-url`` or ``ATLANTIS_DATABASE_URL``
naming another server, both say so in one line and exit 2.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from atlantis import environ
from atlantis.cli.common import explicit_url, fail, print_json
from atlantis.cli.escape import safe
from atlantis.errors import AtlantisError
from atlantis.store import embedded, homes
from atlantis.store.queries import Q

#: Seconds to wait for the server when asking it its version or its supervisors.
CONNECT_WAIT = 5


@dataclass(frozen=True)
class Running:
    """What ``postmaster.pid`` says of a running server."""

    pid: int
    data: str
    port: int
    socket_dir: str | None

    def url(self, dbname: str = "postgres") -> str:
        return make_conninfo("", host=self.socket_dir or "localhost", port=self.port,
                             user="postgres", dbname=dbname, connect_timeout=CONNECT_WAIT)


@click.group("server")
def server() -> None:
    """The embedded PostgreSQL (ATLANTIS_HOME): its status, and stopping it."""


@server.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def server_status(ctx: click.Context, as_json: bool) -> None:
    """Whether the embedded PostgreSQL runs: pid, data folder, socket and port, version."""
    data = _data(ctx)
    found = _running(data)
    version = _version(data, found)
    if as_json:
        print_json({"running": found is not None, "data": str(data), "version": version,
                    "pid": found and found.pid, "port": found and found.port,
                    "socket_dir": found and found.socket_dir})
        return
    if found is None:
        click.echo(safe(f"the embedded PostgreSQL of {data} is not running"
                        + (f" (PostgreSQL {version})" if version else "")))
        return
    click.echo(safe(f"the embedded PostgreSQL runs: pid {found.pid}, data {data}, "
                    f"socket {found.socket_dir or '-'} port {found.port}, "
                    f"PostgreSQL {version or '?'}"))


@server.command("stop")
@click.option("--force", is_flag=True, help="Stop it even while supervisors use it.")
@click.pass_context
def server_stop(ctx: click.Context, force: bool) -> None:
    """Stop the embedded PostgreSQL; refused while supervisors use it, unless --force."""
    data = _data(ctx)
    found = _running(data)
    if found is None:
        click.echo(safe(f"the embedded PostgreSQL of {data} is not running"), err=True)
        return
    if not force:
        users = _supervisors(found)
        if users:
            fail(f"{len(users)} supervisor{'s use' if len(users) != 1 else ' uses'} the "
                 f"embedded PostgreSQL: {', '.join(users)}; stop "
                 f"{'them' if len(users) != 1 else 'it'} first, or use --force")
    try:
        homes.stop(data)
    except AtlantisError as exc:
        fail(f"cannot stop the embedded PostgreSQL of {data}: {exc}")
    click.echo(safe(f"stopped the embedded PostgreSQL of {data} (pid {found.pid})"), err=True)


def _data(ctx: click.Context) -> Path:
    """The embedded data folder; exit 2 when a URL names another server."""
    data = embedded.atlantis_home().expanduser().absolute() / "pgdata"
    url = explicit_url(ctx)
    if url is not None and not _names_embedded(url, _running(data)):
        fail(f"--database-url (or {environ.DATABASE_URL}) names another server; "
             f"`tide db server` manages the embedded PostgreSQL only", code=2)
    return data


def _names_embedded(url: str, found: Running | None) -> bool:
    """Whether ``url`` reaches the embedded server (its socket folder), as `tide db url`
    prints it."""
    try:
        host = conninfo_to_dict(url).get("host")
    except (psycopg.Error, ValueError):
        return False
    return found is not None and found.socket_dir is not None and host == found.socket_dir


def _running(data: Path) -> Running | None:
    """The server of ``data`` from its ``postmaster.pid``, when it is alive."""
    if not homes.running(data):
        return None
    try:
        lines = (data / "postmaster.pid").read_text().split("\n")
        return Running(pid=int(lines[0]), data=lines[1], port=int(lines[3]),
                       socket_dir=lines[4].strip() or None)
    except (OSError, ValueError, IndexError):
        return None


def _version(data: Path, found: Running | None) -> str | None:
    """The server's version when it answers, else the major of its data folder."""
    if found is not None:
        try:
            with psycopg.connect(found.url(), autocommit=True) as conn:
                row = conn.execute(Q.doctor_server_version).fetchone()
            if row is not None:
                return str(row[1])
        except psycopg.Error:
            pass
    try:
        major = embedded.home_major(data)
    except AtlantisError:
        return None
    return None if major is None else str(major)


def _supervisors(found: Running) -> list[str]:
    """``host:pid (database)`` of each live supervisor in any database of the server: a
    row that has not expired, unless it names a process of this host that is gone."""
    here = socket.gethostname()
    users: list[str] = []
    try:
        with psycopg.connect(found.url(), autocommit=True) as conn:
            names = [str(r[0]) for r in conn.execute(Q.server_databases)]
    except psycopg.Error as exc:
        fail(f"cannot ask the embedded PostgreSQL which supervisors use it: {exc}")
    for name in names:
        try:
            with psycopg.connect(found.url(name), autocommit=True) as conn:
                has: Any = conn.execute(Q.server_has_workers).fetchone()
                if not has or not has[0]:
                    continue
                for _id, host, pid in conn.execute(Q.server_supervisors):
                    if host == here and not homes.alive(pid):
                        continue  # killed (kill -9) on this host, its row not expired yet
                    users.append(f"{host}:{pid} (database {name})")
        except psycopg.Error:
            continue  # a database that went away meanwhile, or refuses us
    return users
