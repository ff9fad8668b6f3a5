"""What the framework modules share: the one check on the psycopg connection they found."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from atlantis.errors import AtlantisError


def check_not_aborted(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
                      where: str) -> None:
    """Refuse a connection whose transaction an earlier error aborted.

    PostgreSQL would refuse the enqueue anyway; this says why, and keeps atlantis from
    rolling back, under the framework's feet, a transaction the framework still holds open.
    """
    if raw.info.transaction_status == TransactionStatus.INERROR:
        raise AtlantisError(
            f"{where}: the transaction is aborted by an earlier error; roll it back before "
            "enqueueing")
