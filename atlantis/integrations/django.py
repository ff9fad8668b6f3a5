"""Enqueue inside Django's transaction: ``transaction.atomic()`` on the psycopg 3 backend.

::

    from django.db import transaction
    from atlantis.integrations import django as jobs

    with transaction.atomic():
        order = Order.objects.create(...)
        jobs.enqueue("shop.SendReceipt", {"order_id": order.id})

The job's row is written on the connection Django uses for ``using`` (``"default"``), in
the transaction the ``atomic()`` block opened: supervisors see the job when that block
commits, never before, and a block that rolls back (an exception leaves it) takes the job
with it. Outside any ``atomic()`` block Django runs in autocommit, and the job is
committed at once, as the ORM's writes are. A refused call (an unknown job, bad args)
raises the atlantis error and leaves the block's transaction usable, with all that was
done in it (a savepoint undoes the one statement).

There is no ``on_commit`` variant, on purpose: a job enqueued from
``transaction.on_commit`` is written after the commit, so a crash or a lost connection
between the two loses it while the order it was for stays. Written in the transaction,
the job and the order commit together or not at all.

Django must use PostgreSQL through psycopg 3 (``ENGINE``
``django.db.backends.postgresql``, which prefers psycopg 3 when it is installed, as it is
with atlantis). Any other backend, or one on psycopg2, is refused with a
:class:`~atlantis.ConfigurationError`. Everything atlantis sends on this connection is
never prepared, so it goes through PgBouncer in transaction mode as Django's own queries
do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Unpack

import psycopg
from django.db import connections

import atlantis
from atlantis.enqueue import EnqueueOptions
from atlantis.errors import ConfigurationError
from atlantis.integrations.common import check_not_aborted


def connection(using: str = "default") -> psycopg.Connection[Any]:
    """The psycopg 3 connection under Django's connection ``using``, connected.

    For any call of the public API that has no helper here:
    ``atlantis.retry(connection(), job_id)``. What is done on it belongs to the
    transaction Django has open on it (see the module's docstring).
    """
    wrapper = connections[using]
    engine = wrapper.settings_dict.get("ENGINE", "?")
    if wrapper.vendor != "postgresql":
        raise ConfigurationError(
            f"Django database {using!r} uses {engine} ({wrapper.vendor}): atlantis needs "
            "PostgreSQL (ENGINE django.db.backends.postgresql, with psycopg 3)")
    wrapper.ensure_connection()
    # Django refuses queries in an atomic block whose error was caught without a rollback
    # (TransactionManagementError): so does this.
    wrapper.validate_no_broken_transaction()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        kind = f"{type(raw).__module__}.{type(raw).__qualname__}"
        raise ConfigurationError(
            f"Django database {using!r} ({engine}) connects with {kind}: atlantis needs "
            "psycopg 3 (pip install 'psycopg[binary]'; Django's postgresql backend then "
            "uses it instead of psycopg2)")
    check_not_aborted(raw, f"Django database {using!r}")
    return raw


def enqueue(
    job: str,
    args: Mapping[str, Any] | None = None,
    *,
    using: str = "default",
    **options: Unpack[EnqueueOptions],
) -> int:
    """:func:`atlantis.enqueue` on Django's connection ``using``; returns the job's id."""
    return atlantis.enqueue(connection(using), job, args, **options)


def enqueue_many(
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    *,
    using: str = "default",
    **options: Unpack[EnqueueOptions],
) -> list[int]:
    """:func:`atlantis.enqueue_many` on Django's connection ``using``; the ids in order."""
    return atlantis.enqueue_many(connection(using), job, args_list, **options)


def start_workflow(name: str, args: Mapping[str, Any] | None = None, *,
                   using: str = "default") -> int:
    """:func:`atlantis.start_workflow` on Django's connection ``using``; its id."""
    return atlantis.start_workflow(connection(using), name, args)


def cancel(job_id: int, *, by: str | None = None, using: str = "default") -> str | None:
    """:func:`atlantis.cancel` on Django's connection ``using``: done when it commits."""
    return atlantis.cancel(connection(using), job_id, by=by)
