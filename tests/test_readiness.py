"""``--ready-port``: ``/ready`` and ``/live`` of a real supervisor, over real HTTP on
127.0.0.1 (atlantis/supervisor/readiness.py; the probes of deploy/kubernetes/)."""

from __future__ import annotations

import http.client
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import atlantis
from chaos.proxy import Proxy, upstream_socket
from tests.conftest import Supervisor, free_port, job_row, wait_for, wait_state


def probe(port: int, path: str = "/ready", method: str = "GET") -> tuple[int, str] | None:
    """(status, body) of ``METHOD path``; None while nothing answers on the port."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode().strip()
    except OSError:
        return None
    finally:
        conn.close()


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    with Proxy(upstream_socket(db_url)) as p:
        yield p


def test_ready_is_503_while_starting_200_while_serving_and_503_while_draining(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor]) -> None:
    port = free_port()
    # The worker row cannot be written while this lock is held: the start waits there, with
    # the readiness service (the first one) started and the others not yet.
    blocker = psycopg.connect(db_url)
    try:
        blocker.execute("LOCK TABLE atlantis.workers IN SHARE MODE")
        sup = supervise("--ready-port", str(port), concurrency=1)
        assert wait_for(lambda: probe(port), message="the /ready port") == (503, "starting")
        assert probe(port, "/live") == (200, "alive")
    finally:
        blocker.rollback()
        blocker.close()
    wait_for(lambda: probe(port) == (200, "ready"), message="200 once serving")
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": "ready", "seconds": 60.0})
    wait_state(db, job_id, "running")
    sup.signal(signal.SIGTERM)
    wait_for(lambda: probe(port) == (503, "draining"), message="503 once draining")
    assert probe(port, "/live") == (200, "alive")
    assert sup.proc.poll() is None, "the drain waits for the attempt in flight"
    sup.signal(signal.SIGTERM)  # a second one skips the wait: the row goes back unspent
    assert sup.wait() == 0
    assert probe(port) is None, "the port closes with the process"
    row = job_row(db, job_id)
    assert (row["state"], row["attempt"]) == ("available", 0)


def test_ready_is_503_while_the_database_is_unreachable(
        db_url: str, proxy: Proxy, supervise: Callable[..., Supervisor]) -> None:
    port = free_port()
    supervise("--ready-port", str(port), "--worker-refresh", "0.2s", concurrency=1,
              database_url=proxy.url(db_url))
    wait_for(lambda: probe(port) == (200, "ready"), message="200 once serving")
    proxy.stop()  # every connection reset, new ones refused
    try:
        wait_for(lambda: probe(port) == (503, "database unreachable"), message="503 in the outage")
        assert probe(port, "/live") == (200, "alive")
    finally:
        proxy.start()
    wait_for(lambda: probe(port) == (200, "ready"), message="200 once the database is back")


def test_only_get_and_head_of_ready_and_live_are_answered(
        supervise: Callable[..., Supervisor]) -> None:
    port = free_port()
    supervise("--ready-port", str(port), concurrency=1)
    wait_for(lambda: probe(port) == (200, "ready"), message="200 once serving")
    assert probe(port, "/ready?verbose=1") == (200, "ready")
    assert probe(port, "/ready", "HEAD") == (200, "")
    assert probe(port, "/metrics") == (404, "not found: GET /ready or /live")
    assert probe(port, "/ready", "POST") == (405, "method not allowed: GET or HEAD")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"hello\r\n\r\n")
        assert raw.recv(4096).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert probe(port) == (200, "ready"), "a bad request harms nothing"


def test_a_bad_ready_port_is_one_line_and_exit_2(
        db: psycopg.Connection[Any], supervise: Callable[..., Supervisor]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "ready-port"})
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        in_use = supervise("--ready-port", str(port), concurrency=1)
        assert in_use.wait() == 2
    cases = {
        in_use: f"atlantis-supervise: --ready-port {port}: cannot listen on 127.0.0.1:{port}: "
                "Address already in use",
        supervise("--ready-port", "70000"):
            "atlantis-supervise: --ready-port must be between 0 and 65535",
        supervise("--ready-port", "9100", "--metrics-port", "9100"):
            "atlantis-supervise: --ready-port and --metrics-port must differ",
        supervise("--ready-port", "9", "--ready-host", "nosuch.invalid", concurrency=1):
            "atlantis-supervise: --ready-host nosuch.invalid: cannot resolve it: ",
    }
    for sup, line in cases.items():
        assert sup.wait() == 2
        log = sup.log()
        assert "Traceback" not in log, log
        assert log.strip().splitlines()[-1].startswith(line), log
    # Nothing was claimed: no child ever started.
    assert db.execute("SELECT state, attempt FROM atlantis.jobs WHERE id = %s",
                      (job_id,)).fetchone() == ("available", 0)
