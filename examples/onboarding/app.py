"""The onboarding example: the contacts example's import as the middle step of a workflow.

``workflow Onboard`` (``jobs.atl``) creates an account, imports its contacts (the contacts
example's job and handler, :mod:`examples.contacts.app`), then sends a welcome. When a step
fails for good, the workflow times out or an operator cancels it, atlantis runs the
compensations of the steps that started, newest first: ``directory.PurgeContacts`` undoes
the import, then ``onboarding.DeleteAccount`` the account. Run the worker with::

    atlantis-supervise --queue default --queue contacts --app examples.onboarding.app:registry

(``CONTACTS_CRM_URL`` set as for the contacts example), and start one with
``atlantis.start_workflow(conn, "onboarding.Onboard", {"account_id": "acme"})``.

What every handler here keeps to:

* **Idempotent under ``ctx.idempotency_key``.** The key is the same on every attempt of a
  step (``"{workflow_id}:{step}"``), and another for its compensation
  (``"{workflow_id}:{step}:compensate"``). Each effect is recorded under it in the
  transaction that makes it, in ``onboarding_journal``; an attempt that finds its key there
  returns what the first one did instead of doing it again.
* **A small JSON result.** What a step returns is stored as its job's ``result`` and handed
  to the steps after it in ``ctx.results`` (the welcome names the import's count).
* **A compensation tolerates a step that did nothing.** A step that started may have had
  its effect without completing (its result is then ``None``), or none at all: the undo
  deletes what is there, finds nothing to delete without complaint, and says which.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

import atlantis
from examples.contacts import app as contacts

#: The declarations: this example's jobs and workflow, and the contacts example's job.
registry = atlantis.Registry.from_atl("jobs.atl", "../contacts/jobs.atl")

WORKFLOW = "onboarding.Onboard"
SCHEMA_FILE = Path(__file__).with_name("schema.sql")


class AccountArgs(Protocol):
    """The args every job of the workflow takes (``args { account_id varchar(64) not null }``)."""

    @property
    def account_id(self) -> str: ...


def ensure_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the tables of both examples if they are missing (each file is idempotent)."""
    contacts.ensure_schema(conn)
    with conn.transaction():
        conn.execute(SCHEMA_FILE.read_text("utf-8"))


def connect(ctx: atlantis.JobContext) -> psycopg.Connection[Any]:
    """The database the attempt was dispatched from, as the contacts example finds it."""
    return psycopg.connect(contacts.database_url(ctx), autocommit=True,
                           application_name=ctx.job)


_JOURNAL = """
INSERT INTO onboarding_journal (idempotency_key, workflow_id, step, compensation, account_id,
                                detail)
VALUES (%(key)s, %(workflow_id)s, %(step)s, %(compensation)s, %(account)s, %(detail)s)
ON CONFLICT (idempotency_key) DO NOTHING
"""


def journal(conn: psycopg.Connection[Any], ctx: atlantis.JobContext, account: str,
            detail: dict[str, Any]) -> dict[str, Any]:
    """Record ``detail`` under ``ctx.idempotency_key``, unless an earlier attempt did; return
    what is recorded (the first attempt's detail). Call it in the effect's transaction."""
    conn.execute(_JOURNAL, {"key": ctx.idempotency_key, "workflow_id": ctx.workflow_id,
                            "step": ctx.step, "compensation": ctx.compensating is not None,
                            "account": account, "detail": Jsonb(detail)})
    row = conn.execute("SELECT detail FROM onboarding_journal WHERE idempotency_key = %s",
                       (ctx.idempotency_key,)).fetchone()
    assert row is not None
    recorded: dict[str, Any] = row[0]
    return recorded


def already_done(conn: psycopg.Connection[Any], ctx: atlantis.JobContext) -> dict[str, Any] | None:
    """What an earlier attempt of this key recorded, or None."""
    row = conn.execute("SELECT detail FROM onboarding_journal WHERE idempotency_key = %s",
                       (ctx.idempotency_key,)).fetchone()
    return None if row is None else dict(row[0])


def forward_key(ctx: atlantis.JobContext) -> str:
    """The idempotency key of the step a compensation undoes (its own without the suffix)."""
    return ctx.idempotency_key.removesuffix(":compensate")


def say_compensating(ctx: atlantis.JobContext) -> None:
    """One line in the attempt's log (``tide job logs``): what is undone, and why."""
    why = ctx.compensating
    cause = (f"step {why.step} failed" if why and why.step
             else "the workflow was cancelled or timed out")
    print(f"undoing step {ctx.step} of workflow {ctx.workflow_id} ({cause}): "
          f"ctx.compensating={why!r}", flush=True)


# ---- forward steps ------------------------------------------------------------------------

@registry.handler("onboarding.CreateAccount")
def create_account(ctx: atlantis.JobContext, args: AccountArgs) -> dict[str, Any]:
    """Create the account row, owned by this step's idempotency key.

    A second attempt finds the row it created and returns the same result. An account that
    another workflow created is left alone: the step is discarded (dead, not retried),
    which fails this workflow; its compensation then finds nothing of its own to delete.
    """
    account = args.account_id
    with connect(ctx) as conn, conn.transaction():
        conn.execute("INSERT INTO accounts (account_id, created_by) VALUES (%s, %s)"
                     " ON CONFLICT DO NOTHING", (account, ctx.idempotency_key))
        row = conn.execute("SELECT created_by, created_at FROM accounts WHERE account_id = %s",
                           (account,)).fetchone()
        assert row is not None
        owner, created_at = row
        if owner != ctx.idempotency_key:
            raise atlantis.Discard(f"account {account} already exists (created by {owner})")
        created = created_at.isoformat(timespec="seconds")
        return journal(conn, ctx, account, {"account_id": account, "created_at": created})


@registry.handler("directory.ImportContacts")
def import_contacts(ctx: atlantis.JobContext, args: AccountArgs) -> dict[str, Any]:
    """The contacts example's import, unchanged (resumable from its cursor, every write an
    upsert), then the count it left, as this step's result."""
    contacts.import_contacts(ctx, args)
    with connect(ctx) as conn, conn.transaction():
        row = conn.execute("SELECT count(*) FROM contacts WHERE account_id = %s",
                           (args.account_id,)).fetchone()
        assert row is not None
        return journal(conn, ctx, args.account_id, {"contacts": int(row[0])})


@registry.handler("onboarding.SendWelcome")
def send_welcome(ctx: atlantis.JobContext, args: AccountArgs) -> dict[str, Any]:
    """Send (here: record) the welcome, once per idempotency key, naming the number of
    contacts the import step returned (``ctx.results``).

    While ``mail_outage`` holds its row, the provider refuses: the step is discarded (dead
    at once, no retry), and the workflow compensates.
    """
    account = args.account_id
    imported = (ctx.results.get("import") or {}).get("contacts")
    with connect(ctx) as conn, conn.transaction():
        done = already_done(conn, ctx)
        if done is not None:
            return done
        outage = conn.execute("SELECT reason FROM mail_outage").fetchone()
        if outage is not None:
            raise atlantis.Discard(f"the mail provider refused the welcome to {account}: "
                                   f"{outage[0]}")
        body = f"Welcome, {account}! We brought along your {imported} contacts."
        conn.execute("INSERT INTO welcome_messages (idempotency_key, account_id, body)"
                     " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                     (ctx.idempotency_key, account, body))
        return journal(conn, ctx, account, {"message": ctx.idempotency_key,
                                            "contacts": imported})


# ---- compensations ------------------------------------------------------------------------

@registry.handler("onboarding.DeleteAccount")
def delete_account(ctx: atlantis.JobContext, args: AccountArgs) -> dict[str, Any]:
    """Undo ``create``: delete the account row if this workflow's step created it.

    ``ctx.results["create"]`` is None when the step started but never completed; the row
    may exist all the same, so the delete goes by the step's key, not by its result.
    """
    say_compensating(ctx)
    account = args.account_id
    with connect(ctx) as conn, conn.transaction():
        done = already_done(conn, ctx)
        if done is not None:
            return done
        deleted = conn.execute("DELETE FROM accounts WHERE account_id = %s AND created_by = %s",
                               (account, forward_key(ctx))).rowcount
        return journal(conn, ctx, account, {
            "deleted": deleted == 1,
            "step_completed": ctx.results.get("create") is not None,
        })


@registry.handler("directory.PurgeContacts")
def purge_contacts(ctx: atlantis.JobContext, args: AccountArgs) -> dict[str, Any]:
    """Undo ``import``: delete the account's contacts and its import state (so that a later
    import starts afresh). Pages an interrupted import committed are deleted too; an import
    that fetched nothing leaves nothing to delete."""
    say_compensating(ctx)
    account = args.account_id
    imported = ctx.results.get("import")
    with connect(ctx) as conn, conn.transaction():
        done = already_done(conn, ctx)
        if done is not None:
            return done
        purged = conn.execute("DELETE FROM contacts WHERE account_id = %s", (account,)).rowcount
        conn.execute("DELETE FROM contact_import_state WHERE account_id = %s", (account,))
        return journal(conn, ctx, account, {
            "purged": purged,
            "imported": imported.get("contacts") if isinstance(imported, dict) else None,
        })
