"""Where the database is: ``ATLANTIS_DATABASE_URL``, ``--database-url``, or the embedded one.

With no URL configured, every command uses an embedded PostgreSQL
(:mod:`atlantis.store.embedded`: PostgreSQL 18 from PyPI for a new home, the home's own
major for an existing one), started on first use with its data under ``ATLANTIS_HOME`` and
left running for the user's other commands.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any
from urllib.parse import quote, unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from atlantis import environ
from atlantis.store.embedded import embedded_url

#: The name atlantis-supervise's cli.py still imports; everything else reads
#: ``atlantis.environ.DATABASE_URL``.
ENV_URL = environ.DATABASE_URL


def resolve_url(explicit: str | None = None) -> str:
    """The URL to use: explicit, else ``ATLANTIS_DATABASE_URL``, else the embedded server."""
    return explicit or os.environ.get(environ.DATABASE_URL) or embedded_url()


def database_url() -> str:
    """The database atlantis uses here, as ``tide`` and ``atlantis-supervise`` pick it:
    ``ATLANTIS_DATABASE_URL`` when set, else the embedded PostgreSQL under ``ATLANTIS_HOME``
    (started if it is not running). Pass it to ``psycopg.connect`` to enqueue from your code.

    The URL may hold a password: do not log it.
    """
    return resolve_url()


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
