"""Limits under real supervisors (tests/apps/limited.atl): what runs at once and what starts
in a window, from the intervals the handlers record with PostgreSQL's clock. The same
transitions driven by SQL: tests/test_limit_store.py."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.conftest import wait_for

APP = "tests.apps.limited:registry"


def enqueue(db: psycopg.Connection[Any], job: str, args: list[dict[str, Any]]) -> list[int]:
    row = db.execute("SELECT atlantis.enqueue_many(%s, %s::jsonb[])",
                     (job, [Jsonb(a) for a in args])).fetchone()
    assert row is not None
    return list(row[0])


def intervals(db: psycopg.Connection[Any]) -> list[tuple[str, int, Any, Any]]:
    """(key, job_id, started, ended) of every attempt that ended."""
    return [tuple(r) for r in db.execute(
        "SELECT s.key, s.job_id, s.at, e.at FROM test_events s JOIN test_events e"
        " ON e.job_id = s.job_id AND e.attempt = s.attempt AND e.event = 'ended'"
        " WHERE s.event = 'started' ORDER BY s.at").fetchall()]


def overlap(a: tuple[str, int, Any, Any], b: tuple[str, int, Any, Any]) -> bool:
    return bool(a[2] < b[3] and b[2] < a[3])


def test_one_per_key_across_supervisors(db: psycopg.Connection[Any], supervise: Any) -> None:
    ids = enqueue(db, "limited.PerKey", [{"key": f"k{i % 3}", "hold": 0.1} for i in range(18)])
    for _ in range(2):
        supervise(queues=("limited",), app=APP, concurrency=3)
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.jobs WHERE id = ANY(%s)"
                                " AND state = 'complete'", (ids,)).fetchone() == (18,),
             timeout=60)
    seen = intervals(db)
    assert len(seen) == 18
    for i, a in enumerate(seen):
        for b in seen[i + 1:]:
            if a[0] == b[0]:
                assert not overlap(a, b), (a, b)
    assert any(overlap(a, b) for a in seen for b in seen if a[0] != b[0])
