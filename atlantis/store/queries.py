"""The named statements of ``queries.sql``, loaded once as typed attributes.

Keeping SQL in one file (and reading it as ``LiteralString``) means no code path glues SQL
from strings; every value reaches PostgreSQL as a parameter.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class Queries:
    enqueue_many: LiteralString
    sync_job_type: LiteralString
    claim: LiteralString
    touch: LiteralString
    finish: LiteralString
    rescue: LiteralString
    worker_upsert: LiteralString
    worker_delete: LiteralString
    worker_list: LiteralString
    job_get: LiteralString
    job_list: LiteralString
    listen: LiteralString
    job_retry: LiteralString
    job_cancel: LiteralString
    notify_queue: LiteralString
    queue_stats: LiteralString
    release_orphans: LiteralString
    queue_known: LiteralString

    def __init__(self, text: str) -> None:
        parts = _HEADER.split(text)
        found: dict[str, str] = {}
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise ValueError(f"query {name!r} is defined twice")
            found[name] = body.strip()
        expected = set(type(self).__annotations__)
        if set(found) != expected:
            raise ValueError(
                f"queries.sql defines {sorted(set(found) - expected)} unknown and misses "
                f"{sorted(expected - set(found))}"
            )
        for name, body in found.items():
            setattr(self, name, body)


def _load() -> Queries:
    text = resources.files("atlantis.store").joinpath("queries.sql").read_text("utf-8")
    return Queries(text)


Q = _load()
