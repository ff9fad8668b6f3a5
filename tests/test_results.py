"""A handler's return value as its job's ``result``, and a workflow step's context.

The rules (``atlantis.protocol.results``): a result is JSON, at most 64 KiB of it, without
NUL. Outside a workflow one that is not is stored as null, with one warning line on the
attempt's stderr (in ``tide job logs``); inside one the step ends ``dead``, kind ``result``,
not retried. The child checks, and the supervisor checks again what a child sends: a forged
frame costs its own attempt at most, never a batch of results.

Child-level tests play the supervisor's part (``tests/test_child.py``'s ``Child``); the rest
run real supervisors on the test app ``tests/apps/results.py``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis import limits
from atlantis.app import load_app
from atlantis.context import Compensating, JobContext, step_fields
from atlantis.protocol import results
from atlantis.protocol.messages import Done, Run, decode, encode
from atlantis.store.migrate import sync
from atlantis.supervisor import policy
from tests.conftest import job_row, run_tide, wait_for, wait_state
from tests.test_child import Child

APP = "tests.apps.results:registry"
QUEUES = ("results",)
STEP = {"workflow_id": 12, "step": "import", "compensation": False,
        "results": {"create": {"account": "a1"}, "fetch": [1, 2]}, "compensating": None}
UNDO = {"workflow_id": 12, "step": "import", "compensation": True,
        "results": {"import": None, "create": {"account": "a1"}},
        "compensating": {"step": "welcome", "error": "ValueError: no mail server"}}
WARNING = "atlantis: the handler's return value was not stored: "
NOT_JSON = "it is not JSON-serializable (Type is not JSON serializable: object)"
TOO_LARGE = "its JSON is 70002 bytes, more than the limit of 65536 bytes (64 KiB)"
HAS_NUL = "it holds a NUL character (\\u0000), which PostgreSQL cannot store"


# ---- the rules, alone --------------------------------------------------------------------

def test_encode_keeps_none_as_no_result_and_writes_json_with_orjson() -> None:
    assert results.encode(None) == (None, None)
    assert results.encode({"a": [1, 2.5, None]}) == ('{"a":[1,2.5,null]}', None)
    assert results.encode("x") == ('"x"', None)


@pytest.mark.parametrize(("value", "why"), [
    (object(), NOT_JSON),
    (2**70, "it is not JSON-serializable (Integer exceeds 64-bit range)"),
    ("x" * 70_000, TOO_LARGE),
    ({"a": "b\x00c"}, HAS_NUL),
    (orjson.loads("[" * 65 + "]" * 65), "it is nested 65 levels deep, more than the limit of 64"),
], ids=["object", "bigint", "huge", "nul", "deep"])
def test_encode_refuses_what_cannot_be_stored(value: object, why: str) -> None:
    assert results.encode(value) == (None, why)


def test_the_limit_is_on_the_bytes_of_json() -> None:
    at = "x" * (limits.MAX_RESULT_BYTES - 2)  # the quotes make it exactly the limit
    assert results.encode(at)[1] is None and results.check(orjson.dumps(at).decode())[1] is None
    past = at + "x"
    assert results.encode(past)[1] is not None
    assert results.check(orjson.dumps(past).decode()) == (
        None, "its JSON is 65537 bytes, more than the limit of 65536 bytes (64 KiB)")
    wide = "é" * (limits.MAX_RESULT_BYTES // 2)  # two bytes each in UTF-8
    assert results.check(orjson.dumps(wide).decode())[1] is not None
    # As orjson writes it again, past the limit: "1e5" is "100000.0".
    assert results.check("[" + ",".join(["1e5"] * 16000) + "]")[1] == (
        "its JSON is 144001 bytes, more than the limit of 65536 bytes (64 KiB)")


def test_depth_counts_containers_not_brackets_in_strings() -> None:
    at = "[" * limits.MAX_DEPTH + "]" * limits.MAX_DEPTH
    assert results.check(at) == (at, None) and results.encode(orjson.loads(at)) == (at, None)
    shallow = orjson.dumps({"s": "[{" * 100, "t": [[1]]}).decode()
    assert results.check(shallow) == (shallow, None)


@pytest.mark.parametrize(("text", "nul"), [
    ('"\\u0000"', True),
    ('{"\\u0000": 1}', True),
    ('"a\\\\\\u0000"', True),  # an escaped backslash, then NUL
    ('"a\\\\u0000"', False),  # an escaped backslash, then the text u0000
    ('"a\\\\\\\\u0000"', False),
    ('"\\u00000"', True),
])
def test_nul_is_found_only_where_json_has_one(text: str, nul: bool) -> None:
    value = orjson.loads(text)
    has = "\x00" in (value if isinstance(value, str) else "".join(value))
    assert has is nul
    assert (results.check(text)[1] == HAS_NUL) is nul


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", "it is not valid JSON (unexpected character"),
    ('"\ud800"', "it is not valid JSON ("),
    ("1e400", "it is not valid JSON (number is infinity"),
    ("[" * 1025 + "]" * 1025, "it is not valid JSON (depth limit exceeded"),
    ("[" * 65 + "]" * 65, "it is nested 65 levels deep, more than the limit of 64"),
    ('{"a": ' * 100 + "1" + "}" * 100, "it is nested 100 levels deep, more than the limit of 64"),
])
def test_check_refuses_text_a_forger_sends(text: str, why: str) -> None:
    stored, found = results.check(text)
    assert stored is None and found is not None and found.startswith(why), found


def test_what_the_supervisor_stores_is_what_orjson_writes_again() -> None:
    """Every number then reads in jsonb: 1e-20000 is JSON, but jsonb refuses it."""
    assert results.check(' {"a" : [1e-20000, 1e5, 12345678901234567890123] } ') == (
        '{"a":[0.0,100000.0,1.2345678901234568e+22]}', None)
    assert results.check('{"a":[1,2.5,"x",null]}') == ('{"a":[1,2.5,"x",null]}', None)


def test_the_supervisor_stores_drops_or_kills_by_where_the_step_is() -> None:
    limits_ = policy.Limits(max_snooze=1.0, max_backoff=1.0)
    plain = policy.AttemptFacts(1, 3, 1.0, 60.0)
    step = policy.AttemptFacts(1, 3, 1.0, 60.0, workflow=True)
    good = Done(job_id=1, outcome="complete", result='{"a": 1}')
    assert policy.decide(plain, limits_, good) == policy.Verdict("complete", True,
                                                                 result='{"a":1}')
    bad = Done(job_id=1, outcome="complete", result="{nope")
    dropped = policy.decide(plain, limits_, bad)
    assert (dropped.state, dropped.result, dropped.error) == ("complete", None, None)
    assert dropped.unstored is not None and dropped.unstored.startswith("it is not valid JSON")
    dead = policy.decide(step, limits_, bad)
    assert (dead.state, dead.spent, dead.label, dead.result) == ("dead", True, "discard", None)
    assert dead.error is not None and dead.error["kind"] == "result"
    assert dead.error["message"].startswith("the result the child sent cannot be stored: it is "
                                            "not valid JSON")
    # A cancel wins over a result, stored or not.
    cancelled = policy.decide(step, limits_, bad, cancelled=True)
    assert cancelled.state == "cancelled" and cancelled.result is None


def test_non_finite_names_where_nan_and_the_infinities_were_written_as_null() -> None:
    value = {"ratio": float("nan"), "max": float("inf"), "ok": None,
             "rows": [1.5, {"low": float("-inf")}]}
    text, why = results.encode(value)
    assert why is None and text == (
        '{"ratio":null,"max":null,"ok":null,"rows":[1.5,{"low":null}]}')
    assert results.non_finite(value, text) == (
        "nan at ['ratio'], inf at ['max'], -inf at ['rows'][1]['low']")
    assert results.non_finite({"ok": None}, '{"ok":null}') is None
    assert results.non_finite(float("nan"), "null") == "nan at the top"
    many = [float("nan")] * 7
    assert results.non_finite(many, results.encode(many)[0]) == (
        "nan at [0], nan at [1], nan at [2], nan at [3], nan at [4] and 2 more")


def test_a_non_finite_result_is_stored_with_nulls_outside_a_workflow_and_kills_a_step() -> None:
    limits_ = policy.Limits(max_snooze=1.0, max_backoff=1.0)
    plain = policy.AttemptFacts(1, 3, 1.0, 60.0)
    step = policy.AttemptFacts(1, 3, 1.0, 60.0, workflow=True)
    where = "nan at ['ratio'], inf at ['max']"
    done = Done(job_id=1, outcome="complete", result='{"ratio":null,"max":null}', nulled=where)
    stored = policy.decide(plain, limits_, done)
    assert (stored.state, stored.result, stored.nulled, stored.error) == (
        "complete", '{"ratio":null,"max":null}', where, None)
    dead = policy.decide(step, limits_, done)
    assert (dead.state, dead.spent, dead.label, dead.result) == ("dead", True, "discard", None)
    assert dead.error is not None and dead.error["kind"] == "result"
    assert dead.error["message"] == (
        "the result the child sent cannot be stored: it holds NaN or an infinity, which JSON "
        f"cannot carry ({where}); the step is not retried (its effect already happened)")


# ---- the step's context --------------------------------------------------------------------

def _ctx(**fields: Any) -> JobContext:
    return JobContext(job_id=77, job="results.Return", queue="results", attempt=1,
                      max_attempts=3, deadline=datetime.now(UTC),
                      logger=logging.getLogger("t"), **fields)


def test_outside_a_workflow_the_context_has_no_step() -> None:
    ctx = _ctx(**step_fields(None))
    assert (ctx.workflow_id, ctx.step, ctx.idempotency_key, dict(ctx.results),
            ctx.compensating) == (None, None, "77", {}, None)


def test_a_forward_step_sees_its_predecessors_results() -> None:
    ctx = _ctx(**step_fields(orjson.dumps(STEP).decode()))
    assert (ctx.workflow_id, ctx.step, ctx.idempotency_key) == (12, "import", "12:import")
    assert dict(ctx.results) == {"create": {"account": "a1"}, "fetch": [1, 2]}
    assert ctx.compensating is None
    with pytest.raises(TypeError):
        ctx.results["create"] = 1  # type: ignore[index]


def test_a_compensation_has_its_own_key_and_knows_what_failed() -> None:
    ctx = _ctx(**step_fields(orjson.dumps(UNDO).decode()))
    assert ctx.idempotency_key == "12:import:compensate"
    assert ctx.compensating == Compensating(step="welcome", error="ValueError: no mail server")
    assert atlantis.Compensating is Compensating
    assert dict(ctx.results) == {"import": None, "create": {"account": "a1"}}
    cancelled = dict(UNDO, compensating={"step": None, "error": "cancelled by alice"})
    assert _ctx(**step_fields(orjson.dumps(cancelled).decode())).compensating == Compensating(
        None, "cancelled by alice")


@pytest.mark.parametrize("text", [
    "[]", '{"workflow_id": "12", "step": "a"}', '{"workflow_id": 12}',
    '{"workflow_id": 12, "step": "a", "results": []}',
    '{"workflow_id": 12, "step": "a", "compensating": "x"}', "{nope",
])
def test_a_malformed_context_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        step_fields(text)


def test_run_and_done_carry_the_context_and_the_result() -> None:
    big = orjson.dumps({"results": {"s": "x" * 300_000}}).decode()  # past MAX_TEXT: a Run's own
    run = Run(job_id=1, job="j", queue="q", attempt=1, max_attempts=1, args="{}",
              deadline=datetime.now(UTC).isoformat(), lease_end=1.0, lease_margin=0.5,
              workflow=big)
    assert decode(encode(run)[4:]) == run
    done = Done(job_id=1, outcome="complete", result='{"a":1}')
    assert decode(encode(done)[4:]) == done


# ---- the child -----------------------------------------------------------------------------

_job_ids = itertools.count(1000)


class ResultChild(Child):
    """A child of the results app; ``step`` runs one attempt, in a workflow if given one."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, app=APP)

    def step(self, mode: str, workflow: dict[str, Any] | None = None) -> Done:
        job_id = next(_job_ids)
        args = orjson.dumps({"key": "k", "mode": mode}).decode()
        deadline = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()
        self.send(Run(job_id=job_id, job="results.Return", queue="results", attempt=1,
                      max_attempts=3, args=args, deadline=deadline, lease_end=1e12,
                      lease_margin=1.0,
                      workflow=None if workflow is None else orjson.dumps(workflow).decode()))
        return self.done(job_id)[1]


@pytest.fixture(scope="module")
def result_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResultChild]:
    c = ResultChild(tmp_path_factory.mktemp("results"))
    yield c
    c.close()


@pytest.mark.parametrize(("mode", "expected"), [
    ("dict", {"key": "k", "n": 1, "nested": {"list": [1, 2.5, "x", None]}, "ok": True}),
    ("async", ["async", "k"]),
])
def test_the_child_sends_what_the_handler_returned(result_child: ResultChild, mode: str,
                                                   expected: Any) -> None:
    done = result_child.step(mode)
    assert done.outcome == "complete" and done.error is None and done.result is not None
    assert orjson.loads(done.result) == expected


def test_none_is_no_result(result_child: ResultChild) -> None:
    done = result_child.step("none")
    assert (done.outcome, done.result) == ("complete", None)


@pytest.mark.parametrize(("mode", "why"), [
    ("object", NOT_JSON), ("huge", TOO_LARGE), ("nul", HAS_NUL),
    ("bigint", "it is not JSON-serializable (Integer exceeds 64-bit range)"),
], ids=["object", "huge", "nul", "bigint"])
def test_outside_a_workflow_a_bad_result_is_dropped_with_a_warning(
        result_child: ResultChild, mode: str, why: str) -> None:
    done = result_child.step(mode)
    assert (done.outcome, done.result, done.error) == ("complete", None, None)
    wait_for(lambda: WARNING + why in result_child.stderr(), 10, message="the warning")


@pytest.mark.parametrize(("mode", "why"), [("object", NOT_JSON), ("huge", TOO_LARGE),
                                           ("nul", HAS_NUL)], ids=["object", "huge", "nul"])
def test_inside_a_workflow_a_bad_result_ends_the_step_unretried(
        result_child: ResultChild, mode: str, why: str) -> None:
    done = result_child.step(mode, STEP)
    assert (done.outcome, done.result) == ("discard", None)
    assert done.error is not None and done.error.kind == "result"
    assert done.error.message == (f"the step's return value cannot be stored as its result: "
                                  f"{why}; the step is not retried (its effect already happened)")


def test_the_handler_sees_its_steps_context(result_child: ResultChild) -> None:
    done = result_child.step("context", UNDO)
    assert done.result is not None
    assert orjson.loads(done.result) == {
        "workflow_id": 12, "step": "import", "idempotency_key": "12:import:compensate",
        "results": {"import": None, "create": {"account": "a1"}},
        "compensating": ["welcome", "ValueError: no mail server"]}
    outside = result_child.step("context")
    assert outside.result is not None
    assert orjson.loads(outside.result)["idempotency_key"] == str(outside.job_id)


# ---- real supervisors ----------------------------------------------------------------------

@pytest.fixture
def app_db(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's database with the results app's declarations (and workflows) synced."""
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    return db


def _start(supervise: Any, concurrency: int = 2) -> Any:
    return supervise(queues=QUEUES, app=APP, concurrency=concurrency)


def _tide(db_url: str, *args: str) -> str:
    return run_tide(["--database-url", db_url, *args]).stdout


def _warned(db_url: str, job_id: int) -> str | None:
    out = _tide(db_url, "job", "logs", str(job_id))
    return out if WARNING in out else None


def _in_state(db: psycopg.Connection[Any], wid: int, state: str) -> bool:
    return _workflow_state(db, wid) == state


def _enqueue(db: psycopg.Connection[Any], mode: str) -> int:
    return atlantis.enqueue(db, "results.Return", {"key": mode, "mode": mode})


def test_a_returned_dict_is_the_jobs_result_in_tide(app_db: psycopg.Connection[Any],
                                                    db_url: str, supervise: Any) -> None:
    _start(supervise)
    ids = {mode: _enqueue(app_db, mode) for mode in ("dict", "async", "none")}
    rows = {mode: wait_state(app_db, job_id, "complete") for mode, job_id in ids.items()}
    expected = {"key": "dict", "n": 1, "nested": {"list": [1, 2.5, "x", None]}, "ok": True}
    assert rows["dict"]["result"] == expected
    assert rows["async"]["result"] == ["async", "async"]
    assert rows["none"]["result"] is None
    doc = orjson.loads(_tide(db_url, "job", "status", str(ids["dict"]), "--json"))
    assert doc["result"] == expected
    text = _tide(db_url, "job", "status", str(ids["dict"]))
    line = next(x for x in text.splitlines() if x.startswith("  result "))
    assert orjson.loads(line.split(None, 1)[1]) == expected  # one line of JSON
    assert "\n  result " not in _tide(db_url, "job", "status", str(ids["none"]))


def test_outside_a_workflow_a_bad_result_completes_null_with_a_warning_in_the_log(
        app_db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)  # one supervisor for every case
    cases = {_enqueue(app_db, mode): why for mode, why in (("object", NOT_JSON),
                                                          ("huge", TOO_LARGE))}
    for job_id, why in cases.items():
        row = wait_state(app_db, job_id, "complete")
        assert row["result"] is None and row["attempt"] == 1 and row["error_count"] == 0
        logs = wait_for(partial(_warned, db_url, job_id), message="the warning in the log")
        lines = [line.split(" ", 3)[2:] for line in logs.splitlines()]
        assert ["stderr", WARNING + why] in lines, lines


def test_outside_a_workflow_nan_and_infinity_are_stored_as_null_with_a_warning(
        app_db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise)
    job_id = _enqueue(app_db, "nonfinite")
    row = wait_state(app_db, job_id, "complete")
    assert row["result"] == {"ratio": None, "max": None} and row["error_count"] == 0
    warning = (f"job={job_id} attempt=1: results.Return: the result held NaN or an infinity, "
               "which JSON cannot carry; stored with null in their place "
               "(nan at ['ratio'], inf at ['max'])")
    wait_for(lambda: warning in sup.log(), message="the warning in the supervisor's log")
    assert " WARNING " in next(line for line in sup.log().splitlines() if warning in line)


def test_a_long_result_is_cut_in_the_human_view_and_whole_in_json(
        app_db: psycopg.Connection[Any], db_url: str) -> None:
    job_id = _enqueue(app_db, "dict")
    value = {"rows": list(range(5000))}
    app_db.execute("UPDATE atlantis.jobs SET state = 'complete', attempt = 1, started_at = now(), "
                   "finished_at = now(), result = %s WHERE id = %s",
                   (orjson.dumps(value).decode(), job_id))
    text = _tide(db_url, "job", "status", str(job_id))
    line = next(x for x in text.splitlines() if x.startswith("  result "))
    assert line.endswith("characters in all; tide job status --json shows it whole)")
    assert len(line) < 600
    assert orjson.loads(_tide(db_url, "job", "status", str(job_id), "--json"))["result"] == value


@pytest.mark.parametrize(("mode", "why"), [
    ("forge-invalid", "it is not valid JSON"),
    ("forge-nul", HAS_NUL),
    ("forge-huge", "its JSON is 70002 bytes"),
], ids=["forge-invalid", "forge-nul", "forge-huge"])
def test_a_forged_result_costs_its_attempt_at_most_never_a_batch(
        app_db: psycopg.Connection[Any], supervise: Any, mode: str, why: str) -> None:
    sup = _start(supervise)
    job_id = _enqueue(app_db, mode)
    row = wait_state(app_db, job_id, "complete")
    assert row["result"] is None and row["attempt"] == 1 and row["error_count"] == 0
    attempts = app_db.execute("SELECT outcome FROM atlantis.attempts WHERE job_id = %s",
                              (job_id,)).fetchall()
    assert attempts == [("complete",)]
    log = wait_for(lambda: (text := sup.log()) and "was not stored" in text and text,
                   message="the supervisor's warning")
    assert f"job={job_id} attempt=1: the result the child sent was not stored: {why}" in log
    assert "refused" not in log
    after = _enqueue(app_db, "dict")  # the supervisor serves on, results and all
    assert wait_state(app_db, after, "complete")["result"]["key"] == "dict"
    assert sup.proc.poll() is None


def test_a_result_is_written_only_on_a_row_that_ends_complete(
        app_db: psycopg.Connection[Any]) -> None:
    """The finish statement itself: a cancel requested meanwhile wins, and keeps it null."""
    from atlantis.store import queries

    ids = [_enqueue(app_db, "dict") for _ in range(3)]
    worker = "host:1:test"
    app_db.execute("UPDATE atlantis.jobs SET state = 'running', attempt = 1, claimed_by = %s, "
                   "claimed_until = now() + interval '1 minute', started_at = now() "
                   "WHERE id = ANY(%s)", (worker, ids))
    app_db.execute("UPDATE atlantis.jobs SET cancel_requested_at = now(), cancelled_by = 'me' "
                   "WHERE id = %s", (ids[1],))
    from atlantis.store.supervision import Result, finish_params

    deep = "[" * limits.MAX_DEPTH + "]" * limits.MAX_DEPTH  # as deep as a result may be
    assert results.check(deep) == (deep, None)
    tiny = results.check("[1e-20000]")[0]  # jsonb refuses the number as it was written
    texts = [tiny, '{"stored": true}', deep]
    batch = [Result(i, 1, "complete", True, 0.0, None, None, "complete", None, 0, 0, 1, text)
             for i, text in zip(ids, texts, strict=True)]
    app_db.execute(queries.Q.finish, finish_params(worker, batch, "host", 1))
    assert job_row(app_db, ids[0])["result"] == [0.0]
    assert job_row(app_db, ids[2])["result"] == orjson.loads(deep)
    cancelled = job_row(app_db, ids[1])
    assert cancelled["state"] == "cancelled" and cancelled["result"] is None


# ---- inside a workflow, under real supervisors ----------------------------------------------

def _start_flow(db: psycopg.Connection[Any], name: str, mode: str) -> int:
    return atlantis.start_workflow(db, name, {"key": mode, "mode": mode})


def _step_rows(db: psycopg.Connection[Any], wid: int) -> dict[str, dict[str, Any]]:
    found = db.execute("SELECT step, id FROM atlantis.jobs WHERE workflow_id = %s AND NOT "
                       "compensation", (wid,)).fetchall()
    return {step: job_row(db, job_id) for step, job_id in found}


def _workflow_state(db: psycopg.Connection[Any], wid: int) -> str:
    row = db.execute("SELECT state FROM atlantis.workflows WHERE id = %s", (wid,)).fetchone()
    assert row is not None
    return str(row[0])


def test_a_step_sees_its_predecessors_results_and_its_key(
        app_db: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    wid = _start_flow(app_db, "results.Chain", "context")
    wait_for(lambda: _workflow_state(app_db, wid) == "complete", message="the workflow")
    steps = _step_rows(app_db, wid)
    first = {"workflow_id": wid, "step": "make", "idempotency_key": f"{wid}:make",
             "results": {}, "compensating": None}
    assert steps["make"]["result"] == first
    assert steps["see"]["result"] == {"workflow_id": wid, "step": "see",
                                      "idempotency_key": f"{wid}:see",
                                      "results": {"make": first}, "compensating": None}


def test_a_compensation_sees_what_it_undoes_under_its_own_key(
        app_db: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    wid = _start_flow(app_db, "results.Undo", "undo")
    wait_for(lambda: _workflow_state(app_db, wid) == "failed", message="the workflow failed")
    made = _step_rows(app_db, wid)["make"]["result"]
    assert made["idempotency_key"] == f"{wid}:make" and made["compensating"] is None
    found = app_db.execute("SELECT id FROM atlantis.jobs WHERE workflow_id = %s AND step = "
                           "'make' AND compensation", (wid,)).fetchall()
    assert len(found) == 1
    undo = job_row(app_db, found[0][0])
    assert undo["state"] == "complete"
    seen = undo["result"]
    assert (seen["workflow_id"], seen["step"], seen["idempotency_key"]) == (
        wid, "make", f"{wid}:make:compensate")
    assert seen["results"] == {"make": made}
    assert seen["compensating"][0] == "fail" and "fails on purpose" in seen["compensating"][1]


def test_a_step_whose_result_cannot_be_stored_ends_dead_unretried(
        app_db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise)  # one supervisor for every case
    cases = {_start_flow(app_db, "results.One", mode): why for mode, why in (
        ("huge", "the step's return value cannot be stored as its result: " + TOO_LARGE),
        ("object", "the step's return value cannot be stored as its result: " + NOT_JSON),
        ("nonfinite", "the result the child sent cannot be stored: it holds NaN or an "
                      "infinity, which JSON cannot carry (nan at ['ratio'], inf at ['max'])"),
        # Last: its child exits as soon as it sent its frame, and a row handed to it in that
        # moment would see the child exit.
        ("forge-invalid", "the result the child sent cannot be stored: it is not valid JSON ("),
    )}
    for wid, why in cases.items():
        wait_for(partial(_in_state, app_db, wid, "failed"), message="the workflow failed")
        row = _step_rows(app_db, wid)["only"]
        assert (row["state"], row["attempt"], row["max_attempts"]) == ("dead", 1, 3)
        assert row["result"] is None and row["error_count"] == 1
        assert row["errors"][-1]["kind"] == "result" and row["last_error"].startswith(why)
        assert row["last_error"].endswith(
            "; the step is not retried (its effect already happened)")
    assert "refused" not in sup.log() and sup.proc.poll() is None


def test_the_consoles_job_page_shows_the_result(app_db: psycopg.Connection[Any],
                                                db_url: str) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    import warnings

    with warnings.catch_warnings():  # as tests/test_console_api.py: httpx works
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings

    done, waiting = _enqueue(app_db, "dict"), _enqueue(app_db, "none")
    app_db.execute("UPDATE atlantis.jobs SET state = 'complete', attempt = 1, started_at = now(),"
                   " finished_at = now(), result = %s WHERE id = %s",
                   ('{"imported": 12, "token": "hidden"}', done))
    with TestClient(create_app(Settings(db_url, redact=frozenset({"token"}))),
                    base_url="http://127.0.0.1") as c:
        page = c.get(f"/jobs/{done}").text
        block = page.split('<section id="result-block"', 1)[1].split("</section>", 1)[0]
        assert " hidden" not in block.split(">", 1)[0]
        assert "&#34;imported&#34;: 12" in block or "&quot;imported&quot;: 12" in block
        assert "[redacted]" in block and "hidden&" not in block  # redacted as args are
        assert c.get(f"/api/jobs/{done}").json()["result"] == {"imported": 12,
                                                               "token": "[redacted]"}
        empty = c.get(f"/jobs/{waiting}").text
        assert '<section id="result-block" hidden>' in empty
