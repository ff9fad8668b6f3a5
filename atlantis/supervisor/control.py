"""Control: what the database announces, heard on LISTEN, with polls as the fallback.

New work on a served queue wakes the claimer; an operator's cancel reaches its attempt
through the ledger; a pause, a resume or a queue limit is looked up at once, as is an
operator's order to this supervisor (orders.py, which polls for it too). NOTIFYs are a fast path
only: a poll finds the cancels (for attempts whose renewals come too seldom to carry them)
and the paused queues that a lost notification never announced.

LISTEN runs on its own connection, to ``--listen-database-url`` when given (a direct one
past a pooler). Polling only, there is none: with ``--no-listen``, or once the LISTEN
connection turns out to go through a pooler in transaction mode, where notifications are
lost (:mod:`atlantis.supervisor.pooler`). Then the claimer finds new work every
``--poll-interval`` (1s), cancels are polled every ``--cancel-poll`` (1s) and pauses every
``--poll-interval`` too, so that each still reaches the supervisor within about a second.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from atlantis.store import supervision as sql
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.supervisor.waiting import until_set
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")


class Control(Service):
    name = "control"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.polling = rt.settings.no_listen
        """No LISTEN: ``--no-listen``, or the LISTEN connection goes through a pooler."""
        self.db_poll = rt.db("poll")
        self._pause_now = asyncio.Event()

    def loops(self) -> list[Loop]:
        if self.polling:
            log.info("polling only (--no-listen): new work every %s, cancels and pauses "
                     "within about a second", format_duration(self.rt.settings.poll_interval))
            return [self._cancel_loop, self._pause_loop]
        return [self._listen_loop, self._cancel_loop, self._pause_loop]

    async def _listen_loop(self) -> None:
        """Wake the claimer on NOTIFY; its poll covers any gap.

        NOTIFYs sent while no session listens are lost, so every new session wakes the
        claimer once. LISTEN is re-issued every ``listen_ping``: a no-op for the server and
        a round trip that proves a quiet connection alive (a half-open one would otherwise
        swallow notifications forever without an error).
        """
        rt = self.rt
        queues = set(rt.settings.queues)
        db = rt.db("listen")
        session = db.connects
        while not rt.draining:
            try:
                await sql.listen(db)
            except (DatabaseUnavailable, StatementRejected):
                await asyncio.sleep(0.1)  # the connection's backoff paces the retries
                continue
            if db.pooled:
                log.warning("the LISTEN connection goes through a connection pooler, where "
                            "notifications are lost: polling only (new work every %s); give "
                            "--listen-database-url a direct URL, or --no-listen",
                            format_duration(rt.settings.poll_interval))
                self.polling = True
                await db.close()
                rt.wake.set()
                return
            if db.connects != session:
                session = db.connects
                rt.wake.set()  # anything enqueued while we were not listening
            try:
                async for channel, payload in db.notifications(rt.settings.listen_ping):
                    if channel == "atlantis_control":
                        self._route(payload)
                    elif payload in queues:
                        rt.wake.set()
            except DatabaseUnavailable:
                continue

    def _route(self, payload: str) -> None:
        """An operator's request: a cancel (for our attempts), a pause, a resume, a limit."""
        try:
            msg = orjson.loads(payload)
            op = msg["op"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            log.warning("ignored a malformed control notification: %.200s", payload)
            return
        rt = self.rt
        if op == "cancel" and msg.get("worker") == rt.worker_id:
            job_id = msg.get("job_id")
            if isinstance(job_id, int):
                rt.ledger.cancel(job_id)
        elif op in ("pause", "resume", "limit") and msg.get("queue") in rt.settings.queues:
            self._pause_now.set()
        elif op == "worker" and msg.get("worker") == rt.worker_id:
            rt.orders_wake.set()  # an operator's drain, eviction or resume (orders.py)

    async def _cancel_loop(self) -> None:
        """Cancels this supervisor did not hear of (a lost NOTIFY), every ``cancel_poll``.

        Each lease renewal also reads its row's cancel request: attempts renewed at least
        as often as this poll (``heartbeat/3 <= cancel_poll``) hear of a cancel that way,
        so the poll runs only while another attempt is in flight.
        """
        rt = self.rt
        looks, needed = -1, True
        while True:
            await asyncio.sleep(rt.settings.cancel_poll)
            if looks != Attempt.looks:  # an attempt started or heard a cancel since: ask again
                looks = Attempt.looks
                every = rt.settings.cancel_poll
                needed = any(not a.cancelling and a.heartbeat / 3 > every
                             for a in rt.ledger.in_flight.values())
            if not needed:
                continue
            try:
                job_ids = await sql.cancel_requests(self.db_poll, rt.worker_id)
            except (DatabaseUnavailable, StatementRejected):
                continue
            for job_id in job_ids:
                rt.ledger.cancel(job_id)

    async def _pause_loop(self) -> None:
        rt = self.rt
        while True:
            try:
                paused, limited = await sql.queue_flags(self.db_poll, list(rt.settings.queues))
            except (DatabaseUnavailable, StatementRejected):
                pass
            else:
                if paused != rt.paused:
                    _changed(rt.paused, paused, "is paused: claiming nothing from it",
                             "is resumed")
                    rt.paused = paused
                    rt.metrics.paused.set(len(paused))
                    rt.wake.set()
                if limited != rt.claim_mode.limited_queues:
                    _changed(rt.claim_mode.limited_queues, limited, "has a concurrency limit now",
                             "has no concurrency limit now")
                    rt.claim_mode.limited_queues = limited
                    rt.wake.set()
            self._pause_now.clear()
            every = rt.settings.pause_poll
            if self.polling:  # no NOTIFY says it sooner
                every = min(every, rt.settings.poll_interval)
            await until_set(self._pause_now, every)


def _changed(was: set[str], now: set[str], added: str, removed: str) -> None:
    """Log the queues that came into ``now`` and those that left it."""
    for q in sorted(now - was):
        log.warning("queue %s %s", q, added)
    for q in sorted(was - now):
        log.warning("queue %s %s", q, removed)
