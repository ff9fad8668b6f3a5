"""The scaling signal as Prometheus gauges, for a process that runs no job: ``tide metrics
serve`` and the console's ``/metrics`` (issue 37).

Each scrape reads the database once (:func:`read`: ``atlantis.queue_signal()`` and the
silent supervisors) through :class:`SignalCollector`, a custom collector: nothing is kept
between scrapes, so a queue that is gone loses its series and one that appears gets them
at once. The supervisor's own ``--metrics-port`` serves its attempts, leases and rescues,
never these: every process that serves them reads the same rows, and a fleet scrapes one
of them (docs/howto/scaling.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from atlantis.store import scaling
from atlantis.store.deadline import StatementDeadline
from atlantis.store.scaling import Fleet, QueueSignal

#: The per-queue gauges (label ``queue``): name, help, the field of :class:`QueueSignal`.
QUEUE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("atlantis_queue_claimable", "Waiting jobs of the queue that are due and free to be "
     "claimed now (not delayed, not held by a limit, the queue not paused); exact up to "
     "1000, estimated beyond.", "claimable"),
    ("atlantis_queue_oldest_claimable_seconds", "How long the oldest claimable job of the "
     "queue has been due, in seconds (0 when none is).", "oldest_claimable_seconds"),
    ("atlantis_queue_running", "Jobs of the queue running now.", "running"),
    ("atlantis_queue_delayed", "Waiting jobs of the queue not due yet (a later run_at, a "
     "retry's backoff).", "delayed"),
    ("atlantis_queue_limit_held", "Due waiting jobs of the queue that a concurrency or rate "
     "limit holds now.", "limit_held"),
    ("atlantis_queue_suspended", "Jobs of the queue suspended by a durable sleep or wait "
     "that is not over.", "suspended"),
    ("atlantis_queue_paused", "1 while an operator has paused the queue, else 0.", "paused"),
)
WORKERS_SILENT = "atlantis_workers_silent"
WORKERS_HELD = "atlantis_workers_held"
DATABASE_UP = "atlantis_database_up"
#: Every name this collector serves.
NAMES = (*(name for name, _, _ in QUEUE_GAUGES), WORKERS_SILENT, WORKERS_HELD, DATABASE_UP)


@dataclass(frozen=True, slots=True)
class Reading:
    """What one scrape read: every queue's signal, and the supervisors (silent, held)."""

    queues: list[QueueSignal]
    fleet: Fleet


def read(conn: psycopg.Connection[Any]) -> Reading:
    """One scrape's rows, read on ``conn``."""
    return Reading(scaling.queue_signal(conn), scaling.fleet(conn))


class SignalCollector(Collector):
    """The gauges of one :class:`Reading`, taken from ``source`` at every collect. A source
    that raises (the database unreachable) makes the scrape serve ``atlantis_database_up 0``
    alone (``on_error`` is told why), never an error page: an alert on that gauge, or on the
    queue series going absent, says it."""

    def __init__(self, source: Callable[[], Reading],
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self.source = source
        self.on_error = on_error

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected only when scraped: registering reads nothing

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(DATABASE_UP, "1 when this scrape could read the database, "
                               "else 0 (and no other atlantis series).")
        try:
            reading = self.source()
        except (psycopg.Error, OSError, StatementDeadline) as exc:
            if self.on_error is not None:
                self.on_error(exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from gauges(reading)


def gauges(reading: Reading) -> Iterator[Metric]:
    """The metric families of ``reading``."""
    for name, text, field in QUEUE_GAUGES:
        family = GaugeMetricFamily(name, text, labels=["queue"])
        for q in reading.queues:
            value = getattr(q, field)
            family.add_metric([q.queue], float(value or 0))
        yield family
    silent = GaugeMetricFamily(WORKERS_SILENT, "Supervisors not seen for two of their own "
                               "liveness intervals (tide worker list says silent).")
    silent.add_metric([], reading.fleet.silent)
    yield silent
    held = GaugeMetricFamily(WORKERS_HELD, "Supervisor names an operator's order holds until "
                             "tide worker resume (order: drain or evict), whether or not a "
                             "supervisor of the name runs now.", labels=["order"])
    held.add_metric(["drain"], reading.fleet.drained)
    held.add_metric(["evict"], reading.fleet.evicted)
    yield held


def registry(source: Callable[[], Reading],
             on_error: Callable[[Exception], None] | None = None) -> CollectorRegistry:
    """A registry holding a :class:`SignalCollector` of ``source`` alone."""
    found = CollectorRegistry(auto_describe=False)
    found.register(SignalCollector(source, on_error))
    return found
