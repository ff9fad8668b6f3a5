"""The contact-import example (examples/contacts): the guide's worked example, for real.

The fake CRM alone first, then the handler under a real ``atlantis-supervise``: several
imports end complete with every contact exactly once, and an import whose supervisor is
SIGKILLed half-way resumes from the cursor it saved, without fetching its first pages
again and without duplicating a row.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import psutil
import psycopg
import pytest

import atlantis
from atlantis.store import migrate, sync
from examples.contacts.app import (
    CRM_URL_ENV,
    CRMError,
    ensure_schema,
    fetch_page,
    percent_done,
    registry,
)
from examples.contacts.crm import FakeCRM, decode_cursor, encode_cursor, expected_contacts
from tests.conftest import job_row, wait_for, wait_state

APP = "examples.contacts.app:registry"
JOB = "directory.ImportContacts"


def fetch_all(crm: FakeCRM, account: str) -> list[dict[str, str]]:
    """Walk the CRM's pages the way the handler does, without a database."""
    contacts: list[dict[str, str]] = []
    cursor = ""
    while True:
        page = fetch_page(crm.url, account, cursor, timeout=5)
        contacts += [{"id": c.id, "name": c.name, "email": c.email} for c in page.contacts]
        assert page.total_estimate == crm.expected_contacts(account)
        cursor = page.next_cursor
        if not cursor:
            return contacts


# ---- the fake CRM, no database ------------------------------------------------------------

def test_fake_crm_is_deterministic_and_paginates_fully() -> None:
    assert expected_contacts("acme") == expected_contacts("acme")
    assert expected_contacts("acme", 42) == 42
    assert decode_cursor(encode_cursor(300)) == 300
    assert decode_cursor("") == 0
    with pytest.raises(ValueError):
        decode_cursor("not a cursor")

    with FakeCRM(page_delay=0, page_size=100) as one, FakeCRM(page_delay=0, page_size=37) as two:
        for account in ("acme", "globex", "a/b c"):
            first = fetch_all(one, account)
            again = fetch_all(one, account)
            other = fetch_all(two, account)  # other page size, same data
            assert first == again == other
            assert len(first) == expected_contacts(account) == one.expected_contacts(account)
            assert len({c["id"] for c in first}) == len(first)
            # Every page was asked for once per walk, in order, starting at the first page.
            cursors = one.requests(account)
            assert len(cursors) == 2 * one.expected_pages(account)
            assert cursors[0] == ""
            assert all(one.request_count(account, c) == 2 for c in cursors)


def test_fake_crm_exact_counts_and_injected_failures() -> None:
    with FakeCRM(page_delay=0, contacts_per_account=250, fail_first=1) as crm:
        with pytest.raises(CRMError, match="HTTP 500"):
            fetch_page(crm.url, "acme", "", timeout=5)
        contacts = fetch_all(crm, "acme")
        assert len(contacts) == 250 and crm.expected_pages("acme") == 3
        assert crm.request_count("acme", "") == 1  # the failed request does not count
        assert crm.requests("acme")[:2] == ["", ""]


def test_percent_done_is_clamped() -> None:
    assert percent_done(0, 0) == 0
    assert percent_done(50, 200) == 25
    assert percent_done(300, 200) == 100


# ---- under a real supervisor ------------------------------------------------------------------

@pytest.fixture
def contacts_db(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The test database with the example's declarations synced and its tables created."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        migrate(conn)
        sync(conn, list(registry.decls.values()))
        ensure_schema(conn)
        yield conn


def enqueue_imports(conn: psycopg.Connection[Any], accounts: list[str]) -> list[int]:
    with conn.transaction():
        return atlantis.enqueue_many(conn, JOB, [{"account_id": a} for a in accounts])


def import_state(conn: psycopg.Connection[Any], account: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT status, next_cursor, pages_done, contacts_done FROM contact_import_state"
        " WHERE account_id = %s", (account,)).fetchone()


def stored(conn: psycopg.Connection[Any], account: str) -> tuple[int, int]:
    """(rows, distinct contact ids) stored for an account."""
    row = conn.execute(
        "SELECT count(*), count(DISTINCT contact_id) FROM contacts WHERE account_id = %s",
        (account,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def start_worker(supervise: Any, crm: FakeCRM) -> Any:
    return supervise("--drain-timeout", "5s", queues=("contacts",), app=APP, concurrency=2,
                     env={CRM_URL_ENV: crm.url})


def test_imports_every_contact_exactly_once(
    contacts_db: psycopg.Connection[Any], supervise: Any
) -> None:
    accounts = ["acme", "globex", "initech"]
    with FakeCRM(page_delay=0.005) as crm:
        ids = enqueue_imports(contacts_db, accounts)
        start_worker(supervise, crm)
        for job_id in ids:
            row = wait_state(contacts_db, job_id, "complete", "dead", timeout=25)
            assert row["state"] == "complete", row["last_error"]
            assert row["attempt"] == 1
            assert row["progress_pct"] == 100
            assert row["progress_msg"].startswith("complete pages=")
        for account in accounts:
            expected = crm.expected_contacts(account)
            assert stored(contacts_db, account) == (expected, expected)
            assert import_state(contacts_db, account) == (
                "complete", "", crm.expected_pages(account), expected)
            # Each page was fetched once: nothing was imported twice.
            cursors = crm.requests(account)
            assert len(cursors) == len(set(cursors)) == crm.expected_pages(account)

        # Running a finished import again is a no-op: no fetch, no write.
        (again,) = enqueue_imports(contacts_db, ["acme"])
        row = wait_state(contacts_db, again, "complete", "dead", timeout=15)
        assert row["state"] == "complete"
        assert row["progress_msg"].startswith("already complete")
        assert len(crm.requests("acme")) == crm.expected_pages("acme")


def test_killed_import_resumes_from_its_cursor(
    contacts_db: psycopg.Connection[Any], supervise: Any
) -> None:
    account = "kill-me"
    # 20 pages of 100 at 0.1 s each: slow enough to kill after page 2, fast enough to finish.
    with FakeCRM(page_delay=0.1, contacts_per_account=2000) as crm:
        expected = crm.expected_contacts(account)
        pages_total = crm.expected_pages(account)
        (job_id,) = enqueue_imports(contacts_db, [account])
        first = start_worker(supervise, crm)

        def mid_import() -> tuple[Any, ...] | None:
            state = import_state(contacts_db, account)
            return state if state and state[2] >= 2 and state[0] != "complete" else None

        wait_for(mid_import, timeout=20, interval=0.02, message="two pages imported")
        # SIGKILL: no drain, no goodbye. The handler's child dies with its supervisor
        # (parent-death signal); wait until it is really gone before anyone resumes.
        children = psutil.Process(first.pid).children(recursive=True)
        assert children, "the supervisor has no child running the handler"
        first.signal(signal.SIGKILL)
        first.wait(10)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"children outlived their supervisor: {alive}"

        status, saved_cursor, pages_saved, contacts_saved = import_state(contacts_db, account) or ()
        assert status == "running" and 2 <= pages_saved < pages_total
        assert saved_cursor == encode_cursor(100 * pages_saved)
        assert contacts_saved == 100 * pages_saved
        assert stored(contacts_db, account) == (contacts_saved, contacts_saved)
        assert job_row(contacts_db, job_id)["state"] == "running"

        # The heartbeat is 10m: stand in for those ten minutes by expiring the lease, then
        # let a new supervisor rescue the row and run the job's next attempt.
        contacts_db.execute(
            "UPDATE atlantis.jobs SET claimed_until = now() - interval '1 second'"
            " WHERE id = %s AND state = 'running'", (job_id,))
        start_worker(supervise, crm)
        row = wait_state(contacts_db, job_id, "complete", "dead", timeout=25)
        assert row["state"] == "complete", row["last_error"]
        assert row["attempt"] == 2
        assert [e["kind"] for e in row["errors"]] == ["lease_expired"]

        # Every contact exactly once, and the counters exact: no page was counted twice.
        assert stored(contacts_db, account) == (expected, expected)
        assert import_state(contacts_db, account) == ("complete", "", pages_total, expected)

        # The second run started at the saved cursor: the pages committed before the kill
        # were served once. Only the page in flight at the kill may have been served twice.
        committed = ["", *(encode_cursor(100 * p) for p in range(1, pages_saved))]
        assert [crm.request_count(account, c) for c in committed] == [1] * pages_saved
        assert crm.request_count(account, saved_cursor) in (1, 2)
        later = [encode_cursor(100 * p) for p in range(pages_saved + 1, pages_total)]
        assert [crm.request_count(account, c) for c in later] == [1] * len(later)
