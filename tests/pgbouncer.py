"""A real PgBouncer (Debian's ``/usr/sbin/pgbouncer``) in transaction mode, for tests.

:func:`start_pgbouncer` runs one in the foreground on 127.0.0.1 (a free port) in front of a
PostgreSQL server's unix socket; :class:`Bouncer` turns that server's URLs into the
pooler's and stops the process by its pid. The pooler is as strict as a stock one:
``pool_mode = transaction``, no ``ignore_startup_parameters`` (a connection that sends
``options`` is refused) and, with 1.18, no prepared statements across transactions.

PgBouncer refuses to run as root: then it is started with ``-u`` as the user the embedded
server runs as (``pgserver``), who may enter the server's socket folder; its own folder
is handed to that user. Without Debian's package the tests skip with one line (CI installs
it through ``scripts/test``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from atlantis.store import server_user
from atlantis.store.server_user import SERVER_USER

PGBOUNCER = Path("/usr/sbin/pgbouncer")


def require_pgbouncer() -> None:
    if not PGBOUNCER.exists():
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer): "
                    f"the PgBouncer tests need Debian's {PGBOUNCER}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bouncer:
    """One running PgBouncer in front of the server ``server_url`` reaches."""

    def __init__(self, server_url: str, folder: Path) -> None:
        params = conninfo_to_dict(server_url)
        self.socket_dir = str(params.get("host") or "")
        self.server_port = str(params.get("port") or 5432)
        self.user = str(params.get("user") or "postgres")
        if not self.socket_dir.startswith("/"):
            raise ValueError("the PgBouncer fixture fronts a server's unix socket")
        self.folder = folder
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, direct_url: str) -> str:
        """``direct_url`` (a URL of the fronted server) going through the pooler instead."""
        params = conninfo_to_dict(direct_url)
        params.pop("port", None)
        params.update(host="127.0.0.1", port=str(self.port), user=self.user)
        return make_conninfo("", **{k: str(v) for k, v in params.items() if v is not None})

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text("utf-8", errors="replace") if path.exists() else ""

    def _config(self) -> None:
        users = self.folder / "users.txt"
        users.write_text(f'"{self.user}" ""\n')
        (self.folder / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={self.socket_dir} port={self.server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
admin_users = {self.user}
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_login_retry = 0.2
server_connect_timeout = 5
logfile = {self.folder / "pgbouncer.log"}
pidfile = {self.folder / "pgbouncer.pid"}
""")

    def start(self) -> None:
        argv = [str(PGBOUNCER)]
        if os.geteuid() == 0:
            import pwd

            entry = pwd.getpwnam(SERVER_USER)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
            argv += ["-u", SERVER_USER]
        for _ in range(5):  # another process may take the free port before we bind it
            self.port = _free_port()
            self._config()
            if os.geteuid() == 0:
                for name in ("users.txt", "pgbouncer.ini"):
                    os.chown(self.folder / name, entry.pw_uid, entry.pw_gid)
            self.proc = subprocess.Popen([*argv, str(self.folder / "pgbouncer.ini")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._ready():
                return
            self.stop()
        raise AssertionError(f"pgbouncer did not start:\n{self.log()[-2000:]}")

    def _ready(self, timeout: float = 20.0) -> bool:
        assert self.proc is not None
        probe = make_conninfo("", host="127.0.0.1", port=str(self.port), user=self.user,
                              dbname="pgbouncer", connect_timeout="2")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                # The admin console answers only the simple protocol: no statement here.
                with psycopg.connect(probe, autocommit=True):
                    return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        """SIGTERM (immediate shutdown), SIGKILL if it lingers; reaped by its pid."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def pgbouncer(server_url: str) -> Iterator[Bouncer]:
    """A PgBouncer in transaction mode in front of ``server_url``'s server, for the block."""
    require_pgbouncer()
    folder = Path(tempfile.mkdtemp(prefix="atl-pgb-", dir="/tmp"))
    bouncer = Bouncer(server_url, folder)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(folder, ignore_errors=True)


def server_pid(home: Path) -> int | None:
    """The postmaster's pid of the embedded server under ``home``, if one runs."""
    for pidfile in home.rglob("postmaster.pid"):
        try:
            return int(pidfile.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            continue
    return None


def stop_server(home: Path, timeout: float = 30.0) -> None:
    """Stop the embedded server under ``home`` by its pid (fast shutdown: SIGINT)."""
    pid = server_pid(home)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def start_server(home: Path) -> str:
    """Start an embedded server of the test's own under ``home``, of the suite's major (as
    atlantis starts one: in a process of its own that leaves it running); its URL."""
    from tests.conftest import suite_major

    code = ("import sys; from pathlib import Path; from atlantis.store.embedded import "
            "embedded_url; print(embedded_url(Path(sys.argv[1]), major=int(sys.argv[2])))")
    out = subprocess.run([sys.executable, "-c", code, str(home), str(suite_major())],
                         capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise AssertionError(f"the embedded server did not start: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def restart_server(home: Path) -> None:
    """``pg_ctl restart`` (fast) of the embedded server under ``home`` (started by
    :func:`start_server`), run as the user the server runs as."""
    from tests.conftest import pg_bin

    data = next(home.rglob("postmaster.pid")).parent
    kwargs = server_user.as_server_user()
    subprocess.run([str(pg_bin() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60",
                    "-l", str(data / "restart.log"), "restart"], check=True, timeout=90,
                   cwd=data, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
