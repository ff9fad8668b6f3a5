"""Queue limits in the console: ``POST /api/queues/{name}/limit`` behind the token (audited,
as a pause is), the queues page's limit form, the limits on the queue views, and what holds
a waiting job on its page and in ``GET /api/jobs/{id}``. Starlette's TestClient on the app,
real PostgreSQL. The jobs are tests/apps/limited.atl's (queue ``limited``)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

pytest.importorskip("starlette")

from tests.docs import bad_input_text
from tests.test_console_api import BEARER, Client, client
from tests.test_tide_limits import claim, enqueue, queue_limit

__all__ = ["client"]  # a fixture used here


def test_the_api_sets_and_removes_a_limit_audited(db: psycopg.Connection[Any],
                                                 client: Client) -> None:
    c = client(token=True)
    r = c.post("/api/queues/limited/limit", headers=BEARER, json={"concurrency": 3})
    assert (r.status_code, r.json()) == (200, {"queue": "limited", "concurrency": 3,
                                              "was": None})
    assert queue_limit(db) == (3, "console:ops-team")
    queues = {q["queue"]: q for q in c.get("/api/queues").json()["queues"]}
    assert {k: queues["limited"][k] for k in ("concurrency_limit", "limited_running",
                                               "held")} == {
        "concurrency_limit": 3, "limited_running": 0, "held": 0}
    assert len(queues["limited"]["per_minute"]) == 60  # the other keys are kept
    again = c.post("/api/queues/limited/limit", headers=BEARER, json={"concurrency": 3})
    assert again.json() == {"queue": "limited", "concurrency": 3, "was": 3}
    removed = c.post("/api/queues/limited/limit", headers=BEARER, json={"concurrency": None})
    assert removed.json() == {"queue": "limited", "concurrency": None, "was": 3}
    assert queue_limit(db) == (None, "console:ops-team")
    # Any queue name, percent-encoded as for pause.
    odd = c.post(f"/api/queues/{quote('reports/daily', safe='')}/limit", headers=BEARER,
                 json={"concurrency": 1})
    assert odd.json() == {"queue": "reports/daily", "concurrency": 1, "was": None}
    rows = db.execute("SELECT action, target, label, outcome, detail FROM atlantis.console_audit"
                      " ORDER BY id").fetchall()
    assert [r[:4] for r in rows] == [
        ("limit", "limited", "ops-team", "changed"), ("limit", "limited", "ops-team", "unchanged"),
        ("limit", "limited", "ops-team", "changed"),
        ("limit", "reports/daily", "ops-team", "changed")]
    assert rows[2][4] == {"concurrency": None, "was": 3}


def test_a_limit_needs_the_right_to_write(db: psycopg.Connection[Any], client: Client) -> None:
    read_only = client()
    assert read_only.post("/api/queues/limited/limit", headers=BEARER,
                          json={"concurrency": 2}).status_code == 403
    c = client(token=True)
    assert c.post("/api/queues/limited/limit", json={"concurrency": 2}).status_code == 403
    wrong = c.post("/api/queues/limited/limit", json={"concurrency": 2},
                   headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "error" in wrong.json()
    # A page form without credentials writes nothing either.
    assert c.post("/queues/limit", data={"queue": "limited", "concurrency": "2"},
                  follow_redirects=False).status_code == 403
    assert queue_limit(db) is None
    assert db.execute("SELECT count(*) FROM atlantis.console_audit").fetchone() == (0,)


#: id: (JSON body, the error's exact text); each is a 400.
BAD_BODIES: dict[str, tuple[Any, str]] = {
    "limit-zero": ({"concurrency": 0}, "concurrency: at least 1, not 0 (null removes the limit)"),
    "limit-negative": ({"concurrency": -2},
                       "concurrency: at least 1, not -2 (null removes the limit)"),
    "limit-past-int": ({"concurrency": 2147483648}, "concurrency: out of range (at most 2147483647)"),
    "limit-string": ({"concurrency": "3"},
                     "concurrency: a whole number, 1 or more, or null to remove the limit"),
    "limit-bool": ({"concurrency": True},
                   "concurrency: a whole number, 1 or more, or null to remove the limit"),
    "limit-fraction": ({"concurrency": 1.5},
                       "concurrency: a whole number, 1 or more, or null to remove the limit"),
    "limit-missing": ({}, "concurrency: missing (a whole number, 1 or more, or null to remove "
                          "the limit)"),
    "limit-not-an-object": ([3], "the body must be a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_bad_limit_is_a_400_and_changes_nothing(db: psycopg.Connection[Any], client: Client,
                                                  case: str) -> None:
    body, message = BAD_BODIES[case]
    c = client(token=True)
    r = c.post("/api/queues/limited/limit", headers=BEARER, json=body)
    assert (r.status_code, r.json()) == (400, {"error": message})
    assert queue_limit(db) is None


def test_the_bad_input_table_quotes_these_messages() -> None:
    text = bad_input_text()
    for case, (_, message) in BAD_BODIES.items():
        assert f"| 400, `{message}` | `tests/test_console_limits.py::" \
               f"test_a_bad_limit_is_a_400_and_changes_nothing[{case}]` |" in text, case


def test_the_queues_page_shows_limits_and_sets_them(db: psycopg.Connection[Any],
                                                    client: Client) -> None:
    enqueue(db, "k1", "k1", "k2")
    assert len(claim(db)) == 2
    c = client(token=True)
    page = c.get("/queues", headers=BEARER).text
    assert "<th>Limit</th>" in page and ">Slots in use</th>" in page and ">Held</th>" in page
    row = _row(page, "limited")
    assert re.search(r'class="limit">-</td>\s*<td class="slots">2</td>\s*<td class="held">1</td>',
                     row), row
    assert 'action="/queues/limit"' in row and "Remove limit" not in row

    r = c.post("/queues/limit", headers=BEARER, follow_redirects=False,
               data={"queue": "limited", "concurrency": "2"})
    assert (r.status_code, r.headers["location"]) == (303, "/queues")
    assert queue_limit(db) == (2, "console:ops-team")
    row = _row(c.get("/queues", headers=BEARER).text, "limited")
    assert re.search(r'class="limit">2</td>\s*<td class="slots">2/2</td>', row), row
    assert "Remove limit" in row and 'value="2"' in row
    overview = c.get("/").text
    assert "2/2 slots · 1 held" in overview

    bad = c.post("/queues/limit", headers=BEARER, data={"queue": "limited",
                                                        "concurrency": "two"})
    assert bad.status_code == 400 and "text/html" in bad.headers["content-type"]
    assert "concurrency: a whole number, 1 or more, or null to remove the limit" in bad.text
    assert queue_limit(db) == (2, "console:ops-team")
    r = c.post("/queues/limit", headers=BEARER, follow_redirects=False,
               data={"queue": "limited", "concurrency": "none"})
    assert r.status_code == 303 and queue_limit(db) == (None, "console:ops-team")
    # Without the token the page has no form.
    assert 'action="/queues/limit"' not in client().get("/queues").text


def _row(page: str, queue: str) -> str:
    found = re.search(rf'<tr>\s*<td><a href="/jobs\?queue={queue}">.*?</tr>', page, re.S)
    assert found, page
    return found.group(0)


def test_the_job_page_and_api_say_what_holds_a_job(db: psycopg.Connection[Any],
                                                    client: Client) -> None:
    first, second = enqueue(db, "acct-7", "acct-7")
    assert claim(db) == [first]
    held = f"waiting for a slot of `concurrency 1 by key=acct-7`: job {first} running"
    c = client()
    assert c.get(f"/api/jobs/{second}").json()["held"] == held
    assert c.get(f"/api/jobs/{first}").json()["held"] is None
    page = c.get(f"/jobs/{second}").text
    assert f'<p id="held"><span class="badge paused">held</span> <span id="held-text">{held}' \
           in page
    assert '<p id="held" hidden>' in c.get(f"/jobs/{first}").text
    # A redacted by-field's value stays hidden in what holds the job.
    hidden = client(redact=("key",))
    doc = hidden.get(f"/api/jobs/{second}").json()
    assert doc["held"] == (f"waiting for a slot of `concurrency 1 by key=[redacted]`: job "
                           f"{first} running")
    assert "acct-7" not in hidden.get(f"/jobs/{second}").text
