"""The embedded PostgreSQL's folders: who may enter them, as root and as a plain user.

Each test starts its own server with ``embedded_url(home)`` in a fresh folder directly under
/tmp (unix socket paths must stay short), in a separate process as every atlantis command
does, and stops it by the pid in its ``postmaster.pid``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from atlantis.errors import ConfigurationError
from atlantis.store.embedded import embedded_url
from atlantis.store.server_user import SERVER_USER
from chaos.server import OwnServer
from tests.conftest import ROOT

START = "import sys; from pathlib import Path; from atlantis.store.embedded import embedded_url; " \
        "print(embedded_url(Path(sys.argv[1])))"
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh folder under /tmp; any server started under it is stopped by pid at the end."""
    folder = Path(tempfile.mkdtemp(prefix="atl-e", dir="/tmp"))
    yield folder
    for pidfile in folder.rglob("postmaster.pid"):
        stop(pidfile.parent)
    shutil.rmtree(folder, ignore_errors=True)


def start(home: Path, *, user: str | None = None, env: dict[str, str] | None = None) -> str:
    """``embedded_url(home)`` in a new process (as ``user``, with only that user's groups)."""
    kwargs: dict[str, Any] = {}
    if user is not None:
        entry = pwd.getpwnam(user)
        kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    done = subprocess.run([sys.executable, "-c", START, str(home)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, env={**os.environ, **(env or {})},
                          **kwargs)
    assert done.returncode == 0, done.stderr
    return str(done.stdout).strip()


def skip_unless_runs_as(user: str) -> None:
    """Skip, saying why, when ``user`` cannot run this interpreter and import atlantis.

    A virtualenv under a private home (``/root`` is 0700 on some machines) is out of reach
    of another user; that is the machine's layout, not a fault of the embedded server.
    """
    entry = pwd.getpwnam(user)
    try:
        done = subprocess.run([sys.executable, "-c", "import atlantis.store.database"],
                              capture_output=True, text=True, cwd=ROOT, timeout=60,
                              user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
    except PermissionError as exc:
        pytest.skip(f"{user} may not run {sys.executable}: {exc}")
    if done.returncode != 0 and "Permission denied" in done.stderr:
        pytest.skip(f"{user} may not import atlantis here: {done.stderr.strip().splitlines()[-1]}")


def stop(pgdata: Path) -> None:
    """Fast shutdown (SIGINT to the postmaster), waiting for it to exit."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
        process = psutil.Process(pid)
    except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
        return
    process.send_signal(signal.SIGINT)
    process.wait(30)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def postmaster(pgdata: Path) -> psutil.Process:
    return psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))


def check_server(url: str, pgdata: Path) -> str:
    """The server answers on ``url``; its socket folder, returned, is private."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_setting('data_directory'), "
                           "current_setting('unix_socket_directories'), "
                           "current_setting('listen_addresses')").fetchone()
    assert row is not None
    data, sockets, listen = row
    assert Path(data) == pgdata.resolve()
    assert listen == ""  # no TCP at all
    socket_dir = Path(sockets)
    assert mode(socket_dir) == 0o700, oct(mode(socket_dir))  # never world-writable
    return str(sockets)


@pytest.mark.skipif(not AS_ROOT, reason="the root case needs root")
def test_as_root_the_server_runs_as_its_own_user(base: Path) -> None:
    home = base / "home"
    base.chmod(0o700)  # as a private parent: the server user may pass it, nobody may list it
    url = start(home)
    pgdata = home / "pgdata"
    server = pwd.getpwnam(SERVER_USER)

    # ATLANTIS_HOME: created 0700, then opened to the server user's group only (pass through).
    assert mode(home) == 0o710
    assert (home.stat().st_uid, home.stat().st_gid) == (0, server.pw_gid)
    # The data folder (and the socket in it): the server user's, 0700.
    assert mode(pgdata) == 0o700 and pgdata.stat().st_uid == server.pw_uid
    # A parent the server user could not pass: only o+x added, never read (pgserver: o+rx).
    assert mode(base) == 0o701
    assert check_server(url, pgdata) == str(pgdata.resolve())

    # The server process: the server user, with its own group and no supplementary ones.
    uids, gids = postmaster(pgdata).uids(), postmaster(pgdata).gids()
    assert set(uids) == {server.pw_uid} and set(gids) == {server.pw_gid}
    status = Path(f"/proc/{postmaster(pgdata).pid}/status").read_text()
    groups = next(line for line in status.splitlines() if line.startswith("Groups:"))
    assert groups.split()[1:] in ([], [str(server.pw_gid)])

    # A second command joins the running server: nothing is widened again.
    assert start(home) == url
    assert (mode(home), mode(base)) == (0o710, 0o701)


@pytest.mark.skipif(not AS_ROOT, reason="switching to another user needs root")
def test_as_a_plain_user_with_a_long_home(base: Path) -> None:
    """Unprivileged, with a home too long for a socket: the socket goes to a private folder."""
    skip_unless_runs_as("nobody")
    nobody = pwd.getpwnam("nobody")
    os.chown(base, nobody.pw_uid, nobody.pw_gid)
    # The lock file the wheel would share between users, left 0644 by root's servers
    # (this suite's): a plain user's start must not need it.
    Path(tempfile.gettempdir(), ".lockfile").touch(exist_ok=True)
    home = base / ("h" * 90)
    runtime = base / "run"
    url = start(home, user="nobody", env={"XDG_RUNTIME_DIR": str(runtime)})
    pgdata = home / "pgdata"
    assert mode(home) == 0o700 and home.stat().st_uid == nobody.pw_uid
    assert mode(pgdata) == 0o700
    sockets = Path(check_server_as_root(url))
    assert sockets != pgdata and sockets.is_relative_to(runtime)
    assert sockets.stat().st_uid == nobody.pw_uid
    assert set(postmaster(pgdata).uids()) == {nobody.pw_uid}


def check_server_as_root(url: str) -> str:
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_setting('unix_socket_directories')").fetchone()
    assert row is not None
    socket_dir = Path(row[0])
    assert mode(socket_dir) == 0o700, oct(mode(socket_dir))
    return str(socket_dir)


@pytest.mark.skipif(AS_ROOT, reason="the unprivileged case runs when the suite is not root")
def test_as_this_user(base: Path) -> None:
    home = base / "home"
    url = start(home)
    pgdata = home / "pgdata"
    assert mode(home) == 0o700 and mode(pgdata) == 0o700
    assert check_server(url, pgdata) == str(pgdata.resolve())


def test_an_existing_home_keeps_its_mode(base: Path) -> None:
    """atlantis sets 0700 only on a home it creates; one that exists keeps its mode."""
    home = base / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    url = start(home)
    assert mode(home) == 0o755
    check_server(url, home / "pgdata")


@pytest.mark.skipif(not AS_ROOT, reason="refused only as root")
def test_as_root_a_home_too_long_for_the_socket_is_refused(base: Path) -> None:
    home = base / ("h" * 100)
    with pytest.raises(ConfigurationError, match="too long for the embedded PostgreSQL"):
        embedded_url(home)
    assert not home.exists()  # refused before anything was created


@pytest.mark.parametrize("name", ["a home", "it's", "k=v&x=%41#"],
                         ids=["space", "quote", "equals"])
def test_a_home_with_a_space_quote_or_equals_works(base: Path, name: str) -> None:
    """The socket folder is quoted for pg_ctl's shell and PostgreSQL's list of folders, and
    percent-encoded in the URL."""
    home = base / name
    url = start(home)
    pgdata = home / "pgdata"
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    assert row is not None and Path(row[0]) == pgdata.resolve()
    assert psycopg.conninfo.conninfo_to_dict(url)["host"] == str(pgdata)


@pytest.mark.parametrize("name", ['a"b', "a$b", "a`b", "a\\b", "a\nb", "a,b"])
def test_a_home_the_server_cannot_take_is_refused_before_anything_is_made(
        base: Path, name: str) -> None:
    home = base / name
    with pytest.raises(ConfigurationError, match="cannot take in a path"):
        embedded_url(home)
    assert not home.exists()


@pytest.mark.skipif(not AS_ROOT, reason="the server runs as another user only as root")
def test_a_server_under_a_folder_closed_to_others_restarts(base: Path) -> None:
    """Under a ``mktemp -d`` folder (0700, root:root; made 0701 to let the server user
    through), every program run as the server user has that user's own group: with
    root's group, the group bits (none) applied and ``pg_ctl`` could not pass."""
    base.chmod(0o700)
    with OwnServer.create(prefix="atl-c", parent=base) as own:
        own.restart()
        assert own.running()
        with psycopg.connect(own.admin_url, connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
