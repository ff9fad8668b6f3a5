"""The process supervisor (issue 4): kill trees, parent death, memory, leftovers, drain,
systemd, output, big messages, bad configuration, JSON logs, SIGHUP and recycling.

Real supervisors, real children, real signals and a real PostgreSQL. Tests wait on
conditions; a wait's timeout is only a bound for a hung test, never a timing assertion.
"""

from __future__ import annotations

import collections
import decimal
import functools
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import psycopg
import pytest

import atlantis
from tests.conftest import BIN, ROOT, child_processes, events, job_row, wait_for, wait_state

APP = "tests.apps.process:registry"
QUEUES = ("proc",)


# ---- helpers --------------------------------------------------------------------------------

def _gone(pid: int) -> bool:
    """Dead, or a zombie waiting to be reaped (it runs no code any more)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _fields(text: str) -> dict[str, int]:
    """``a=1 b=2`` -> {"a": 1, "b": 2} (the pids handlers record)."""
    return {k: int(v) for k, v in (part.split("=", 1) for part in text.split() if "=" in part)}


def _event(db: psycopg.Connection[Any], key: str, prefix: str = "", timeout: float = 30.0) -> str:
    """The first event recorded under ``key`` that starts with ``prefix`` (waits for it)."""
    def find() -> str | None:
        return next((e[2] for e in events(db, key) if e[2].startswith(prefix)), None)

    found: str = wait_for(find, timeout, message=f"event {key!r} {prefix!r}")
    return found


@pytest.fixture
def strays() -> Iterator[Callable[[int], None]]:
    """Register pids a test expects to die; whatever survives the test is killed afterwards.

    Each pid is captured as a psutil.Process while alive, so a recycled pid is never hit.
    """
    procs: list[psutil.Process] = []

    def add(pid: int) -> None:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass

    yield add
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


# ---- 1. kill trees ---------------------------------------------------------------------------

def test_timeout_kills_grandchildren_that_ignore_sigterm_or_left_the_group(
    db: psycopg.Connection[Any], supervise: Any, strays: Callable[[int], None]
) -> None:
    job_id = atlantis.enqueue(db, "proc.Escape", {"key": "esc"})  # timeout 1s, one attempt
    # The handler ignores SIGTERM: it records its pids and runs on until the SIGKILL.
    supervise("--kill-grace", "2s", app=APP, queues=QUEUES, concurrency=1)
    pids = _fields(_event(db, "esc"))
    assert set(pids) == {"stubborn", "detached", "daemon"}
    for pid in pids.values():
        strays(pid)
    row = wait_state(db, job_id, "dead", timeout=30)
    assert row["last_error"] == "timeout after 1s"
    assert [e["kind"] for e in row["errors"]] == ["timeout"]
    for name, pid in pids.items():
        wait_for(functools.partial(_gone, pid), timeout=10, message=f"the {name} grandchild {pid} to die")


def test_a_crashing_child_takes_its_escaped_descendants_along(
    db: psycopg.Connection[Any], supervise: Any, strays: Callable[[int], None]
) -> None:
    sup = supervise(app=APP, queues=QUEUES, concurrency=1)
    job_id = atlantis.enqueue(db, "proc.Crash", {"key": "crash"})
    row = wait_state(db, job_id, "dead")
    assert row["last_error"] == "child exited with code 3"
    pids = _fields(_event(db, "crash"))
    for pid in pids.values():
        strays(pid)
    for name, pid in pids.items():
        wait_for(functools.partial(_gone, pid), timeout=10, message=f"the {name} descendant {pid} to die")
    assert sup.proc.poll() is None
    line = next(line for line in sup.log().splitlines() if "the child died and left processes" in line)
    assert f"job={job_id} attempt=1" in line and str(pids["detached"]) in line


# ---- 2. parent death -------------------------------------------------------------------------

def test_kill_9_of_the_supervisor_takes_idle_and_busy_children_and_their_trees_down(
    db: psycopg.Connection[Any], supervise: Any, strays: Callable[[int], None]
) -> None:
    sup = supervise(app=APP, queues=QUEUES, concurrency=3)
    atlantis.enqueue(db, "proc.Hold", {"key": "hold"})
    pids = _fields(_event(db, "hold"))
    for pid in pids.values():
        strays(pid)
    # All three children are up (two of them idle: no attempt to tie them to anything).
    children = wait_for(lambda: len(c := child_processes(sup.pid)) == 3 and c, message="three children")
    for pid in children:
        strays(pid)
    assert pids["child"] in children
    sup.signal(signal.SIGKILL)
    sup.wait()
    named = {**{f"child {pid}": pid for pid in children}, **{f"{k} {v}": v for k, v in pids.items()}}
    for name, pid in named.items():
        wait_for(functools.partial(_gone, pid), timeout=10, message=f"{name} to die with the supervisor")


# ---- 3. memory ---------------------------------------------------------------------------------

def test_memory_hog_is_killed_at_the_limit(db: psycopg.Connection[Any], supervise: Any) -> None:
    # A child with the app and psycopg loaded is about 40 MB: 100MB leaves room for a normal job.
    sup = supervise("--max-memory-per-child", "100MB", app=APP, queues=QUEUES, concurrency=1)
    ok_id = atlantis.enqueue(db, "proc.Noop", {"key": "light"})
    wait_state(db, ok_id, "complete")
    hog_id = atlantis.enqueue(db, "proc.Hog", {"key": "hog", "mb": 400})
    row = wait_state(db, hog_id, "dead", timeout=30)
    assert "memory limit" in row["last_error"]
    assert [e["kind"] for e in row["errors"]] == ["memory"]
    assert [e[2] for e in events(db, "hog")][1:] == []  # never got to "allocated"
    hog_pid = _fields(events(db, "hog")[0][2])["pid"]
    wait_for(lambda: _gone(hog_pid), message="the hog to be gone")
    assert "over the memory limit" in sup.log()
    after_id = atlantis.enqueue(db, "proc.Noop", {"key": "after"})
    wait_state(db, after_id, "complete")


# ---- 4. leftovers ------------------------------------------------------------------------------

def test_leftover_thread_and_process_are_reported_and_the_child_replaced(
    db: psycopg.Connection[Any], supervise: Any, strays: Callable[[int], None]
) -> None:
    sup = supervise(app=APP, queues=QUEUES, concurrency=1)
    first = atlantis.enqueue(db, "proc.Noop", {"key": "before"})
    wait_state(db, first, "complete")
    before_pid = _fields(_event(db, "before"))["pid"]
    job_id = atlantis.enqueue(db, "proc.Leaver", {"key": "left"})
    row = wait_state(db, job_id, "complete")
    assert row["errors"] == [] and row["last_error"] is None
    pids = _fields(_event(db, "left"))
    strays(pids["sleep"])
    assert pids["pid"] == before_pid  # an app-level thread started at import is not a leftover
    wait_for(lambda: _gone(pids["sleep"]), timeout=10, message="the leftover sleep to die")
    # The child with a thread that cannot be stopped exits anyway: threads die with it.
    wait_for(lambda: _gone(pids["pid"]), timeout=10, message="the child with leftovers to exit")

    def warning() -> str | None:
        return next((line for line in sup.log().splitlines() if "left work running" in line), None)

    line = wait_for(warning, message="the leftover warning")
    assert f"job={job_id} attempt=1" in line
    assert "thread 'lingerer'" in line and f"process {pids['sleep']} (sleep 300)" in line
    assert "app-background" not in line
    next_id = atlantis.enqueue(db, "proc.Noop", {"key": "next"})
    wait_state(db, next_id, "complete")
    assert _fields(_event(db, "next"))["pid"] not in (pids["pid"], before_pid)


def test_a_fork_that_returns_from_the_handler_reports_nothing_twice(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise(app=APP, queues=QUEUES, concurrency=1)
    job_id = atlantis.enqueue(db, "proc.Fork", {"key": "fork"})
    row = wait_state(db, job_id, "complete", "dead", timeout=15)
    assert row["state"] == "complete" and row["errors"] == []
    copy = _fields(_event(db, "fork", "copy"))["copy"]
    original = _fields(_event(db, "fork", "original="))
    assert original["copy"] == copy
    # The original went on after its copy ended: the result is the original's, not the copy's.
    assert [e[2] for e in events(db, "fork")][-1] == "original-finished"
    wait_for(lambda: _gone(copy), message="the forked copy to end")
    next_id = atlantis.enqueue(db, "proc.Noop", {"key": "next"})
    wait_state(db, next_id, "complete")
    assert _fields(_event(db, "next"))["pid"] == original["original"]  # the child lives on
    log = sup.log()
    assert "not running" not in log and "corrupt" not in log and "no lease renewal" not in log, log


# ---- 5. drain ----------------------------------------------------------------------------------

def test_sigterm_lets_the_attempt_finish_and_claims_nothing_new(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise(app=APP, queues=QUEUES, concurrency=2)
    nap_id = atlantis.enqueue(db, "proc.Nap", {"key": "nap", "seconds": 2.0})
    _event(db, "nap", "started")
    sup.signal(signal.SIGTERM)
    wait_for(lambda: "draining" in sup.log(), message="the drain to start")
    late_id = atlantis.enqueue(db, "proc.Noop", {"key": "late"})  # an idle child exists
    assert sup.wait(30) == 0
    row = job_row(db, nap_id)
    assert row["state"] == "complete" and row["attempt"] == 1
    assert [e[2].split()[0] for e in events(db, "nap")] == ["started", "finished"]
    late = job_row(db, late_id)
    assert late["state"] == "available" and late["attempt"] == 0
    assert events(db, "late") == []


def test_drain_timeout_kills_the_attempt_and_releases_the_row_unspent(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--drain-timeout", "1s", app=APP, queues=QUEUES, concurrency=1)
    nap_id = atlantis.enqueue(db, "proc.Nap", {"key": "long", "seconds": 120.0})
    child_pid = _fields(_event(db, "long", "started"))["pid"]
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    row = job_row(db, nap_id)
    assert (row["state"], row["attempt"], row["errors"], row["last_error"]) == ("available", 0, [], None)
    assert _gone(child_pid)
    assert "releasing the row" in sup.log()


def test_second_sigterm_skips_the_drain_wait(db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = supervise("--drain-timeout", "60s", app=APP, queues=QUEUES, concurrency=1)
    nap_id = atlantis.enqueue(db, "proc.Nap", {"key": "long", "seconds": 120.0})
    child_pid = _fields(_event(db, "long", "started"))["pid"]
    sup.signal(signal.SIGTERM)
    wait_for(lambda: "draining" in sup.log(), message="the drain to start")
    sup.signal(signal.SIGTERM)
    assert sup.wait(15) == 0  # far less than the 60s drain
    row = job_row(db, nap_id)
    assert (row["state"], row["attempt"], row["errors"]) == ("available", 0, [])
    assert _gone(child_pid)


# ---- 6. systemd --------------------------------------------------------------------------------

def test_systemd_notifications(db: psycopg.Connection[Any], supervise: Any) -> None:
    folder = tempfile.mkdtemp(dir="/tmp")
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
        sock.settimeout(0.5)
        got: list[str] = []

        def receive_until(predicate: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 30
            while not predicate():
                if time.monotonic() > deadline:
                    pytest.fail(f"no {what} among {got}")
                try:
                    got.extend(sock.recv(4096).decode().splitlines())
                except TimeoutError:
                    pass

        sup = supervise(app=APP, queues=QUEUES, concurrency=1,
                        env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "500000"})
        receive_until(lambda: "READY=1" in got and "WATCHDOG=1" in got[got.index("READY=1"):],
                      "READY=1 then WATCHDOG=1")
        status = [line for line in got if line.startswith("STATUS=")]
        assert status and re.search(r"STATUS=serving proc: \d+/1 in flight", status[0]), status
        # The notification socket is the supervisor's alone: children do not inherit it.
        children = wait_for(lambda: child_processes(sup.pid), message="a child")
        for pid in children:
            env = psutil.Process(pid).environ()
            assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env
        sup.signal(signal.SIGTERM)
        receive_until(lambda: "STOPPING=1" in got, "STOPPING=1")
        assert sup.wait(30) == 0
        ready, stopping = got.index("READY=1"), got.index("STOPPING=1")
        assert ready < got.index("WATCHDOG=1") < stopping
        assert "WATCHDOG=1" in got[ready:stopping]
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


# ---- 7. output ---------------------------------------------------------------------------------

def test_handler_output_is_tagged_escaped_and_never_fatal(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise(app=APP, queues=QUEUES, concurrency=1)
    lines, width = 100, 1 << 20  # 100 MB of stdout
    job_id = atlantis.enqueue(db, "proc.Chatty", {"key": "chat", "lines": lines, "width": width})
    wait_state(db, job_id, "complete", timeout=60)
    after_id = atlantis.enqueue(db, "proc.Noop", {"key": "after"})
    wait_state(db, after_id, "complete")
    assert sup.proc.poll() is None
    tag = f"job={job_id} attempt=1 ".encode()
    xs = 0
    markers: dict[bytes, bytes] = {}
    with open(sup.log_path, "rb") as f:
        for raw in f:
            if b"xxxxxxxx" in raw:
                assert tag in raw, raw[:200]
                xs += raw.count(b"x")
            elif any(m in raw for m in (b"chatty-", b"garbage")):
                markers[raw.split(tag)[-1].strip()] = raw
    # Every byte arrived, and every line, the very last one included, carries its tag.
    assert xs == lines * (width - 1)
    escaped = rb"garbage \xff\xfe\xc3( end"
    assert set(markers) == {b"chatty-begin", escaped, b"chatty-stderr", b"chatty-end",
                            b"chatty-tail-without-newline"}, markers
    for line in markers.values():
        assert tag in line


# ---- 8. big messages ---------------------------------------------------------------------------

def test_megabyte_args_and_a_10mb_error_do_not_deadlock(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise(app=APP, queues=QUEUES, concurrency=1)
    blob = "b" * 900_000
    job_id = atlantis.enqueue(db, "proc.Bulky", {"key": "bulk", "blob": blob, "error_mb": 10})
    row = wait_state(db, job_id, "dead", timeout=60)
    assert _event(db, "bulk") == f"blob={len(blob)}"
    assert row["last_error"].startswith("ValueError: EEEEEEEE")
    # Stored bounded: a 10 MB message is cut (saying so), not written ten times over.
    assert len(row["last_error"]) < 70_000 and "truncated" in row["last_error"]
    assert (row["progress_pct"], row["progress_msg"]) == (50, "m" * 256)  # a 10 MB checkpoint
    (error,) = row["errors"]
    assert error["kind"] == "exception" and error["message"] == row["last_error"]
    assert len(error["traceback"]) < 70_000 and "Traceback" in error["traceback"]
    after_id = atlantis.enqueue(db, "proc.Noop", {"key": "after"})
    wait_state(db, after_id, "complete")
    assert sup.proc.poll() is None


# ---- 9. bad configuration ----------------------------------------------------------------------

BAD_APPS = {
    "notregistry.py": "registry = 42\n",
    "missingatl.py": "import atlantis\nregistry = atlantis.Registry.from_atl('nowhere.atl')\n",
    "diratl.py": "import atlantis\nregistry = atlantis.Registry.from_atl('folder.atl')\n",
    "badatl.py": "import atlantis\nregistry = atlantis.Registry.from_atl('bad.atl')\n",
    "boom.py": "raise RuntimeError('boom at import')\n",
    "nohandler.py": "import atlantis\nregistry = atlantis.Registry.from_atl('good.atl')\n",
    "brokendep.py": "import no_such_dependency_xyz\n",
    "multiline.py": "raise RuntimeError('first line\\nsecond line')\n",
    "syntax.py": "def broken(:\n",
}


@pytest.mark.parametrize(("app", "expected"), [
    ("no_such_module_xyz:registry", "no module named 'no_such_module_xyz'"),
    ("notregistry:registry", "registry is a int, not an atlantis.Registry"),
    ("notregistry:nothing", "has no attribute 'nothing'"),
    ("missingatl:registry", "cannot read nowhere.atl"),
    ("diratl:registry", "cannot read folder.atl"),
    ("badatl:registry", "bad.atl:3:"),
    ("boom:registry", "RuntimeError: boom at import"),
    ("nohandler:registry", "no handler is registered"),
    ("brokendep:registry", "No module named 'no_such_dependency_xyz'"),
    ("nocolon", "expected package.module:attribute"),
    ("multiline:registry", "RuntimeError: first line second line"),
    ("syntax:registry", "syntax.py:1)"),
])
def test_bad_configuration_exits_2_with_one_clear_line(
    db_url: str, tmp_path: Path, app: str, expected: str
) -> None:
    for name, text in BAD_APPS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "folder.atl").mkdir()
    (tmp_path / "bad.atl").write_text("job Oops in x {\n  retries 1\n  frobnicate 3\n}\n")
    (tmp_path / "good.atl").write_text("job Fine in x {\n  retries 1\n}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ATLANTIS_APP", None)
    done = subprocess.run(
        [str(BIN / "atlantis-supervise"), "--queue", "q", "--app", app, "--database-url", db_url],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("atlantis-supervise: ") and expected in lines[0], lines[0]
    assert done.stdout == ""


def test_bad_option_values_exit_2(db_url: str) -> None:
    for option in (["--max-memory-per-child", "lots"], ["--drain-timeout", "soon"], ["--concurrency", "0"]):
        done = subprocess.run(
            [str(BIN / "atlantis-supervise"), "--queue", "q", "--app", APP, "--database-url", db_url, *option],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 2, (option, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# ---- 10. JSON logs -----------------------------------------------------------------------------

def test_json_log_lines_parse_and_handler_output_carries_its_fields(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--log-format", "json", app=APP, queues=QUEUES, concurrency=1)
    job_id = atlantis.enqueue(db, "proc.Chatty", {"key": "j", "lines": 2, "width": 10})
    wait_state(db, job_id, "complete")
    leaver_id = atlantis.enqueue(db, "proc.Leaver", {"key": "jl"})  # a supervisor warning too
    wait_state(db, leaver_id, "complete")
    strays_pid = _fields(_event(db, "jl"))["sleep"]
    wait_for(lambda: _gone(strays_pid), message="the leftover to die")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    docs = []
    for raw in sup.log().splitlines():
        doc = orjson.loads(raw)  # every line, from the first to the last
        assert {"ts", "level", "msg"} <= doc.keys(), doc
        docs.append(doc)
    output = [d for d in docs if d.get("job_id") == job_id and d.get("stream")]
    texts = [d["msg"] for d in output]
    assert any("chatty-end" in t for t in texts) and any("chatty-stderr" in t for t in texts)
    for d in output:
        assert (d["attempt"], d["queue"]) == (1, "proc")
    assert any("left work running" in d["msg"] and d.get("job_id") == leaver_id
               and d["level"] == "warning" for d in docs)
    assert any("using database" in d["msg"] for d in docs)
    assert any("stopped" in d["msg"] for d in docs)


def test_json_formatter_survives_surrogates_and_odd_values() -> None:
    from atlantis.supervisor.logformat import JsonFormatter

    record = logging.LogRecord("atlantis.x", logging.WARNING, __file__, 1, "bad name %s",
                               ("caf\udce9",), None)
    record.job_id = decimal.Decimal("7")
    doc = orjson.loads(JsonFormatter().format(record))
    assert doc["msg"] == "bad name caf\\xe9"  # the byte the surrogate stood for, escaped
    assert doc["level"] == "warning" and doc["job_id"] == "7"


# ---- 11. SIGHUP --------------------------------------------------------------------------------

HUP_APP = """\
import os
import time

import atlantis
from tests.apps.basic import record

VERSION = {version}
registry = atlantis.Registry.from_atl({atl!r})


@registry.handler("proc.Noop")
def noop(ctx, args):
    record(ctx, args.key, f"v{{VERSION}} pid={{os.getpid()}}")


@registry.handler("proc.Nap")
def nap(ctx, args):
    record(ctx, args.key, f"v{{VERSION}}-started pid={{os.getpid()}}")
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    record(ctx, args.key, f"v{{VERSION}}-finished pid={{os.getpid()}}")
"""


def test_sighup_replaces_children_with_new_code_without_losing_a_job(
    db: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    module = tmp_path / "hupapp.py"
    atl = str(ROOT / "tests" / "apps" / "process.atl")
    module.write_text(HUP_APP.format(version=1, atl=atl))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "PYTHONDONTWRITEBYTECODE": "1"}
    sup = supervise(app="hupapp:registry", queues=QUEUES, concurrency=2, env=env)
    nap_id = atlantis.enqueue(db, "proc.Nap", {"key": "nap", "seconds": 4.0})
    nap_pid = _fields(_event(db, "nap", "v1-started"))["pid"]
    before = wait_for(lambda: len(c := child_processes(sup.pid)) == 2 and c, message="two children")
    (idle_pid,) = before - {nap_pid}
    module.write_text(HUP_APP.format(version=2, atl=atl))
    sup.signal(signal.SIGHUP)
    wait_for(lambda: _gone(idle_pid), timeout=10, message="the idle child from before SIGHUP to go")
    new_ids = [atlantis.enqueue(db, "proc.Noop", {"key": f"new{i}"}) for i in range(3)]
    for i, new_id in enumerate(new_ids):
        wait_state(db, new_id, "complete")
        version, pid = _event(db, f"new{i}").split()
        assert version == "v2" and _fields(pid)["pid"] not in before
    row = wait_state(db, nap_id, "complete")
    assert row["attempt"] == 1 and row["errors"] == []
    assert [e[2] for e in events(db, "nap")] == [f"v1-started pid={nap_pid}", f"v1-finished pid={nap_pid}"]
    wait_for(lambda: _gone(nap_pid), timeout=10, message="the old busy child to retire")
    assert "SIGHUP" in sup.log()


# ---- 12. recycling -----------------------------------------------------------------------------

def test_max_jobs_per_child_recycles(db: psycopg.Connection[Any], supervise: Any) -> None:
    ids = atlantis.enqueue_many(db, "proc.Noop", [{"key": "mj"} for _ in range(5)])
    supervise("--max-jobs-per-child", "2", app=APP, queues=QUEUES, concurrency=1)
    for job_id in ids:
        wait_state(db, job_id, "complete")
    per_pid = collections.Counter(_fields(e[2])["pid"] for e in events(db, "mj"))
    assert sorted(per_pid.values()) == [1, 2, 2], per_pid


def test_metrics_endpoint_counts_attempts(db: psycopg.Connection[Any], supervise: Any) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ok = atlantis.enqueue(db, "tests.Echo", {"key": "m1"})
    bad = atlantis.enqueue(db, "tests.Fail", {"key": "m2", "mode": "discard"})
    # Heartbeat 3 s: renewed every second while it sleeps.
    slow = atlantis.enqueue(db, "tests.Sleep", {"key": "m3", "seconds": 2.5})
    supervise("--metrics-port", str(port), "--worker-refresh", "0.5s", concurrency=1)
    wait_state(db, ok, "complete")
    wait_state(db, bad, "dead")
    wait_state(db, slow, "complete")

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    text = wait_for(lambda: (t := scrape()) and 'outcome="discard"' in t and t, message="metrics")
    assert 'atlantis_attempts_total{job="tests.Echo",outcome="complete",queue="tests"} 1.0' in text
    assert 'atlantis_attempts_total{job="tests.Fail",outcome="discard",queue="tests"} 1.0' in text
    assert "atlantis_database_up 1.0" in text
    renewals = re.search(r"^atlantis_lease_renewals_total (\S+)$", text, re.M)
    renewed = re.search(r"^atlantis_leases_renewed_total (\S+)$", text, re.M)
    assert renewals and renewed and float(renewals[1]) >= 1 and float(renewed[1]) >= 1, text
    assert "atlantis_paused_queues 0.0" in text and "atlantis_stalled_jobs 0.0" in text
    # The dead-letter gauge follows the worker row's refresh.
    wait_for(lambda: "atlantis_dead_jobs 1.0" in scrape(), message="the dead-letter gauge")


def test_the_worker_row_shows_each_running_job_with_its_child_and_memory(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    """``tide worker list`` reads this: the pid and resident memory of each attempt's child
    (read from /proc, a few children per refresh when there are hundreds)."""
    ids = [atlantis.enqueue(db, "tests.Sleep", {"key": f"w{i}", "seconds": 60.0})
           for i in range(2)]
    supervise("--worker-refresh", "0.2s", concurrency=2)
    for job_id in ids:
        wait_state(db, job_id, "running")

    def jobs() -> list[dict[str, Any]]:
        row = db.execute("SELECT jobs FROM atlantis.workers").fetchone()
        got = list(row[0]) if row and row[0] else []
        return got if len(got) == 2 and all(j["rss"] for j in got) else []

    shown = wait_for(jobs, message="both attempts in the worker row, with their memory")
    assert sorted(j["job_id"] for j in shown) == sorted(ids)
    for j in shown:
        child = psutil.Process(j["child_pid"])
        assert "atlantis.child" in " ".join(child.cmdline())
        # The child's own resident memory at least (a Python interpreter: megabytes).
        assert j["rss"] >= 5 << 20
