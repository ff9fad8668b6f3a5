"""atlantis.testing's ``run_inline`` and ``wake`` in the test's own process, on the suite's
databases (tests/conftest.py), with the suite's apps: the context's flags, a workflow step's
``results``, a durable sleep and a wait for an event suspended then resumed, args refused
as ``atlantis.enqueue`` refuses them, and a handler's exception raised as it raised it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import atlantis
from atlantis.app import load_app
from atlantis.store import sync
from atlantis.testing import run_inline, wake
from tests.conftest import job_row

OPS = "tests.apps.ops:registry"
DURABLE = "tests.apps.durable:registry"
RESULTS = "tests.apps.results:registry"


def _events(conn: psycopg.Connection[Any], key: str) -> list[str]:
    rows = conn.execute("SELECT event FROM test_events WHERE key = %s ORDER BY id",
                        (key,)).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize(("cancelled", "stopping"), [(True, False), (False, True)])
def test_the_handler_sees_the_context_flags(db_url: str, db: psycopg.Connection[Any],
                                            cancelled: bool, stopping: bool) -> None:
    # ops.Long "wait" loops until ctx.cancelled or ctx.stopping (50 s), then records them.
    run = run_inline(OPS, "ops.Long", {"key": "flags", "mode": "wait"}, db=db_url,
                     cancelled=cancelled, stopping=stopping)
    seen = f"cancelled={cancelled} stopping={stopping}"
    assert _events(db, "flags") == ["started", seen]
    assert run.state == ("cancelled" if cancelled else "complete")
    assert job_row(db, run.job_id)["state"] == run.state


def test_a_workflow_step_reads_the_results_it_is_given(db_url: str,
                                                       db: psycopg.Connection[Any]) -> None:
    registry = load_app(RESULTS)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    made = {"key": "k", "n": 1, "nested": {"list": [1, 2.5, "x", None]}}
    run = run_inline(RESULTS, "results.Return", {"key": "k", "mode": "context"}, db=db_url,
                     results={"make": made}, workflow_id=41, step="see")
    assert run.result["results"] == {"make": made}
    assert (run.result["workflow_id"], run.result["step"]) == (41, "see")


def test_a_sleep_suspends_and_a_wake_resumes_it(db_url: str,
                                                ddb: psycopg.Connection[Any]) -> None:
    args = {"key": "nap", "seconds": 3600.0}
    run = run_inline(DURABLE, "durable.Nap", args, db=db_url)
    assert (run.suspended, run.state, run.waits) == (True, "available", "sleep:nap")
    assert run.result is None
    assert _events(ddb, "nap") == ["before"]
    with pytest.raises(RuntimeError, match="not due"):  # an hour's sleep: not due yet
        run_inline(DURABLE, "durable.Nap", args, db=db_url, resume=run)
    assert wake(ddb, run.job_id) == [run.job_id]
    again = run_inline(DURABLE, "durable.Nap", args, db=db_url, resume=run)
    assert (again.job_id, again.suspended, again.state) == (run.job_id, False, "complete")
    assert again.result == "woke"
    assert _events(ddb, "nap") == ["before", "after"]  # the step before ran once


def test_a_wait_for_an_event_resumes_once_it_is_sent(db_url: str,
                                                     ddb: psycopg.Connection[Any]) -> None:
    args = {"key": "wait", "event": "approved"}
    run = run_inline(DURABLE, "durable.Wait", args, db=db_url)
    assert (run.suspended, run.state, run.waits) == (True, "available", "event:approved")
    assert wake(ddb, run.job_id) == [run.job_id]  # woken without its event: waits again
    still = run_inline(DURABLE, "durable.Wait", args, db=db_url, resume=run)
    assert (still.suspended, still.waits) == (True, "event:approved")
    atlantis.send_event(ddb, run.job_id, "approved", {"by": "ops"})
    done = run_inline(DURABLE, "durable.Wait", args, db=db_url, resume=run)
    assert (done.state, done.result) == ("complete", {"by": "ops"})
    assert _events(ddb, "wait") == ["before", "received"]


@pytest.mark.parametrize("args", [
    {"key": "k", "seconds": "an hour"},
    {"key": "k"},
    {"key": "k", "seconds": 1.0, "extra": 1},
])
def test_bad_args_are_refused_as_enqueue_refuses_them(db_url: str,
                                                      ddb: psycopg.Connection[Any],
                                                      args: dict[str, Any]) -> None:
    with pytest.raises(atlantis.ValidationError) as enqueued:
        atlantis.enqueue(ddb, "durable.Nap", args)
    with pytest.raises(atlantis.ValidationError) as inline:
        run_inline(DURABLE, "durable.Nap", args, db=db_url)
    assert str(inline.value) == str(enqueued.value)
    assert ddb.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)


def test_a_raising_handler_raises_the_same_exception(db_url: str,
                                                      db: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValueError, match="^bad value in attempt 3$") as raised:
        run_inline("tests.apps.basic:registry", "tests.Fail", {"key": "f", "mode": "raise"},
                   db=db_url, attempt=3)
    assert type(raised.value) is ValueError
    row = db.execute("SELECT id, state, attempt FROM atlantis.jobs").fetchone()
    assert row is not None and row[1:] == ("dead", 3)  # its last attempt, ended as it fails
    assert _events(db, "f") == ["ran"]
