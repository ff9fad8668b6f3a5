"""The contact-import example: a long-running handler that survives being run twice.

This is the worked example of the guide "Write a long-running handler", in Python. The
job imports an account's full contact list from an upstream CRM that paginates at about
100 contacts per request. Run the worker with::

    atlantis-supervise --queue contacts --app examples.contacts.app:registry

and give it the CRM's base URL in ``CONTACTS_CRM_URL`` (the supervisor's environment
reaches every handler).

Three rules shape the handler:

* **Idempotency.** atlantis runs each job on one worker at a time, but a crash, a lost
  lease or a retry runs the same arguments again. Every write here is an upsert, so the
  work a second run re-does overwrites the same rows instead of duplicating them.
* **The cursor in our own table is the source of truth for resume.** Each page's contacts
  and the cursor that follows them are committed in one transaction: after any crash the
  state row names exactly the first page whose contacts are not stored yet.
* **Progress in atlantis is for operators only.** :func:`atlantis.checkpoint` mirrors the
  counters to ``progress_pct``/``progress_msg`` for ``tide job status``; the handler
  never reads them back, because the resume logic must not depend on a column it does
  not own (and whose writes are advisory and may be coalesced).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg

import atlantis

#: The declarations of this app; the path is looked up beside this module.
registry = atlantis.Registry.from_atl("jobs.atl")

#: The environment variable holding the CRM's base URL, e.g. ``http://127.0.0.1:8080``.
CRM_URL_ENV = "CONTACTS_CRM_URL"

#: Contacts asked for per page; the CRM may answer with fewer.
PAGE_LIMIT = 100

#: Seconds one page request may take before the attempt fails (and is retried from the
#: saved cursor). Far below the job's 10-minute heartbeat window, so a hung upstream
#: surfaces as an error instead of a silent stall.
FETCH_TIMEOUT = 60.0

SCHEMA_FILE = Path(__file__).with_name("schema.sql")


class ImportContactsArgs(Protocol):
    """The declared arguments (``args { account_id varchar(64) not null }``)."""

    @property
    def account_id(self) -> str: ...


@dataclass(frozen=True)
class Contact:
    id: str
    name: str
    email: str


@dataclass(frozen=True)
class Page:
    """One page of the CRM's answer. ``next_cursor == ""`` means this was the last page."""

    contacts: list[Contact]
    next_cursor: str
    total_estimate: int


class CRMError(Exception):
    """The CRM could not be reached or answered with something unusable.

    Raising it fails the attempt; atlantis retries with backoff, and the retry resumes at
    the cursor saved by the last committed page.
    """


class InterruptedImportError(Exception):
    """Cancellation or a shutdown reached the attempt between two pages.

    Raised rather than returning: a handler that returns is reported ``complete``, and
    this import is not. The supervisor decides the row's fate (released on a drain,
    cancelled on ``tide job cancel``); the next attempt resumes at the saved cursor.
    """


def ensure_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the example's tables if they are missing (``schema.sql`` is idempotent).

    Commits on its own, so the tables exist for handlers running in other processes.
    """
    with conn.transaction():
        conn.execute(SCHEMA_FILE.read_text("utf-8"))


def database_url(ctx: atlantis.JobContext) -> str:
    """The database this attempt was dispatched from (the example keeps its tables there)."""
    url = ctx.database_url or os.environ.get("ATLANTIS_DATABASE_URL")
    if not url:
        raise atlantis.Discard("no database URL: neither ctx.database_url nor ATLANTIS_DATABASE_URL")
    return url


def crm_url() -> str:
    """The CRM's base URL from ``CONTACTS_CRM_URL``.

    A missing URL is a configuration error no retry can fix, so the job goes to the
    dead-letter queue at once (``Discard``) instead of burning its attempts.
    """
    url = os.environ.get(CRM_URL_ENV, "").rstrip("/")
    if not url:
        raise atlantis.Discard(f"{CRM_URL_ENV} is not set in the supervisor's environment")
    return url


def fetch_page(
    base_url: str, account_id: str, cursor: str, *,
    limit: int = PAGE_LIMIT, timeout: float = FETCH_TIMEOUT, page: int | None = None,
) -> Page:
    """``GET /accounts/<id>/contacts?cursor=...&limit=...``, parsed; CRMError on failure.

    The cursor is opaque: it is only ever echoed back as the CRM handed it out. With
    ``page`` (a number from 0), page ``page`` of ``limit`` contacts instead (``?page=``;
    ``cursor`` is then not sent): what the fan-out import's children ask for.
    """
    asked: dict[str, str | int] = ({"cursor": cursor, "limit": limit} if page is None
                                   else {"page": page, "limit": limit})
    where = f"after cursor={cursor!r}" if page is None else f"{page}"
    query = urllib.parse.urlencode(asked)
    account = urllib.parse.quote(account_id, safe="")
    url = f"{base_url}/accounts/{account}/contacts?{query}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        raise CRMError(f"fetch page {where}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CRMError(f"fetch page {where}: {exc}") from exc
    try:
        return Page(
            contacts=[Contact(str(c["id"]), str(c["name"]), str(c["email"]))
                      for c in body["contacts"]],
            next_cursor=str(body.get("next_cursor") or ""),
            total_estimate=int(body.get("total_estimate") or 0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CRMError(f"unexpected answer for page {where}: {exc!r}") from exc


def percent_done(done: int, total_estimate: int) -> float:
    """Progress for operators. The total is the CRM's estimate, so clamp to 0..100."""
    if total_estimate <= 0:
        return 0.0
    return max(0.0, min(100.0, 100.0 * done / total_estimate))


_OPEN = """
INSERT INTO contact_import_state (account_id, status)
VALUES (%(account)s, 'running')
ON CONFLICT (account_id) DO UPDATE
   SET status = CASE WHEN contact_import_state.status = 'complete' THEN 'complete'
                     ELSE 'running' END,
       updated_at = now()
RETURNING status, next_cursor, pages_done, contacts_done
"""

_UPSERT_CONTACT = """
INSERT INTO contacts (account_id, contact_id, name, email)
VALUES (%s, %s, %s, %s)
ON CONFLICT (account_id, contact_id) DO UPDATE
   SET name = EXCLUDED.name, email = EXCLUDED.email, imported_at = now()
"""

_SAVE_PAGE = """
UPDATE contact_import_state
   SET next_cursor = %(cursor)s,
       pages_done = %(pages)s,
       contacts_done = %(contacts)s,
       status = CASE WHEN %(cursor)s = '' THEN 'complete' ELSE 'running' END,
       updated_at = now()
 WHERE account_id = %(account)s
"""


@registry.handler("directory.ImportContacts")
def import_contacts(ctx: atlantis.JobContext, args: ImportContactsArgs) -> None:
    """Import every contact of ``args.account_id``, resuming where an earlier run stopped.

    1. Idempotent open: upsert the state row and read back the cursor and counters. A
       first run gets a fresh row (no cursor: the first page); a re-run gets what the
       last committed page left. An import already ``complete`` stays complete and the
       re-run is a no-op (delete its state row to import the account afresh).
    2. One page per iteration: fetch, then upsert its contacts *and* save the next cursor
       and counters in one transaction. The data and the cursor can never disagree, so
       the counters stay exact across crashes and a resumed run fetches no page twice
       except the one that was in flight when the previous run died.
    3. The last page marks the import complete in that same transaction. Were it a
       separate statement, a crash between the two would leave a finished cursor on a
       ``running`` row, and the next run could not tell "done" from "not started".
    """
    account = args.account_id
    base = crm_url()
    with psycopg.connect(database_url(ctx), autocommit=True,
                         application_name="contacts-import") as conn:
        # 1. Idempotent open: resume cursor + counters from the state table.
        with conn.transaction():
            row = conn.execute(_OPEN, {"account": account}).fetchone()
        assert row is not None
        status, saved_cursor, pages, contacts = row
        if status == "complete":
            atlantis.checkpoint(ctx, 100, f"already complete pages={pages} contacts={contacts}")
            return
        cursor: str = saved_cursor or ""
        atlantis.checkpoint(ctx, 0, f"resuming pages={pages} contacts={contacts}")

        # 2. Paginated fetch + write. Each iteration is one upstream page.
        while True:
            if ctx.cancelled:
                raise InterruptedImportError(f"stopped before the page at cursor={cursor!r}")
            page = fetch_page(base, account, cursor)
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    _UPSERT_CONTACT,
                    [(account, c.id, c.name, c.email) for c in page.contacts],
                )
                pages += 1
                contacts += len(page.contacts)
                cur.execute(_SAVE_PAGE, {"cursor": page.next_cursor, "pages": pages,
                                         "contacts": contacts, "account": account})
            cursor = page.next_cursor

            # Mirror to atlantis for `tide job status`; advisory, never read back.
            atlantis.checkpoint(ctx, percent_done(contacts, page.total_estimate),
                                f"page={pages} contacts={contacts}")
            if not cursor:
                break

    # 3. Complete: recorded with the last page above.
    atlantis.checkpoint(ctx, 100, f"complete pages={pages} contacts={contacts}")
