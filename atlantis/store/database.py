"""Where the database is: ``ATLANTIS_DATABASE_URL``, ``--database-url``, or the embedded one.

With no URL configured, every command uses an embedded PostgreSQL (the ``pgserver``
package, PostgreSQL 16 from PyPI), started on first use with its data under
``ATLANTIS_HOME`` and left running for the user's other commands.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from atlantis import environ
from atlantis.errors import ConfigurationError

#: The name atlantis-supervise's cli.py still imports; everything else reads
#: ``atlantis.environ.DATABASE_URL``.
ENV_URL = environ.DATABASE_URL


#: The system user pgserver runs the server as when atlantis runs as root.
SERVER_USER = "pgserver"
#: Longest unix socket path the kernel takes (``sun_path`` is 108 bytes with its NUL).
_SOCKET_PATH_MAX = 107
_SOCKET_NAME = ".s.PGSQL.5432"


def atlantis_home() -> Path:
    raw = os.environ.get(environ.HOME) or os.path.join(
        os.path.expanduser("~"), ".local", "share", "atlantis"
    )
    return Path(raw)


def embedded_url(home: Path | None = None) -> str:
    """Start (or join) the embedded PostgreSQL under ``home`` and return its URL.

    ``home`` (default :func:`atlantis_home`) is created with mode 0700 when missing. The
    server listens on a unix socket only (trust authentication: whoever reaches the socket
    is its superuser), so the socket stays in a directory only its owner can enter: the
    data folder (0700), or, when that path is too long for a socket, a private 0700 folder.

    Run as root, pgserver runs the server as the system user ``pgserver`` (creating it with
    ``useradd`` if needed). pgserver itself would make every parent of the data folder and of
    its binaries listable by everyone (``g+rx,o+rx``) and, for a long path, put the socket in
    a world-writable folder; atlantis replaces both steps: ``home`` becomes group
    ``pgserver`` with mode 0710, any other parent the server cannot pass gets only ``o+x``
    (pass through, not list), and a path too long for the socket is refused.
    """
    home = (home or atlantis_home()).expanduser().absolute()
    data = home / "pgdata"
    if _as_root():  # refused before anything is created (see _socket_dir)
        _socket_fits(data)
    _private_dir(home)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        from pgserver import postgres_server

        _harden(postgres_server)
        if _as_root():
            ensure_server_user()
            _let_server_through(home, is_home=True)
        server = postgres_server.get_server(data, cleanup_mode=None)
        info = server.get_postmaster_info()
        if info.socket_dir is not None:
            _check_private(Path(info.socket_dir), "the embedded PostgreSQL's socket folder")
        return str(server.get_uri())


def ensure_server_user() -> None:
    """Create the system user the embedded server runs as (root only), tolerating another
    process creating it at the same moment: two commands (or two test workers) starting on a
    fresh machine both found it missing, and the second ``useradd`` failed."""
    from pgserver.utils import ensure_user_exists

    try:
        ensure_user_exists(SERVER_USER)
    except subprocess.CalledProcessError:
        import pwd

        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise
        # created by the other process meanwhile


def _as_root() -> bool:
    return os.geteuid() == 0


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
    """Replace pgserver's steps that open folders to every user (see embedded_url), and run
    its commands with the server user's own group."""
    for name in ("ensure_prefix_permissions", "find_suitable_socket_dir", "initdb", "pg_ctl"):
        if not hasattr(postgres_server, name):  # a pgserver we do not know: fail closed
            raise ConfigurationError(
                f"this pgserver version lacks {name}; atlantis cannot run it safely "
                f"(set {environ.DATABASE_URL} to use your own PostgreSQL)")
    postgres_server.ensure_prefix_permissions = _let_server_through
    postgres_server.find_suitable_socket_dir = _socket_dir
    for name in ("initdb", "pg_ctl"):
        command = getattr(postgres_server, name)
        if not getattr(command, "_atlantis", False):
            setattr(postgres_server, name, _own_groups(command))


def _own_groups(command: Any) -> Any:
    """``command`` (pgserver's initdb or pg_ctl), run as the server user with that user's
    group only: pgserver passes ``user=`` alone to subprocess, which keeps root's groups
    (gid 0) for initdb, pg_ctl and so the server itself."""

    def run(args: list[str], pgdata: Path | None = None, **kwargs: Any) -> Any:
        if kwargs.get("user") is not None:
            kwargs.setdefault("group", _server_ids()[1])
            kwargs.setdefault("extra_groups", [])
        return command(args, pgdata=pgdata, **kwargs)

    run._atlantis = True  # type: ignore[attr-defined]
    return run


def _server_ids() -> tuple[int, int, set[int]]:
    """The server user's uid, its primary group and all its groups."""
    import grp
    import pwd

    entry = pwd.getpwnam(SERVER_USER)
    groups = {g.gr_gid for g in grp.getgrall() if SERVER_USER in g.gr_mem}
    return entry.pw_uid, entry.pw_gid, groups | {entry.pw_gid}


def _passable(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _let_server_through(path: Path, *, is_home: bool = False) -> None:
    """As root: let the server user pass through every parent of ``path`` (and ``path``
    itself when it is ATLANTIS_HOME), opening as little as it can.

    Folders it can pass already stay as they are. ATLANTIS_HOME gets group ``pgserver`` and
    ``g+x``; any other folder only ``o+x``: entering it by a known name, never listing it.
    (pgserver's own version adds ``g+rx,o+rx`` to every parent up to ``/``.)
    """
    if not _as_root():
        return
    uid, gid, gids = _server_ids()
    folders = ([path] if is_home else []) + list(path.parents)
    for folder in folders:
        st = folder.stat()
        if _passable(st, uid, gids):
            continue
        if is_home and folder == path:
            os.chown(folder, -1, gid)
            os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IXGRP)
        else:
            os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


def _socket_dir(pgdata: Path, runtime_path: Path) -> Path:
    """Where the server's socket goes: the data folder (0700) when the path fits a socket.

    Otherwise, unprivileged, a private 0700 folder under the user's runtime folder; as root
    the path is refused (pgserver would make any other folder world-writable).
    """
    if len(os.fsencode(pgdata / _SOCKET_NAME)) <= _SOCKET_PATH_MAX:
        return pgdata
    if _as_root():
        _socket_fits(pgdata)
    import hashlib

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
    owners = {os.geteuid()} | ({_server_ids()[0]} if _as_root() else set())
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners:
        raise ConfigurationError(f"{what} {folder} is not a folder of this user")
    if st.st_mode & 0o077:
        if st.st_uid != os.geteuid():
            raise ConfigurationError(f"{what} {folder} is open to other users")
        os.chmod(folder, 0o700)


def resolve_url(explicit: str | None = None) -> str:
    """The URL to use: explicit, else ``ATLANTIS_DATABASE_URL``, else the embedded server."""
    return explicit or os.environ.get(environ.DATABASE_URL) or embedded_url()


#: Shown instead of a secret, and instead of a URL libpq cannot parse.
HIDDEN = "***"
UNPARSEABLE = "<unparseable database url>"

_URI = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
# ``key = value`` pairs of a conninfo whose key names a password; tolerant of what libpq
# refuses (an unterminated quote runs to the end of the string).
_KEYWORD_SECRET = re.compile(
    r"([\w-]*password[\w-]*)\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE
)
_QUOTED = re.compile(r'"([^"]*)"')
_SHORT_SECRET = 4  # secrets shorter than this are hidden only where they stand alone


class DatabaseUrlError(ValueError):
    """A database URL or conninfo libpq cannot parse. The message never quotes the URL."""


def _is_secret_key(key: str) -> bool:
    return "password" in key.lower()


def _parse(url: str) -> dict[str, str] | None:
    """libpq's reading of ``url``, or None if it cannot read it."""
    try:
        params = conninfo_to_dict(url)
    except (psycopg.Error, ValueError):
        return None
    return {k: str(v) for k, v in params.items() if v is not None}


def _nested(key: str, value: str) -> bool:
    """Whether ``dbname`` is itself a URL or a conninfo (libpq may expand it)."""
    return key == "dbname" and (bool(_URI.match(value)) or "=" in value)


def redact(url: str) -> str:
    """The URL or conninfo with every password-like value hidden, for logs and stderr.

    Every key containing ``password`` (``password``, ``sslpassword``, ...) is replaced by
    ``***``, whether it came from a URL's user info, its query string or a ``key=value``
    conninfo. A string libpq cannot parse is never echoed: ``<unparseable database url>``.
    The result is a ``key=value`` conninfo.
    """
    params = _parse(url)
    if params is None:
        return UNPARSEABLE
    hidden = secrets(url)
    for key, value in params.items():
        if _is_secret_key(key):
            params[key] = HIDDEN
        elif _nested(key, value):
            params[key] = redact(value) if _parse(value) is not None else HIDDEN
        else:  # e.g. the host, when the password held an unencoded "@"
            params[key] = _hide(value, hidden)
    return make_conninfo("", **params)


def secrets(url: str) -> set[str]:
    """Every spelling of every password in ``url`` that a message could quote.

    Read by libpq when it can, and otherwise (and as well) by tolerant patterns, so that a
    URL libpq refuses still has its secrets found; each also percent-encoded and decoded.
    """
    found: set[str] = set()
    params = _parse(url) or {}
    for key, value in params.items():
        if _is_secret_key(key):
            found.add(value)
        elif _nested(key, value) and value != url:
            found |= secrets(value)
    if _URI.match(url):
        rest = _URI.sub("", url, count=1)
        authority = rest.split("?", 1)[0].split("#", 1)[0]
        userinfo, at, _ = authority.rpartition("@")
        if at and ":" in userinfo:
            password = userinfo.split(":", 1)[1]
            # An unencoded "@" in the password: libpq reads the rest as the host.
            found |= {password, *password.split("@")}
        query = rest.partition("?")[2]
        for pair in query.split("&"):
            key, eq, value = pair.partition("=")
            if eq and _is_secret_key(unquote(key)):
                found.add(value)
    else:
        for m in _KEYWORD_SECRET.finditer(url):
            value = m.group(2)
            if value.startswith("'"):
                value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
                found.add(re.sub(r"\\(.)", r"\1", value))
            found.add(value)
    spellings = set()
    for value in found:
        spellings |= {value, unquote(value), quote(value, safe="")}
    return {s for s in spellings if s}


def scrub(text: str, url: str) -> str:
    """``text`` (an error message, a log line) with nothing of ``url``'s passwords in it.

    The URL itself becomes its redacted form and every spelling of every password becomes
    ``***``. If libpq cannot parse the URL, its parse errors quote pieces of it: then every
    double-quoted piece of the URL in ``text`` is hidden as well.
    """
    if not url:
        return text
    if url in text:
        text = text.replace(url, redact(url))
    text = _hide(text, secrets(url))
    if _parse(url) is None:
        text = _QUOTED.sub(lambda m: f'"{HIDDEN}"' if m.group(1) and m.group(1) in url else m.group(0),
                           text)
    return text


def _hide(text: str, hidden: set[str]) -> str:
    """``text`` with every occurrence of the strings in ``hidden`` replaced by ``***``.

    Longest first; a string shorter than four characters only where it stands alone, so
    that a one-letter password does not garble the rest of a message.
    """
    for secret in sorted(hidden, key=len, reverse=True):
        if len(secret) >= _SHORT_SECRET:
            text = text.replace(secret, HIDDEN)
        else:
            text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", HIDDEN, text)
    return text


def describe_db_error(exc: BaseException, url: str) -> str:
    """One line saying what went wrong with ``url``, free of its passwords.

    For any error raised while connecting or talking to the database (psycopg's, or an
    OSError). libpq's multi-line messages are joined with ``; ``.
    """
    lines = [line.strip() for line in scrub(str(exc), url).splitlines() if line.strip()]
    text = "; ".join(lines) or type(exc).__name__
    if url and _parse(url) is None:
        return f"invalid database URL: {text}"
    return text


def check_url(url: str) -> None:
    """Raise :class:`DatabaseUrlError` (one line, no password) unless libpq can parse ``url``."""
    try:
        conninfo_to_dict(url)
    except (psycopg.Error, ValueError) as exc:
        raise DatabaseUrlError(describe_db_error(exc, url)) from None


def announce(url: str, *, embedded: bool) -> None:
    kind = "embedded PostgreSQL" if embedded else "database"
    print(f"atlantis: using {kind} {redact(url)}", file=sys.stderr)


def connect(url: str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
    """A connection for atlantis's one-off work (migrate, sync): it prepares no statement,
    so that it works through a pooler in transaction mode too (PgBouncer), where a
    statement prepared in one transaction is gone in the next."""
    kwargs.setdefault("prepare_threshold", None)
    return psycopg.connect(url, autocommit=autocommit, application_name="atlantis", **kwargs)
