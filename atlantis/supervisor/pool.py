"""The pool: child processes, their generations, zygotes, respawn backoff and SIGHUP.

It starts ``--concurrency`` children (fresh interpreters, or forks of a zygote with
``--isolation fresh``), starts each held attempt of the ledger in an idle child, and turns
what children report (a checkpoint, a result, a crash, a protocol violation) into the
attempt's outcome through :mod:`policy`, recorded in the ledger for the completer to write.
A child that breaks the protocol is killed and its attempt fails with kind ``protocol``;
the others never notice. Its ``stop`` drains the attempts in flight (:mod:`drain`), then
retires every child.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterable

from atlantis.protocol.messages import Checkpoint, Done, Fatal, FromChild, Preloadable, Ready, Run
from atlantis.store.supervision import Progress
from atlantis.supervisor import policy
from atlantis.supervisor.attempt_logs import AttemptLogs
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.children import Child
from atlantis.supervisor.drain import drain
from atlantis.supervisor.jobset import JobSet
from atlantis.supervisor.keeper import LeaseKeeper
from atlantis.supervisor.output import Label
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Service
from atlantis.supervisor.spawn import child_environment, set_scheduling, spawn_child
from atlantis.supervisor.zygote import Zygote

log = logging.getLogger("atlantis.supervisor")

class Pool(Service):
    name = "pool"

    def __init__(self, rt: Runtime, logs: AttemptLogs, jobs: Iterable[str] = ()) -> None:
        super().__init__(rt)
        self.ledger = rt.ledger
        self.logs = logs
        s = rt.settings
        self.env = child_environment(s.database_url, s.handler_database_url)
        self.children: set[Child] = set()
        self.generation = 0
        self.failed_starts = 0
        self.respawn_at = 0.0
        self.zygote: Zygote | None = None
        self.old_zygotes: list[Zygote] = []
        self.fork_unsafe: str | None = None
        self.preloads: set[Preloadable] = set()
        """What workers turned out to need: every zygote loads it (:mod:`atlantis.child.preload`)."""
        self.jobset = JobSet(jobs)
        self.keeper = LeaseKeeper(rt.loop, self.env, lambda: [
            (c.pid, c.cell_fd) for c in self.children if c.pid and c.cell_fd >= 0])

    async def start(self) -> None:
        self.keeper.start()
        self.ensure()

    async def stop(self) -> None:
        """Drain the attempts in flight (:func:`drain.drain`), then retire every child."""
        await drain(self.rt)
        await self._shutdown()
        self.keeper.close()

    # ---- children -------------------------------------------------------------------------

    def idle(self) -> int:
        """Children idle now."""
        return sum(1 for c in self.children if c.state == "idle")

    def _idle_for(self, job: str) -> Child | None:
        """An idle child that can run ``job``, of the current generation if one is idle."""
        best: Child | None = None
        for c in self.children:
            if c.state == "idle" and JobSet.runs(c, job):
                if c.generation == self.generation:
                    return c
                best = best or c
        return best

    def ensure(self) -> None:
        """Start children until ``--concurrency`` of the current generation live."""
        rt = self.rt
        if rt.draining:
            return
        live = [c for c in self.children
                if c.state in ("starting", "idle", "busy") and c.generation == self.generation]
        if len(live) < rt.settings.concurrency and rt.now() < self.respawn_at:
            rt.loop.call_at(self.respawn_at, self.ensure)
            return
        forker: Zygote | None = None
        if rt.settings.isolation == "fresh" and self.fork_unsafe is None:
            forker = self._current_zygote()
            if not forker.ready:
                return  # called again once it is
        # Interpreters start a few at a time: hundreds starting at once (--concurrency 500)
        # would starve the supervisor of the CPU it needs to renew the leases of the
        # attempts already running. Forks from the zygote are cheap but bounded alike.
        starting = sum(1 for c in self.children if c.state == "starting")
        room = max(0, rt.settings.start_at_once - starting)
        for _ in range(min(rt.settings.concurrency - len(live), room)):
            try:
                child = spawn_child(rt.settings.app, self.env, self.generation, rt.loop, self,
                                    rt.settings.output_lines_per_second, forker,
                                    rt.settings.child_scheduling, self.keeper)
                child.output.sink = self.logs.line
            except OSError as exc:  # out of descriptors or processes: try again later
                self._start_failed(f"could not start a child: {exc}")
                return
            self.children.add(child)

    def reload(self, jobs: Iterable[str] | None = None) -> None:
        """SIGHUP: replace every child with one that imports the app afresh, losing no job.

        Replacements start first; each old idle child retires when a new one is ready, and
        a busy one after its attempt. If the new code cannot be imported, the old children
        go on serving while the replacements are retried with backoff. ``jobs``: the jobs
        of the app as just loaded (the new children say theirs when ready).
        """
        if jobs is not None:
            self.jobset.reload(jobs, self.children)
        self.generation += 1
        log.info("SIGHUP: replacing children (generation %d)", self.generation)
        for child in list(self.children):
            if child.state == "starting":
                self.retire(child)
        self.ensure()

    def retire(self, child: Child) -> None:
        """Let the child exit once it is idle (EOF on its control pipe ends it)."""
        child.state = "retiring"
        child.close_control()

    def _start_failed(self, why: str) -> None:
        self.failed_starts += 1
        delay = policy.backoff(0.5, self.failed_starts, cap=self.rt.settings.respawn_max, rand=0.5)
        self.respawn_at = self.rt.now() + delay
        log.error("%s; next start in %.1fs", why, delay)
        self.rt.loop.call_at(self.respawn_at, self.ensure)

    def _current_zygote(self) -> Zygote:
        """The zygote of this generation, started on first use (``--isolation fresh``)."""
        z = self.zygote
        if z is None or z.dead or z.generation != self.generation:
            if z is not None and not z.dead:
                self.old_zygotes.append(z)  # it keeps serving its running workers
            z = Zygote(self.rt.settings.app, self.env, self.rt.loop, self.generation,
                       self.ensure, self._zygote_died, self.rt.settings.fork_timeout)
            set_scheduling(z.pid, self.rt.settings.child_scheduling)  # its workers inherit it
            z.preload(self.preloads)
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
            self.ensure()
        elif z is self.zygote and not self.rt.draining:
            self.zygote = None
            self._start_failed(f"the zygote exited (pid {z.pid})")
        self.rt.changed.set()

    # ---- attempts -------------------------------------------------------------------------

    def feed(self) -> None:
        """Start the ledger's held rows in idle children, oldest first.

        A row held too long (:func:`policy.hold_limit`: the supervisor was stalled, so
        the claimer could not give it back in time) is given back instead of started.
        """
        stale, expired = self.ledger.take_held(self._free_for, self.assign)
        if expired:
            log.warning("gave back %d rows claimed ahead instead of starting them: %d had "
                        "(nearly) outlived their leases, the supervisor was stalled", stale, expired)
        elif stale:
            log.info("gave back %d rows claimed ahead: held past their hold before a child "
                     "was free", stale)

    def _free_for(self, a: Attempt) -> bool:
        """Whether a child is idle for held ``a``: those kept for the claimer's limited claim
        (``ClaimMode.idle_reserved``) take only that claim's rows."""
        if self.rt.draining:
            return False
        idle = sum(c.state == "idle" for c in self.children)
        return idle > (0 if a.limited else self.rt.claim_mode.idle_reserved)

    def assign(self, a: Attempt) -> bool:
        """Start ``a`` in an idle child that has its handler; False if none is idle."""
        child = self._idle_for(a.row.job)
        if child is None:
            return False
        self.ledger.started(a)
        child.state = "busy"
        child.label = Label(a.job_id, a.attempt, a.queue, a.run)
        child.output.begin(child.label)
        a.child = child
        a.child_pid = child.pid or None
        a.started = self.rt.now()
        a.look_again(limits=True, lease=True)  # its timeout counts from now
        row = a.row
        child.set_lease(a.lease_end, row.heartbeat)  # before the Run: never an older attempt's end
        child.send(Run(
            job_id=row.id, job=row.job, queue=row.queue, attempt=row.attempt,
            max_attempts=row.max_attempts, args=row.args, deadline=row.deadline.isoformat(),
            # The child's own stop comes after the supervisor's and the keeper's, so that a
            # supervisor that is alive acts first and records why; all precede the lease end.
            lease_end=a.lease_end, lease_margin=policy.child_margin(row.heartbeat),
            database_url=self.rt.settings.child_database_url, workflow=row.workflow,
            trace=self.ledger.tracing.traceparent(a),
            run_id=row.run_id,
        ))  # a child that died meanwhile is handled by its exit
        # (A row cancelled while its claim was on its way never gets here: Ledger.take_held
        # ends it cancelled before any child takes it.)
        return True

    def _attempt_of(self, child: Child) -> Attempt | None:
        label = child.label
        if label is None:
            return None
        return self.ledger.attempt_of(label.job_id, child)

    def _end(self, child: Child, a: Attempt, verdict: policy.Verdict) -> None:
        if child.label is not None:
            a.log_lines, a.log_dropped = self.logs.ended(child.label)
            a.log_dropped += child.output.dropped
        a.child_pid = child.pid or a.child_pid
        child.clear_lease()
        child.label = None
        child.output.end()
        a.child = None
        self.ledger.end(a, verdict)

    # ---- what children report (called from the event loop's readers) ---------------------

    def on_message(self, child: Child, msg: FromChild) -> None:
        try:
            self._on_message(child, msg)
        except Exception as exc:  # a bug here must cost one attempt at most
            log.exception("%s: handling a message failed", child.tag())
            self.on_protocol_error(child, f"message could not be handled: {exc}")

    def _on_message(self, child: Child, msg: FromChild) -> None:
        rt = self.rt
        if isinstance(msg, Ready):
            if child.state != "starting":
                if child.state != "retiring":  # retired while starting: it exits on EOF
                    self.on_protocol_error(child, "ready sent twice")
                return
            child.state = "idle"
            self.failed_starts = 0
            self.ensure()  # the next ones may start now
            if child.generation != self.generation or rt.draining:
                self.retire(child)
            else:
                old = next((c for c in self.children
                            if c.state == "idle" and c.generation != self.generation), None)
                if old is not None:
                    self.retire(old)
                self.feed()
            self.jobset.update(self.children)
            rt.wake.set()
            return
        if isinstance(msg, Fatal):
            log.error("child %d could not load the app: %s", child.pid, policy.clip(msg.error, 4096))
            return
        a = self._attempt_of(child)
        if a is None or msg.job_id != a.job_id:
            self.on_protocol_error(child, f"{msg.t} for job {msg.job_id}, which it is not running")
            return
        if isinstance(msg, Checkpoint):
            a.took_checkpoint(Progress(policy.pct_value(msg.pct),
                                       policy.progress_text(msg.msg)), rt.now())
            self.ledger.tracing.checkpoint(a, msg.pct, msg.msg)
            return
        assert isinstance(msg, Done)
        if msg.spans is not None:
            self.ledger.tracing.ingest(a, msg.spans)
        self._done(child, a, msg)

    def _done(self, child: Child, a: Attempt, msg: Done) -> None:
        rt = self.rt
        s = rt.settings
        child.jobs_run += 1
        self.ledger.ran(rt.now() - a.started)
        if msg.leftovers:
            log.warning("%s: the handler returned but left work running: %s; terminated it",
                        a.tag(), policy.clip("; ".join(msg.leftovers), 4096), extra=a.log_extra())
            # Said on the attempt too, where people look (tide job status, the console).
            a.warning = policy.clip("the handler returned but left work running: "
                                    f"{'; '.join(msg.leftovers)}; atlantis ended it", 4096)
            if child.label is not None:
                self.logs.line(child.label, "stderr", f"atlantis: {a.warning}")
            child.state = "retiring"  # it exits by itself; a fresh child replaces it
        elif msg.retire is not None:
            # The handler changed the child's process in a way it could not undo: the next
            # attempt goes to a fresh child, never to this one.
            log.warning("%s: the handler left the child unfit for another attempt: %s; "
                        "replacing the child", a.tag(), policy.clip(msg.retire, 4096),
                        extra=a.log_extra())
            self.retire(child)
        elif (s.isolation == "fresh" or child.generation != self.generation
              or (s.max_jobs_per_child and child.jobs_run >= s.max_jobs_per_child)
              or self.rt.draining or a.stop_reason is not None):
            self.retire(child)
        else:
            child.state = "idle"
        if msg.steps > 0:  # a count the child reports (a forged negative one is ignored)
            rt.metrics.steps_recorded(a.queue, msg.steps)
        if msg.preload and self.zygote is not None:
            self.preloads.update(msg.preload)
            self.zygote.preload(self.preloads)
        verdict = policy.decide(a.facts, self.rt.limits, msg, a.stop_reason,
                                cancelled=a.cancelling)
        if verdict.unstored is not None:
            log.warning("%s: the result the child sent was not stored: %s", a.tag(),
                        verdict.unstored, extra=a.log_extra())
        if verdict.nulled is not None:
            log.warning("%s: %s: the result held NaN or an infinity, which JSON cannot carry; "
                        "stored with null in their place (%s)", a.tag(), a.job,
                        verdict.nulled, extra=a.log_extra())
        self._end(child, a, verdict)
        self.ensure()
        self.feed()
        self.rt.wake.set()

    def on_protocol_error(self, child: Child, why: str) -> None:
        """The child broke the protocol: kill it; its attempt fails with kind ``protocol``."""
        child.violated()
        a = self._attempt_of(child)
        log.error("%s: protocol violation (%s); killing the child", child.tag(), why,
                  extra=a.log_extra() if a else {})
        if a is not None:
            a.stop("protocol", self.rt.now(), sig=signal.SIGKILL, detail=why)
        else:
            child.signal_group(signal.SIGKILL)

    def on_exit(self, child: Child) -> None:
        try:
            self._on_exit(child)
        except Exception:
            log.exception("%s: handling the exit failed", child.tag())

    def _on_exit(self, child: Child) -> None:
        rt = self.rt
        self.children.discard(child)
        code = child.returncode if child.returncode is not None else -signal.SIGKILL
        a = self._attempt_of(child)
        if a is not None:
            self._end(child, a, policy.decide_exit(a.facts, rt.limits, code, a.stop_reason,
                                                   a.stop_detail, cancelled=a.cancelling,
                                                   said=child.last_words()))
        if child.state == "starting":
            self._start_failed(f"child {child.pid} exited before it was ready "
                               f"({policy.describe_exit(code)})")
        child.signal_group(signal.SIGKILL)  # whatever it left behind
        child.state = "dead"
        for z in list(self.old_zygotes):  # an old generation's zygote closes with its last worker
            if not z.watching:
                z.close()
        self.ensure()
        self.jobset.update(self.children)
        rt.wake.set()
        rt.changed.set()

    # ---- stop -----------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Retire every child, wait for them (then kill), and close the zygotes."""
        rt = self.rt
        for child in list(self.children):
            self.retire(child)
        deadline = rt.now() + rt.settings.exit_timeout
        while self.children and rt.now() < deadline:
            await rt.wait_changed(0.1)
        for child in list(self.children):
            child.signal_group(signal.SIGKILL)
        zygotes = [z for z in (self.zygote, *self.old_zygotes) if z is not None and not z.dead]
        for z in zygotes:
            z.close()
        deadline = rt.now() + rt.settings.exit_timeout
        while (self.children or any(not z.dead for z in zygotes)) and rt.now() < deadline:
            await rt.wait_changed(0.1)
        for z in zygotes:
            if not z.dead:
                z.kill()
        deadline = rt.now() + rt.settings.exit_timeout
        while self.children and rt.now() < deadline:
            await rt.wait_changed(0.1)
        if self.children:
            log.error("%d children did not report their exit; giving up on them",
                      len(self.children))
