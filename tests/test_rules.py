"""Each rule written once, asked of both sides: where Python (the supervisor's policy, the
API's checks) and SQL (the statements the supervisor sends, the operators' functions) both
apply a rule, the same inputs give the same answer.

The rules: retry or dead with the job's backoff (the policy for a finished attempt, the
rescue for an expired lease), the error entry of a cancelled attempt (every way a job is
cancelled), the cap on a checkpoint's message, the clamp of its percentage, and the depth of
a JSON value.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis import limits
from atlantis.enqueue import EnqueueOptions
from atlantis.protocol.messages import Done
from atlantis.store import Q
from atlantis.store.supervision import Progress, Renewal, Result, finish_params, renew_params
from atlantis.supervisor import policy
from tests.conftest import job_row

pytestmark = pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16

WORKER = "w-rules"
CAP = 100.0  # --max-backoff in these tests: 10 s doubled reaches it by the 5th failure


def _claim(db: psycopg.Connection[Any], job_id: int) -> int:
    """Claim ``job_id`` (the only available row of the queue) as the supervisor does;
    returns the attempt."""
    rows = db.execute(Q.claim, {"limited": [], "queues": ["tests"], "jobs": ["tests.Echo"],
                                "limit": 1, "worker": WORKER, "within": 5.0}).fetchall()
    assert [r[0] for r in rows] == [job_id]
    return int(job_row(db, job_id)["attempt"])


def _running(db: psycopg.Connection[Any], key: str, attempt: int, max_attempts: int) -> int:
    """A job of ``max_attempts`` with a 10 s backoff, claimed for its ``attempt``."""
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": key})
    db.execute("UPDATE atlantis.jobs SET max_attempts = %s, attempt = %s,"
               " backoff = interval '10 seconds' WHERE id = %s",
               (max_attempts, attempt - 1, job_id))
    assert _claim(db, job_id) == attempt
    return job_id


def _waits(db: psycopg.Connection[Any], job_id: int) -> float:
    found = db.execute("SELECT extract(epoch FROM run_at - now())::float8 FROM atlantis.jobs"
                       " WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return max(0.0, float(found[0]))


def _finish(db: psycopg.Connection[Any], job_id: int, verdict: policy.Verdict,
            progress: Progress | None = None) -> None:
    row = job_row(db, job_id)
    result = Result(job_id, row["attempt"], verdict.state, verdict.spent, verdict.delay,
                    verdict.error, progress, verdict.label, run=row["run"],
                    backoff=verdict.backoff)
    db.execute(Q.finish, finish_params(WORKER, [result], "host", 1))


def _bounds(attempt: int) -> tuple[float, float]:
    """The job's backoff for ``attempt`` as the policy's backoff computes it: the least and
    the most jitter."""
    return (policy.backoff(10.0, attempt, cap=CAP, rand=0.0),
            policy.backoff(10.0, attempt, cap=CAP, rand=1.0))


def test_retry_or_dead_and_the_backoff_agree_between_the_policy_and_the_rescue(
        db: psycopg.Connection[Any]) -> None:
    """The same attempt of the same job: failed by the policy (and written by the finish
    statement), or lost to a second lease expiry in a row (the rescue). Both end it dead
    or back to available alike, and back after the same backoff."""
    limits_ = policy.Limits(max_snooze=3600, max_backoff=CAP)
    for max_attempts in (1, 2, 3, 6):
        for attempt in range(1, max_attempts + 1):
            key = f"{attempt}of{max_attempts}"
            facts = policy.AttemptFacts(attempt, max_attempts, 10.0, 30.0)
            verdict = policy.decide(facts, limits_, Done(job_id=0, outcome="failed"))
            failed = _running(db, f"f{key}", attempt, max_attempts)
            _finish(db, failed, verdict)
            lost = _running(db, f"l{key}", attempt, max_attempts)
            db.execute(  # the previous attempt of this run ended by a lease expiry too
                "UPDATE atlantis.jobs SET claimed_until = now() - interval '1 second',"
                " errors = jsonb_build_array(jsonb_build_object('kind', 'lease_expired',"
                " 'run', run, 'attempt', attempt - 1)) WHERE id = %s", (lost,))
            db.execute(Q.rescue, {"limit": 100, "worker": "rescuer", "max_backoff": CAP})
            states = (job_row(db, failed)["state"], job_row(db, lost)["state"])
            assert states == (verdict.state, verdict.state), key
            expected = "dead" if policy.out_of_attempts(attempt, max_attempts) else "available"
            assert verdict.state == expected, key
            if expected == "available":
                low, high = _bounds(attempt)
                for job_id in (failed, lost):  # PostgreSQL's now() moves between statements
                    assert low - 1.0 <= _waits(db, job_id) <= high + 0.001, (key, job_id)


def test_the_supervisors_backoff_is_the_databases_retry_delay(
        db: psycopg.Connection[Any]) -> None:
    """``policy.backoff`` (the supervisor's pacing) and ``atlantis.retry_delay`` (a job's
    retry) are one formula: every delay the database draws lies between the policy's least
    and most jitter, both reach those bounds' middle ground, and both cap and refuse alike."""
    def sql(base: float, failures: int, cap: float) -> float:
        found = db.execute("SELECT extract(epoch FROM atlantis.retry_delay("
                           "make_interval(secs => %s), %s, make_interval(secs => %s)))::float8",
                           (base, failures, cap)).fetchone()
        assert found is not None
        return float(found[0])

    for base, failures, cap in ((10.0, 1, 1e6), (10.0, 4, 1e6), (0.5, 7, 1e6), (3.0, 12, 1e6)):
        low = policy.backoff(base, failures, cap=cap, rand=0.0)
        high = policy.backoff(base, failures, cap=cap, rand=1.0)
        assert high == pytest.approx(low * 5 / 3)
        drawn = [sql(base, failures, cap) for _ in range(40)]
        assert all(low - 1e-6 <= d <= high + 1e-6 for d in drawn), (base, failures, drawn)
        assert min(drawn) < (low + high) / 2 < max(drawn)  # jittered over the whole range
    for base, failures, cap in ((10.0, 2**31 - 1, 86400.0), (10.0, 20, 60.0), (0.0, 5, 60.0),
                                (10.0, 0, 60.0), (10.0, 3, 0.0)):
        assert sql(base, failures, cap) == policy.backoff(base, failures, cap=cap, rand=0.5)


def _entry(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    """The row's last error entry, without when and where it was written."""
    entry: dict[str, Any] = job_row(db, job_id)["errors"][-1]
    return {k: v for k, v in entry.items() if k not in ("at", "worker", "rescued_by")}


def _last_error(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    entry = _entry(db, job_id)
    assert job_row(db, job_id)["last_error"] == entry["message"]
    return entry


def test_every_cancel_writes_one_entry(db: psycopg.Connection[Any]) -> None:
    """An operator's cancel of a waiting job (atlantis.cancel) and the supervisor's of a
    running one (policy.cancel_error, completed by the finish statement) write the same
    entry; a cancelled row whose lease expired (the rescue) or that nobody received (the
    release of orphans) writes it too, the rescue saying why it ended there."""
    waiting = atlantis.enqueue(db, "tests.Echo", {"key": "c-waiting"})
    assert db.execute("SELECT atlantis.cancel(%s, 'alice')", (waiting,)).fetchone() == (
        "cancelled",)
    running = _running(db, "c-running", 1, 3)
    db.execute("SELECT atlantis.cancel(%s, 'alice')", (running,))
    facts = policy.AttemptFacts(1, 3, 10.0, 30.0)
    verdict = policy.forced(facts, policy.Limits(3600, CAP), "cancel")
    assert verdict is not None and verdict.error == policy.cancel_error(facts)
    _finish(db, running, verdict)
    entry = {"run": 1, "kind": "cancelled", "message": "cancelled by alice", "by": "alice"}
    assert _last_error(db, waiting) == {**entry, "attempt": 0}
    assert _last_error(db, running) == {**entry, "attempt": 1}

    rescued = _running(db, "c-rescued", 1, 3)
    db.execute("SELECT atlantis.cancel(%s, 'alice')", (rescued,))
    db.execute("UPDATE atlantis.jobs SET claimed_until = now() - interval '1 second'"
               " WHERE id = %s", (rescued,))
    db.execute(Q.rescue, {"limit": 100, "worker": "rescuer", "max_backoff": CAP})
    lease = f" (lease expired, worker {WORKER} presumed dead)"
    assert _entry(db, rescued) == {**entry, "attempt": 1, "message": "cancelled by alice" + lease}
    assert job_row(db, rescued)["last_error"] == "cancelled by alice"

    orphan = _running(db, "c-orphan", 1, 3)
    db.execute("SELECT atlantis.cancel(%s, 'alice')", (orphan,))
    db.execute(Q.release_orphans, {"worker": WORKER, "known": []})
    assert _last_error(db, orphan) == {**entry, "attempt": 0}


def test_a_long_checkpoint_message_is_cut_alike_by_python_and_sql(
        db: psycopg.Connection[Any]) -> None:
    """The supervisor's cap (policy.progress_text) and the database's
    (atlantis.progress_text, which the renew and finish statements apply) keep the same
    characters of a long message, wide ones (outside the BMP) included."""
    message = "é😀m" * 300
    capped = policy.progress_text(message)
    assert len(capped) == limits.MAX_PROGRESS_MSG
    found = db.execute("SELECT atlantis.progress_text(%s)", (message,)).fetchone()
    assert found == (capped,)
    renewed = _running(db, "m-renewed", 1, 3)
    db.execute(Q.renew, renew_params(WORKER, [Renewal(renewed, 1, Progress(50.0, message))]))
    assert job_row(db, renewed)["progress_msg"] == capped
    finished = _running(db, "m-finished", 1, 3)
    complete = policy.Verdict("complete", True)
    _finish(db, finished, complete, Progress(50.0, message))
    assert job_row(db, finished)["progress_msg"] == capped


def test_a_percentage_is_clamped_alike_by_python_and_sql(db: psycopg.Connection[Any]) -> None:
    values: list[float | None] = [None, math.nan, -math.inf, -1.0, -0.5, 0.0, 0.4, 0.5, 1.5,
                                  2.5, 33.3, 99.5, 100.0, 100.5, 1e300, math.inf]
    found = db.execute("SELECT atlantis.clamp_pct(p) FROM unnest(%s::float8[]) WITH ORDINALITY"
                       " AS u(p, n) ORDER BY n", (values,)).fetchall()
    assert [r[0] for r in found] == [limits.clamp_pct(v) for v in values]
    # Through the renewal, whose batch goes as JSON, which has no NaN (a checkpoint without a
    # percentage) nor infinity: the row keeps what the rule gives.
    renewals = {v: _running(db, f"p-{n}", 1, 3) for n, v in enumerate(values) if v is not None}
    db.execute(Q.renew, renew_params(WORKER, [Renewal(job_id, 1, Progress(v, "m"))
                                              for v, job_id in renewals.items()]))
    for v, job_id in renewals.items():
        assert job_row(db, job_id)["progress_pct"] == limits.clamp_pct(v), v
    # And through the finish statement, whose results go as JSON too.
    for n, pct in enumerate(p for p in values if p is not None):
        finished = _running(db, f"f-{n}", 1, 3)
        _finish(db, finished, policy.Verdict("complete", True), Progress(pct, "m"))
        assert job_row(db, finished)["progress_pct"] == limits.clamp_pct(pct), pct


def test_a_json_depth_is_counted_alike_by_python_and_sql(db: psycopg.Connection[Any]) -> None:
    values: list[Any] = [1, "x", None, [], {}, {"a": [1]}, [[], [[[]]], {"b": {}}],
                         [[[[[]]]]] * 2, orjson.loads("[" * 70 + "]" * 70)]
    found = [db.execute("SELECT atlantis.jsonb_depth(%s::jsonb)",
                        (orjson.dumps(v).decode(),)).fetchone() for v in values]
    assert [f[0] if f else None for f in found] == [limits.json_depth(v) for v in values]


def test_the_enqueue_options_are_one_set_checked_once(db: psycopg.Connection[Any]) -> None:
    """Every enqueue takes :class:`EnqueueOptions` and nothing else: a misspelt option is
    refused as Python refuses an unknown keyword, before anything is written."""
    with pytest.raises(TypeError, match="'prio'"):
        atlantis.enqueue(db, "tests.Echo", {"key": "o"}, prio=1)  # type: ignore[call-arg]
    with pytest.raises(atlantis.ValidationError, match="priority"):
        atlantis.enqueue(db, "tests.Echo", {"key": "o"}, priority="high")  # type: ignore[arg-type]
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "o"}, priority=-3, queue="tests")
    assert job_row(db, job_id)["priority"] == -3
    assert sorted(EnqueueOptions.__annotations__) == ["delay", "priority", "queue", "run_at"]
