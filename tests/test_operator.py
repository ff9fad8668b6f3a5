"""Operator paths of ``tide`` and ``atlantis-supervise``: handler text never drives the
operator's terminal, a database that never answers never hangs a command, and a metrics port
that cannot be had is one line. Real PostgreSQL, real supervisors and children."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis import operations
from tests.conftest import BIN, ROOT, run_tide, wait_for, wait_state
from tests.docs import bad_input_text
from tests.test_operations import make_dead

#: Set the window title, clear the screen, go back over the line, a C1 CSI, a bidi override.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\rfake ok\x9b31m \u202egnp.exe"
#: The same as every human output shows it.
SHOWN = r"\x1b]0;owned\x07\x1b[2J\rfake ok\x9b31m \u202egnp.exe"
#: What a terminal would obey: controls other than newline, DEL, C1, bidi overrides.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def tide(db_url: str | None, *args: str, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tide`` in this process (:func:`tests.conftest.run_tide`): what these tests check is
    its output and exit status; a command that should give up at its deadline and does not
    fails the test at pytest's timeout."""
    return run_tide((["--database-url", db_url] if db_url else []) + list(args), check=check,
                    env=env)


# ---- handler text is shown, never obeyed -------------------------------------------------

def test_handler_text_is_escaped_in_every_human_output_and_exact_in_json(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    queue = "q" + HOSTILE
    logged = atlantis.enqueue(db, "tests.Echo", {"key": "esc", "value": HOSTILE})
    progress = atlantis.enqueue(db, "tests.Checkpoints",
                                {"key": "esc2", "count": 1, "pct": 50, "msg": HOSTILE})
    supervise(concurrency=1)
    wait_state(db, logged, "complete")
    wait_state(db, progress, "complete")
    failed = atlantis.enqueue(db, "tests.Echo", {"key": "x"}, queue=queue)
    make_dead(db, failed)
    db.execute("UPDATE atlantis.jobs SET last_error = %s, progress_msg = %s WHERE id = %s",
               (f"Traceback (most recent call last):\n  File \"x\"\nValueError: {HOSTILE}",
                HOSTILE, failed))
    operations.pause(db, queue, reason=HOSTILE, by="ops" + HOSTILE)
    atlantis.enqueue(db, "tests.Echo", {"key": "y"}, queue="u" + HOSTILE)  # nobody serves it
    db.execute("INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, in_flight, "
               "expires_at, jobs) VALUES (%s, %s, 77, %s, 1, 0, now() + interval '1 minute', "
               "'[]')", ("w" + HOSTILE, "h" + HOSTILE, [queue]))
    wait_for(lambda: tide(db_url, "job", "logs", str(logged)).stdout, message="the log lines")

    outputs = {
        "status": tide(db_url, "job", "status", str(progress)).stdout,
        "status-dead": tide(db_url, "job", "status", str(failed)).stdout,
        "list": tide(db_url, "job", "list").stdout,
        "logs": tide(db_url, "job", "logs", str(logged)).stdout,
        "dlq": tide(db_url, "dlq", "list").stdout,
        "stats": tide(db_url, "queue", "stats").stdout,
        "watch": tide(db_url, "job", "watch", str(progress)).stdout,
        "workers": tide(db_url, "worker", "list").stdout,
        "doctor": tide(db_url, "db", "doctor", check=False).stdout,
        "resume": tide(db_url, "queue", "resume", queue).stdout,
    }
    for name, text in outputs.items():
        assert not RAW.search(text), (name, text)
    assert SHOWN in outputs["status"] and SHOWN in outputs["logs"]
    assert SHOWN in outputs["status-dead"] and SHOWN in outputs["dlq"]
    assert "q" + SHOWN in outputs["list"] and "q" + SHOWN in outputs["stats"]
    assert outputs["resume"] == f"queue q{SHOWN} resumed\n"
    assert "h" + SHOWN in outputs["workers"] and "w" + SHOWN in outputs["workers"]
    assert "u" + SHOWN in outputs["doctor"]
    # A traceback stays on its lines, each control in it escaped.
    error = outputs["status-dead"].split("  error      ", 1)[1].splitlines()
    assert error[:3] == ["Traceback (most recent call last):", " " * 13 + '  File "x"',
                         " " * 13 + f"ValueError: {SHOWN}"]

    # --json stays exact.
    status = orjson.loads(tide(db_url, "job", "status", str(progress), "--json").stdout)
    assert status["progress_msg"] == HOSTILE
    lines = [orjson.loads(ln) for ln in
             tide(db_url, "job", "logs", str(logged), "--json").stdout.splitlines()]
    assert any(HOSTILE in ln["line"] for ln in lines)
    listed = orjson.loads(tide(db_url, "job", "list", "--json").stdout)
    assert {j["queue"] for j in listed} >= {queue}


# ---- a database that never answers never hangs a command ------------------------------------

class SilentPeer:
    """A TCP server on 127.0.0.1 that accepts connections and never says a word; with
    ``upstream`` (a PostgreSQL unix socket), it passes the connection's startup on (so the
    connection succeeds) and then goes silent: whatever the client sends next is dropped,
    as a stopped server would."""

    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.stopped = threading.Event()
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = [self.listener]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self.open.append(client)
            if self.upstream is not None:
                threading.Thread(target=self._startup_only, args=(client,), daemon=True).start()

    def _startup_only(self, client: socket.socket) -> None:
        server = socket.socket(socket.AF_UNIX)
        self.open.append(server)
        try:
            server.connect(self.upstream or "")
            head = _read(client, 4)
            server.sendall(head + _read(client, int.from_bytes(head, "big") - 4))
            while chunk := server.recv(65536):  # the server's side still reaches the client
                client.sendall(chunk)
        except OSError:
            return

    def url(self, db_url: str) -> str:
        return psycopg.conninfo.make_conninfo(db_url, host="127.0.0.1", port=str(self.port),
                                              sslmode="disable", gssencmode="disable")

    def stop(self) -> None:
        self.stopped.set()
        for sock in self.open:
            sock.close()
        self.thread.join(5)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


@pytest.fixture
def silent_peer() -> Iterator[Any]:
    peers: list[SilentPeer] = []

    def start(upstream: str | None = None) -> SilentPeer:
        peers.append(SilentPeer(upstream))
        return peers[-1]

    yield start
    for peer in peers:
        peer.stop()


def _unix_socket(db_url: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    return f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}"


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


CONNECT_TOO_SLOW = ("no answer within 2s; wait longer with --timeout or ATLANTIS_TIDE_TIMEOUT")
STATEMENT_TOO_SLOW = ("tide: the database gave no answer within 1s; wait longer with --timeout "
                      "or ATLANTIS_TIDE_TIMEOUT")


BAD_TIMEOUT = ("tide: Invalid value for --timeout: invalid duration 'soon' (use e.g. 500ms, 30s, "
               "10m, 2h, 1d, 1h30m) (see `tide --help`)")


def test_a_peer_that_never_answers_the_connection_is_one_line_and_exit_1(
        db_url: str, silent_peer: Any) -> None:
    peer = silent_peer()
    url = psycopg.conninfo.make_conninfo("", host="127.0.0.1", port=str(peer.port),
                                         dbname="atlantis", user="ops")
    for argv, env in ((["--timeout", "1s", "job", "list"], None),
                      (["db", "doctor"], {"ATLANTIS_TIDE_TIMEOUT": "1s"}),
                      (["--timeout", "1s", "queue", "stats"], None)):
        got = tide(url, *argv, check=False, env=env)
        assert got.returncode == 1 and got.stdout == ""
        line = _last_line(got)
        assert line.startswith("tide: cannot connect to ") and line.endswith(CONNECT_TOO_SLOW)
        assert "127.0.0.1" in line


def test_a_server_that_stops_answering_after_connect_is_one_line_and_exit_1(
        db: psycopg.Connection[Any], db_url: str, silent_peer: Any) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "stall"})
    peer = silent_peer(_unix_socket(db_url))
    for argv in (["db", "doctor"], ["job", "cancel", str(job_id)]):
        got = tide(peer.url(db_url), "--timeout", "1s", *argv, check=False)
        assert (got.returncode, got.stdout, _last_line(got)) == (1, "", STATEMENT_TOO_SLOW)
    assert tide(db_url, "job", "status", str(job_id), "--json").returncode == 0


def test_a_statement_blocked_by_a_lock_is_cancelled_at_the_deadline(
        db: psycopg.Connection[Any], db_url: str) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "locked"})
    holder = psycopg.connect(db_url)
    holder.execute("LOCK TABLE atlantis.jobs IN ACCESS EXCLUSIVE MODE")
    try:
        for argv in (["job", "cancel", str(job_id)], ["db", "doctor"], ["job", "list"]):
            got = tide(db_url, "--timeout", "1s", *argv, check=False)
            assert (got.returncode, got.stdout, _last_line(got)) == (1, "", STATEMENT_TOO_SLOW)
        waiting = db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                             "'tide' AND wait_event_type = 'Lock'").fetchone()
        assert waiting == (0,)  # cancelled on the server, not left waiting
    finally:
        holder.close()
    # The cancel never happened later: the job still waits.
    assert db.execute("SELECT state FROM atlantis.jobs WHERE id = %s",
                      (job_id,)).fetchone() == ("available",)
    # A bad --timeout is a usage error.
    bad = tide(db_url, "--timeout", "soon", "job", "list", check=False)
    assert (bad.returncode, _last_line(bad)) == (2, BAD_TIMEOUT)


# ---- a metrics port that cannot be had ------------------------------------------------------

def test_a_metrics_port_in_use_or_a_host_that_does_not_resolve_is_one_line_and_exit_2(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "metrics"})
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        in_use = supervise("--metrics-port", str(port), concurrency=1)
        assert in_use.wait() == 2
    unknown = supervise("--metrics-port", "9", "--metrics-host", "nosuch.invalid", concurrency=1)
    assert unknown.wait() == 2
    for sup, line in ((in_use, f"atlantis-supervise: --metrics-port {port}: cannot listen on "
                               f"127.0.0.1:{port}: Address already in use"),
                      (unknown, "atlantis-supervise: --metrics-host nosuch.invalid: cannot "
                                "resolve it: ")):
        log = sup.log()
        assert "Traceback" not in log, log
        assert log.strip().splitlines()[-1].startswith(line), log
    # Nothing was claimed: no child ever started.
    assert db.execute("SELECT state, attempt FROM atlantis.jobs WHERE id = %s",
                      (job_id,)).fetchone() == ("available", 0)


def test_the_bad_input_table_quotes_these_messages() -> None:
    text = bad_input_text()
    for message in (SHOWN, CONNECT_TOO_SLOW, STATEMENT_TOO_SLOW, BAD_TIMEOUT,
                    "atlantis-supervise: --metrics-host nosuch.invalid: cannot resolve it: ",
                    ": cannot listen on 127.0.0.1:9100: Address already in use"):
        assert message in text, message


def test_commands_that_wait_by_nature_outlive_the_statement_deadline(
        db: psycopg.Connection[Any], db_url: str) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "patient"})
    holder = psycopg.connect(db_url)
    holder.execute("LOCK TABLE atlantis.jobs IN ACCESS EXCLUSIVE MODE")
    argvs = {"watch": ["job", "watch", str(job_id), "--interval", "100ms"],
             "prune": ["job", "prune", "--older-than", "1d"]}
    procs = {name: subprocess.Popen([str(BIN / "tide"), "--database-url", db_url, "--timeout",
                                     "1s", *argv], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for name, argv in argvs.items()}
    try:
        try:
            # Both wait on the lock well past their 1 s deadline (by the server's clock).
            wait_for(lambda: db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tide' AND "
                "wait_event_type = 'Lock' AND now() - query_start > interval '3 seconds'"
            ).fetchone() == (2,), message="both commands waiting on the lock past the deadline")
            assert all(p.poll() is None for p in procs.values())
        finally:
            holder.close()
        make_dead(db, job_id)  # watch ends once the job has finished
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=60)
            assert (proc.returncode, "Traceback" in err) == (0, False), (name, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
