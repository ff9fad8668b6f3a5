"""SIGHUP reloads the app: new job types are claimed, removed ones no longer are, a broken
app changes nothing; and waiting jobs of a type no live supervisor handles are flagged by
`tide queue stats`, `tide db doctor` and the console (issue 18).

Each test runs a real supervisor on an app package written to tmp_path, which the test
rewrites between signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg

import atlantis
from atlantis.declarations import parse_atl_file
from atlantis.store import fleet, sync
from tests.conftest import BIN, ROOT, child_processes, wait_for, wait_state

QUEUE = "reload"
APP = "reloadapp:registry"

ATL = """\
job {name} in reload {{
  args {{ key text }}
  retries   0
  timeout   30s
  heartbeat 3s
  queue     "reload"{schedule}
}}
"""

MODULE = """\
import atlantis
from tests.apps.basic import record

registry = atlantis.Registry.from_atl({atls})
{handlers}
"""

HANDLER = """
@registry.handler("reload.{name}")
def handle_{name}(ctx, args):
    record(ctx, args.key or "tick", "v{version}")
"""


def write_app(root: Path, *, declared: tuple[str, ...], handled: tuple[str, ...],
              version: int = 1, broken: str | None = None) -> None:
    """The package ``reloadapp``: one .atl per declared job, a handler for each handled one;
    ``broken="module"`` writes a syntax error into the module, ``"atl"`` a bad .atl file."""
    pkg = root / "reloadapp"
    pkg.mkdir(exist_ok=True)
    for atl in pkg.glob("*.atl"):
        atl.unlink()
    for name in declared:
        every_second = '\n  schedule "* * * * * *"' if name == "Tick" else ""
        (pkg / f"{name.lower()}.atl").write_text(ATL.format(name=name, schedule=every_second))
    atls = ", ".join(repr(f"{n.lower()}.atl") for n in declared)
    if broken == "atl":
        (pkg / "zz_bad.atl").write_text("job Oops in reload {\n  retries lots\n}\n")
        atls += ", 'zz_bad.atl'"
    text = MODULE.format(atls=atls, handlers="".join(
        HANDLER.format(name=n, version=version) for n in handled))
    if broken == "module":
        text += "\ndef oops(:\n"
    (pkg / "__init__.py").write_text(text)


def start(db: psycopg.Connection[Any], supervise: Callable[..., Any], root: Path, *args: str,
          concurrency: int = 2) -> Any:
    env = {"PYTHONPATH": f"{root}{os.pathsep}{ROOT}", "PYTHONDONTWRITEBYTECODE": "1"}
    sup = supervise("--worker-refresh", "0.5s", *args, app=APP, queues=(QUEUE,),
                    concurrency=concurrency, env=env)
    wait_for(lambda: db.execute("SELECT 1 FROM atlantis.workers WHERE pid = %s",
                                (sup.pid,)).fetchone(), message="the supervisor's start")
    return sup


def declared(db: psycopg.Connection[Any], job: str) -> bool:
    return db.execute("SELECT EXISTS (SELECT 1 FROM atlantis.job_types WHERE job = %s)",
                      (job,)).fetchone() == (True,)


def served(db: psycopg.Connection[Any], worker_pid: int) -> list[str] | None:
    row = db.execute("SELECT job_types FROM atlantis.workers WHERE pid = %s AND "
                     "expires_at > now()", (worker_pid,)).fetchone()
    return None if row is None else row[0]


def result(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    """The job completed: which version of the handler ran it, in which process."""
    row = wait_state(db, job_id, "complete", "dead", "cancelled")
    assert row["state"] == "complete", row
    event, pid = db.execute("SELECT event, pid FROM test_events WHERE job_id = %s",
                            (job_id,)).fetchone() or ("", 0)
    return {"version": int(event.removeprefix("v")), "pid": pid}


def test_sighup_claims_new_job_types_and_stops_claiming_removed_ones(
        db: psycopg.Connection[Any], supervise: Callable[..., Any], tmp_path: Path) -> None:
    write_app(tmp_path, declared=("One",), handled=("One",))
    sup = start(db, supervise, tmp_path)
    first = result(db, atlantis.enqueue(db, "reload.One", {"key": "a"}))
    assert first["version"] == 1
    assert not declared(db, "reload.Two")

    # New job types: no `tide db sync` here, the reload stores the declarations itself;
    # Tick has a schedule (every second), which the scheduler now follows.
    write_app(tmp_path, declared=("One", "Two", "Tick"), handled=("One", "Two", "Tick"),
              version=2)
    sup.signal(signal.SIGHUP)
    wait_for(lambda: declared(db, "reload.Two"), message="the reload to sync reload.Two")
    two = atlantis.enqueue(db, "reload.Two", {"key": "b"})
    assert result(db, two)["version"] == 2
    wait_for(lambda: served(db, sup.pid) == ["reload.One", "reload.Tick", "reload.Two"],
             message="the worker row to list the new job types")
    wait_for(lambda: db.execute("SELECT count(*) FROM test_events WHERE key = 'tick'"
                                ).fetchone() != (0,), message="a scheduled Tick to run")

    # A job type removed from the app (its declaration stays): no longer claimed.
    write_app(tmp_path, declared=("One", "Two", "Tick"), handled=("Two",), version=3)
    sup.signal(signal.SIGHUP)
    wait_for(lambda: served(db, sup.pid) == ["reload.Two"],
             message="the worker row to list only reload.Two")
    gone = atlantis.enqueue(db, "reload.One", {"key": "c"})
    after = atlantis.enqueue(db, "reload.Two", {"key": "d"})  # behind it in claim order
    assert result(db, after)["version"] == 3
    row = db.execute("SELECT state, attempt FROM atlantis.jobs WHERE id = %s", (gone,)).fetchone()
    assert row == ("available", 0)
    assert sup.proc.poll() is None


def test_an_app_that_fails_to_load_keeps_the_old_children_and_jobs(
        db: psycopg.Connection[Any], supervise: Callable[..., Any], tmp_path: Path) -> None:
    write_app(tmp_path, declared=("One",), handled=("One",))
    sup = start(db, supervise, tmp_path, concurrency=1)
    assert result(db, atlantis.enqueue(db, "reload.One", {"key": "a"}))["version"] == 1
    before = child_processes(sup.pid)
    assert len(before) == 1

    for n, broken in enumerate(("module", "atl"), start=1):
        write_app(tmp_path, declared=("One", "Two"), handled=("One", "Two"), version=2,
                  broken=broken)
        sup.signal(signal.SIGHUP)
        wait_for(lambda n=n: sup.log().count("SIGHUP: the app could not be loaded") == n,  # type: ignore[misc]
                 message=f"the reload of the broken app ({broken}) to be refused")
        lines = [line for line in sup.log().splitlines() if "could not" in line
                 or "Traceback" in line or "SyntaxError" in line]
        assert len(lines) == n, lines  # one line per refused reload, nothing else
        assert ("SyntaxError" if broken == "module" else "zz_bad.atl") in lines[-1]
        # The old child still serves, with the old code; nothing new was declared.
        job = atlantis.enqueue(db, "reload.One", {"key": f"b{n}"})
        assert result(db, job) == {"pid": next(iter(before)), "version": 1}
        assert child_processes(sup.pid) == before and not declared(db, "reload.Two")
        assert served(db, sup.pid) == ["reload.One"]

    # Fixed: the next reload goes through.
    write_app(tmp_path, declared=("One", "Two"), handled=("One", "Two"), version=2)
    sup.signal(signal.SIGHUP)
    wait_for(lambda: declared(db, "reload.Two"), message="the fixed app's reload")
    assert result(db, atlantis.enqueue(db, "reload.Two", {"key": "c"}))["version"] == 2
    assert sup.proc.poll() is None


def test_waiting_jobs_of_a_type_no_live_supervisor_handles_are_flagged(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Any],
        tmp_path: Path) -> None:
    # The app declares both, but this supervisor has a handler for One only.
    write_app(tmp_path, declared=("One", "Two"), handled=("One",))
    sync(db, [d for atl in sorted((tmp_path / "reloadapp").glob("*.atl"))
              for d in parse_atl_file(atl)])  # as `tide db sync` does
    sup = start(db, supervise, tmp_path)
    result(db, atlantis.enqueue(db, "reload.One", {"key": "a"}))
    stuck = atlantis.enqueue(db, "reload.Two", {"key": "b"})

    # The three commands at once (each starts an interpreter).
    runs = [subprocess.Popen([str(BIN / "tide"), "--database-url", db_url, *args], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
            for args in (["queue", "stats", "--json"], ["queue", "stats"],
                         ["db", "doctor", "--json"])]
    (stats_json, _), (stats_text, _), (doctor_json, _) = (p.communicate(timeout=60) for p in runs)

    stats = {q["queue"]: q for q in orjson.loads(stats_json)}
    assert stats[QUEUE]["supervisors"] == 1 and stats[QUEUE]["unserved"] is True
    assert stats[QUEUE]["unserved_jobs"] == ["reload.Two"]
    line = next(x for x in stats_text.splitlines() if x.startswith(QUEUE))
    assert "no live supervisor handles reload.Two" in line

    doc = orjson.loads(doctor_json)
    assert runs[2].returncode == 1 and "unserved_jobs" in doc["problems"], doc
    [item] = doc["checks"]["unserved_jobs"]["items"]
    assert (item["queue"], item["job"], item["waiting"]) == (QUEUE, "reload.Two", 1)
    assert doc["checks"]["unserved_queues"]["ok"]  # the queue itself is served

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer Starlette prefers the httpx2 fork
        from starlette.testclient import TestClient
    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings

    with TestClient(create_app(Settings(db_url)), base_url="http://127.0.0.1") as c:
        queues = {q["queue"]: q for q in c.get("/api/queues").json()["queues"]}
        assert queues[QUEUE]["unserved"] and queues[QUEUE]["unserved_jobs"] == ["reload.Two"]
        workers = c.get("/api/workers").json()["workers"]
        assert [w["job_types"] for w in workers] == [["reload.One"]]
        assert "no live supervisor handles reload.Two" in c.get("/queues").text
        assert "no handler: reload.Two" in c.get("/").text

    # Handled once the app is reloaded with a handler for it: the flag goes away.
    write_app(tmp_path, declared=("One", "Two"), handled=("One", "Two"), version=2)
    sup.signal(signal.SIGHUP)
    assert result(db, stuck)["version"] == 2
    [after] = [q for q in fleet.queue_stats(db) if q.queue == QUEUE]
    assert not after.unserved and after.unserved_jobs == []
