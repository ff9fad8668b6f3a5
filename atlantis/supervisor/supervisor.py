"""The supervisor's main loop.

One asyncio loop does everything: claims rows for idle children, relays checkpoints,
renews leases (one statement for all of them), writes results in batches, enforces
timeouts, rescues expired leases, and drains on SIGTERM. Signal handlers only set flags
and wake the loop. Attempts never run here: each runs in a child process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
from collections.abc import Coroutine
from typing import Any

from psycopg.types.json import Jsonb

from atlantis.protocol.framing import Message
from atlantis.registry import Registry
from atlantis.store.queries import Q
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.children import Child, describe_exit, spawn_child
from atlantis.supervisor.config import SupervisorConfig, lease_margin
from atlantis.supervisor.db import DatabaseUnavailable, Db, Health
from atlantis.supervisor.metrics import Metrics
from atlantis.supervisor.systemd import Notifier
from atlantis.supervisor.zygote import Zygote, ZygoteGone
from atlantis.units import format_duration, format_size

log = logging.getLogger("atlantis.supervisor")

WORKER_TTL = 30.0
WORKER_REFRESH = 5.0
LISTEN_PING = 15.0
"""A quiet LISTEN connection re-issues its LISTEN this often: a half-open one never errors."""


class Supervisor:
    def __init__(self, config: SupervisorConfig, registry: Registry, *,
                 early_signals: list[int] | None = None) -> None:
        self._early_signals = early_signals if early_signals is not None else []
        self.cfg = config
        self.registry = registry
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.jobs = sorted(registry.registrations)
        self.children: set[Child] = set()
        self.in_flight: dict[int, Attempt] = {}
        self.results: list[tuple[Attempt, dict[str, Any]]] = []
        self.generation = 0
        self.stop_signals = 0
        self.draining = False
        self.failed_starts = 0
        self.respawn_at = 0.0
        self.notifier = Notifier()
        self.metrics = Metrics()
        self.health = Health(on_change=self._health_changed)
        self.db_claim = Db(config.database_url, "claim", self.health)
        self.db_finish = Db(config.database_url, "finish", self.health)
        self.db_lease = Db(config.database_url, "lease", self.health)
        # Rescue and registration get their own connection: a renewal must never queue
        # behind them (a lease renewal that waits is a lease that may be lost).
        self.db_upkeep = Db(config.database_url, "upkeep", self.health)
        self.db_listen = Db(config.database_url, "listen", self.health)
        self._writing: list[tuple[Attempt, dict[str, Any]]] = []
        self.env = dict(os.environ)
        self.env.update(ATLANTIS_DATABASE_URL=config.database_url, PYTHONUNBUFFERED="1")
        cwd = os.getcwd()
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._touching: asyncio.Task[None] | None = None
        self._rescuing: asyncio.Task[None] | None = None
        self.crashed = False
        self._side_tasks: set[asyncio.Task[None]] = set()
        self.zygote: Zygote | None = None
        self.fork_unsafe: str | None = None
        self.lost_ids: set[int] = set()
        self.old_zygotes: list[Zygote] = []

    # ---- life cycle -----------------------------------------------------------------------

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        self.flush_wake = asyncio.Event()
        self.changed = asyncio.Event()
        self.stop_event = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self._on_stop_signal)
        self.loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        for _ in self._early_signals:
            self._on_stop_signal()
        if self.cfg.metrics_port is not None:
            self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_host)
            log.info("metrics on http://%s:%d/metrics", self.cfg.metrics_host, self.cfg.metrics_port)
        await self._register_worker()
        self._ensure_children()
        log.info(
            "supervisor %s serving queues %s with %d children (isolation %s)",
            self.worker_id, ",".join(self.cfg.queues), self.cfg.concurrency, self.cfg.isolation,
            extra={"worker": self.worker_id},
        )
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="claim"),
            asyncio.create_task(self._finish_loop(), name="finish"),
            asyncio.create_task(self._tick_loop(), name="tick"),
            asyncio.create_task(self._listen_loop(), name="listen"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        self.notifier.notify("READY=1", self._status())
        await self.stop_event.wait()
        await self._drain()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            # During an outage, do not hold the stop up for it: the row expires by itself.
            await self.db_upkeep.fetch(Q.worker_delete, {"id": self.worker_id},
                                       timeout=1 if self.health.down_since is not None else 5)
        except DatabaseUnavailable:
            pass
        for db in (self.db_claim, self.db_finish, self.db_lease, self.db_upkeep, self.db_listen):
            await db.close()
        self.notifier.close()
        log.info("supervisor %s stopped", self.worker_id)
        return 1 if self.crashed else 0

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        task.add_done_callback(self._task_ended)
        return task

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.critical("internal error in the %s loop; draining and stopping", task.get_name(),
                     exc_info=exc)
        self.crashed = True
        self.stop_signals += 1
        self.stop_event.set()

    def _on_stop_signal(self) -> None:
        self.stop_signals += 1
        self.stop_event.set()
        self.changed.set()

    def _on_hup(self) -> None:
        """Replace every child with one that imports the app afresh, losing no job.

        Replacements start first; each old idle child retires when a new one is ready, and
        a busy one after its attempt. If the new code cannot be imported, the old children
        go on serving while the replacements are retried with backoff.
        """
        self.generation += 1
        log.info("SIGHUP: replacing children (generation %d)", self.generation)
        for child in list(self.children):
            if child.state == "starting":
                self._retire(child)
        self._ensure_children()

    async def _drain(self) -> None:
        self.draining = True
        self.notifier.notify("STOPPING=1", self._status())
        log.info("draining: %d attempts in flight, waiting up to %s", len(self.in_flight),
                 format_duration(self.cfg.drain_timeout))
        deadline = self.loop.time() + self.cfg.drain_timeout
        seen_signals = min(self.stop_signals, 1)  # two signals before the drain: no wait
        while self.in_flight and self.loop.time() < deadline and self.stop_signals == seen_signals:
            await self._wait_changed(deadline - self.loop.time())
        for a in list(self.in_flight.values()):
            log.warning("%s: still running at the end of the drain; stopping it and releasing the row",
                        a.tag(), extra={"job_id": a.job_id, "attempt": a.attempt})
            self._stop(a, "drain", sig=signal.SIGKILL if self.stop_signals > seen_signals else signal.SIGTERM)
        while self.in_flight:
            if self.stop_signals > seen_signals + 1:
                for a in self.in_flight.values():
                    self._stop(a, "drain", sig=signal.SIGKILL)
            await self._wait_changed(0.1)
        flush_deadline = self.loop.time() + 10.0
        while (self.results or self._flushing) and self.loop.time() < flush_deadline:
            self.flush_wake.set()
            await self._wait_changed(0.1)
        for child in list(self.children):
            self._retire(child)
        exit_deadline = self.loop.time() + 5.0
        while self.children and self.loop.time() < exit_deadline:
            await self._wait_changed(0.1)
        for child in list(self.children):
            child.signal_group(signal.SIGKILL)
        while self.children:
            await self._wait_changed(0.1)
        zygotes = [z for z in (self.zygote, *self.old_zygotes) if z is not None and not z.dead]
        for z in zygotes:
            z.close()
        exit_deadline = self.loop.time() + 5.0
        while any(not z.dead for z in zygotes) and self.loop.time() < exit_deadline:
            await self._wait_changed(0.1)
        for z in zygotes:
            if not z.dead:
                z.kill()

    async def _wait_changed(self, timeout: float) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), max(timeout, 0.0))
        except TimeoutError:
            pass

    def _status(self) -> str:
        db = ""
        if self.health.down_since is not None:
            db = (f", database unreachable for {format_duration(round(self.loop.time() - self.health.down_since))}"
                  f" ({self.health.error})")
        phase = "draining" if self.draining else "serving"
        return f"STATUS={phase} {','.join(self.cfg.queues)}: {len(self.in_flight)}/{self.cfg.concurrency} in flight{db}"

    def _health_changed(self) -> None:
        """The database became unreachable or reachable again: tell systemd at once."""
        self.notifier.notify(self._status())
        if self.health.down_since is None:
            self.wake.set()  # claim what was enqueued meanwhile (its NOTIFYs may be lost)
            self.flush_wake.set()

    # ---- children -------------------------------------------------------------------------

    def _ensure_children(self) -> None:
        if self.draining:
            return
        live = [c for c in self.children if c.state in ("starting", "idle", "busy")
                and c.generation == self.generation]
        if len(live) < self.cfg.concurrency and self.loop.time() < self.respawn_at:
            self.loop.call_at(self.respawn_at, self._ensure_children)
            return
        forker: Zygote | None = None
        if self.cfg.isolation == "fresh" and self.fork_unsafe is None:
            forker = self._current_zygote()
            if not forker.ready:
                return  # called again once it is
        for _ in range(self.cfg.concurrency - len(live)):
            try:
                child = spawn_child(self.cfg.app, self.env, self.generation, self.loop,
                                    self._on_message, self._on_exit, forker)
            except ZygoteGone as exc:
                log.error("could not start a worker: %s", exc, exc_info=exc.__cause__)
                return  # the zygote's exit starts a new one
            self.children.add(child)

    def _current_zygote(self) -> Zygote:
        """The zygote of this generation, started on first use (``--isolation fresh``)."""
        z = self.zygote
        if z is None or z.dead or z.generation != self.generation:
            if z is not None and not z.dead:
                self.old_zygotes.append(z)  # it keeps serving its running workers
            z = Zygote(self.cfg.app, self.env, self.loop, self._ensure_children, self._zygote_died)
            z.generation = self.generation
            self.zygote = z
        return z

    def _zygote_died(self, z: Zygote) -> None:
        if z in self.old_zygotes:
            self.old_zygotes.remove(z)
        if z.unsafe is not None:
            # Still a new process per attempt, each a fresh interpreter: slower, but safe.
            self.fork_unsafe = z.unsafe
            log.warning("--isolation fresh: %s, so workers cannot be forked from a zygote; "
                        "starting a new interpreter for every attempt instead", z.unsafe)
            self.zygote = None
            self._ensure_children()
            return
        if z is self.zygote and not self.draining:
            self.zygote = None
            self.failed_starts += 1
            self.respawn_at = self.loop.time() + min(0.5 * 2 ** (self.failed_starts - 1), 10.0)
            self.loop.call_at(self.respawn_at, self._ensure_children)
        self.changed.set()

    def _close_idle_zygotes(self) -> None:
        """An old generation's zygote closes once its last worker is gone."""
        for z in list(self.old_zygotes):
            if not z.watching:
                z.close()

    def _retire(self, child: Child) -> None:
        """Let the child exit once it is idle (EOF on its control pipe ends it)."""
        child.state = "retiring"
        child.close_control()

    def _on_message(self, child: Child, msg: Message) -> None:
        kind = msg.get("t")
        if kind == "ready":
            if child.state == "starting":
                child.state = "idle"
                self.failed_starts = 0
                if child.generation != self.generation or self.draining:
                    self._retire(child)
                else:
                    old = next((c for c in self.children if c.state == "idle"
                                and c.generation != self.generation), None)
                    if old is not None:
                        self._retire(old)
                self.wake.set()
        elif kind == "checkpoint":
            a = child.attempt
            if a is not None and a.job_id == msg.get("job_id"):
                pct = msg.get("pct")
                value = float(pct) if isinstance(pct, int | float | str) else float("nan")
                a.progress = (value, str(msg.get("msg", "")))
                if not a.progress_dirty:
                    a.progress_dirty = True
                    a.progress_since = self.loop.time()
        elif kind == "done":
            a = child.attempt
            if a is None or a.job_id != msg.get("job_id"):
                log.error("child %d reported a result for a job it was not running", child.pid)
                return
            child.attempt = None
            child.jobs_run += 1
            leftovers = msg.get("leftovers")
            if leftovers:
                log.warning("%s: the handler returned but left work running: %s; terminated it",
                            a.tag(), "; ".join(leftovers),
                            extra={"job_id": a.job_id, "attempt": a.attempt, "queue": a.queue})
                child.state = "retiring"  # it exits by itself; a fresh child replaces it
            elif (self.cfg.isolation == "fresh" or child.generation != self.generation
                  or (self.cfg.max_jobs_per_child and child.jobs_run >= self.cfg.max_jobs_per_child)
                  or self.draining or a.stop_reason is not None):
                self._retire(child)
            else:
                child.state = "idle"
            self._record(a, self._outcome_from_done(a, msg))
            self._ensure_children()
            self.wake.set()
        elif kind == "fatal":
            log.error("child %d could not load the app: %s", child.pid, msg.get("error"))

    def _on_exit(self, child: Child) -> None:
        self.children.discard(child)
        code = child.returncode if child.returncode is not None else -signal.SIGKILL
        a = child.attempt
        if a is not None:
            child.attempt = None
            self._record(a, self._outcome_from_exit(a, code))
        if child.state == "starting":
            self.failed_starts += 1
            delay = min(0.5 * 2 ** (self.failed_starts - 1), 10.0)
            self.respawn_at = self.loop.time() + delay
            log.error("child %d exited before it was ready (%s); next start in %.1fs",
                      child.pid, describe_exit(code), delay)
        child.signal_group(signal.SIGKILL)  # whatever it left behind
        child.state = "dead"
        self._close_idle_zygotes()
        self._ensure_children()
        self.wake.set()
        self.changed.set()

    # ---- outcomes -------------------------------------------------------------------------

    def _forced(self, a: Attempt) -> dict[str, Any] | None:
        """The outcome when the supervisor stopped the attempt itself."""
        reason = a.stop_reason
        if reason == "timeout":
            return self._failure(a, "timeout", f"timeout after {format_duration(a.timeout)}")
        if reason == "memory":
            return self._failure(a, "memory", f"memory limit ({format_size(self.cfg.max_memory_per_child)}) exceeded")
        if reason == "drain":
            return {"outcome": "release"}
        if reason == "cancel":
            return {"outcome": "cancelled"}
        return None

    def _failure(self, a: Attempt, kind: str, message: str, **more: Any) -> dict[str, Any]:
        error = {"attempt": a.attempt, "kind": kind, "message": message, **more}
        return {"outcome": "failed", "error": error}

    def _outcome_from_done(self, a: Attempt, msg: Message) -> dict[str, Any]:
        forced = self._forced(a)
        if forced is not None:
            return forced
        outcome = str(msg.get("outcome"))
        result: dict[str, Any] = {"outcome": outcome}
        err = msg.get("error")
        if isinstance(err, dict):
            result["error"] = {"attempt": a.attempt, **err}
        if outcome == "snooze":
            result["delay"] = float(msg.get("delay") or 0.0)
        return result

    def _outcome_from_exit(self, a: Attempt, code: int) -> dict[str, Any]:
        forced = self._forced(a)
        if forced is not None:
            return forced
        more: dict[str, Any] = {"exit_code": code} if code >= 0 else {"signal": -code}
        return self._failure(a, "crash", describe_exit(code), **more)

    def _record(self, a: Attempt, result: dict[str, Any]) -> None:
        self.in_flight.pop(a.job_id, None)
        a.finished = True
        self.changed.set()
        self.metrics.attempts.labels(a.queue, a.job, "lost" if a.lost else result["outcome"]).inc()
        if a.started:
            self.metrics.duration.labels(a.queue, a.job).observe(self.loop.time() - a.started)
        if a.lost:
            log.warning("%s: the lease was lost; its result is not written", a.tag(),
                        extra={"job_id": a.job_id, "attempt": a.attempt})
            return
        self.results.append((a, result))
        self.flush_wake.set()

    def _stop(self, a: Attempt, reason: str, *, sig: int = signal.SIGTERM) -> None:
        if a.stop_reason is None:
            a.stop_reason = reason
        if a.child is None:
            return
        if sig == signal.SIGKILL:
            a.killed = True
        elif a.term_sent_at is None:
            a.term_sent_at = self.loop.time()
            if not a.cancel_sent:
                a.child.send({"t": "cancel", "job_id": a.job_id})
                a.cancel_sent = True
        a.child.signal_group(sig)

    # ---- claims ---------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        backoff = 0.0
        orphans_possible = False
        while not self.draining:
            if backoff:
                await asyncio.sleep(backoff)
            try:
                await asyncio.wait_for(self.wake.wait(), self.cfg.poll_interval)
            except TimeoutError:
                pass
            self.wake.clear()
            if self.draining:
                return
            if orphans_possible:
                try:
                    await self._release_orphans()
                    orphans_possible = False
                except DatabaseUnavailable:
                    backoff = min(max(backoff * 2, 0.1), 2.0)
                    continue
            idle = [c for c in self.children if c.state == "idle"]
            if not idle:
                continue
            try:
                # In a transaction: a claim abandoned on a link that delivers it late is
                # rolled back. Only a COMMIT whose answer is lost leaves rows claimed for
                # nobody; the next round gives those back (_release_orphans).
                rows = await self.db_claim.fetch(Q.claim, {
                    "queues": list(self.cfg.queues), "jobs": self.jobs, "limit": len(idle),
                    "worker": self.worker_id,
                }, timeout=5, transaction=True)
            except DatabaseUnavailable as exc:
                orphans_possible = orphans_possible or exc.sent
                backoff = min(max(backoff * 2, 0.1), 2.0)
                continue
            backoff = 0.0
            t0 = self.db_claim.sent_at  # not before the wait for a connection: see Db.sent_at
            for row in rows:
                self._dispatch(row, t0)
            if rows and len(rows) == len(idle):
                self.wake.set()  # more work may be waiting

    async def _release_orphans(self) -> None:
        """Give back rows claimed by a claim whose answer never arrived (see the query)."""
        # Lost attempts did run: their rows are left to be rescued as failures, not released.
        known = [*self.in_flight, *(a.job_id for a, _ in self.results + self._writing),
                 *self.lost_ids]
        rows = await self.db_claim.fetch(Q.release_orphans,
                                         {"worker": self.worker_id, "known": known}, timeout=5)
        if rows:
            log.warning("released %d rows claimed by a claim whose answer was lost: %s",
                        len(rows), ", ".join(str(r[0]) for r in rows))
            self.wake.set()

    def _dispatch(self, row: tuple[Any, ...], t0: float) -> None:
        job_id, job, queue, args, attempt, max_attempts, timeout, heartbeat, deadline = row
        a = Attempt(job_id=job_id, attempt=attempt, job=job, queue=queue, args=args,
                    max_attempts=max_attempts, timeout=timeout, heartbeat=heartbeat,
                    deadline=deadline.isoformat(), lease_end=t0 + heartbeat, renewed_at=t0)
        self.in_flight[job_id] = a
        child = next((c for c in self.children if c.state == "idle"), None)
        if child is None:  # a child died while we claimed: give the row back at once
            self._record(a, {"outcome": "release"})
            return
        child.state = "busy"
        child.attempt = a
        a.child = child
        a.started = self.loop.time()
        child.send({
            "t": "run", "job_id": job_id, "job": job, "queue": queue, "args": args,
            "attempt": attempt, "max_attempts": max_attempts, "deadline": a.deadline,
            # The child's own stop comes after the supervisor's (half the margin), so that a
            # supervisor that is alive acts first and records why; both precede the lease end.
            "lease_end": a.lease_end, "lease_margin": lease_margin(heartbeat) / 2,
            "database_url": self.cfg.database_url,
        })  # a child that died meanwhile is handled by its exit

    # ---- results --------------------------------------------------------------------------

    _flushing = False

    async def _finish_loop(self) -> None:
        # Attempts whose result went out in a statement whose answer was lost: it may have
        # committed, and then the retry (fenced on the running attempt) matches no row.
        maybe_written: set[tuple[int, int]] = set()
        while True:
            await self.flush_wake.wait()
            self.flush_wake.clear()
            if not self.results:
                continue
            batch, self.results = self.results, []
            self._flushing = True
            self._writing = batch
            try:
                rows = await self.db_finish.fetch(Q.finish, self._finish_params(batch), timeout=10)
            except DatabaseUnavailable as exc:
                if exc.sent:
                    maybe_written.update(a.key for a, _ in batch)
                self.results = batch + self.results
                self._flushing = False
                self._writing = []
                await asyncio.sleep(0.1)  # the connection's backoff paces the retries
                self.flush_wake.set()
                continue
            self._flushing = False
            self._writing = []
            written = {r[0] for r in rows}
            for a, result in batch:
                if a.job_id in written:
                    maybe_written.discard(a.key)
                elif a.key in maybe_written:
                    maybe_written.discard(a.key)
                    await self._confirm_written(a, result)
                else:
                    log.warning("%s: result not recorded: the row is no longer this attempt's "
                                "(lease lost or row changed)", a.tag(),
                                extra={"job_id": a.job_id, "attempt": a.attempt})
            self.changed.set()
            self.wake.set()

    async def _confirm_written(self, a: Attempt, result: dict[str, Any]) -> None:
        """After a retry matched no row: was the first try's commit the one that landed?"""
        spent = 0 if result["outcome"] in ("snooze", "release") else 1
        try:
            rows = await self.db_finish.fetch_dicts(Q.job_get, {"id": a.job_id}, timeout=5)
        except DatabaseUnavailable:
            rows = []
        row = rows[0] if rows else None
        if (row is not None and row["claimed_by"] == self.worker_id and row["state"] != "running"
                and row["attempt"] == a.attempt - 1 + spent):
            log.info("%s: result already recorded (now %s) by the try whose answer was lost "
                     "when the connection broke", a.tag(), row["state"],
                     extra={"job_id": a.job_id, "attempt": a.attempt})
        else:
            log.warning("%s: result not recorded: the row is no longer this attempt's "
                        "(lease lost or row changed while the database was unreachable)", a.tag(),
                        extra={"job_id": a.job_id, "attempt": a.attempt})

    def _finish_params(self, batch: list[tuple[Attempt, dict[str, Any]]]) -> dict[str, Any]:
        p: dict[str, list[Any]] = {k: [] for k in (
            "ids", "attempts", "outcomes", "errors", "delays", "has_progress", "pcts", "msgs")}
        for a, result in batch:
            p["ids"].append(a.job_id)
            p["attempts"].append(a.attempt)
            p["outcomes"].append(result["outcome"])
            err = result.get("error")
            p["errors"].append(Jsonb(err) if err is not None else None)
            p["delays"].append(result.get("delay", 0.0))
            has = a.progress is not None and a.progress_dirty
            p["has_progress"].append(has)
            p["pcts"].append(a.progress[0] if has and a.progress else None)
            p["msgs"].append(a.progress[1] if has and a.progress else None)
        return {**p, "worker": self.worker_id}

    # ---- leases, timeouts, upkeep ---------------------------------------------------------

    async def _tick_loop(self) -> None:
        last_worker = self.loop.time()
        last_rescue = 0.0
        last_memory = 0.0
        last_watchdog = 0.0
        last_in_flight = -1
        while True:
            now = self.loop.time()
            for a in list(self.in_flight.values()):
                self._check_attempt(a, now)
            if self.cfg.max_memory_per_child and now - last_memory >= 0.25:
                last_memory = now
                self._check_memory()
            if self._touching is None or self._touching.done():
                batch = self._touch_batch(now)
                if batch:
                    self._touching = self._spawn(self._touch(batch), "touch")
            if now - last_rescue >= self.cfg.rescue_interval and (
                    self._rescuing is None or self._rescuing.done()):
                last_rescue = now
                self._rescuing = self._spawn(self._rescue(), "rescue")
            if now - last_worker >= WORKER_REFRESH or len(self.in_flight) != last_in_flight:
                # STATUS follows the in-flight count, at most once a tick.
                last_in_flight = len(self.in_flight)
                self.notifier.notify(self._status())
                self.metrics.in_flight.set(last_in_flight)
                self.metrics.children.set(len(self.children))
                self.metrics.database_up.set(0 if self.health.down_since is not None else 1)
            if now - last_worker >= WORKER_REFRESH:
                last_worker = now
                self._spawn(self._register_worker(), "worker")
            wd = self.notifier.watchdog_interval
            if wd is not None and now - last_watchdog >= wd:
                last_watchdog = now
                self.notifier.notify("WATCHDOG=1")
            await asyncio.sleep(self.cfg.tick)

    def _check_attempt(self, a: Attempt, now: float) -> None:
        if a.lost:
            return
        if now >= a.lease_end - lease_margin(a.heartbeat):
            self._lose(a, "the lease could not be renewed in time; killing the attempt so that "
                          "no other worker runs the row alongside it")
            return
        if a.stop_reason is None and a.child is not None and now >= a.started + a.timeout:
            log.warning("%s: timeout after %s; terminating it", a.tag(), format_duration(a.timeout),
                        extra={"job_id": a.job_id, "attempt": a.attempt, "queue": a.queue})
            self._stop(a, "timeout")
        if a.term_sent_at is not None and not a.killed and now >= a.term_sent_at + self.cfg.kill_grace:
            self._stop(a, a.stop_reason or "timeout", sig=signal.SIGKILL)

    def _lose(self, a: Attempt, why: str) -> None:
        """The attempt no longer owns its row: kill it at once; nothing more is written."""
        a.lost = True
        self.lost_ids.add(a.job_id)
        self.metrics.leases_lost.inc()
        log.error("%s: %s", a.tag(), why,
                  extra={"job_id": a.job_id, "attempt": a.attempt, "queue": a.queue})
        self._stop(a, "lease", sig=signal.SIGKILL)

    def _check_memory(self) -> None:
        for a in list(self.in_flight.values()):
            if a.child is None or a.stop_reason is not None:
                continue
            rss = a.child.rss()
            if rss > self.cfg.max_memory_per_child:
                log.warning("%s: child uses %s, over the memory limit of %s; killing it",
                            a.tag(), format_size(rss), format_size(self.cfg.max_memory_per_child),
                            extra={"job_id": a.job_id, "attempt": a.attempt})
                self._stop(a, "memory", sig=signal.SIGKILL)

    def _touch_batch(self, now: float) -> list[Attempt]:
        live = [a for a in self.in_flight.values() if not a.lost and not a.finished]
        if any(now >= a.renewed_at + a.heartbeat / 3 for a in live):
            return live
        return [a for a in live
                if a.progress_dirty and now - a.progress_since >= self.cfg.progress_interval]

    async def _touch(self, batch: list[Attempt]) -> None:
        t0 = self.loop.time()
        # The renewal must be answered before the first of these attempts is killed for want
        # of it: a renewal that lands after the kill would only hold the dead row back.
        budget = min(a.lease_end - lease_margin(a.heartbeat) for a in batch) - t0
        if budget <= 0:
            return
        sent = {a.job_id: a.progress if a.progress_dirty else None for a in batch}
        for a in batch:
            a.progress_dirty = False
        try:
            rows = await self.db_lease.fetch(Q.touch, {
                "ids": [a.job_id for a in batch], "attempts": [a.attempt for a in batch],
                "has_progress": [sent[a.job_id] is not None for a in batch],
                "pcts": [p[0] if (p := sent[a.job_id]) else None for a in batch],
                "msgs": [p[1] if (p := sent[a.job_id]) else None for a in batch],
                "worker": self.worker_id,
            }, timeout=budget)
        except DatabaseUnavailable:
            for a in batch:
                if sent[a.job_id] is not None and not a.progress_dirty:
                    a.progress_dirty = True
                    a.progress_since = t0
            return
        renewed = {r[0]: r[1] for r in rows}
        t0 = self.db_lease.sent_at  # the renewal counts from when it went out, not from before
        for a in batch:
            if a.lost:
                continue  # killed while the renewal was on its way; its row is left to expire
            if a.job_id in renewed:
                a.lease_end = t0 + a.heartbeat
                a.renewed_at = t0
                if a.child is not None:
                    a.child.send({"t": "lease", "job_id": a.job_id, "lease_end": a.lease_end})
                if renewed[a.job_id] and a.stop_reason is None:
                    log.info("%s: cancelled by an operator; stopping it", a.tag(),
                             extra={"job_id": a.job_id, "attempt": a.attempt})
                    self._stop(a, "cancel")
            elif not a.finished and not a.lost:
                self._lose(a, "the lease is gone (the row was rescued or changed); killing the "
                              "attempt, nothing of it will be written")

    async def _rescue(self) -> None:
        # Results of ours still waiting to be written (say, finished during an outage) would
        # be rescued as "lease expired" and run again: write them first.
        now = self.loop.time()
        if any(a.lease_end - lease_margin(a.heartbeat) <= now for a, _ in self.results + self._writing):
            self.flush_wake.set()
            return
        try:
            rows = await self.db_upkeep.fetch(Q.rescue, {"limit": 1000, "worker": self.worker_id},
                                              timeout=10)
        except DatabaseUnavailable:
            return
        self.metrics.rescued.inc(len(rows))
        for job_id, state, queue in rows:
            log.warning("job=%s: lease expired, its worker presumed dead; now %s", job_id, state,
                        extra={"job_id": job_id, "queue": queue})
        if rows:
            self.wake.set()

    async def _register_worker(self) -> None:
        try:
            await self.db_upkeep.fetch(Q.worker_upsert, {
                "id": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": list(self.cfg.queues), "concurrency": self.cfg.concurrency,
                "in_flight": len(self.in_flight),
                "status": "draining" if self.draining else "running", "ttl": WORKER_TTL,
            }, timeout=5)
        except DatabaseUnavailable:
            pass

    # ---- notifications --------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        """Wake the claim loop on NOTIFY; the poll in the claim loop covers any gap.

        NOTIFYs sent while no session listens are lost, so every new session wakes the claim
        loop once. The LISTEN is re-issued every LISTEN_PING: it is a no-op for the server
        and a round trip that proves a quiet connection alive (a half-open one would
        otherwise swallow notifications forever without an error).
        """
        queues = set(self.cfg.queues)
        db = self.db_listen
        session = db.connects
        while not self.draining:
            try:
                await db.fetch(Q.listen, timeout=5)
            except DatabaseUnavailable:
                await asyncio.sleep(0.1)  # the connection's backoff paces the retries
                continue
            if db.connects != session:
                session = db.connects
                self.wake.set()  # anything enqueued while we were not listening
            try:
                async for payload in db.notifications(LISTEN_PING):
                    if payload in queues:
                        self.wake.set()
            except DatabaseUnavailable:
                continue
