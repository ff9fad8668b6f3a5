"""Prometheus metrics of one supervisor, served on ``--metrics-port``."""

from __future__ import annotations

import socket
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class MetricsUnavailable(Exception):  # noqa: N818 - a configuration problem, not a bug
    """``--metrics-port``/``--metrics-host`` cannot be listened on: a usage error (exit 2)."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.attempts = Counter(
            "atlantis_attempts_total", "Attempts that ended, by outcome.",
            ["queue", "job", "outcome"], registry=self.registry)
        self.duration = Histogram(
            "atlantis_attempt_duration_seconds", "Wall time of attempts, claim to result.",
            ["queue", "job"], registry=self.registry,
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 1800, 3600, 7200))
        self.in_flight = Gauge(
            "atlantis_in_flight", "Attempts running now.", registry=self.registry)
        self.children = Gauge(
            "atlantis_children", "Child processes alive now.", registry=self.registry)
        self.database_up = Gauge(
            "atlantis_database_up", "1 while the database answers, 0 during an outage.",
            registry=self.registry)
        self.leases_lost = Counter(
            "atlantis_leases_lost_total", "Attempts stopped because their lease was lost.",
            registry=self.registry)
        self.renewals = Counter(
            "atlantis_lease_renewals_total", "Renewal statements that came back: each renews "
            "every lease due (one statement per renewal tick, however many attempts run).",
            registry=self.registry)
        self.leases_renewed = Counter(
            "atlantis_leases_renewed_total", "Leases renewed (rows), over all statements.",
            registry=self.registry)
        self.rescued = Counter(
            "atlantis_rescued_total", "Rows of dead workers this supervisor rescued.",
            registry=self.registry)
        self.stalled = Gauge(
            "atlantis_stalled_jobs", "Running jobs of the served queues with no checkpoint "
            "for longer than their stall threshold.", registry=self.registry)
        self.paused = Gauge(
            "atlantis_paused_queues", "Served queues an operator paused.", registry=self.registry)
        self.dead = Gauge(
            "atlantis_dead_jobs", "Jobs of the served queues in the dead-letter queue.",
            registry=self.registry)
        self.held = Gauge(
            "atlantis_jobs_held", "Due waiting jobs of limited jobs or queues, not running yet: "
            "held by a concurrency or rate limit, or not claimed yet (each queue's count stops "
            "at 10000).", ["queue"], registry=self.registry)
        self.queue_limit = Gauge(
            "atlantis_queue_concurrency_limit", "The concurrency limit of a served queue (tide "
            "queue limit); no sample for a queue without one.", ["queue"],
            registry=self.registry)
        self.workflows = Gauge(
            "atlantis_workflows", "Workflows in each state, in the whole database (every "
            "supervisor reports the same counts; each stops at 100000).", ["state"],
            registry=self.registry)
        self.schedule_missed = Counter(
            "atlantis_schedule_slots_missed_total", "Schedule slots skipped because they were "
            "already later than the grace when a round first saw them (nothing ran then); "
            "counted by the supervisor that recorded them.", ["job"], registry=self.registry)
        self.schedule_skipped = Counter(
            "atlantis_schedule_slots_skipped_total", "Schedule slots not enqueued because an "
            "earlier run of the schedule was still waiting or running (overlap skip); counted "
            "by the supervisor that recorded them.", ["job"], registry=self.registry)
        self.step_records = Counter(
            "atlantis_handler_step_records_total", "Handler step records written (ctx.run_step, "
            "ctx.transaction, ctx.sleep), as the attempts that wrote them reported.", ["queue"],
            registry=self.registry)
        self.asleep = Gauge(
            "atlantis_jobs_asleep", "Jobs of a served queue suspended by a durable sleep "
            "(available, waiting for their wake time).", ["queue"], registry=self.registry)
        self.waiting = Gauge(
            "atlantis_jobs_waiting", "Jobs of a served queue suspended until something "
            "happens: an event (`for` event) or the end of the jobs they joined (`for` join).",
            ["queue", "for"], registry=self.registry)
        self.events = Gauge(
            "atlantis_events", "Events the database keeps for the jobs of a served queue: "
            "sent and not yet delivered (`pending`) or delivered to a wait (`delivered`).",
            ["queue", "state"], registry=self.registry)
        self.child_jobs = Gauge(
            "atlantis_child_jobs", "Children (jobs a handler spawned) the database keeps in a "
            "served queue, by state.", ["queue", "state"], registry=self.registry)
        self.database_up.set(1)
        # Labelled series, looked up once: ``labels()`` validates and locks on every call.
        self._ended: dict[tuple[str, str, str], Any] = {}
        self._durations: dict[tuple[str, str], Any] = {}

    def waits_read(self, queues: list[str], found: dict[tuple[str, str, str], int]) -> None:
        """The durable-wait gauges of ``queues`` from :func:`atlantis.store.upkeep.queue_asleep`
        (every series of a served queue set, 0 when none was found)."""
        for queue in queues:
            self.asleep.labels(queue).set(found.get(("suspended", queue, "sleep"), 0))
            for waits in ("event", "join"):
                self.waiting.labels(queue, waits).set(found.get(("suspended", queue, waits), 0))
            for state in ("pending", "delivered"):
                self.events.labels(queue, state).set(found.get(("events", queue, state), 0))
            for state in ("available", "running", "complete", "dead", "cancelled"):
                self.child_jobs.labels(queue, state).set(
                    found.get(("children", queue, state), 0))

    def steps_recorded(self, queue: str, n: int) -> None:
        self.step_records.labels(queue).inc(n)

    def attempt_ended(self, queue: str, job: str, outcome: str, seconds: float | None) -> None:
        """Count an ended attempt, and observe how long it took (when it started)."""
        counter = self._ended.get((queue, job, outcome))
        if counter is None:
            counter = self._ended[queue, job, outcome] = self.attempts.labels(queue, job, outcome)
        counter.inc()
        if seconds is not None:
            histogram = self._durations.get((queue, job))
            if histogram is None:
                histogram = self._durations[queue, job] = self.duration.labels(queue, job)
            histogram.observe(seconds)

    def limits_read(self, usage: dict[str, tuple[int | None, int]]) -> None:
        """The limit gauges from ``(limit, held)`` by served queue: a queue whose limit was
        removed loses its ``atlantis_queue_concurrency_limit`` sample."""
        for queue, (limit, held) in usage.items():
            self.held.labels(queue).set(held)
            if limit is not None:
                self.queue_limit.labels(queue).set(limit)
            else:
                self.queue_limit.remove(queue)  # nothing to remove when it had none

    def serve(self, port: int, host: str) -> None:
        """Listen on ``host:port``; :class:`MetricsUnavailable` (one line) if it cannot."""
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except socket.gaierror as exc:
            raise MetricsUnavailable(
                f"--metrics-host {host}: cannot resolve it: {exc.strerror or exc}") from None
        except (OSError, OverflowError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise MetricsUnavailable(
                f"--metrics-port {port}: cannot listen on {host}:{port}: {why}") from None
