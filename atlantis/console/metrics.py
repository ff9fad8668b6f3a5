"""``GET /metrics``: the scaling gauges of :mod:`atlantis.scaling` in Prometheus's text
format, the same ``tide metrics serve`` serves, read from the database at each scrape.

A read like the others: open unless the console is ``--private``, where it takes
``Authorization: Bearer TOKEN`` (Prometheus's ``authorization`` scrape setting); a wrong
token is refused (401). A database that cannot be read serves ``atlantis_database_up 0``.
"""

from __future__ import annotations

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from atlantis import scaling
from atlantis.console.common import ApiError, db_of, require_read
from atlantis.store.deadline import StatementDeadline


async def metrics(request: Request) -> Response:
    try:
        require_read(request)
    except ApiError as exc:
        return PlainTextResponse(exc.message + "\n", status_code=exc.status,
                                 headers={"WWW-Authenticate": "Bearer"})
    failure: Exception | None = None
    try:
        reading = await db_of(request).run(scaling.read)
    except (psycopg.Error, OSError, StatementDeadline) as exc:
        failure = exc

    def source() -> scaling.Reading:
        if failure is not None:
            raise failure
        return reading

    return Response(generate_latest(scaling.registry(source)), media_type=CONTENT_TYPE_LATEST)


routes = [Route("/metrics", metrics)]
