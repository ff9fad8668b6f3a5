"""The driver's side of the durable waits (issue 35): it keeps about WAITERS ``chaos.Waiter``
and FANS ``chaos.Fan`` going through the faults, and sends each waiter its events.

Each waiter gets one event of each name of :data:`chaos.waits.EVENTS`, sent on the
driver's own connection at a random time up to SEND_WITHIN seconds after the driver first
saw the job (a waiter works 20-800 ms before its first wait, so some events come before the
job reaches its wait and some after), each with a payload ``{"nonce": <unique>}``, and each
noted (:class:`chaos.waits.Sent`: the job, the event, the nonce, the id ``send_event``
returned). A send whose answer is lost (the server restarts) is looked up by its nonce
before it is sent again, so that no event is sent twice. Waiters are found in the table,
not taken from the enqueue's answer, which a restart may lose though the enqueue
committed. The arguments come from a random stream of their own, so that a seed draws
the rest of the mix as it did before them.
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg

import atlantis
from chaos import waits
from chaos.cluster import Cluster

WAITERS = 3
"""About this many ``chaos.Waiter`` waiting or running at any time."""
FANS = 2
"""... and this many ``chaos.Fan``, each of 5-10 ``chaos.Leaf``."""
SEND_WITHIN = 4.0
"""Seconds after a waiter is first seen within which each of its events is sent."""


@dataclass
class Pending:
    due: float
    job_id: int
    event: str
    nonce: str
    uncertain: bool = False
    """A send went out and its answer was lost: it may have committed."""


def waiter_args(rng: random.Random) -> dict[str, Any]:
    """20-800 ms of work before the first wait; 20% fail their first attempt once they
    received the first event."""
    return {"tick_ms": rng.randint(20, 800), "fail": "first" if rng.random() < 0.2 else "never"}


def fan_args(rng: random.Random) -> dict[str, Any]:
    """5-10 leaves spawned 50-300 ms apart (so that faults land amid the spawns), leaves of
    10-80 ms (30% of fan-outs: 0.3-0.8 s); in 30% one leaf fails its first attempt, 20% of
    fan-outs fail their first attempt halfway through their spawns."""
    n = rng.randint(5, 10)
    leaf = rng.randint(300, 800) if rng.random() < 0.3 else rng.randint(10, 80)
    return {"n": n, "tick_ms": rng.randint(50, 300), "leaf_ms": leaf,
            "fail_leaf": rng.randrange(n) if rng.random() < 0.3 else -1,
            "fail": "first" if rng.random() < 0.2 else "never"}


class Sender:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.sent: list[waits.Sent] = []
        self.enqueued = 0
        self._seen: set[int] = set()
        self._pending: list[Pending] = []
        self._next = 0.0
        self._looked = False

    def step(self, now: float, *, enqueue: bool = True) -> None:
        """Every half second: find new waiters, plan their events, top the jobs up; at every
        call, send the events that are due."""
        if now >= self._next:
            self._next = now + 0.5
            self._look(now, enqueue)
        self._send_due(now)

    def finish(self, seconds: float) -> bool:
        """Once the faults stop: send every event still to be sent (to every waiter there is),
        for at most ``seconds``; whether all went."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._next = 0.0
            for p in self._pending:
                p.due = 0.0
            self.step(time.monotonic(), enqueue=False)
            if not self._pending and self._next > 0.0 and self._looked:
                return True
            time.sleep(0.1)
        return False

    def _look(self, now: float, enqueue: bool) -> None:
        self._looked = False
        rows = self.cluster.query(
            "SELECT id, job, state IN ('available', 'running') FROM atlantis.jobs "
            " WHERE job = %s OR (job = %s AND state IN ('available', 'running'))",
            (waits.WAITER, waits.FAN))
        if rows is None:
            return
        self._looked = True
        for job_id, job, _ in rows:
            if job == waits.WAITER and job_id not in self._seen:
                self._seen.add(job_id)
                self._pending += [Pending(now + self.rng.uniform(0, SEND_WITHIN), job_id, e,
                                          secrets.token_hex(8)) for e in waits.EVENTS]
        live = Counter(job for _, job, going in rows if going)
        more = {waits.WAITER: [waiter_args(self.rng)
                               for _ in range(max(0, WAITERS - live[waits.WAITER]))],
                waits.FAN: [fan_args(self.rng) for _ in range(max(0, FANS - live[waits.FAN]))]}
        conn = self.cluster.conn()
        if not enqueue or conn is None or not any(more.values()):
            return
        try:
            with conn.transaction():
                for job, args in more.items():
                    if args:
                        self.enqueued += len(atlantis.enqueue_many(conn, job, args))
        except psycopg.OperationalError:  # the server restarts: enqueue again later
            self.cluster.disconnect()

    def _send_due(self, now: float) -> None:
        for p in [p for p in self._pending if p.due <= now]:
            if not self._send(p):
                return  # the server is away: try again at the next call
            self._pending.remove(p)

    def _send(self, p: Pending) -> bool:
        """Send ``p`` (or find that it went); whether it is settled (sent or refused)."""
        conn = self.cluster.conn()
        if conn is None:
            return False
        try:
            found = conn.execute(
                "SELECT id FROM atlantis.job_events "
                " WHERE job_id = %s AND event = %s AND payload->>'nonce' = %s",
                (p.job_id, p.event, p.nonce)).fetchone() if p.uncertain else None
            event_id = int(found[0]) if found else atlantis.send_event(
                conn, p.job_id, p.event, {"nonce": p.nonce}, by="chaos")
        except atlantis.JobEndedError:  # cancelled meanwhile
            event_id = None
        except psycopg.OperationalError:
            p.uncertain = True
            self.cluster.disconnect()
            return False
        self.sent.append(waits.Sent(p.job_id, p.event, p.nonce, event_id))
        return True
