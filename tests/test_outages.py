"""Database outages: PostgreSQL restarted, connections cut or left half-open.

The contract: the supervisor survives (never exits because the database went away),
reconnects with backoff, keeps the attempts whose leases are still valid, and stops the
ones whose leases it cannot renew in time, so that no row ever runs twice at once.

Restarts use a server of this module's own (the session's server is shared by every test);
cuts and half-open links use a TCP proxy in front of the session's server.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

import atlantis
from chaos.proxy import Proxy, upstream_socket
from chaos.server import OwnServer
from tests.conftest import (
    TEST_APP,
    Supervisor,
    job_row,
    prepare_template,
    url_for,
    wait_for,
    wait_state,
)

# ---- fixtures -------------------------------------------------------------------------------


#: The template database of this module's own server.
OWN_TEMPLATE = "atl_outages"


@pytest.fixture(scope="module")
def own_server() -> Iterator[OwnServer]:
    with OwnServer.create(prefix="atl-o") as own:
        prepare_template(own.admin_url, OWN_TEMPLATE)
        yield own


_counter = iter(range(1_000_000))


@pytest.fixture
def own_db(own_server: OwnServer) -> Iterator[str]:
    """A fresh database on the module's own server."""
    if not own_server.running():  # a failed test may have left it stopped
        own_server.start()
    name = f"o_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(own_server.admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {OWN_TEMPLATE}")
    yield url_for(own_server.admin_url, name)
    if not own_server.running():
        own_server.start()
    with psycopg.connect(own_server.admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    with Proxy(upstream_socket(db_url)) as p:
        yield p


class NotifySink:
    """A stand-in for systemd's notification socket: collects what the supervisor sends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.received: list[str] = []

    def statuses(self) -> list[str]:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                break
            self.received += [line for line in data.decode().splitlines() if line.startswith("STATUS=")]
        return self.received

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def notify_sink() -> Iterator[NotifySink]:
    folder = Path(tempfile.mkdtemp(prefix="atl-n", dir="/tmp"))
    sink = NotifySink(folder / "notify")
    yield sink
    sink.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """Start a supervisor against any URL (a proxy's, the module server's); stopped by pid after."""
    started: list[Supervisor] = []

    def run(url: str, *args: str, concurrency: int = 2, env: dict[str, str] | None = None) -> Supervisor:
        argv = ["--queue=tests", "--app", TEST_APP, "--concurrency", str(concurrency),
                "--poll-interval", "0.2s", "--rescue-interval", "0.5s", "--drain-timeout", "10s",
                "--kill-grace", "2s", *args]
        sup = Supervisor(url, tmp_path / f"supervisor-{len(started)}.log", argv, {**os.environ, **(env or {})})
        started.append(sup)
        return sup

    yield run
    for sup in started:
        sup.stop()


# ---- helpers --------------------------------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _events(conn: psycopg.Connection[Any]) -> list[tuple[str, int, str, int]]:
    return [(r[0], r[1], r[2], r[3]) for r in conn.execute(
        "SELECT key, attempt, event, pid FROM test_events ORDER BY id").fetchall()]


def _started(conn: psycopg.Connection[Any], n: int) -> list[tuple[str, int, str, int]]:
    def check() -> list[tuple[str, int, str, int]] | None:
        started = [e for e in _events(conn) if e[2] == "started"]
        return started if len(started) >= n else None

    result: list[tuple[str, int, str, int]] = wait_for(check, timeout=30, message=f"{n} attempts to start")
    return result


def _renewed(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    """Wait until every lease was renewed once: the outage then breaks the supervisor's
    lease connection under it, rather than coming before that connection exists."""
    def check() -> bool:
        row = conn.execute("SELECT count(*) FROM atlantis.jobs WHERE id = ANY(%s) AND state = 'running'"
                           " AND claimed_until > started_at + heartbeat", (ids,)).fetchone()
        return row is not None and row[0] == len(ids)

    wait_for(check, timeout=10, message="the leases to be renewed once")


def _finished_once_per_key(conn: psycopg.Connection[Any], keys: list[str]) -> dict[str, int]:
    """The attempt that recorded each key's side effect; fails if any key recorded it twice."""
    finished: dict[str, list[int]] = {}
    for key, attempt, event, _ in _events(conn):
        if event == "finished":
            finished.setdefault(key, []).append(attempt)
    assert sorted(finished) == sorted(keys), finished
    assert all(len(a) == 1 for a in finished.values()), f"a side effect ran twice: {finished}"
    return {k: a[0] for k, a in finished.items()}


def _alive(sup: Supervisor) -> bool:
    return sup.proc.poll() is None


def _then_new_work_runs(conn: psycopg.Connection[Any], key: str) -> None:
    job_id = atlantis.enqueue(conn, "tests.Echo", {"key": key})
    wait_state(conn, job_id, "complete", timeout=20)


# ---- PostgreSQL restarted -------------------------------------------------------------------


def _assert_survived_outage(sup: Supervisor) -> None:
    """Still running, and its log tells the outage: a lost connection, then recovery."""
    assert _alive(sup)
    log = sup.log()
    assert "connection lease lost" in log, log
    assert "database unreachable" in log and "database reachable again" in log, log


def test_restart_shorter_than_the_lease_keeps_the_attempts(
    own_server: OwnServer, own_db: str, start: Callable[..., Supervisor]
) -> None:
    """A restart takes ~0.2 s on a quiet machine, seconds on a loaded one: well inside the
    6.75 s an unrenewed 9 s lease is kept (a 3 s one, 2.25 s, was not always enough)."""
    with psycopg.connect(own_db, autocommit=True) as conn:
        ids = atlantis.enqueue_many(conn, "tests.SleepSteady",
                                    [{"key": f"s{i}", "seconds": 8.0} for i in range(2)])
        sup = start(own_db)
        started = _started(conn, 2)
        _renewed(conn, ids)
    own_server.stop()
    try:
        assert _alive(sup)
    finally:
        own_server.start()
    with psycopg.connect(own_db, autocommit=True) as conn:
        for job_id in ids:
            row = wait_state(conn, job_id, "complete", "dead", timeout=30)
            assert (row["state"], row["attempt"], row["errors"]) == ("complete", 1, []), row
        assert _finished_once_per_key(conn, ["s0", "s1"]) == {"s0": 1, "s1": 1}
        # The very children that started the attempts finished them.
        assert {e[3] for e in _events(conn) if e[2] == "finished"} == {e[3] for e in started}
        _then_new_work_runs(conn, "after-restart")
    # The renewals went on over a new connection: the old one died with the server.
    _assert_survived_outage(sup)


def test_outage_longer_than_the_lease_stops_the_attempts_and_reruns_them(
    own_server: OwnServer, own_db: str, start: Callable[..., Supervisor], notify_sink: NotifySink
) -> None:
    with psycopg.connect(own_db, autocommit=True) as conn:
        ids = atlantis.enqueue_many(conn, "tests.Sleep", [{"key": f"l{i}", "seconds": 5.0} for i in range(2)])
        sup = start(own_db, env={"NOTIFY_SOCKET": str(notify_sink.path)})
        started = _started(conn, 2)
        _renewed(conn, ids)
    own_server.stop()
    try:
        # Nobody can renew the leases: the attempts are stopped (by the supervisor, or the
        # child by itself) before the leases end, so they are dead before anyone may
        # claim the rows again; the supervisor lives on.
        for _, _, _, pid in started:
            wait_for(functools.partial(_gone, pid), timeout=10, message=f"child {pid} to stop")
        assert _alive(sup)
        wait_for(lambda: any("database unreachable" in s for s in notify_sink.statuses()),
                 timeout=10, message="STATUS= to say the database is unreachable")
        assert _alive(sup)
    finally:
        own_server.start()
    outage_over = time.monotonic()
    with psycopg.connect(own_db, autocommit=True) as conn:
        for job_id in ids:
            row = wait_state(conn, job_id, "complete", "dead", timeout=30)
            assert (row["state"], row["attempt"]) == ("complete", 2), row
            assert [e["kind"] for e in row["errors"]] == ["lease_expired"]
        recovered = time.monotonic() - outage_over
        # Attempt 1 never recorded its side effect; attempt 2 did, once.
        assert _finished_once_per_key(conn, ["l0", "l1"]) == {"l0": 2, "l1": 2}
        _then_new_work_runs(conn, "after-long-outage")
    assert _alive(sup)
    log = sup.log()
    assert "could not be renewed in time" in log
    assert "database unreachable" in log and "database reachable again" in log, log
    assert not any("database unreachable" in s for s in notify_sink.statuses()[-1:])
    print(f"jobs re-run and complete {recovered:.1f}s after the server came back")


# ---- connections cut or half-open (TCP proxy) -----------------------------------------------


def test_connections_cut_briefly_lose_and_duplicate_nothing(
    db_url: str, db: psycopg.Connection[Any], proxy: Proxy, start: Callable[..., Supervisor],
    notify_sink: NotifySink,
) -> None:
    ids = atlantis.enqueue_many(db, "tests.Sleep", [{"key": f"c{i}", "seconds": 3.0} for i in range(2)])
    sup = start(proxy.url(db_url), env={"NOTIFY_SOCKET": str(notify_sink.path)})
    _started(db, 2)
    _renewed(db, ids)
    proxy.stop()  # every connection reset, new ones refused
    try:
        wait_for(lambda: any("database unreachable" in s for s in notify_sink.statuses()),
                 timeout=5, message="STATUS= to say the database is unreachable")
        assert _alive(sup)
    finally:
        proxy.start()
    for job_id in ids:
        row = wait_state(db, job_id, "complete", "dead", timeout=30)
        assert (row["state"], row["attempt"], row["errors"]) == ("complete", 1, []), row
    assert _finished_once_per_key(db, ["c0", "c1"]) == {"c0": 1, "c1": 1}
    # Idle now: cut again for longer than a lease. Work enqueued meanwhile is claimed as
    # the link comes back, by a claim that waited seconds for a connection: its lease
    # counts from when the claim went out, so the attempt is not taken for expired.
    outages = sup.log().count("database unreachable")
    proxy.stop()
    try:
        waiting = atlantis.enqueue(db, "tests.Echo", {"key": "during-cut"})  # one attempt only
        wait_for(lambda: sup.log().count("database unreachable") > outages, timeout=10,
                 message="the supervisor to notice the second cut")
        time.sleep(4.0)  # the outage itself: longer than the 3 s heartbeat
        assert _alive(sup)
    finally:
        proxy.start()
    row = wait_state(db, waiting, "complete", "dead", timeout=20)
    assert (row["state"], row["attempt"], row["errors"]) == ("complete", 1, []), row
    _then_new_work_runs(db, "after-cut")
    _assert_survived_outage(sup)


def test_half_open_connections_are_noticed_and_unrenewable_leases_stop_their_attempts(
    db_url: str, db: psycopg.Connection[Any], proxy: Proxy, start: Callable[..., Supervisor],
    notify_sink: NotifySink,
) -> None:
    (job_id,) = atlantis.enqueue_many(db, "tests.Sleep", [{"key": "h", "seconds": 4.0}])
    sup = start(proxy.url(db_url), concurrency=1, env={"NOTIFY_SOCKET": str(notify_sink.path)})
    ((_, _, _, pid),) = _started(db, 1)
    _renewed(db, [job_id])
    proxy.freeze()  # sockets stay open, nothing gets through: only timeouts can tell
    try:
        wait_for(lambda: _gone(pid), timeout=10, message="the attempt's child to stop")
        wait_for(lambda: "could not be renewed in time" in sup.log(), timeout=5,
                 message="the supervisor to say why")
        wait_for(lambda: any("database unreachable" in s for s in notify_sink.statuses()),
                 timeout=10, message="STATUS= to say the database is unreachable")
        assert _alive(sup)
        # While frozen, the row still looks running with attempt 1 (nothing got through).
        assert job_row(db, job_id)["attempt"] == 1
    finally:
        proxy.thaw()
    row = wait_state(db, job_id, "complete", "dead", timeout=30)
    assert (row["state"], row["attempt"]) == ("complete", 2), row
    assert [e["kind"] for e in row["errors"]] == ["lease_expired"]
    assert _finished_once_per_key(db, ["h"]) == {"h": 2}
    _then_new_work_runs(db, "after-freeze")
    assert _alive(sup)


def test_a_claim_delivered_late_on_a_half_open_link_takes_no_rows(
    db_url: str, db: psycopg.Connection[Any], proxy: Proxy, start: Callable[..., Supervisor]
) -> None:
    """A claim the supervisor gave up on, delivered once the link heals, must not take rows
    for nobody (they would sit until their lease ended, and lose an attempt)."""
    sup = start(proxy.url(db_url), concurrency=1)
    _then_new_work_runs(db, "before")  # connected and idle: claims go out every poll
    proxy.freeze()
    try:
        wait_for(lambda: "connection claim abandoned" in sup.log(), timeout=20,
                 message="a claim to be abandoned")
        job_id = atlantis.enqueue(db, "tests.Echo", {"key": "late-claim"})  # one attempt only
    finally:
        proxy.thaw()  # the held claim reaches the server now, after the row exists
    row = wait_state(db, job_id, "complete", "dead", timeout=30)
    assert (row["state"], row["attempt"], row["errors"]) == ("complete", 1, []), row
    assert _alive(sup)


def test_a_claim_answered_too_late_to_start_its_rows_gives_them_back(
    db_url: str, db: psycopg.Connection[Any], proxy: Proxy, start: Callable[..., Supervisor]
) -> None:
    """A claim answered after most of its rows' leases went by (a link that stalls, here
    for ~3.5s, against a 3s heartbeat) must not start them: an attempt started then would
    be killed at once for its lease, and spend the row's only attempt. The rows go back,
    unspent, and run from the next claim."""
    sup = start(proxy.url(db_url), "--claim-timeout", "20s", concurrency=1)
    _then_new_work_runs(db, "before")  # connected and idle: claims go out every poll
    for round_ in range(5):
        proxy.freeze()
        try:
            time.sleep(0.5)  # a claim is on its way into the stalled link (one every 0.2s)
            job_id = atlantis.enqueue(db, "tests.Echo", {"key": f"late-{round_}"})  # one attempt
            time.sleep(3.0)  # the claim's rows would have under a quarter of their lease left
        finally:
            proxy.thaw()  # the claim reaches the server now, and takes the row
        row = wait_state(db, job_id, "complete", "dead", timeout=30)
        assert (row["state"], row["attempt"], row["errors"]) == ("complete", 1, []), row
        if "too late to start it; giving it back" in sup.log():
            break
        # A claim that had reached the server just before the freeze (its answer held
        # until the thaw, empty) kept the next one from going out: the row was claimed
        # afresh after the thaw. Again.
    else:
        raise AssertionError("no claim was answered late in five rounds")
    assert _alive(sup)


# ---- unreachable at start -------------------------------------------------------------------


def test_waits_for_a_database_that_is_not_up_yet(
    db_url: str, db: psycopg.Connection[Any], proxy: Proxy, start: Callable[..., Supervisor]
) -> None:
    proxy.stop()
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "late-db"})
    sup = start(proxy.url(db_url), "--startup-timeout", "30s")
    wait_for(lambda: "waiting for the database" in sup.log(), timeout=10,
             message="the supervisor to say it waits")
    assert _alive(sup)
    proxy.start()
    wait_state(db, job_id, "complete", timeout=30)
    sup.signal(signal.SIGTERM)
    assert sup.wait() == 0


def test_a_sighup_while_it_waits_for_the_database_does_not_kill_it(
    db_url: str, db: psycopg.Connection[Any], proxy: Proxy, start: Callable[..., Supervisor]
) -> None:
    """Found by the chaos run: a SIGHUP (a reload, a deploy) that came before the event
    loop's handler was installed killed the supervisor (SIGHUP's default action). There are
    no children yet to replace: the ones started later import the app afresh anyway."""
    proxy.stop()
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "hup-at-start"})
    sup = start(proxy.url(db_url), "--startup-timeout", "30s")
    wait_for(lambda: "waiting for the database" in sup.log(), timeout=10,
             message="the supervisor to say it waits")
    sup.signal(signal.SIGHUP)
    proxy.start()
    wait_state(db, job_id, "complete", timeout=30)
    assert _alive(sup), sup.log()
    sup.signal(signal.SIGTERM)
    assert sup.wait() == 0


def test_gives_up_on_an_unreachable_database_after_the_startup_timeout(
    db_url: str, proxy: Proxy, start: Callable[..., Supervisor]
) -> None:
    proxy.stop()
    sup = start(proxy.url(db_url), "--startup-timeout", "1s")
    assert sup.wait(timeout=30) == 1
    assert "database unreachable" in sup.log() and "Connection refused" in sup.log(), sup.log()


def test_the_wait_for_the_database_never_sleeps_a_negative_time() -> None:
    """The startup's wait sleeps in steps until its end; the clock read twice (once to test
    the end, once for the step) let a step come out negative past the end, and the
    supervisor died of a ValueError instead of saying the database was unreachable (a full
    run's failure of the test above). Waits of a few hundred nanoseconds make that likely."""
    from atlantis.supervisor.cli import _sleep_unless

    sleep = _sleep_unless([])
    for i in range(20_000):
        sleep(1e-7 * (i % 10))


def test_a_stop_signal_ends_the_wait_for_the_database(
    db_url: str, proxy: Proxy, start: Callable[..., Supervisor]
) -> None:
    proxy.stop()
    sup = start(proxy.url(db_url), "--startup-timeout", "60s")
    wait_for(lambda: "waiting for the database" in sup.log(), timeout=10,
             message="the supervisor to say it waits")
    sup.signal(signal.SIGTERM)
    assert sup.wait(timeout=15) == 0
