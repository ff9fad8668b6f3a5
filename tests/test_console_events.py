"""The console sends an event to a job (issue 35's events): ``POST /api/jobs/{id}/events``
and the job page's form ``POST /jobs/{id}/events``, behind the console's token (and, for a
login cookie, its CSRF token), audited as ``send-event``. Starlette's TestClient on the real
app, real PostgreSQL, and a real supervisor for the job that waits for the event. The
Python, SQL and ``tide`` sides: tests/test_events.py.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import warnings

with warnings.catch_warnings():  # newer Starlette prefers the httpx2 fork; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import atlantis
from atlantis.console.app import create_app
from atlantis.console.settings import Settings
from tests.conftest import CONSOLE_BEARER as BEARER
from tests.conftest import CONSOLE_SECRET as SECRET
from tests.conftest import console_audit, job_row, wait_for, wait_state
from tests.docs import bad_input_text

HERE = "tests/test_console_events.py"


def _import_job(db: psycopg.Connection[Any]) -> int:
    """A job no supervisor runs: it stays ``available``, and an event may reach it."""
    return atlantis.enqueue(db, "console.Import", {"account_id": "acme"})


def _events(db: psycopg.Connection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return db.execute("SELECT id, event, payload, sent_by FROM atlantis.job_events "
                      "WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()


def _waiting(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    row = job_row(db, job_id)
    return row if row["state"] == "available" and row["suspended_for"] else None


def test_an_event_from_the_api_wakes_the_job_that_waits_for_it(
        ddb: psycopg.Connection[Any], supervise: Any, console: TestClient) -> None:
    supervise(queues=("durable",), app="tests.apps.durable:registry", concurrency=2)
    job_id = atlantis.enqueue(ddb, "durable.Wait", {"key": "console", "event": "approved",
                                                    "timeout": None})
    wait_for(lambda: _waiting(ddb, job_id), message="the job to wait for its event")
    page = console.get(f"/jobs/{job_id}", headers=BEARER).text
    waits = re.search(r'<p id="asleep"( hidden)?>(.*?)</p>', page, re.S)
    assert waits and waits.group(1) is None and "for event approved" in waits.group(2), page
    form = re.search(r'<form [^>]*id="send-event"[^>]*>(.*?)</form>', page, re.S)
    assert form and " hidden" not in form.group(0).split(">", 1)[0], page
    assert 'name="event" required placeholder="approved" value="approved"' in form.group(1)

    r = console.post(f"/api/jobs/{job_id}/events", headers=BEARER,
                     json={"event": "approved", "payload": {"by": "alice"}})
    assert r.status_code == 200, r.text
    event_id = r.json()["event_id"]
    assert r.json() == {"id": job_id, "event": "approved", "event_id": event_id}
    row = wait_state(ddb, job_id, "complete")
    assert row["result"] == {"by": "alice"}
    assert ddb.execute("SELECT id, event, payload, sent_by, consumed_by FROM atlantis.job_events "
                       "WHERE job_id = %s", (job_id,)).fetchall() == [
        (event_id, "approved", {"by": "alice"}, "console:ops-team", "approval")]
    assert console_audit(ddb) == [("send-event", str(job_id), "ops-team", "sent approved",
                            {"event": "approved", "event_id": event_id})]
    # The job has ended: its page offers the form no more.
    page = console.get(f"/jobs/{job_id}", headers=BEARER).text
    assert re.search(r'<form [^>]*id="send-event"[^>]* hidden', page), page


def test_the_job_page_form_sends_an_event_with_the_login_cookie(
        db: psycopg.Connection[Any], console: TestClient) -> None:
    job_id = _import_job(db)
    r = console.post("/login", data={"token": SECRET, "next": f"/jobs/{job_id}"},
                     follow_redirects=False)
    assert r.status_code == 303
    page = console.get(f"/jobs/{job_id}").text
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert csrf is not None and 'data-action="send-event"' in page
    assert f'data-confirm="Send this event to job {job_id}?"' in page
    # The cookie alone cannot write: the form carries the session's CSRF token.
    assert console.post(f"/jobs/{job_id}/events", data={"event": "nudge"}).status_code == 403
    r = console.post(f"/jobs/{job_id}/events", follow_redirects=False,
                     data={"csrf": csrf.group(1), "event": "nudge", "payload": '[1, "two"]'})
    assert r.status_code == 303, r.text
    [(event_id, event, payload, by)] = _events(db, job_id)
    assert (event, payload, by) == ("nudge", [1, "two"], "console:ops-team")
    assert r.headers["location"] == f"/jobs/{job_id}?event_sent={event_id}"
    shown = console.get(r.headers["location"]).text
    assert f'<p id="event-sent" class="muted">Event {event_id} sent to this job.</p>' in shown
    # Only an event id is ever shown there.
    for bogus in ("x<b>", "9" * 5000, "\u0661"):
        assert 'id="event-sent"' not in console.get(f"/jobs/{job_id}",
                                                    params={"event_sent": bogus}).text
    # An empty payload field sends none.
    r = console.post(f"/jobs/{job_id}/events", follow_redirects=False,
                     data={"csrf": csrf.group(1), "event": "nudge", "payload": "  "})
    assert r.status_code == 303, r.text
    assert [e[2] for e in _events(db, job_id)] == [[1, "two"], None]
    assert [(a[0], a[3]) for a in console_audit(db)] == [("send-event", "sent nudge")] * 2
    assert job_row(db, job_id)["state"] == "available"


def test_an_ended_job_refuses_the_event_with_409_and_the_refusal_is_audited(
        db: psycopg.Connection[Any], supervise: Any, console: TestClient) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "done"})
    supervise()
    wait_state(db, job_id, "complete")
    message = f"job {job_id} is complete: an event can no longer reach it"
    r = console.post(f"/api/jobs/{job_id}/events", headers=BEARER, json={"event": "late"})
    assert (r.status_code, r.json()) == (409, {"error": message})
    page = console.post(f"/jobs/{job_id}/events", headers=BEARER, data={"event": "late"})
    assert page.status_code == 409 and message in page.text
    assert _events(db, job_id) == []
    assert console_audit(db) == [("send-event", str(job_id), "ops-team", f"refused: {message}",
                           {"event": "late"})] * 2


def test_an_unknown_job_is_404(db: psycopg.Connection[Any], console: TestClient) -> None:
    r = console.post("/api/jobs/999999/events", headers=BEARER, json={"event": "x"})
    assert (r.status_code, r.json()) == (404, {"error": "no job with id 999999"})
    page = console.post("/jobs/999999/events", headers=BEARER, data={"event": "x"})
    assert page.status_code == 404 and "no job with id 999999" in page.text
    assert console.post("/api/jobs/nope/events", headers=BEARER,
                        json={"event": "x"}).status_code == 404
    assert db.execute("SELECT count(*) FROM atlantis.job_events").fetchone() == (0,)
    assert console_audit(db) == []


#: id: (the JSON body of POST /api/jobs/{id}/events, the 400's exact text; "{job}" the id)
BAD_BODIES: dict[str, tuple[Any, str]] = {
    "no-event": ({"payload": 1}, "event: missing (the name of the event to send)"),
    "empty-event": ({"event": ""}, "event: missing (the name of the event to send)"),
    "number-event": ({"event": 5}, "event: a string"),
    "nul-in-event": ({"event": "a\u0000b"},
                     "event: contains a NUL character (\\u0000), which PostgreSQL cannot store"),
    "long-event": ({"event": "e" * 201}, "event: at most 200 characters, not 201"),
    "nul-in-payload": ({"event": "x", "payload": {"k": ["\u0000"]}},
                       "payload: contains a NUL character (\\u0000), which PostgreSQL cannot "
                       "store"),
    "oversized-payload": ({"event": "big", "payload": "x" * 65535},
                          "event big to job {job}: its payload is 65537 bytes of JSON, more "
                          "than the limit of 65536"),
    "not-an-object": (["approved"], "the body must be a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_bad_event_is_a_400_and_sends_nothing(db: psycopg.Connection[Any],
                                                console: TestClient, case: str) -> None:
    body, message = BAD_BODIES[case]
    job_id = _import_job(db)
    r = console.post(f"/api/jobs/{job_id}/events", headers=BEARER, json=body)
    assert r.headers["content-type"].startswith("application/json"), r.text
    assert (r.status_code, r.json()) == (400, {"error": message.format(job=job_id)})
    assert _events(db, job_id) == []
    refused = [(a[0], a[3]) for a in console_audit(db)]
    # The database's own refusals are audited; what the console refuses first never reached it.
    assert refused == ([("send-event", f"refused: {message.format(job=job_id)}")]
                       if case == "oversized-payload" else [])


#: id: (the job page form's payload field, the 400's exact text: orjson's, as tide's)
BAD_FORMS: dict[str, tuple[str, str]] = {
    "payload-not-json": ("{by: alice}", "payload: not JSON (unexpected character, expected a "
                                        "string key: line 1 column 2 (char 1))"),
    "payload-nan": ("NaN", "payload: not JSON (unexpected character, expected a JSON value: "
                           "line 1 column 1 (char 0))"),
}


@pytest.mark.parametrize("case", list(BAD_FORMS))
def test_a_form_with_a_payload_that_is_not_json_is_a_clear_400(
        db: psycopg.Connection[Any], console: TestClient, case: str) -> None:
    payload, message = BAD_FORMS[case]
    job_id = _import_job(db)
    page = console.post(f"/jobs/{job_id}/events", headers=BEARER,
                        data={"event": "approved", "payload": payload})
    assert page.status_code == 400 and "text/html" in page.headers["content-type"]
    assert f'<p class="error-text" id="error-message">{message}</p>' in page.text, page.text
    assert _events(db, job_id) == [] and console_audit(db) == []


def test_without_the_right_to_write_it_is_refused(db: psycopg.Connection[Any],
                                                  db_url: str, console: TestClient) -> None:
    job_id = _import_job(db)
    body = {"event": "approved"}
    r = console.post(f"/api/jobs/{job_id}/events", json=body)
    assert (r.status_code, r.json()) == (403, {"error": "writes need Authorization: Bearer "
                                                        "TOKEN"})
    r = console.post(f"/api/jobs/{job_id}/events", json=body,
                     headers={"Authorization": "Bearer nope"})
    assert (r.status_code, r.json()) == (401, {"error": "wrong token"})
    assert console.post(f"/jobs/{job_id}/events", data=body).status_code == 403
    anonymous = console.get(f"/jobs/{job_id}").text
    assert 'id="send-event"' not in anonymous and "data-action" not in anonymous
    # A console without a token is read-only for everyone, bearer or not.
    with TestClient(create_app(Settings(db_url)), base_url="http://127.0.0.1") as read_only:
        r = read_only.post(f"/api/jobs/{job_id}/events", json=body, headers=BEARER)
        assert r.status_code == 403 and "read-only console" in r.json()["error"]
        assert 'id="send-event"' not in read_only.get(f"/jobs/{job_id}").text
    assert _events(db, job_id) == [] and console_audit(db) == []


def test_the_bad_input_table_quotes_these_messages() -> None:
    text = bad_input_text()
    for case, (_, message) in BAD_BODIES.items():
        quoted = message.replace("{job}", "N")
        assert f"| 400, `{quoted}` | `{HERE}::test_a_bad_event_is_a_400_and_sends_nothing" \
               f"[{case}]` |" in text, case
    for case, (_, message) in BAD_FORMS.items():
        assert f"`{message}` | `{HERE}::test_a_form_with_a_payload_that_is_not_json_is_a_" \
               f"clear_400[{case}]` |" in text, case
