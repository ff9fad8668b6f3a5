"""Limits in the database (migration 0018, live/limits.sql and live/limited_claims.sql), driven by SQL as the
claims of this release and of the previous one drive them: the trigger jobs_limit_claim
lets a limited row turn `running` only while every limit has room, whoever claims it; a
slot is free once its row leaves `running` by any path; rate windows count starts and
refund rows given back unspent; atlantis.claim_limited lets groups take turns and never
waits behind a full limit. The same under real supervisors: tests/test_limited_jobs.py."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from atlantis.store.queries import Q

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix

FIELDS = [{"name": "account_id", "type": "varchar", "length": 64, "array": False,
           "not_null": True, "has_default": False, "default": None},
          {"name": "n", "type": "int", "length": None, "array": False,
           "not_null": False, "has_default": True, "default": 0}]

# The claim statement of 0.2.0 and 0.3.0, verbatim in substance: it knows nothing of limits.
OLD_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT j.id
      FROM unnest(%(queues)s::text[]) AS q(name)
     CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM atlantis.jobs
             WHERE state = 'available' AND queue = q.name AND run_at <= now()
               AND job = ANY(%(jobs)s::text[])
             ORDER BY priority, run_at, id
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED
           ) j
     ORDER BY j.priority, j.run_at, j.id
     LIMIT %(limit)s
)
UPDATE atlantis.jobs j
   SET state = 'running', attempt = j.attempt + 1, claimed_by = %(worker)s,
       claimed_until = now() + j.heartbeat, started_at = now(), progress_history = '[]'
  FROM picked
 WHERE j.id = picked.id
RETURNING j.id
"""


def declare(db: psycopg.Connection[Any], job: str, limits: list[dict[str, Any]], *,
            queue: str = "lim") -> None:
    db.execute(
        "INSERT INTO atlantis.job_types (job, queue, max_attempts, timeout, heartbeat, backoff,"
        " fields, limits) VALUES (%s, %s, 3, '1h', '5m', '1s', %s, %s)"
        " ON CONFLICT (job) DO UPDATE SET limits = excluded.limits",
        (job, queue, Jsonb(FIELDS), Jsonb(limits)))


def enqueue(db: psycopg.Connection[Any], job: str, accounts: list[str], **kw: Any) -> list[int]:
    row = db.execute(
        "SELECT atlantis.enqueue_many(%s, %s::jsonb[], run_at => %s, priority => %s)",
        (job, [Jsonb({"account_id": a}) for a in accounts], kw.get("run_at"),
         kw.get("priority"))).fetchone()
    assert row is not None
    return list(row[0])


def claim_limited(db: psycopg.Connection[Any], n: int, *, jobs: list[str] | None = None,
                  queues: tuple[str, ...] = ("lim",), worker: str = "w1"
                  ) -> tuple[list[int], float | None]:
    found = db.cursor(row_factory=psycopg.rows.dict_row).execute(
        Q.claim_limited, {"queues": list(queues), "jobs": jobs or ["t.Lim"], "worker": worker,
                          "limit": n, "after": None, "within": 5.0}).fetchall()
    assert found[-1]["id"] is None  # the hint row
    return [r["id"] for r in found[:-1]], found[-1]["wake_in"]


def old_claim(db: psycopg.Connection[Any], n: int, jobs: list[str] | None = None) -> list[int]:
    return [r[0] for r in db.execute(OLD_CLAIM, {"queues": ["lim"], "jobs": jobs or ["t.Lim"],
                                                 "limit": n, "worker": "old"}).fetchall()]


def finish(db: psycopg.Connection[Any], ids: list[int], state: str = "complete") -> None:
    db.execute("UPDATE atlantis.jobs SET state = %s, claimed_until = NULL,"
               " finished_at = now() WHERE id = ANY(%s)", (state, ids))


def account(db: psycopg.Connection[Any], job_id: int) -> str:
    row = db.execute("SELECT args->>'account_id' FROM atlantis.jobs WHERE id = %s",
                     (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def held(db: psycopg.Connection[Any], job_id: int) -> str | None:
    row = db.execute(Q.limit_hold, {"id": job_id}).fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


BY_ACCOUNT = [{"kind": "concurrency", "n": 1, "by": ["account_id"]}]


def digest(key: str) -> str:
    """A group's key as jobs.limit_group holds it (atlantis.key_digest)."""
    return hashlib.sha256(key.encode()).hexdigest()


def test_enqueue_marks_limited_rows_only(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", BY_ACCOUNT)
    declare(db, "t.Free", [])
    lim = enqueue(db, "t.Lim", ["a1", "a2"])
    free = enqueue(db, "t.Free", ["a1"] * 10)  # a batch of 8 or more takes the set-based path
    groups = dict(db.execute("SELECT id, limit_group FROM atlantis.jobs").fetchall())
    # The group is the digest of its values (migration 0021: values of any length).
    assert [groups[i] for i in lim] == [digest('["a1"]'), digest('["a2"]')]
    assert {groups[i] for i in free} == {None}


def test_concurrency_by_key_holds_for_every_claimer(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", BY_ACCOUNT)
    ids = enqueue(db, "t.Lim", ["a1", "a1", "a1", "a2"])
    got, wake = claim_limited(db, 8)
    assert sorted(account(db, i) for i in got) == ["a1", "a2"] and wake is None
    # The previous release's claim knows nothing of limits: the trigger refuses for it.
    assert old_claim(db, 8) == []
    assert claim_limited(db, 8)[0] == []
    assert held(db, ids[1]) == (f"waiting for a slot of `concurrency 1 by account_id=a1`: "
                                f"job {ids[0]} running")
    # Any path out of running frees the slot in its own transaction: here an operator's SQL.
    finish(db, [ids[0]], "dead")
    assert held(db, ids[1]) is None
    assert old_claim(db, 8) == [ids[1]]


def test_a_global_limit_and_a_by_limit_both_hold(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", [*BY_ACCOUNT, {"kind": "concurrency", "n": 2, "by": []}])
    enqueue(db, "t.Lim", ["a1", "a1", "a2", "a3", "a4"])
    got, _ = claim_limited(db, 8)
    assert len(got) == 2 and len({account(db, i) for i in got}) == 2
    waiting = [i for (i,) in db.execute(
        "SELECT id FROM atlantis.jobs WHERE state = 'available' ORDER BY id").fetchall()]
    assert "`concurrency 2`" in (held(db, waiting[-1]) or "")


def test_rescue_frees_the_slot_in_its_transaction(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", BY_ACCOUNT)
    ids = enqueue(db, "t.Lim", ["a1", "a1"])
    assert claim_limited(db, 1)[0] == [ids[0]]
    db.execute("UPDATE atlantis.jobs SET claimed_until = now() - interval '1 second'"
               " WHERE id = %s", (ids[0],))
    with db.transaction():
        rescued = db.execute(Q.rescue, {"worker": "w2", "limit": 10, "max_backoff": 86400.0}).fetchall()
        assert [r[0] for r in rescued] == [ids[0]]
        # Before that transaction commits, a claim of the same transaction sees the slot free.
        got, _ = claim_limited(db, 1, worker="w2")
        assert len(got) == 1


def test_a_held_key_does_not_block_other_keys_or_jobs(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", BY_ACCOUNT)
    declare(db, "t.Free", [])
    enqueue(db, "t.Lim", ["a1"] * 50 + ["a2"] * 50)
    free = enqueue(db, "t.Free", ["x"])
    first, _ = claim_limited(db, 1)
    full = account(db, first[0])
    # That key is full: its 49 waiting rows are passed over, the other key's first is claimed
    # (the groups take turns in the order of their digests).
    second, _ = claim_limited(db, 8)
    assert [account(db, i) for i in second] == [{"a1": "a2", "a2": "a1"}[full]]
    # The claim of unlimited rows never takes limited ones, and is not held up by them.
    fast = db.execute(Q.claim, {"queues": ["lim"], "jobs": ["t.Lim", "t.Free"], "limit": 10,
                                "worker": "w1", "limited": ["t.Lim"], "within": 5.0}).fetchall()
    assert [r[0] for r in fast] == free


def test_groups_take_turns_within_a_priority(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", [{"kind": "concurrency", "n": 100, "by": ["account_id"]}])
    enqueue(db, "t.Lim", ["big"] * 2000)
    small = enqueue(db, "t.Lim", ["small"])
    got, _ = claim_limited(db, 2)
    assert small[0] in got
    # Priority comes first.
    urgent = enqueue(db, "t.Lim", ["big"], priority=-1)
    got, _ = claim_limited(db, 1)
    assert got == urgent


def test_groups_rotate_across_claims(db: psycopg.Connection[Any]) -> None:
    """More groups than one call looks at (2n + 4, at least 8): each call starts after the
    group the last one looked at, so every group gets its turn before any gets a second."""
    declare(db, "t.Lim", [{"kind": "concurrency", "n": 100, "by": ["account_id"]}])
    for k in range(30):
        enqueue(db, "t.Lim", [f"a{k:02}"] * 3)
    after = None
    order: list[str] = []
    for _ in range(30):
        found = db.cursor(row_factory=psycopg.rows.dict_row).execute(
            Q.claim_limited, {"queues": ["lim"], "jobs": ["t.Lim"], "worker": "w1", "limit": 1,
                              "after": after, "within": 5.0}).fetchall()
        order += [account(db, r["id"]) for r in found[:-1]]
        after = found[-1]["cursor"]  # read by name, as the claimer does
    assert sorted(order) == [f"a{k:02}" for k in range(30)]


def test_a_row_scheduled_later_does_not_hold_its_key(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", BY_ACCOUNT)
    later = enqueue(db, "t.Lim", ["a1"], run_at="2999-01-01T00:00:00Z", priority=-5)
    due = enqueue(db, "t.Lim", ["a1"])
    assert claim_limited(db, 2)[0] == due
    assert held(db, later[0]) is None  # not due: nothing holds it yet


def test_a_limited_claim_past_its_deadline_rolls_back_whole(db: psycopg.Connection[Any]) -> None:
    """The claimer sends the limited claim without BEGIN ... COMMIT: the database refuses to
    commit one that ran past its deadline (atlantis.claim_in_time), so a late claim never
    starts and spends nothing: no row running, no attempt, no rate window's start."""
    declare(db, "t.Lim", BY_ACCOUNT + [{"kind": "rate", "n": 10, "period": 60.0, "by": []}])
    ids = enqueue(db, "t.Lim", ["a1", "a2", "a3"])
    params = {"queues": ["lim"], "jobs": ["t.Lim"], "worker": "w1", "limit": 3, "after": None}
    before = db.execute("SELECT count(*) FROM atlantis.limit_starts").fetchone()
    with pytest.raises(psycopg.errors.QueryCanceled, match="past its deadline"):
        db.execute(Q.claim_limited, {**params, "within": -1.0}).fetchall()
    rows = db.execute("SELECT state, attempt, claimed_by FROM atlantis.jobs WHERE id = ANY(%s)",
                      (ids,)).fetchall()
    assert rows == [("available", 0, None)] * 3
    assert db.execute("SELECT count(*) FROM atlantis.limit_starts").fetchone() == before
    # In time, the same statement claims them, each key once.
    found = db.execute(Q.claim_limited, {**params, "within": 5.0}).fetchall()
    assert sorted(r[0] for r in found[:-1]) == sorted(ids)


def test_claims_racing_for_one_key_never_both_win(db_url: str) -> None:
    """Two claimers of one key in two transactions: the second finds the key's lock taken
    (it never waits) and is told to come back shortly; after the first commits, the count
    sees its claim."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        declare(setup, "t.Lim", BY_ACCOUNT)
        enqueue(setup, "t.Lim", ["a1"] * 5)
    with psycopg.connect(db_url) as one, psycopg.connect(db_url) as two:
        got1, _ = claim_limited(one, 1)
        got2, wake = claim_limited(two, 1, worker="w2")
        assert len(got1) == 1 and got2 == [] and wake is not None and wake < 1
        one.commit()
        two.rollback()
        assert claim_limited(two, 1, worker="w2")[0] == []  # still full
        two.commit()


def test_concurrent_claimers_never_exceed_the_limit(db_url: str) -> None:
    """Eight threads, each claiming and finishing in a loop with both statements of this
    release and the previous one, sample the running count under a global limit of 3."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        declare(setup, "t.Lim", [{"kind": "concurrency", "n": 3, "by": []}])
        enqueue(setup, "t.Lim", ["a"] * 400)
    over: list[int] = []
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                for _ in range(60):
                    got = (old_claim(conn, 2) if k % 2
                           else claim_limited(conn, 2, worker=f"w{k}")[0])
                    row = conn.execute("SELECT count(*) FROM atlantis.jobs"
                                       " WHERE state = 'running'").fetchone()
                    assert row is not None
                    if row[0] > 3:
                        over.append(row[0])
                    finish(conn, got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert over == []
    with psycopg.connect(db_url, autocommit=True) as check:
        row = check.execute("SELECT count(*) FROM atlantis.jobs WHERE state = 'complete'"
                            ).fetchone()
        assert row is not None and row[0] > 0


def test_rate_counts_starts_in_a_sliding_window(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", [{"kind": "rate", "n": 2, "period": 60.0, "by": ["account_id"]}])
    ids = enqueue(db, "t.Lim", ["a1"] * 4 + ["a2"])
    got, wake = claim_limited(db, 8)
    assert sorted(got) == sorted([ids[0], ids[1], ids[4]])
    assert wake is not None and 58 < wake <= 60
    finish(db, got)
    assert claim_limited(db, 8)[0] == []  # finished or not, they started
    assert (held(db, ids[2]) or "").startswith("rate 2/1m by account_id=a1: next start in ")
    # The attempts' started_at is the time the window recorded.
    row = db.execute("SELECT count(*) FROM atlantis.limit_starts s JOIN atlantis.jobs j"
                     " ON j.id = s.job_id AND j.started_at = s.at").fetchone()
    assert row is not None and row[0] == 3
    # The window ends: the next two start.
    db.execute("UPDATE atlantis.limit_starts SET until = now() - interval '2 seconds'")
    assert len(claim_limited(db, 8)[0]) == 2
    assert db.execute(Q.limit_sweep, {"batch": 100}).fetchone() == (3,)


def test_a_claim_given_back_unspent_is_refunded(db: psycopg.Connection[Any]) -> None:
    from atlantis.store.supervision import Result, finish_params

    declare(db, "t.Lim", [{"kind": "rate", "n": 1, "period": 3600.0, "by": []}])
    ids = enqueue(db, "t.Lim", ["a1", "a1"])
    got, _ = claim_limited(db, 1)
    assert got == [ids[0]]
    # Given back by the supervisor before any child ran it (a drain, a late answer).
    release = Result(job_id=ids[0], run=1, attempt=1, state="available", spent=False,
                     delay=0.0, error=None, progress=None, label="release")
    db.execute(Q.finish, finish_params("w1", [release], "host", 1))
    assert db.execute("SELECT count(*) FROM atlantis.limit_starts").fetchone() == (0,)
    assert len(claim_limited(db, 1)[0]) == 1
    # A claim whose answer was lost is given back too (release_orphans): refunded.
    db.execute(Q.release_orphans, {"worker": "w1", "known": []})
    assert db.execute("SELECT count(*) FROM atlantis.limit_starts").fetchone() == (0,)


def test_queue_limit_set_shown_and_removed(db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Free", [], queue="q1")
    ids = enqueue(db, "t.Free", ["a"] * 5)
    assert db.execute(Q.set_queue_limit, {"queue": "q1", "concurrency": 2, "by": "ops"}
                      ).fetchone() == (None,)
    # Rows waiting when it was set are marked: the claim of unlimited rows leaves them.
    fast = db.execute(Q.claim, {"queues": ["q1"], "jobs": ["t.Free"], "limit": 10,
                                "worker": "w1", "limited": [], "within": 5.0}).fetchall()
    assert fast == []
    got, _ = claim_limited(db, 10, jobs=["t.Free"], queues=("q1",))
    assert got == ids[:2]
    assert held(db, ids[2]) == (f"waiting for a slot of `queue q1 concurrency 2`: "
                                f"jobs {ids[0]}, {ids[1]} running")
    usage = db.execute(Q.limit_usage, {"queues": ["q1"]}).fetchall()
    assert usage == [("q1", 2, 2, 2, 3)]
    # Lowered below what runs: those finish, nothing more starts until under it.
    db.execute(Q.set_queue_limit, {"queue": "q1", "concurrency": 1, "by": "ops"})
    finish(db, [ids[0]])
    assert claim_limited(db, 10, jobs=["t.Free"], queues=("q1",))[0] == []
    finish(db, [ids[1]])
    assert claim_limited(db, 10, jobs=["t.Free"], queues=("q1",))[0] == [ids[2]]
    # Removed: the rows only it marked are plain rows again.
    assert db.execute(Q.set_queue_limit, {"queue": "q1", "concurrency": None, "by": "ops"}
                      ).fetchone() == (1,)
    fast = db.execute(Q.claim, {"queues": ["q1"], "jobs": ["t.Free"], "limit": 10,
                                "worker": "w1", "limited": [], "within": 5.0}).fetchall()
    assert sorted(r[0] for r in fast) == ids[3:]
    with pytest.raises(psycopg.Error, match="must be 1 or more"):
        db.execute(Q.set_queue_limit, {"queue": "q1", "concurrency": 0, "by": "ops"})


def test_a_row_enqueued_before_its_limit_is_marked_by_the_claim(
        db: psycopg.Connection[Any]) -> None:
    declare(db, "t.Lim", [])
    ids = enqueue(db, "t.Lim", ["a1", "a1"])
    # The limit is declared as the rows wait, and the sync's marking missed them (a race).
    declare(db, "t.Lim", BY_ACCOUNT)
    claim = {"queues": ["lim"], "jobs": ["t.Lim"], "limit": 10, "worker": "w1",
             "limited": ["t.Lim"], "within": 5.0}
    assert [r[0] for r in db.execute(Q.claim, claim).fetchall()] == [ids[0]]
    assert db.execute(Q.claim, claim).fetchall() == []


def test_sync_marks_the_rows_of_a_job_whose_limits_changed(
        db: psycopg.Connection[Any]) -> None:
    from atlantis.declarations import parse_atl
    from atlantis.store.migrate import sync

    free = parse_atl("job Sync in t {\n  args { account_id text }\n}\n")
    limited = parse_atl("job Sync in t {\n  args { account_id text }\n"
                        "  concurrency 1 by account_id\n}\n")
    with psycopg.connect(db.info.dsn) as conn:
        sync(conn, free)
    ids = enqueue(db, "t.Sync", ["a1", "a2"])
    assert db.execute("SELECT count(*) FROM atlantis.jobs WHERE limit_group IS NOT NULL"
                      ).fetchone() == (0,)
    with psycopg.connect(db.info.dsn) as conn:
        sync(conn, limited)
    groups = [g for (g,) in db.execute(
        "SELECT limit_group FROM atlantis.jobs WHERE id = ANY(%s) ORDER BY id", (ids,))]
    assert groups == [digest('["a1"]'), digest('["a2"]')]
    with psycopg.connect(db.info.dsn) as conn:
        sync(conn, free)
    assert db.execute("SELECT count(*) FROM atlantis.jobs WHERE limit_group IS NOT NULL"
                      ).fetchone() == (0,)


def _blocks(db: psycopg.Connection[Any], statement: str, params: tuple[Any, ...] = ()) -> int:
    """Buffers one run of ``statement`` touches, its plans cached (the third of three runs:
    plans made, catalogs read), each run rolled back."""
    blocks = 0
    for _ in range(3):
        with db.transaction(force_rollback=True):
            plan = db.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}",
                              params).fetchone()
        assert plan is not None
        node = plan[0][0]["Plan"]
        blocks = int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])
    return blocks


def _group_walk_blocks(db: psycopg.Connection[Any]) -> int:
    """Buffers one call of atlantis.limited_groups touches."""
    return _blocks(db, "SELECT atlantis.limited_groups('lim', 0, NULL, 50)")


def test_the_group_walk_probes_the_index_before_the_table_is_analyzed(
        db: psycopg.Connection[Any], db_url: str) -> None:
    """Rows just enqueued, statistics that say the table is nearly empty: each probe of the
    walk still seeks its group in jobs_limited_idx, instead of reading the whole priority
    through jobs_fetch_idx and sorting it (the limited drain ran at half speed so until
    autovacuum analyzed the table: 27,000 buffers a walk of 50 groups at 10,000 rows, against
    about 200)."""
    declare(db, "t.Lim", BY_ACCOUNT)
    enqueue(db, "t.Lim", [f"a{i % 100}" for i in range(10_000)])
    db.commit()
    assert _group_walk_blocks(db) < 2_000
    # The same walk with the sort allowed again: the plan that cost so much.
    db.execute("ALTER FUNCTION atlantis.limited_groups(text, int, text, int) RESET enable_sort")
    db.commit()
    with psycopg.connect(db_url) as fresh:  # plans made afresh
        assert _group_walk_blocks(fresh) > 10_000


def _group_claim_blocks(db: psycopg.Connection[Any], groups: list[str]) -> int:
    """Buffers one call of atlantis.claim_groups touches claiming the first row of each of
    ``groups``."""
    return _blocks(db, "SELECT * FROM atlantis.claim_groups('lim', 0, %s, 'w', "
                       "ARRAY['t.Lim'], '{}')", (groups,))


def test_the_group_claim_seeks_each_group_before_the_table_is_analyzed(
        db: psycopg.Connection[Any], db_url: str) -> None:
    """Rows just enqueued, statistics that say the table is nearly empty: the claim of a
    group's first row is one seek in jobs_limited_idx, not a walk of jobs_fetch_idx from the
    queue's head past every waiting row of the other groups (0.44 ms a call in the limited
    drain benchmark, against 0.34)."""
    declare(db, "t.Lim", BY_ACCOUNT)
    enqueue(db, "t.Lim", [f"a{i % 2_000}" for i in range(6_000)])
    db.commit()
    # The 40 groups whose first row comes last in the queue: each 1,960-2,000 rows from its
    # head.
    groups = [g for (g,) in db.execute(
        "SELECT limit_group FROM atlantis.jobs ORDER BY id DESC LIMIT 40")]
    # Only the claim's own reads are counted: the limit's trigger reads the same either way.
    db.execute("ALTER TABLE atlantis.jobs DISABLE TRIGGER jobs_limit_claim")
    assert _group_claim_blocks(db, groups) < 1_500  # about 20 a group
    # The group matched by equality again: the plan that walked the queue.
    body = db.execute("SELECT pg_get_functiondef('atlantis.claim_groups(text, int, text[], "
                      "text, text[], text[])'::regprocedure)").fetchone()
    assert body is not None
    old = body[0].replace("x.limit_group >= t.g AND x.limit_group <= t.g",
                          "x.limit_group = t.g")
    assert old != body[0]
    db.execute(old)
    db.commit()
    with psycopg.connect(db_url) as fresh:  # plans made afresh
        assert _group_claim_blocks(fresh, groups) > 3_000  # about 120 a group
