"""Fixtures: a real embedded PostgreSQL, a fresh database per test, real supervisors."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from atlantis import environ
from atlantis.app import load_app
from atlantis.store import embedded, migrate, sync
from tests.forkserver import ForkedProcess, ForkServer, forkable

ROOT = Path(__file__).resolve().parent.parent


def _pin_psutil_boot_time() -> None:
    """psutil dates a process by the boot time, read anew from /proc/stat at each call, plus
    its start since boot, and ``Process.children()`` drops a child that looks older than its
    parent: a boot time that moves between two reads (a clock step) hides every child
    started within a second of its parent (psutil issues 2526 and 2542; atlantis's own sweeps
    read the kernel's parent links instead, ``atlantis.child.tree.processes_under``). The
    tests' process listings in this process read it once."""
    import functools

    try:
        import psutil._pslinux as pslinux
    except ImportError:  # not Linux
        return
    pslinux.boot_time = functools.cache(pslinux.boot_time)


_pin_psutil_boot_time()
BIN = Path(sys.executable).parent
TEST_APP = "tests.apps.basic:registry"
#: Apps whose declarations every test database has synced (add yours here).
SYNCED_APPS = [TEST_APP, "tests.apps.process:registry", "tests.apps.hostile:registry",
               "tests.apps.values:registry", "tests.apps.contain:registry",
               "tests.apps.sched:registry", "tests.apps.ops:registry",
               "tests.apps.console_app:registry", "tests.apps.limited:registry"]
TEMPLATE = "atl_template"
#: Turned off on the suite's shared server (never on a server a test starts for itself, nor
#: in the product): it is thrown away after the run and no test crashes it, so nothing needs
#: to reach the disk. Each test's CREATE DATABASE ... TEMPLATE and DROP DATABASE then cost
#: no fsync.
TEST_SERVER_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")
_counter = itertools.count()


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
             message: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def suite_major() -> int:
    """The suite's PostgreSQL major (:func:`chaos.server.suite_major`); a bad
    ``ATLANTIS_TEST_PG`` is a usage error of pytest's."""
    from chaos.server import suite_major as major

    try:
        return major()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pg_bin() -> Path:
    """The folder of the suite's server programs (pg_ctl, psql, pg_dump, ...)."""
    return embedded.bin_dir(suite_major())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "server_matrix: database-facing; also run on every PostgreSQL major "
        f"({environ.TEST_PG}=16 runs only these)")
    if suite_major() != embedded.DEFAULT_MAJOR and not config.option.markexpr:
        config.option.markexpr = "server_matrix"


#: The long tail, started first (in this order) so that none of it is the last test to end:
#: xdist hands tests out in collection order, a few at a time (scripts/test runs it with
#: ``--maxschedchunk``). Prefixes of node ids; each takes tens of seconds, the chaos run over
#: a minute. The rest keep their order.
LONG_TAIL = (
    "tests/test_chaos.py::test_a_minute_of_chaos_keeps_every_promise",
    "tests/test_containment.py::test_five_thousand_failures_keep_twenty_errors_and_count_all",
    "tests/test_testing_plugin.py::",
    "tests/test_wheel_install.py::",
    "tests/test_docs.py::test_the_tutorial_runs_as_written",
    "tests/test_demo_database.py::",
    "tests/test_demo_durable.py::test_the_durable_demo_resumes",
    "tests/test_handler_steps.py::test_transaction_steps_write_exactly_once_under_repeated_kill_9",
    "tests/test_roles.py::test_a_reader_reads_with_tide_and_changes_nothing",
    "tests/test_leases.py::test_kill_9_supervisor_children_die_and_another_finishes",
    "tests/test_server_versions.py::test_doctor_explains_and_upgrade_home_moves",
    "tests/test_leases.py::test_rows_claimed_ahead_are_given_back_behind_a_long_attempt",
    "tests/test_operator.py::test_handler_text_is_escaped_in_every_human_output",
    "tests/test_keeper.py::",
    "tests/test_example_onboarding.py::",
    "tests/test_pgbouncer.py::",
    "tests/test_codegen.py::test_generated_module_passes_ruff_and_mypy_strict",
    "tests/test_workflow_declarations.py::test_generated_workflow_module_passes_ruff",
    "tests/test_outages.py::",
    "tests/test_schedules.py::",
    "tests/test_console_browser.py::",
)


def long_tail_rank(nodeid: str) -> int:
    """Where a test starts: its place in :data:`LONG_TAIL`, after it the rest."""
    return next((i for i, prefix in enumerate(LONG_TAIL) if nodeid.startswith(prefix)),
                len(LONG_TAIL))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: long_tail_rank(item.nodeid))  # stable: the rest keep order


def pytest_report_header(config: pytest.Config) -> str:
    return f"atlantis: PostgreSQL {suite_major()} (embedded; {environ.TEST_PG} picks 16 or 18)"


@pytest.fixture(scope="session")
def pg_home() -> Iterator[Path]:
    # Unix socket paths must stay short: the data folder directly under /dev/shm or /tmp
    # (chaos.server.scratch_root: a tmpfs makes each test's CREATE DATABASE ten times
    # cheaper).
    from chaos.server import scratch_root

    home = Path(tempfile.mkdtemp(prefix="atl-", dir=scratch_root()))
    home.chmod(0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server(pg_home: Path) -> Iterator[Any]:
    server = embedded.start(pg_home / "pgdata", major=suite_major(), cleanup_mode="stop")
    os.environ["ATLANTIS_HOME"] = str(pg_home)
    os.environ.pop(environ.DATABASE_URL, None)
    with psycopg.connect(str(server.get_uri()), autocommit=True) as conn:
        for name in TEST_SERVER_SETTINGS:  # a test server's durability: none needed
            conn.execute(f"ALTER SYSTEM SET {name} = off")
        # The WAL may be memory (scratch_root): checkpoints recycle it at 256 MB, not 1 GB.
        conn.execute("ALTER SYSTEM SET max_wal_size = '256MB'")
        conn.execute("SELECT pg_reload_conf()")
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def admin_url(pg_server: Any) -> str:
    return str(pg_server.get_uri())


def url_for(admin_url: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_url, dbname=dbname)


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> str:
    prepare_template(admin_url, TEMPLATE)
    return TEMPLATE


def prepare_template(admin_url: str, name: str) -> None:
    """Create database ``name``: migrated, the test apps synced, the events table made."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(url_for(admin_url, name)) as conn:
        migrate(conn)
        for app in SYNCED_APPS:
            registry = load_app(app)
            sync(conn, list(registry.decls.values()), list(registry.workflows.values()))
        from tests.apps.basic import EVENTS_DDL

        conn.execute(EVENTS_DDL)
        conn.commit()


@pytest.fixture
def db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh database, migrated, with the test app's declarations synced.

    Copied file by file (``STRATEGY FILE_COPY``), not block by block through the WAL (15's
    default, some 10 MB of WAL a copy): its two checkpoints cost no fsync on this server
    (:data:`TEST_SERVER_SETTINGS`); a copy took 17-18 ms instead of 31-34."""
    name = f"t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template_db} STRATEGY FILE_COPY")
    yield url_for(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def db(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


_forks: ForkServer | None = None


def fork_server() -> ForkServer:
    """This worker's supervisor fork server (tests/forkserver.py), started on first use and
    stopped at the end of the session (:func:`_stop_fork_server`)."""
    global _forks
    if _forks is None:
        _forks = ForkServer(ROOT)
    return _forks


@pytest.fixture(scope="session", autouse=True)
def _stop_fork_server() -> Iterator[None]:
    yield
    if _forks is not None:
        _forks.close()


class Supervisor:
    """A real ``atlantis-supervise`` process; its log goes to a file the test can read.

    Forked from this worker's fork server (tests/forkserver.py: the command without its
    imports' half second of CPU) unless ``env`` changes how an interpreter starts, or
    ``program`` asks for the installed entry point itself."""

    def __init__(self, db_url: str, log_path: Path, args: list[str], env: dict[str, str],
                 session: bool = False, program: bool = False) -> None:
        self.log_path = log_path
        argv = ["--database-url", db_url, *args]
        self.proc: subprocess.Popen[bytes] | ForkedProcess
        if (not program and os.environ.get(environ.TEST_FORK) != "0"
                and forkable(env, fork_server().env)):
            self._log = None
            log_path.write_bytes(b"")  # there when this returns, as the program's would be
            self.proc = fork_server().spawn(argv, env, ROOT, log_path, session)
            return
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(BIN / "atlantis-supervise"), *argv],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            start_new_session=session,  # a group of its own, for a test that signals it
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, *, hurry: bool = False) -> None:
        """SIGTERM (a drain), then SIGKILL after 15 s. ``hurry``: a second SIGTERM after
        a second skips the drain's wait for attempts still running (the fixture's teardown:
        a test's leftover long attempt would otherwise hold it for the whole drain)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(1 if hurry else 15)
            except subprocess.TimeoutExpired:
                try:
                    if not hurry:
                        raise
                    self.proc.send_signal(signal.SIGTERM)
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if self._log is not None:
            self._log.close()


@pytest.fixture
def ddb(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's database with tests/apps/durable.py's declarations and its effects table
    (handler steps, issue 34)."""
    from tests.apps.durable import EFFECTS_DDL

    registry = load_app("tests.apps.durable:registry")
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    db.execute(EFFECTS_DDL)
    db.commit()
    return db


@pytest.fixture
def supervise(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """Start supervisors for this test's database; every one is stopped by pid afterwards."""
    started: list[Supervisor] = []

    def start(*args: str, queues: tuple[str, ...] = ("tests",), app: str = TEST_APP,
              concurrency: int = 2, env: dict[str, str] | None = None,
              database_url: str | None = None, session: bool = False,
              program: bool = False) -> Supervisor:
        argv = [f"--queue={q}" for q in queues]
        argv += ["--app", app, "--concurrency", str(concurrency), "--poll-interval", "0.2s",
                 "--rescue-interval", "0.5s", "--drain-timeout", "10s", "--kill-grace", "2s", *args]
        full_env = {**os.environ, **(env or {})}
        sup = Supervisor(database_url or db_url, tmp_path / f"supervisor-{len(started)}.log",
                         argv, full_env, session, program)
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.stop(hurry=True)


def run_tide(argv: list[str], *, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tide ARGV`` run in this process (click's runner), as the installed command would run
    it: its exit status, stdout and stderr apart. Half a second quicker than a process of its
    own; a test whose subject is the process (its exit by a signal, its stdin, the installed
    entry point, what it does with a terminal) runs ``BIN / "tide"`` instead. ``check``: a
    non-zero status raises :class:`subprocess.CalledProcessError`, as ``subprocess.run``."""
    from click.testing import CliRunner

    from atlantis.cli.tide import main

    result = CliRunner().invoke(main, argv, env=env, prog_name="tide", catch_exceptions=False)
    done = subprocess.CompletedProcess(["tide", *argv], result.exit_code, result.stdout,
                                       result.stderr)
    if check:
        done.check_returncode()
    return done


#: The token of the ``console`` fixture's console (label ``ops-team``), and its header.
CONSOLE_SECRET = "s3cret-token"
CONSOLE_BEARER = {"Authorization": f"Bearer {CONSOLE_SECRET}"}


@pytest.fixture
def console(db_url: str) -> Iterator[Any]:
    """The console (Starlette's TestClient on the real app) with a token, label
    ``ops-team``: :data:`CONSOLE_BEARER` may write. Skipped without the console extra."""
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    import warnings

    with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings, Token

    settings = Settings(db_url, token=Token("ops-team", CONSOLE_SECRET), poll_interval=0.5,
                        log_interval=0.2, debounce=0.05)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as tc:
        yield tc


def console_audit(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """The console's audit rows, oldest first: (action, target, label, outcome, detail)."""
    return conn.execute("SELECT action, target, label, outcome, detail"
                        " FROM atlantis.console_audit ORDER BY id").fetchall()


def stop_process(proc: subprocess.Popen[bytes], grace: float = 15.0) -> int:
    """SIGTERM to ``proc`` (by its pid), SIGKILL if it is still there after ``grace``
    seconds; its exit status."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def child_processes(pid: int) -> set[int]:
    """The live child processes of supervisor ``pid`` that run attempts (its lease keeper,
    ``python -m atlantis.keeper``, left out)."""
    import psutil

    found: set[int] = set()
    try:
        for c in psutil.Process(pid).children():
            try:
                if (c.status() != psutil.STATUS_ZOMBIE
                        and "atlantis.keeper" not in " ".join(c.cmdline())):
                    found.add(c.pid)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return found


def job_row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    from psycopg.rows import dict_row

    row = conn.cursor(row_factory=dict_row).execute(
        "SELECT * FROM atlantis.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def wait_state(conn: psycopg.Connection[Any], job_id: int, *states: str,
               timeout: float = 30.0) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        row = job_row(conn, job_id)
        last.update(row)
        return row if row["state"] in states else None

    try:
        result: dict[str, Any] = wait_for(check, timeout, message=f"job {job_id} in {states}")
    except pytest.fail.Exception as exc:  # say where the row stood: a flake is read from it
        seen = {k: last.get(k) for k in ("state", "attempt", "claimed_by", "claimed_until",
                                         "run_at", "last_error", "suspended_for")}
        raise pytest.fail.Exception(f"{exc}; the row at the end: {seen}") from None
    return result


def events(conn: psycopg.Connection[Any], key: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT job_id, attempt, event, pid FROM test_events WHERE key = %s ORDER BY id", (key,)
    ).fetchall()


def free_port() -> int:
    """A TCP port of 127.0.0.1 free a moment ago (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def scrape_metrics(port: int) -> str:
    """The text of a supervisor's /metrics on 127.0.0.1:``port``; "" while it cannot be read."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""
