"""Servers older than 16 are refused, shown on a real one: Debian's ``postgresql-15``
(``./scripts/test`` installs it), started in a folder of its own by an unprivileged user
(initdb refuses root). ``tide db migrate`` and ``atlantis-supervise`` both stop on one line
and a non-zero exit, and the database is left as it was: no atlantis schema, no role."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from atlantis.store import doctor
from tests.conftest import BIN, ROOT, TEST_APP, wait_for

PG15 = Path("/usr/lib/postgresql/15/bin")
#: The user the server runs as when the tests run as root.
UNPRIVILEGED = "nobody"


def _as_user() -> dict[str, Any]:
    """Popen arguments that run a command as the unprivileged user when this is root."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(UNPRIVILEGED)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@pytest.fixture
def pg15_url() -> Iterator[str]:
    """A PostgreSQL 15 server on a unix socket in its own folder, trust auth, stopped (by
    pid) and removed afterwards."""
    if not (PG15 / "initdb").exists():
        pytest.skip("postgresql-15 is not installed (apt-get install postgresql-15, or run "
                    f"./scripts/test as root): no {PG15 / 'initdb'}")
    # Directly under /tmp: the unprivileged user must reach it, and a socket path stays short.
    home = Path(tempfile.mkdtemp(prefix="atl-pg15-", dir="/tmp"))
    user = _as_user()
    if user:
        os.chown(home, user["user"], user["group"])
    data, log = home / "data", home / "server.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run([str(PG15 / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                        "--locale=C", "--encoding=UTF8", "--no-sync", "--no-instructions"],
                       cwd=home, capture_output=True, check=True, timeout=120, **user)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(PG15 / "postgres"), "-D", str(data), "-c", "listen_addresses=",
                 "-c", f"unix_socket_directories={home}", "-c", "fsync=off",
                 "-c", "shared_buffers=16MB", "-c", "max_connections=20"],
                cwd=home, stdout=out, stderr=subprocess.STDOUT, **user)
        url = f"host={home} user=postgres dbname=postgres connect_timeout=5"

        def accepting() -> bool:
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"postgres 15 exited {proc.returncode}: "
                            f"{log.read_text('utf-8', errors='replace')}")
            try:
                with psycopg.connect(url):
                    return True
            except psycopg.OperationalError:
                return False

        wait_for(accepting, timeout=60, interval=0.1, message="postgres 15 to accept connections")
        yield url
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)  # immediate shutdown: the folder goes anyway
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(home, ignore_errors=True)


def _nothing_created(url: str) -> None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT to_regnamespace('atlantis')").fetchone()
        assert row is not None and row[0] is None, "the atlantis schema was created"
        roles = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'atlantis%'").fetchall()
        assert roles == []


def test_postgresql_15_is_refused(pg15_url: str) -> None:
    with psycopg.connect(pg15_url) as conn:
        number, text = doctor.server_version(conn)
    assert 150000 <= number < 160000, text
    refusal = f"PostgreSQL {text} is too old: atlantis needs 16 or newer"

    done = subprocess.run([str(BIN / "tide"), "--database-url", pg15_url, "db", "migrate"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(refusal), done.stderr
    _nothing_created(pg15_url)

    # The supervisor migrates on start: it exits 2 at once (a configuration error, not waited
    # for as a database still starting would be; the subprocess timeout bounds it).
    done = subprocess.run([str(BIN / "atlantis-supervise"), "--database-url", pg15_url,
                           "--app", TEST_APP, "--queue", "tests"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"atlantis-supervise: cannot prepare the database: {refusal}"), done.stderr
    _nothing_created(pg15_url)
