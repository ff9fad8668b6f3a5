"""The contact-import example with transaction steps: the guide's import, no state table.

:mod:`examples.contacts.app` is the guide's handler: a state table of its own
(``contact_import_state``) holds the cursor, saved in the same transaction as each page's
contacts, and read back by every run. Here atlantis keeps that record instead: one
``ctx.transaction(f"page-{n}", ...)`` per page fetches the page, upserts its contacts and
returns the next cursor, and atlantis commits those writes together with the step's record
and a check that this run still holds the job (its lease). On a later run of the job (a
crash, a killed worker, a retry) every recorded page returns its record without running,
so the loop walks the recorded cursors and carries on at the first page not committed yet.
The writes of a page therefore happen exactly once, whatever dies when. Run the worker with::

    atlantis-supervise --queue contacts --app examples.contacts.durable:registry

with ``CONTACTS_CRM_URL`` set, as for the state-table version. It claims only
``directory.ImportContactsDurable`` (the one job this registry has a handler for); run both
apps, or one of each, on the same queue.

What changes against the guide's handler:

* **No state table, no open/resume statement.** The records are the state: the loop is
  written as if it ran once, from the first page.
* **The page is fetched inside its step**, so a resumed run fetches no page it has a record
  of; only the page in flight when the previous run died is fetched again (its writes were
  rolled back with the rest of its transaction).
* **The upsert stays.** Exactly-once is about committed writes; ``ON CONFLICT`` still keeps
  the table right if an account is imported again by a new job.
* **The counters travel in the records**: each step returns the running totals with the
  cursor, so progress after a resume is exact without a table to keep them.
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

import atlantis
from examples.contacts.app import (
    Contact,
    InterruptedImportError,
    crm_url,
    fetch_page,
    percent_done,
)

#: The declarations of the example (the same file as app.py's); this registry has a handler
#: for the durable import only.
registry = atlantis.Registry.from_atl("jobs.atl")

JOB = "directory.ImportContactsDurable"


class ImportContactsArgs(Protocol):
    """The declared arguments (``args { account_id varchar(64) not null }``)."""

    @property
    def account_id(self) -> str: ...


_UPSERT_CONTACT = """
INSERT INTO contacts (account_id, contact_id, name, email)
VALUES (%s, %s, %s, %s)
ON CONFLICT (account_id, contact_id) DO UPDATE
   SET name = EXCLUDED.name, email = EXCLUDED.email, imported_at = now()
"""


def upsert_contacts(conn: psycopg.Connection[Any], account: str,
                    contacts: list[Contact]) -> None:
    """Write ``contacts`` of ``account`` with ``conn``, in the caller's transaction."""
    with conn.cursor() as cur:
        cur.executemany(_UPSERT_CONTACT, [(account, c.id, c.name, c.email) for c in contacts])


def import_page(conn: psycopg.Connection[Any], base: str, account: str,
                done: dict[str, Any]) -> dict[str, Any]:
    """One transaction step: fetch the page after ``done["cursor"]``, upsert its contacts.

    Runs inside the step's transaction on ``conn`` (and uses nothing else to write): what it
    returns is recorded in that transaction, and becomes the ``done`` of the next page.
    """
    page = fetch_page(base, account, done["cursor"])
    upsert_contacts(conn, account, page.contacts)
    return {
        "cursor": page.next_cursor,
        "pages": done["pages"] + 1,
        "contacts": done["contacts"] + len(page.contacts),
        "total_estimate": page.total_estimate,
    }


@registry.handler(JOB)
def import_contacts_durable(ctx: atlantis.JobContext,
                            args: ImportContactsArgs) -> dict[str, int]:
    """Import every contact of ``args.account_id``, one transaction step per page.

    The loop reads as a single run from the first page. On a re-run, ``ctx.transaction``
    returns the recorded value of each page already committed (without fetching or writing
    it), so the loop reaches the first unrecorded page with the cursor and the counters
    that page needs. Returns the totals (the job's result).
    """
    base = crm_url()
    done: dict[str, Any] = {"cursor": "", "pages": 0, "contacts": 0, "total_estimate": 0}
    while True:
        if ctx.cancelled:
            # Raised, not returned: the import is not complete. The next run resumes at
            # the first page without a record.
            raise InterruptedImportError(f"stopped before page {done['pages']}")
        done = ctx.transaction(f"page-{done['pages']}", import_page,
                               base, args.account_id, done)
        atlantis.checkpoint(ctx, percent_done(done["contacts"], done["total_estimate"]),
                            f"page={done['pages']} contacts={done['contacts']}")
        if not done["cursor"]:
            break
    return {"pages": done["pages"], "contacts": done["contacts"]}
