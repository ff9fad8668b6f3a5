"""The console shows children (issue 35): a job's page links its parent and lists its
children (counts by state, the first 100 linked, "and N more"), ``GET /api/jobs/{id}``
carries ``parent_id`` and ``children``, and a job that waits in a join says so, on its page
and in ``suspension``, the text its page's live updates show as the server sent it (the
API's document and a stream's ``event: job`` from a real ``python -m atlantis.console``).
Real PostgreSQL, the real app through Starlette's TestClient, and a real supervisor running
tests/apps/durable.py's FanOut for the join. ``tide``'s side: tests/test_children.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import warnings

import httpx

with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import atlantis
from atlantis.console.app import create_app
from atlantis.console.settings import Settings
from tests.conftest import job_row, wait_for, wait_state
from tests.test_console_api import Console, read_events

APP = "tests.apps.durable:registry"
JOINING = {"label": "waiting", "text": "for the jobs of join all to end"}


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    settings = Settings(db_url, poll_interval=0.5, log_interval=0.2, debounce=0.05)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as tc:
        yield tc


@pytest.fixture
def console_server(db_url: str, tmp_path: Path) -> Iterator[Callable[[], Console]]:
    started: list[Console] = []

    def start() -> Console:
        con = Console(db_url, tmp_path / f"console-{len(started)}.log")
        started.append(con)
        return con

    yield start
    for con in started:
        con.stop()


def _family(db: psycopg.Connection[Any], n: int) -> tuple[int, list[int]]:
    """A parent and ``n`` children made as rows (no supervisor runs them): the children
    enqueued, then given the parent as ``ctx.spawn`` would."""
    parent = atlantis.enqueue(db, "durable.FanOut", {"key": "rows", "n": n})
    children = atlantis.enqueue_many(db, "durable.Child",
                                     [{"key": "rows", "i": i} for i in range(n)])
    db.execute("UPDATE atlantis.jobs SET parent_id = %s WHERE id = ANY(%s)", (parent, children))
    return parent, children


def _section(page: str, section_id: str) -> re.Match[str]:
    found = re.search(rf'<section id="{section_id}"([^>]*)>(.*?)</section>', page, re.S)
    assert found, page
    return found


def _listed(section: str) -> list[tuple[int, int, str, str]]:
    """The children's rows of a page: (id linked to, id shown, job, state)."""
    return [(int(a), int(b), job, state) for a, b, job, state in re.findall(
        r'<tr><td><a href="/jobs/(\d+)">(\d+)</a></td><td>([^<]*)</td>'
        r'<td><span class="badge state-\w+">(\w+)</span></td></tr>', section)]


def _waits(page: str) -> re.Match[str]:
    found = re.search(r'<p id="asleep"( hidden)?>(.*?)</p>', page, re.S)
    assert found, page
    return found


def test_a_parent_lists_counts_and_links_its_children_and_a_child_links_its_parent(
        ddb: psycopg.Connection[Any], client: TestClient) -> None:
    parent, children = _family(ddb, 103)
    for child in children[:2]:
        assert atlantis.cancel(ddb, child) == "cancelled"

    page = client.get(f"/jobs/{parent}").text
    section = _section(page, "children")
    assert "hidden" not in section.group(1)
    assert 'data-counts="available=101 cancelled=2"' in section.group(1)
    counts = re.search(r'<small id="children-counts">(.*?)</small>', section.group(2), re.S)
    assert counts and re.sub(r"<[^>]+>", "", counts.group(1)) == \
        "101 available 2 cancelled 103 in all", counts
    # The first 100, oldest first, each linked to its page; the rest counted.
    assert _listed(section.group(2)) == [
        (c, c, "durable.Child", "cancelled" if i < 2 else "available")
        for i, c in enumerate(children[:100])]
    assert '<p id="children-more" class="muted">and 3 more</p>' in section.group(2)
    assert 'id="parent-link"' not in page

    doc = client.get(f"/api/jobs/{parent}").json()
    assert doc["parent_id"] is None
    assert doc["children"] == {"available": 101, "cancelled": 2}

    child = client.get(f"/jobs/{children[-1]}").text
    link = re.search(r'<span id="parent-link">(.*?)</span>', child, re.S)
    assert link and link.group(1) == f'· child of <a href="/jobs/{parent}">job {parent}</a>'
    assert re.search(r'<section id="children"[^>]* hidden>', child)
    doc = client.get(f"/api/jobs/{children[-1]}").json()
    assert (doc["parent_id"], doc["children"]) == (parent, {})


def test_a_few_children_are_all_listed_and_a_job_without_any_shows_none(
        ddb: psycopg.Connection[Any], client: TestClient) -> None:
    parent, children = _family(ddb, 3)
    section = _section(client.get(f"/jobs/{parent}").text, "children").group(2)
    assert [row[0] for row in _listed(section)] == children
    assert re.search(r'<p id="children-more" class="muted" hidden>', section)

    lonely = atlantis.enqueue(ddb, "durable.Child", {"key": "alone", "i": 0})
    page = client.get(f"/jobs/{lonely}").text
    assert re.search(r'<section id="children" data-counts=""[^>]* hidden>', page), page
    assert 'id="parent-link"' not in page
    doc = client.get(f"/api/jobs/{lonely}").json()
    assert (doc["parent_id"], doc["children"], doc["suspension"]) == (None, {}, None)


def _joining(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    row = job_row(db, job_id)
    return row if row["state"] == "available" and row["suspended_for"] == "join:all" else None


def _running_children(db: psycopg.Connection[Any], parent: int, n: int) -> list[int] | None:
    rows = db.execute("SELECT id, state FROM atlantis.jobs WHERE parent_id = %s ORDER BY id",
                      (parent,)).fetchall()
    return [r[0] for r in rows] if len(rows) == n and all(
        r[1] == "running" for r in rows) else None


def test_a_parent_waiting_in_its_join_says_so_on_its_page_in_the_api_and_its_stream(
        ddb: psycopg.Connection[Any], supervise: Any, client: TestClient,
        console_server: Callable[[], Console]) -> None:
    supervise(queues=("durable",), app=APP, concurrency=3)
    parent = atlantis.enqueue(ddb, "durable.FanOut", {"key": "join", "n": 2,
                                                      "hold_ms": 60_000})
    wait_for(lambda: _joining(ddb, parent), message="the parent to wait in its join")
    children = wait_for(lambda: _running_children(ddb, parent, 2),
                        message="both children to run")

    doc = client.get(f"/api/jobs/{parent}").json()
    assert doc["suspended_for"] == "join:all" and doc["suspended_until"] is None
    assert doc["suspension"] == JOINING
    assert doc["children"] == {"running": 2}

    page = client.get(f"/jobs/{parent}").text
    waits = _waits(page)
    assert waits.group(1) is None
    assert '<span class="badge asleep" id="asleep-label">waiting</span>' in waits.group(2)
    assert '<span id="asleep-text">for the jobs of join all to end</span>' in waits.group(2)
    # A join has no deadline: no "until" shown.
    assert re.search(r'<span id="asleep-when" hidden>', waits.group(2)), waits.group(2)
    section = _section(page, "children").group(2)
    assert [(r[0], r[3]) for r in _listed(section)] == [(c, "running") for c in children]
    assert "2 running" in section
    for child in children:
        assert f'child of <a href="/jobs/{parent}">' in client.get(f"/jobs/{child}").text

    # The stream the page's live updates read carries the same words, and drops them once
    # the wait is over.
    con = console_server()
    cancelled: list[str | None] = []

    def cancel_then_wait(seen: list[tuple[str, Any]]) -> bool:
        if not cancelled:  # after the first event: the parent as it waits
            cancelled.append(atlantis.cancel(ddb, parent))
        return any(n == "job" and d["state"] == "cancelled" for n, d in seen)

    with httpx.Client(base_url=con.url, timeout=httpx.Timeout(60.0)) as http, \
            http.stream("GET", f"/api/jobs/{parent}/stream") as r:
        assert r.status_code == 200
        seen = read_events(r, cancel_then_wait)
    assert cancelled == ["cancelled"]
    docs = [d for n, d in seen if n == "job"]
    assert docs[0]["suspension"] == JOINING and docs[0]["children"] == {"running": 2}
    assert docs[0]["parent_id"] is None
    assert docs[-1]["state"] == "cancelled" and docs[-1]["suspension"] is None
    for child in children:  # cancelling the parent cancelled its children
        wait_state(ddb, child, "cancelled")


def _suspended_for(db: psycopg.Connection[Any], job_id: int) -> str | None:
    row = job_row(db, job_id)
    return row["suspended_for"] if row["state"] == "available" else None


def test_the_api_says_a_sleep_and_an_event_wait_in_the_pages_words(
        ddb: psycopg.Connection[Any], supervise: Any, client: TestClient) -> None:
    supervise(queues=("durable",), app=APP, concurrency=2)
    nap = atlantis.enqueue(ddb, "durable.Nap", {"key": "nap", "seconds": 600})
    wait = atlantis.enqueue(ddb, "durable.Wait", {"key": "wait", "event": "approved",
                                                  "timeout": None})
    wait_for(lambda: _suspended_for(ddb, nap) == "sleep:nap", message="the nap to sleep")
    wait_for(lambda: _suspended_for(ddb, wait) == "event:approved",
             message="the wait to wait for its event")
    doc = client.get(f"/api/jobs/{nap}").json()
    assert doc["suspension"] == {"label": "asleep", "text": "in handler step nap"}
    assert doc["suspended_until"] is not None
    assert re.search(r'<span id="asleep-when">', _waits(client.get(f"/jobs/{nap}").text)
                     .group(2))
    doc = client.get(f"/api/jobs/{wait}").json()
    assert doc["suspension"] == {"label": "waiting", "text": "for event approved"}
    assert doc["suspended_until"] is None
    page = _waits(client.get(f"/jobs/{wait}").text).group(2)
    assert '<span id="asleep-text">for event approved</span>' in page
    assert re.search(r'<span id="asleep-when" hidden>', page)
