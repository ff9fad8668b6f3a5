"""``tide db sync --prune`` (issue 36, item 4): the declarations an app no longer declares
removed, a dry run without ``--yes``, that app's namespaces only, and each reason that keeps
one (waiting or running rows, a live supervisor serving it, a schedule, a workflow using it,
a workflow's instances) named.

The releases are tests/apps/prune_old.py (and prune_sched.py, with a schedule) before and
tests/apps/prune_new.py after: namespace ``pruned``, ``pruned.Keep`` alone left.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.declarations.model import StepDecl, WorkflowDecl
from atlantis.store.migrate import sync
from tests.conftest import Supervisor, run_tide, wait_for, wait_state

pytestmark = pytest.mark.server_matrix

OLD = "tests.apps.prune_old:registry"
SCHED = "tests.apps.prune_sched:registry"
NEW = "tests.apps.prune_new:registry"


def tide_sync(db_url: str, app: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tide(["--database-url", db_url, "db", "sync", "--app", app, *args], check=False)


def prune(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return tide_sync(db_url, NEW, "--prune", *args)


def declared(db: psycopg.Connection[Any]) -> set[str]:
    """Every job and workflow declaration in the database, ``job:NAME`` / ``workflow:NAME``."""
    jobs = db.execute("SELECT 'job:' || job FROM atlantis.job_types").fetchall()
    flows = db.execute("SELECT 'workflow:' || workflow FROM atlantis.workflow_types").fetchall()
    return {row[0] for row in (*jobs, *flows)}


def lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return done.stdout.splitlines()


def test_a_dry_run_lists_what_would_go_and_changes_nothing(
        db: psycopg.Connection[Any], db_url: str) -> None:
    assert tide_sync(db_url, OLD).returncode == 0
    before = declared(db)
    done = prune(db_url)
    assert done.returncode == 0, done.stderr
    assert lines(done) == ["would remove workflow pruned.Flow", "would remove workflow pruned.Quiet",
                           "would remove job pruned.Busy", "would remove job pruned.Gone",
                           "would remove job pruned.Used"]
    assert "dry run: nothing changed" in done.stderr
    assert declared(db) == before


def test_yes_removes_the_apps_undeclared_ones_and_no_other_apps(
        db: psycopg.Connection[Any], db_url: str) -> None:
    assert tide_sync(db_url, OLD).returncode == 0
    before = declared(db)
    served = unserved_declarations(db_url)
    assert {"pruned.Busy", "pruned.Gone", "pruned.Used"} <= served
    done = prune(db_url, "--yes")
    assert done.returncode == 0, done.stderr
    gone = {"workflow:pruned.Flow", "workflow:pruned.Quiet", "job:pruned.Busy",
            "job:pruned.Gone", "job:pruned.Used"}
    assert lines(done) == ["removed workflow pruned.Flow", "removed workflow pruned.Quiet",
                           "removed job pruned.Busy", "removed job pruned.Gone",
                           "removed job pruned.Used"]
    assert declared(db) == before - gone
    assert "job:pruned.Keep" in declared(db) and "job:tests.Echo" in declared(db)
    # `tide db doctor` no longer reports them as declarations nobody serves.
    assert not {"pruned.Busy", "pruned.Gone", "pruned.Used"} & unserved_declarations(db_url)
    # Another app (every name of its namespace declared): nothing of it is touched.
    again = tide_sync(db_url, "tests.apps.sched:registry", "--prune", "--yes")
    assert again.returncode == 0 and again.stdout == ""
    assert "nothing to prune" in again.stderr
    assert declared(db) == before - gone


def unserved_declarations(db_url: str) -> set[str]:
    done = run_tide(["--database-url", db_url, "db", "doctor", "--json"], check=False)
    items = orjson.loads(done.stdout)["checks"]["unserved_declarations"]["items"]
    return {str(item["job"]) for item in items}


def test_a_waiting_row_keeps_its_declaration_and_the_rest_go(
        db: psycopg.Connection[Any], db_url: str, tmp_path: Path) -> None:
    assert tide_sync(db_url, OLD).returncode == 0
    atlantis.enqueue(db, "pruned.Busy", {"gate": str(tmp_path / "gate")})
    for args in ((), ("--yes",)):
        done = prune(db_url, *args)
        assert done.returncode == 1, done.stderr
        assert "kept job pruned.Busy: 1 waiting or running row" in lines(done)
    assert "removed job pruned.Gone" in lines(done)
    assert "job:pruned.Busy" in declared(db) and "job:pruned.Gone" not in declared(db)


def test_a_running_row_and_a_live_supervisor_serving_it_keep_it(
        db: psycopg.Connection[Any], db_url: str, tmp_path: Path,
        supervise: Callable[..., Supervisor]) -> None:
    assert tide_sync(db_url, OLD).returncode == 0
    sup = supervise(queues=("pruned", "pruned_keep"), app=OLD)
    job_id = atlantis.enqueue(db, "pruned.Busy", {"gate": str(tmp_path / "gate")})
    wait_state(db, job_id, "running")
    host = db.execute("SELECT host FROM atlantis.workers WHERE pid = %s",
                      (sup.pid,)).fetchone()
    assert host is not None
    who = f"served by live supervisor {host[0]}:{sup.pid}"
    done = prune(db_url, "--yes")
    assert done.returncode == 1, done.stderr
    assert f"kept job pruned.Busy: 1 waiting or running row; {who}" in lines(done)
    assert f"kept job pruned.Gone: {who}" in lines(done)
    assert "job:pruned.Gone" in declared(db)
    # The older release finishes and stops: nothing keeps them any more.
    (tmp_path / "gate").touch()
    wait_state(db, job_id, "complete")
    sup.stop()
    wait_for(lambda: not db.execute("SELECT 1 FROM atlantis.workers WHERE expires_at > now()"
                                    ).fetchone(), message="no live supervisor")
    done = prune(db_url, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {"removed job pruned.Busy", "removed job pruned.Gone"} <= set(lines(done))


def test_a_schedule_keeps_its_declaration(db: psycopg.Connection[Any], db_url: str) -> None:
    assert tide_sync(db_url, SCHED).returncode == 0
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot) VALUES ('pruned.Nightly', now())")
    done = prune(db_url, "--yes")
    assert done.returncode == 1
    assert ("kept job pruned.Nightly: a schedule ('30 2 * * *'): sync a release that declares "
            "it without one first") in lines(done)
    assert "removed job pruned.Gone" in lines(done)
    assert "job:pruned.Nightly" in declared(db)


def test_a_workflow_using_it_keeps_it_and_its_instances_keep_a_workflow(
        db: psycopg.Connection[Any], db_url: str) -> None:
    assert tide_sync(db_url, OLD).returncode == 0
    # Another app's workflow declaration using pruned.Used (stored as its sync stores it).
    other = WorkflowDecl(name="Other", namespace="elsewhere",
                         steps=(StepDecl(name="one", job="pruned.Keep", compensate="pruned.Used"),))
    sync(db, [], [other])
    db.commit()
    atlantis.start_workflow(db, "pruned.Flow", {})
    done = prune(db_url, "--yes")
    assert done.returncode == 1
    assert lines(done) == [
        "kept workflow pruned.Flow: 1 instance not ended (running, compensating or "
        "compensation_failed)",
        "removed workflow pruned.Quiet",
        "removed job pruned.Busy",
        # Only pruned.Quiet, removed in the same run, used it.
        "removed job pruned.Gone",
        "kept job pruned.Used: used by workflow elsewhere.Other",
    ]
    assert {"workflow:pruned.Flow", "job:pruned.Used",
            "workflow:elsewhere.Other"} <= declared(db)


def test_yes_and_namespace_need_prune(db_url: str) -> None:
    done = tide_sync(db_url, NEW, "--yes")
    assert done.returncode == 2 and "--yes and --namespace go with --prune" in done.stderr


def test_namespace_adds_one_the_app_no_longer_uses(
        db: psycopg.Connection[Any], db_url: str) -> None:
    assert "job:sched.Tick" in declared(db)
    done = prune(db_url, "--namespace", "sched", "--yes")
    assert "kept job sched.Tick: a schedule ('*/2 * * * * *'): sync a release that declares it "\
           "without one first" in lines(done)
    assert done.returncode == 1


def test_a_live_supervisor_of_a_release_that_records_no_jobs_keeps_its_queues_jobs(
        db: psycopg.Connection[Any], db_url: str) -> None:
    """A supervisor before migration 0014 leaves ``job_types`` NULL: it may serve any job of
    its queues."""
    assert tide_sync(db_url, OLD).returncode == 0
    db.execute("INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, expires_at)"
               " VALUES ('old', 'oldhost', 7, '{pruned}', 1, now() + interval '1 hour')")
    done = prune(db_url, "--yes")
    assert done.returncode == 1
    assert "kept job pruned.Gone: served by live supervisor oldhost:7" in lines(done)
    assert "removed workflow pruned.Quiet" in lines(done)
