"""No password in a repr, a log line, an error message or tide's output."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from datetime import UTC, datetime

import psycopg
import pytest

from atlantis.context import JobContext
from atlantis.store.database import (
    UNPARSEABLE,
    DatabaseUrlError,
    check_url,
    describe_db_error,
    redact,
    scrub,
)
from tests.conftest import BIN, ROOT

SECRET = "hunter2-Sekr3t"
SSL_SECRET = "keyfile-Pa55"


def closed_port() -> int:
    """A local TCP port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def unreachable_url() -> str:
    return f"postgresql://alice:{SECRET}@127.0.0.1:{closed_port()}/db?sslpassword={SSL_SECRET}"


def connect_error(url: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        psycopg.connect(url, connect_timeout=5)
    return caught.value


def tide(*args: str, url: str | None = None, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "tide"), *(["--database-url", url] if url is not None else []), *args]
    full_env = {k: v for k, v in os.environ.items() if k != "ATLANTIS_DATABASE_URL"}
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**full_env, **(env or {})})


# ---- redact ----------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    f"postgresql://alice:{SECRET}@db.example:5432/app?sslpassword={SSL_SECRET}",
    f"postgres://alice:{SECRET}@db.example/app?sslmode=require&sslpassword={SSL_SECRET}",
    f"postgresql://alice@db.example/app?password={SECRET}&sslpassword={SSL_SECRET}",
    f"host=db.example user=alice password={SECRET} sslpassword={SSL_SECRET} dbname=app",
    f"host=db.example password='{SECRET}' sslpassword = '{SSL_SECRET}' dbname=app",
])
def test_redact_hides_every_password_key(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown and SSL_SECRET not in shown
    assert "password=***" in shown and "sslpassword=***" in shown
    assert "host=db.example" in shown and "dbname=app" in shown


def test_redact_keeps_a_url_without_password_readable() -> None:
    shown = redact("postgresql://alice@db.example:6543/app")
    assert shown == "user=alice dbname=app host=db.example port=6543"


@pytest.mark.parametrize("url", [
    "postgresql://u:pa%zzss@localhost/db",            # libpq: invalid percent-encoded token
    "host=localhost password='pa%zzss dbname=db",     # unterminated quote
    "postgres://u:pa zzss@localhost/db",              # spaces
    "postgresql://u:pa%zzss@[::1/db",                 # unterminated IPv6 address
])
def test_unparseable_urls_are_never_echoed(url: str) -> None:
    assert redact(url) == UNPARSEABLE
    with pytest.raises(DatabaseUrlError) as refused:
        check_url(url)
    message = str(refused.value)
    assert "zzss" not in message and "pa%" not in message
    assert message.startswith("invalid database URL: ") and "\n" not in message
    # The same through psycopg, as tide and the supervisor meet it.
    error = connect_error(url)
    assert "zzss" in str(error) or url.startswith("host=")  # libpq quotes it ...
    described = describe_db_error(error, url)
    assert "zzss" not in described and "\n" not in described  # ... we never do


def test_an_unencoded_at_sign_in_the_password_leaks_no_part_of_it() -> None:
    # libpq reads "postgresql://u:first@second99@host" as password "first", host "second99@host".
    url = f"postgresql://u:first-part@second99@127.0.0.1:{closed_port()}/db"
    assert "second99" not in redact(url) and "first-part" not in redact(url)
    described = describe_db_error(connect_error(url), url)
    assert "second99" not in described and "first-part" not in described


# ---- error messages --------------------------------------------------------------------

def test_a_connection_error_is_one_line_without_the_password() -> None:
    url = unreachable_url()
    error = connect_error(url)
    assert isinstance(error, psycopg.OperationalError)
    described = describe_db_error(error, url)
    assert "\n" not in described and "127.0.0.1" in described
    assert SECRET not in described and SSL_SECRET not in described


def test_scrub_hides_the_url_and_every_spelling_of_its_passwords() -> None:
    url = "postgresql://alice:p%40ss%2Fword-123@db.example/app"
    text = (f"could not use {url}; password p@ss/word-123 was refused "
            f"(encoded: p%40ss%2Fword-123)")
    scrubbed = scrub(text, url)
    assert "p@ss/word-123" not in scrubbed and "p%40ss%2Fword-123" not in scrubbed
    assert "word-123" not in scrubbed and "db.example" in scrubbed
    assert scrub("nothing to hide", "") == "nothing to hide"


def test_scrub_hides_a_short_password_only_where_it_stands_alone() -> None:
    url = "host=db.example password=ab"
    assert scrub("absent: 'ab' in about", url) == "absent: '***' in about"


def test_a_password_in_a_conninfo_with_an_unterminated_quote_is_scrubbed() -> None:
    url = f"host=db.example password='{SECRET}"
    assert SECRET not in scrub(f"bad: {SECRET} and {url}", url)


# ---- repr ------------------------------------------------------------------------------

def test_job_context_repr_shows_no_database_url() -> None:
    url = f"postgresql://alice:{SECRET}@db.example/app"
    ctx = JobContext(job_id=42, job="directory.ImportContacts", queue="contacts", attempt=2,
                     max_attempts=3, deadline=datetime(2030, 1, 1, tzinfo=UTC),
                     logger=logging.getLogger("t"), database_url=url)
    for text in (repr(ctx), str(ctx), f"{ctx!r}", repr([ctx])):
        assert SECRET not in text and "db.example" not in text and "postgresql" not in text
    shown = repr(ctx)
    assert "job_id=42" in shown and "directory.ImportContacts" in shown
    assert "attempt=2" in shown and "contacts" in shown
    assert ctx.database_url == url


# ---- tide ------------------------------------------------------------------------------

def assert_one_clean_line(out: subprocess.CompletedProcess[str], *hidden: str) -> str:
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    for text in hidden:
        assert text not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.mark.parametrize("args", [("job", "status", "1"), ("job", "list"), ("queue", "stats")])
def test_tide_with_a_malformed_url_exits_2_with_one_line(args: tuple[str, ...]) -> None:
    out = tide(*args, url="postgresql://u:pa%zzss@localhost/db")
    assert out.returncode == 2
    line = assert_one_clean_line(out, "zzss", "pa%")
    assert line.startswith("tide: invalid database URL") and "percent-encoded" in line


def test_tide_with_a_malformed_conninfo_from_the_environment_exits_2() -> None:
    out = tide("job", "list", env={"ATLANTIS_DATABASE_URL": f"host=localhost password='{SECRET}"})
    assert out.returncode == 2
    assert "unterminated quoted string" in assert_one_clean_line(out, SECRET)


def test_tide_with_an_unreachable_server_exits_1_with_one_line() -> None:
    out = tide("job", "status", "1", url=unreachable_url())
    assert out.returncode == 1
    line = assert_one_clean_line(out, SECRET, SSL_SECRET)
    assert line.startswith("tide: cannot connect to ") and "password=***" in line
    assert "Connection refused" in line


def test_tide_names_the_database_it_uses_without_its_password(db_url: str) -> None:
    url = f"{db_url} password={SECRET}"  # the test server trusts local connections
    out = tide("job", "list", "--json", url=url)
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stderr and "password=***" in out.stderr
    assert "atlantis: using database" in out.stderr


def test_tide_reports_a_missing_schema_in_one_line(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS atl_noschema")
        conn.execute("CREATE DATABASE atl_noschema")
    try:
        bare = psycopg.conninfo.make_conninfo(admin_url, dbname="atl_noschema")
        for args in (("job", "status", "1"), ("job", "list"), ("worker", "list")):
            out = tide(*args, url=bare)
            assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
            using, failure = out.stderr.strip().splitlines()
            assert using.startswith("atlantis: using database")
            assert failure == "tide: the atlantis schema is missing; run `tide db migrate`"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS atl_noschema WITH (FORCE)")
