"""The scaling signal served to Prometheus by processes that run no job (issue 37): a real
``tide metrics serve`` (started and stopped by its pid) and the console's ``/metrics``
(Starlette's TestClient), with no supervisor running; the alert rules of
deploy/prometheus/ checked with ``promtool`` (skipped with a line where it is missing), and
every metric they and docs/howto/scaling.md name found in a real scrape. The SQL function
and ``tide queue signal``: tests/test_queue_signal.py.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import socket
import subprocess
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import atlantis
from atlantis import operations, scaling
from atlantis.store import orders
from tests.conftest import (
    BIN,
    ROOT,
    free_port,
    run_tide,
    scrape_metrics,
    stop_process,
    wait_for,
)
from tests.docs import bad_input_text

RULES = ROOT / "deploy" / "prometheus" / "atlantis-alerts.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "atlantis-alerts.test.yml"
HOWTO = ROOT / "docs" / "howto" / "scaling.md"
#: A metric's name in PromQL, a manifest or a rule (atlantis's roles are not metrics).
METRIC = re.compile(r"\batlantis_(?!reader\b|worker\b|operator\b|enqueuer\b)[a-z_]+\b")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$")


def samples(text: str) -> dict[tuple[str, str], float]:
    """{(name, labels): value} of a scrape's text."""
    found = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            found[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return found


def names(text: str) -> set[str]:
    """Every metric a scrape declares (its ``# TYPE`` lines: a labelled series with no sample
    yet is declared too) or has a sample of."""
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    return declared | {name for name, _ in samples(text)}


class MetricsServer:
    """``tide metrics serve --port 0`` for the test's database; its stderr in a file."""

    def __init__(self, db_url: str, log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(BIN / "tide"), "--database-url", db_url, "metrics", "serve", "--port", "0"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._log)
        found = wait_for(lambda: re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics",
                                           self.log()), message="tide metrics serve to listen")
        self.port = int(found.group(1))

    def log(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")

    def scrape(self) -> dict[tuple[str, str], float]:
        """One scrape's samples; asked again while none answers within scrape_metrics' 5 s (a
        machine busy with I/O: the test then fails on what it checks, not on a timeout)."""
        text: str = wait_for(lambda: scrape_metrics(self.port) or None, timeout=60,
                             message="a scrape of tide metrics serve")
        return samples(text)

    def stop(self) -> int:
        code = stop_process(self.proc)
        self._log.close()
        return code


@pytest.fixture
def metrics_server(db_url: str, tmp_path: Path) -> Iterator[MetricsServer]:
    server = MetricsServer(db_url, tmp_path / "metrics.log")
    yield server
    server.stop()


def test_the_stop_of_tide_metrics_serve_is_no_error_its_server_could_swallow() -> None:
    """SIGTERM and SIGINT raise the stop in the main thread wherever it is, which may be
    inside the server's taking of a request: socketserver logs any ``Exception`` raised
    there and goes on serving (seen once in a run of the suite: the test below's server
    had to be killed). The stop is a ``BaseException`` only, as KeyboardInterrupt is."""
    from atlantis.cli.scaling import _Stopped

    assert issubclass(_Stopped, BaseException) and not issubclass(_Stopped, Exception)


def test_tide_metrics_serve_stops_on_sigterm_while_scrapes_arrive(db_url: str,
                                                                  tmp_path: Path) -> None:
    """A SIGTERM that lands while the server takes a request in (between its accept and the
    request's thread) stops it too: the stop is not an error of that request, which the
    server would log and go on serving past (it then had to be killed)."""
    for turn in range(2):
        server = MetricsServer(db_url, tmp_path / f"metrics-{turn}.log")
        done = threading.Event()

        def hammer(port: int = server.port, done: threading.Event = done) -> None:
            while not done.is_set():
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    sock.recv(1)

        threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            wait_for(functools.partial(scrape_metrics, server.port), message="scrapes answered")
        finally:
            code = server.stop()  # stopped by pid whatever happened, the clients still at it
            done.set()
            for t in threads:
                t.join(10)
        assert code == 0, server.log()
        assert "tide: metrics: stopped" in server.log(), server.log()


def test_tide_metrics_serve_with_no_supervisor(db: psycopg.Connection[Any], admin_url: str,
                                               metrics_server: MetricsServer) -> None:
    atlantis.enqueue_many(db, "tests.Echo", [{"key": "a"}, {"key": "b"}], queue="emails")
    atlantis.enqueue(db, "tests.Echo", {"key": "later"}, queue="emails", delay=3600)
    got = metrics_server.scrape()
    queue = 'queue="emails"'
    assert got[("atlantis_database_up", "")] == 1
    assert got[("atlantis_queue_claimable", queue)] == 2
    assert got[("atlantis_queue_delayed", queue)] == 1
    assert got[("atlantis_queue_running", queue)] == 0
    assert got[("atlantis_queue_limit_held", queue)] == 0
    assert got[("atlantis_queue_suspended", queue)] == 0
    assert got[("atlantis_queue_paused", queue)] == 0
    assert got[("atlantis_queue_oldest_claimable_seconds", queue)] >= 0
    assert got[("atlantis_workers_silent", "")] == 0
    assert got[("atlantis_workers_held", 'order="drain"')] == 0
    assert got[("atlantis_workers_held", 'order="evict"')] == 0
    # Declared queues with nothing to do have their series: a scaler sees them at zero.
    assert got[("atlantis_queue_claimable", 'queue="tests"')] == 0
    assert db.execute("SELECT count(*) FROM atlantis.workers").fetchone() == (0,)
    # Each scrape reads anew.
    operations.pause(db, "emails")
    again = metrics_server.scrape()
    assert again[("atlantis_queue_paused", queue)] == 1
    assert again[("atlantis_queue_claimable", queue)] == 0
    # An operator's drain is counted until resumed, whether a supervisor of the name runs.
    db.execute("INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, expires_at,"
               " name) VALUES ('h:1:ab', 'h', 1, '{emails}', 1, now() - interval '1 hour',"
               " 'h:emails')")
    orders.order(db, "h:1:ab", "drain")
    assert metrics_server.scrape()[("atlantis_workers_held", 'order="drain"')] == 1
    # The database gone: the scrape says so, and only that; one line on stderr.
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {db.info.dbname} WITH (FORCE)")
    lost = metrics_server.scrape()
    assert lost == {("atlantis_database_up", ""): 0}
    wait_for(lambda: "tide: metrics: cannot read the database: " in metrics_server.log(),
             message="the failure said once")
    assert metrics_server.stop() == 0, metrics_server.log()
    log = metrics_server.log()
    assert "Traceback" not in log and log.count("cannot read the database") == 1, log
    assert log.strip().splitlines()[-1] == "tide: metrics: stopped"


def test_the_console_serves_the_same_gauges(db: psycopg.Connection[Any], db_url: str) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings, Token
    from tests.test_console_api import SECRET

    def client(*, token: bool = False, private: bool = False) -> Any:
        settings = Settings(db_url, token=Token("ops", SECRET) if token else None,
                            private=private)
        return TestClient(create_app(settings), base_url="http://127.0.0.1")

    atlantis.enqueue(db, "tests.Echo", {"key": "c"}, queue="console-q")
    with client() as open_console:
        page = open_console.get("/metrics")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/plain; version=")
    got = samples(page.text)
    assert got[("atlantis_queue_claimable", 'queue="console-q"')] == 1
    assert {name for name, _ in got} == set(scaling.NAMES)
    # A private console asks for the token, as its other reads do.
    with client(token=True, private=True) as private:
        refused = private.get("/metrics")
        wrong = private.get("/metrics", headers={"Authorization": "Bearer nope"})
        allowed = private.get("/metrics", headers={"Authorization": f"Bearer {SECRET}"})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.text == "this console is private: send Authorization: Bearer TOKEN\n"
    assert (wrong.status_code, wrong.text) == (401, "wrong token\n")
    assert allowed.status_code == 200
    assert samples(allowed.text)[("atlantis_queue_claimable", 'queue="console-q"')] == 1


def test_a_bad_port_or_host_is_one_line_and_exit_2(db_url: str) -> None:
    cases = {"70000": "tide: Invalid value for '--port': 70000 is not in the range "
                      "0<=x<=65535. (see `tide metrics serve --help`)",
             "-1": "tide: Invalid value for '--port': -1 is not in the range 0<=x<=65535. "
                   "(see `tide metrics serve --help`)",
             "http": "tide: Invalid value for '--port': 'http' is not a valid integer range. "
                     "(see `tide metrics serve --help`)"}
    for port, line in cases.items():
        out = run_tide(["--database-url", db_url, "metrics", "serve", "--port", port],
                       check=False)
        assert (out.returncode, out.stderr.splitlines()[-1]) == (2, line), out.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = run_tide(["--database-url", db_url, "metrics", "serve", "--port", str(port)],
                       check=False)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == (f"tide: --port {port}: cannot listen on "
                                           f"127.0.0.1:{port}: Address already in use")
    out = run_tide(["--database-url", db_url, "metrics", "serve", "--host", "nosuch.invalid"],
                   check=False)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].startswith("tide: --host nosuch.invalid: cannot "
                                                  "resolve it: ")
    text = bad_input_text()
    for message in (cases["70000"], ": cannot listen on 127.0.0.1:9465: Address already in use",
                    "tide: --host nosuch.invalid: cannot resolve it: "):
        assert message in text, message


def test_the_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian's `prometheus` package; ./scripts/test installs "
                    "it as root): the alert rules are not checked")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 5 rules found" in check.stdout
    tested = subprocess.run([promtool, "test", "rules", RULES_TEST.name], capture_output=True,
                            text=True, timeout=60, cwd=RULES_TEST.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_metric_the_rules_and_the_howto_name_is_served(
        db: psycopg.Connection[Any], metrics_server: MetricsServer, supervise: Any) -> None:
    """From the metrics server (no job run) and a supervisor's --metrics-port."""
    port = free_port()
    sup = supervise("--metrics-port", str(port), concurrency=1)
    served = names(scrape_metrics(metrics_server.port))
    text = wait_for(lambda: scrape_metrics(port), message="the supervisor's metrics")
    served |= names(text)
    named = set(METRIC.findall(RULES.read_text("utf-8")))
    assert {"atlantis_queue_oldest_claimable_seconds", "atlantis_dead_jobs",
            "atlantis_rescued_total", "atlantis_workers_silent"} <= named
    named |= set(METRIC.findall(HOWTO.read_text("utf-8")))
    assert not named - served, sorted(named - served)
    # The supervisor serves none of the queue gauges: one series per queue, from one place.
    assert not names(text) & {n for n, _, _ in scaling.QUEUE_GAUGES}
    sup.stop()
