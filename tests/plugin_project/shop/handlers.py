"""The shop's handlers: small versions of the guide's contact import (a state table with
the cursor, committed with each page), its transaction-step version, and a broken one."""

from __future__ import annotations

from typing import Any

import psycopg

import atlantis

registry = atlantis.Registry.from_atl("jobs.atl")

PAGES = 2
PER_PAGE = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS import_state (account text PRIMARY KEY, next_page int NOT NULL,
                                         done bool NOT NULL DEFAULT false);
CREATE TABLE IF NOT EXISTS contacts (account text, contact text, PRIMARY KEY (account, contact));
CREATE TABLE IF NOT EXISTS contacts_nokey (account text, contact text);
"""


def setup(conn: psycopg.Connection[Any]) -> None:
    """The shop's tables."""
    conn.execute(SCHEMA)


def fetch_page(account: str, page: int) -> list[str]:
    """The upstream API: page ``page`` of the account's contacts."""
    return [f"{account}-{page}-{i}" for i in range(PER_PAGE)]


@registry.handler("shop.Add")
def add(ctx: atlantis.JobContext, args: Any) -> dict[str, int]:
    ctx.checkpoint(50, "adding")
    return {"sum": args.a + args.b}


@registry.handler("shop.Fail")
def fail(ctx: atlantis.JobContext, args: Any) -> None:
    raise RuntimeError(args.why)


@registry.handler("shop.Import")
def import_contacts(ctx: atlantis.JobContext, args: Any) -> int:
    """The guide's handler: an idempotent open of the state row, then per page the contacts
    (upserts) and the next cursor in one transaction."""
    with ctx.connect(autocommit=True) as conn:
        with conn.transaction():
            row = conn.execute(
                "INSERT INTO import_state (account, next_page) VALUES (%s, 0) "
                "ON CONFLICT (account) DO UPDATE SET account = EXCLUDED.account "
                "RETURNING next_page, done", (args.account,)).fetchone()
        assert row is not None
        page, done = int(row[0]), bool(row[1])
        while not done and page < PAGES:
            with conn.transaction():
                for contact in fetch_page(args.account, page):
                    conn.execute("INSERT INTO contacts VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                 (args.account, contact))
                page += 1
                conn.execute("UPDATE import_state SET next_page = %s, done = %s "
                             "WHERE account = %s", (page, page == PAGES, args.account))
            ctx.checkpoint(100 * page / PAGES, f"page {page}")
    return page


def _page(conn: psycopg.Connection[Any], account: str, page: int) -> int:
    for contact in fetch_page(account, page):
        conn.execute("INSERT INTO contacts VALUES (%s, %s) ON CONFLICT DO NOTHING",
                     (account, contact))
    return page + 1


@registry.handler("shop.ImportDurable")
def import_durable(ctx: atlantis.JobContext, args: Any) -> int:
    """The transaction-step version: each page's writes commit with the step's record."""
    page = 0
    while page < PAGES:
        page = ctx.transaction(f"page-{page}", _page, args.account, page)
        ctx.checkpoint(100 * page / PAGES, f"page {page}")
    return page


@registry.handler("shop.ImportNoKey")
def import_nokey(ctx: atlantis.JobContext, args: Any) -> int:
    """Not idempotent: a page's rows (no key) and the cursor commit apart."""
    with ctx.connect(autocommit=True) as conn:
        conn.execute("INSERT INTO import_state (account, next_page) VALUES (%s, 0) "
                     "ON CONFLICT DO NOTHING", (args.account,))
        row = conn.execute("SELECT next_page FROM import_state WHERE account = %s",
                           (args.account,)).fetchone()
        assert row is not None
        page = int(row[0])
        while page < PAGES:
            with conn.transaction():
                for contact in fetch_page(args.account, page):
                    conn.execute("INSERT INTO contacts_nokey VALUES (%s, %s)",
                                 (args.account, contact))
            page += 1
            conn.execute("UPDATE import_state SET next_page = %s WHERE account = %s",
                         (page, args.account))
            ctx.checkpoint(100 * page / PAGES, f"page {page}")
    return page
