"""The contact-import example fanned out: one child job per page, joined by their parent.

:mod:`examples.contacts.durable` imports an account's pages one after the other, a cursor
at a time, in one job. Here the pages are imported side by side, each by a job of its own:

1. the parent (``directory.ImportContactsFanOut``) learns how many pages there are at run
   time, in a ``ctx.run_step``: the CRM's first page says how many contacts the account has
   and how many a page holds. The count is recorded, so every later run of the parent sees
   the same one, whatever the CRM says by then;
2. it spawns one ``directory.ImportContactsPage`` per page with ``ctx.spawn(f"page-{n}",
   ...)``: each spawn enqueues its child and records the child's id in one transaction, so
   a parent killed half-way and run again gets the ids back and spawns no page twice;
3. it joins them (``ctx.join``): the run ends there, holding no process and no slot, and the
   last page's end wakes it; the join then returns every page's result (the number of
   contacts it imported), in page order, and the parent returns the totals;
4. each child fetches its page by number (``?page=n``) and upserts its contacts in one
   ``ctx.transaction``: its writes happen exactly once, whatever dies when.

Run the worker with::

    atlantis-supervise --queue contacts --app examples.contacts.fan_out:registry \\
        --concurrency 4

with ``CONTACTS_CRM_URL`` set, as for the other versions. It claims only the two jobs this
registry has handlers for. A page that ends ``dead`` (its retries spent) or ``cancelled``
makes the join raise :class:`atlantis.ChildFailed`: the parent then ends ``dead`` at once
(``atlantis.Discard``), naming the pages, since running it again cannot bring them back.
Retry the dead page (``tide job retry PAGE_ID``), then the parent (``tide job retry
PARENT_ID``): the parent keeps its records, so it spawns nothing anew and joins again.
Cancelling the parent cancels its pages still waiting or running.
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

import atlantis
from examples.contacts.app import PAGE_LIMIT, InterruptedImportError, crm_url, fetch_page
from examples.contacts.durable import upsert_contacts

#: The declarations of the example (the same file as app.py's and durable.py's); this
#: registry has handlers for the fan-out's parent and its pages only.
registry = atlantis.Registry.from_atl("jobs.atl")

JOB = "directory.ImportContactsFanOut"
PAGE_JOB = "directory.ImportContactsPage"

#: How many failed pages a dead parent's error names (the rest are counted).
NAMED_PAGES = 20


class FanOutArgs(Protocol):
    """The parent's declared arguments (``args { account_id varchar(64) not null }``)."""

    @property
    def account_id(self) -> str: ...


class PageArgs(Protocol):
    """A page's declared arguments: the account, the page's number (from 0), its size."""

    @property
    def account_id(self) -> str: ...

    @property
    def page(self) -> int: ...

    @property
    def per_page(self) -> int: ...


def count_pages(base: str, account: str) -> dict[str, int]:
    """The page-count step: the first page's answer says how many contacts the account has
    and how many a page holds (the CRM may hand out fewer than asked for)."""
    first = fetch_page(base, account, "", limit=PAGE_LIMIT)
    per_page = max(1, len(first.contacts))
    return {"pages": max(1, -(-first.total_estimate // per_page)), "per_page": per_page}


def import_numbered_page(conn: psycopg.Connection[Any], base: str, account: str, page: int,
                         per_page: int) -> int:
    """A page's transaction step: fetch page ``page``, upsert its contacts with ``conn`` (and
    nothing else), and return how many there were."""
    got = fetch_page(base, account, "", limit=per_page, page=page)
    upsert_contacts(conn, account, got.contacts)
    return len(got.contacts)


@registry.handler(PAGE_JOB)
def import_contacts_page(ctx: atlantis.JobContext, args: PageArgs) -> int:
    """Import one page; the number of contacts it held is the job's result (what the
    parent's join returns for it)."""
    return int(ctx.transaction("import", import_numbered_page, crm_url(), args.account_id,
                               args.page, args.per_page))


@registry.handler(JOB)
def import_contacts_fan_out(ctx: atlantis.JobContext, args: FanOutArgs) -> dict[str, int]:
    """Count the pages, spawn one page job each, join them, return the totals.

    Every run (the first, a resume after the join, a rerun after a crash) goes through the
    same code from the top: the count and each spawn return their records, so only what
    the last run did not record yet is done.
    """
    base = crm_url()
    count = ctx.run_step("count", count_pages, base, args.account_id)
    ids: list[int] = []
    for page in range(count["pages"]):
        if ctx.cancelled:
            # The cancel cancels the pages spawned so far; spawn no more.
            raise InterruptedImportError(f"stopped before spawning page {page}")
        ids.append(ctx.spawn(f"page-{page}", PAGE_JOB, {
            "account_id": args.account_id, "page": page, "per_page": count["per_page"]}))
    atlantis.checkpoint(ctx, 0, f"{len(ids)} pages spawned; waiting for them")
    try:
        imported = ctx.join("pages", ids)
    except atlantis.ChildFailed as exc:
        raise atlantis.Discard(failed_pages(ids, exc)) from exc
    atlantis.checkpoint(ctx, 100, f"complete pages={len(ids)} contacts={sum(imported)}")
    return {"pages": len(ids), "contacts": sum(imported)}


def failed_pages(ids: list[int], exc: atlantis.ChildFailed) -> str:
    """Why the parent ends dead: which pages did not import (``exc.failed``, by page), and
    the join's own message (each one's state and last error)."""
    page_of = {job_id: n for n, job_id in enumerate(ids)}
    named = ", ".join(f"{page_of.get(job_id, '?')} (job {job_id}, {state})"
                      for job_id, state, _ in exc.failed[:NAMED_PAGES])
    more = f" and {len(exc.failed) - NAMED_PAGES} more" if len(exc.failed) > NAMED_PAGES else ""
    return f"pages that did not import: {named}{more}; {exc}"
