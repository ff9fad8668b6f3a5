"""One LISTEN connection per console process, fanned out to every browser.

The supervisors already NOTIFY: ``atlantis_jobs`` (work was enqueued, one per statement and
queue), ``atlantis_control`` (cancel, pause, resume) and ``atlantis_progress`` (a JSON
array of the ids of jobs whose row changed: a checkpoint sample, at most one a second per
job, or a finished attempt; one per statement). The :class:`Broker` listens to all three on
a single connection (``console_listen`` in the store) and, at most every ``debounce``
seconds:

- tells list pages to refresh (one ``refresh`` event, whatever number of notifications);
- reads again, once for all their viewers, the rows of the jobs whose pages are open and
  that a notification named, and sends each viewer the job's document when it changed;
- reads again the workflows whose pages are open and one of whose rows (steps and
  compensations, as of the workflow's last read) a notification named, and sends each
  viewer the workflow's document when it changed (a step's new row is seen when the step
  before it finishes: that row is the workflow's already).

Fallbacks that do not depend on a NOTIFY arriving: the rows of open job pages, and the
open workflows, are read again every ``poll_interval`` (a transition nobody notifies, a
lost notification, the LISTEN connection down), and list pages get a refresh as often
while the connection is down. New log lines of every open job page are read by one statement every
``log_interval`` (logs are not notified: the supervisor's hot path pays nothing for a
console). None of this costs a query per viewer: ten viewers of a job cost what one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
import psycopg

from atlantis.console.data import Database, dumps, job_page_doc, workflow_doc
from atlantis.presentation import log_document
from atlantis.store import admin
from atlantis.store import console_queries as store
from atlantis.store.workflows import Workflow, get_workflow

log = logging.getLogger("atlantis.console")

#: How many events a slow viewer may have waiting before new ones are dropped.
QUEUE_SIZE = 1000


@dataclass(eq=False)
class Subscriber:
    """One open page: ``job_id`` None for a list page or a workflow's (``workflow_id``).
    Events are ``(name, data)``: ``("refresh", b"{}")``, ``("job", json)``, ``("log",
    json)``, ``("workflow", json)``."""

    job_id: int | None
    log_after: int = 0
    workflow_id: int | None = None
    queue: asyncio.Queue[tuple[str, bytes]] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_SIZE))

    def put(self, name: str, data: bytes) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait((name, data))


class Broker:
    def __init__(self, url: str, db: Database, *, redact: frozenset[str] = frozenset(),
                 poll_interval: float = 2.0, log_interval: float = 1.0,
                 debounce: float = 0.25) -> None:
        self.url = url
        self.db = db
        self.redact = redact
        self.poll_interval = poll_interval
        self.log_interval = log_interval
        self.debounce = debounce
        self.listening = False
        self.notifications = 0
        self._lists: set[Subscriber] = set()
        self._jobs: dict[int, set[Subscriber]] = defaultdict(set)
        self._last_doc: dict[int, bytes] = {}
        self._workflows: dict[int, set[Subscriber]] = defaultdict(set)
        self._workflow_rows: dict[int, set[int]] = {}
        """The ids of each open workflow's rows, as of its last read."""
        self._last_workflow_doc: dict[int, bytes] = {}
        self._dirty: set[int] = set()
        self._lists_dirty = False
        self._log_after: int | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- life ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._listen(), name="console-listen"),
                       asyncio.create_task(self._flush(), name="console-flush"),
                       asyncio.create_task(self._logs(), name="console-logs")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        # Bounded: a task waiting on a database that does not answer must not hold the
        # console's shutdown (a statement in a worker thread cannot be interrupted).
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait(self._tasks, timeout=5.0)
        self._tasks = []

    # -- subscriptions ------------------------------------------------------------------

    def subscribe_lists(self) -> Subscriber:
        sub = Subscriber(None)
        self._lists.add(sub)
        return sub

    def subscribe_job(self, job_id: int, log_after: int) -> Subscriber:
        """A viewer of one job, which has read the job's log up to line ``log_after``."""
        sub = Subscriber(job_id, log_after)
        self._jobs[job_id].add(sub)
        # Read from there on for everyone (viewers drop the lines they have already).
        self._log_after = log_after if self._log_after is None else min(self._log_after,
                                                                        log_after)
        return sub

    def subscribe_workflow(self, workflow_id: int, rows: set[int], doc: dict[str, Any]
                           ) -> Subscriber:
        """A viewer of one workflow, which has read its document ``doc`` (its rows:
        ``rows``)."""
        sub = Subscriber(None, workflow_id=workflow_id)
        if workflow_id not in self._workflows:
            self._workflow_rows[workflow_id] = set(rows)
            self._last_workflow_doc[workflow_id] = changes_of(doc)
        self._workflows[workflow_id].add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._lists.discard(sub)
        if sub.workflow_id is not None:
            viewers = self._workflows.get(sub.workflow_id)
            if viewers is not None:
                viewers.discard(sub)
                if not viewers:
                    del self._workflows[sub.workflow_id]
                    self._workflow_rows.pop(sub.workflow_id, None)
                    self._last_workflow_doc.pop(sub.workflow_id, None)
        if sub.job_id is not None:
            viewers = self._jobs.get(sub.job_id)
            if viewers is not None:
                viewers.discard(sub)
                if not viewers:
                    del self._jobs[sub.job_id]
                    self._last_doc.pop(sub.job_id, None)
            if not self._jobs:
                self._log_after = None

    @property
    def viewers(self) -> int:
        return (len(self._lists) + sum(len(v) for v in self._jobs.values())
                + sum(len(v) for v in self._workflows.values()))

    # -- the LISTEN connection ----------------------------------------------------------

    async def _listen(self) -> None:
        backoff = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, application_name="atlantis-console-listen")
                async with conn:
                    await store.listen(conn)
                    self.listening = True
                    backoff = 0.5
                    # Whatever happened while nobody listened: refresh everything once.
                    self._lists_dirty = True
                    self._dirty.update(self._jobs)
                    self._dirty.update(i for rows in self._workflow_rows.values() for i in rows)
                    self._wake.set()
                    async for note in conn.notifies():
                        self._heard(note.channel, note.payload)
            except asyncio.CancelledError:
                self.listening = False
                raise
            except Exception as exc:  # an outage: the polling fallback covers it
                log.warning("console LISTEN connection lost: %s", exc)
            self.listening = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _heard(self, channel: str, payload: str) -> None:
        self.notifications += 1
        self._lists_dirty = True
        if channel == "atlantis_progress":
            try:
                ids = orjson.loads(payload)
            except orjson.JSONDecodeError:
                ids = []
            if isinstance(ids, list):
                self._dirty.update(i for i in ids if isinstance(i, int))
        elif channel == "atlantis_control":
            try:
                op = orjson.loads(payload)
            except orjson.JSONDecodeError:
                op = None
            if isinstance(op, dict) and isinstance(op.get("job_id"), int):
                self._dirty.add(op["job_id"])
        self._wake.set()

    # -- fan-out ------------------------------------------------------------------------

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + self.poll_interval
        while True:
            timeout = max(next_poll - loop.time(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            polling = loop.time() >= next_poll
            if polling:
                next_poll = loop.time() + self.poll_interval
            try:
                await self._send(polling)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("console refresh failed: %s", exc)
            await asyncio.sleep(self.debounce)  # at most 1/debounce refreshes a second

    async def _send(self, polling: bool) -> None:
        if self._lists_dirty or (polling and not self.listening):
            self._lists_dirty = False
            for sub in list(self._lists):
                sub.put("refresh", b"{}")
        wanted = set(self._jobs) if polling else self._dirty & set(self._jobs)
        flows = {w for w, rows in self._workflow_rows.items() if polling or rows & self._dirty}
        self._dirty.clear()
        if flows:
            await self._send_workflows(sorted(flows))
        if not wanted:
            return
        docs = await self.db.run(lambda conn: self._read(conn, sorted(wanted)))
        for job_id, data in docs.items():
            if self._last_doc.get(job_id) == data:
                continue
            self._last_doc[job_id] = data
            for sub in list(self._jobs.get(job_id, ())):
                sub.put("job", data)

    async def _send_workflows(self, ids: list[int]) -> None:
        docs = await self.db.run(lambda conn: self._read_workflows(conn, ids))
        for workflow_id, (rows, key, data) in docs.items():
            if workflow_id not in self._workflows:
                continue  # its last viewer left meanwhile
            self._workflow_rows[workflow_id] = rows
            if self._last_workflow_doc.get(workflow_id) == key:
                continue
            self._last_workflow_doc[workflow_id] = key
            for sub in list(self._workflows.get(workflow_id, ())):
                sub.put("workflow", data)

    def _read_workflows(self, conn: psycopg.Connection[Any],
                        ids: list[int]) -> dict[int, tuple[set[int], bytes, bytes]]:
        """Per workflow: its rows' ids, what tells a change (the document without the
        clock) and the document."""
        found: dict[int, tuple[set[int], bytes, bytes]] = {}
        for workflow_id in ids:
            flow = get_workflow(conn, workflow_id)
            if flow is not None:
                doc = workflow_doc(flow, self.redact)
                found[workflow_id] = (workflow_rows(flow), changes_of(doc), dumps(doc))
        return found

    def _read(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        for job_id in ids:
            row = admin.get_job(conn, job_id)
            if row is not None:
                found[job_id] = dumps(job_page_doc(conn, row, self.redact))
        return found

    async def _logs(self) -> None:
        while True:
            await asyncio.sleep(self.log_interval)
            after = self._log_after
            if after is None or not self._jobs:
                continue
            ids = sorted(self._jobs)
            try:
                lines = await self.db.run(partial(_logs_since, ids=ids, after=after))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("console log read failed: %s", exc)
                continue
            if not lines:
                continue
            if self._log_after is not None:
                self._log_after = max(self._log_after, lines[-1].id)
            by_job: dict[int, list[store.ConsoleLogLine]] = defaultdict(list)
            for line in lines:
                by_job[line.job_id].append(line)
            for job_id, batch in by_job.items():
                for sub in list(self._jobs.get(job_id, ())):
                    fresh = [ln for ln in batch if ln.id > sub.log_after]
                    if fresh:
                        sub.log_after = fresh[-1].id
                        sub.put("log", dumps([log_document(ln) for ln in fresh]))


def _logs_since(conn: psycopg.Connection[Any], *, ids: list[int],
                after: int) -> list[store.ConsoleLogLine]:
    return store.logs_since(conn, ids, after)


def workflow_rows(flow: Workflow) -> set[int]:
    """The ids of a workflow's rows (steps that have one, and compensations)."""
    return {s.job_id for s in flow.steps if s.job_id is not None}


def changes_of(doc: dict[str, Any]) -> bytes:
    """A workflow's document without the clock: equal for two reads with nothing new."""
    return dumps({k: v for k, v in doc.items() if k != "now"})
