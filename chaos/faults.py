"""The faults: injected at random, each kind counted, each undone after a random while.

A fault that lasts (a stopped supervisor, a frozen or cut proxy, a paused queue, a killed
supervisor waiting for its replacement) schedules its own undoing; :meth:`Faults.calm`
undoes all of them at once when the run's fault phase ends.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psutil
import psycopg

import atlantis
from chaos.cluster import QUEUE, Cluster, Instance, slot_name

HEARTBEAT = 2.0
"""The workload's heartbeat, hence its lease (chaos/jobs.atl)."""

WEIGHTS = {
    "kill_child": 3.0, "kill_supervisor": 1.0, "stop_supervisor": 1.5, "restart_postgres": 0.7,
    "cut": 1.5, "half_open": 1.5, "cancel": 2.0, "pause": 0.6, "sighup": 0.6,
    "cancel_workflow": 1.5, "stop_crunching": 3.0, "kill_spawning": 1.5, "order": 0.8,
}
"""How often each kind of fault is picked, relatively."""


def _pid(claimed_by: str | None) -> int | None:
    """The supervisor's pid in a row's ``claimed_by`` (``host:pid:...``)."""
    parts = (claimed_by or "").split(":")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def say(text: str) -> None:
    print(f"chaos: {text}", file=sys.stderr, flush=True)


class Faults:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.counts: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()
        self.cancelled: set[int] = set()
        """Every job a cancel was asked for (whether or not the command went through)."""
        self.cancel_accepted: set[int] = set()
        """The jobs whose ``tide job cancel`` exited 0."""
        self.workflow_cancelled: set[int] = set()
        """Every workflow a cancel was asked for (whether or not it went through)."""
        self.workflow_cancel_running: set[int] = set()
        """The workflows whose cancel committed while they were ``running``."""
        self.paused = False
        self.ordered: set[str] = set()
        """Supervisor names under an operator's drain or eviction, until resumed."""
        self._undo: list[tuple[float, Callable[[], None]]] = []

    def inject(self) -> None:
        kinds = list(WEIGHTS)
        kind = self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        getattr(self, f"_{kind}")()

    def tick(self, *, now: float | None = None) -> None:
        """Undo the faults whose time has come; reap the ``tide`` commands that ended."""
        now = time.monotonic() if now is None else now
        due = [u for u in self._undo if u[0] <= now]
        self._undo = [u for u in self._undo if u[0] > now]
        for _, action in sorted(due, key=lambda u: u[0]):
            action()
        self._reap()

    def calm(self) -> None:
        """Undo every fault still in force: the server up, proxies forwarding, supervisors
        running in every slot, the queue resumed."""
        self.tick(now=float("inf"))
        c = self.cluster
        if not c.server.running():
            c.server.start()
        for slot in c.slots:
            slot.proxy.start()
            slot.proxy.thaw()
        self._reap(wait=True)
        c.tide("queue", "resume", QUEUE)
        for name in sorted(self.ordered):
            c.tide("worker", "resume", name)
        self.ordered.clear()
        self._reap(wait=True)

    def rows(self) -> list[tuple[str, int, str]]:
        """The table's fault rows: (what, how many, a note)."""
        f, n = self.counts, self.notes
        return [
            ("kill -9 of a child (or zygote)", f["kill_child"], ""),
            ("kill -9 of a supervisor, restarted", f["kill_supervisor"], ""),
            ("SIGSTOP/SIGCONT of a supervisor", f["stop_supervisor"],
             f"{n['stop_past_lease']} past the lease"),
            ("PostgreSQL restart", f["restart_postgres"],
             f"{n['restart_fast']} fast, {n['restart_immediate']} immediate"),
            ("proxy: connections cut", f["cut"], ""),
            ("proxy: half-open", f["half_open"], f"{n['half_open_past_lease']} past the lease"),
            ("tide job cancel", f["cancel"], f"{n['cancel_too_late']} after the job finished"),
            ("tide queue pause / resume", f["pause"], ""),
            ("tide worker drain / evict, then resume", f["order"],
             f"{n['order_evict']} evictions, {n['order_exit']} drains with --exit"),
            ("SIGHUP of a supervisor", f["sighup"], ""),
            ("SIGSTOP or kill -9 of a supervisor running chaos.Crunch", f["stop_crunching"],
             f"{n['crunch_killed']} killed, {n['crunch_stopped']} stopped past the lease"),
            ("kill -9 of a supervisor running chaos.Fan amid its spawns", f["kill_spawning"],
             f"{n['spawning_new']} with spawns not yet recorded"),
            ("workflow cancel", f["cancel_workflow"],
             f"{n['cancel_workflow_step']} through a step's row, "
             f"{n['cancel_workflow_late']} once it had stopped"),
        ]

    # ---- helpers ------------------------------------------------------------------------

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        self._undo.append((time.monotonic() + delay, action))

    def _pick(self, *, running: bool = True) -> Instance | None:
        candidates = [i for i in self.cluster.live() if not (running and i.stopped)]
        return self.rng.choice(candidates) if candidates else None

    def _reap(self, *, wait: bool = False) -> None:
        for args, code, err in self.cluster.reap_tides(wait=wait):
            if code == 0 and args[:2] == ["job", "cancel"]:
                self.cancel_accepted.add(int(args[2]))
            elif code != 0 and "nothing to cancel" in err:
                self.notes["cancel_too_late"] += 1  # the job finished first
            elif code != 0:
                self.notes["tide_failed"] += 1
                say(f"tide {' '.join(args)} exited {code}: {err.strip()[-300:]}")

    # ---- the faults ---------------------------------------------------------------------

    def _kill_child(self) -> None:
        sup = self._pick()
        if sup is None:
            return
        try:
            children = psutil.Process(sup.proc.pid).children(recursive=True)
            if children:
                self.rng.choice(children).kill()  # psutil refuses a pid reused meanwhile
                self.counts["kill_child"] += 1
        except psutil.NoSuchProcess:
            pass

    def _kill_supervisor(self) -> None:
        sup = self._pick(running=False)
        if sup is None:
            return
        sup.killed = True
        sup.signal(signal.SIGKILL)
        sup.proc.wait()
        self.counts["kill_supervisor"] += 1
        slot = next(s for s in self.cluster.slots if s.current is sup)
        self._later(self.rng.uniform(0.2, 2.0), lambda: self.cluster.start_supervisor(slot))

    def _stop_supervisor(self) -> None:
        sup = self._pick()
        if sup is None:
            return
        pause = self.rng.uniform(0.5, 3 * HEARTBEAT)
        sup.stopped = True
        sup.signal(signal.SIGSTOP)
        self.counts["stop_supervisor"] += 1
        if pause > HEARTBEAT:
            self.notes["stop_past_lease"] += 1

        def resume() -> None:
            sup.stopped = False
            sup.signal(signal.SIGCONT)

        self._later(pause, resume)

    def _claimers(self, rows: list[tuple[Any, ...]] | None) -> list[Instance]:
        """The live, running supervisors holding rows whose ``claimed_by`` are ``rows[i][0]``."""
        pids = {_pid(r[0]) for r in rows or ()}
        return [i for i in self.cluster.live() if not i.stopped and i.proc.pid in pids]

    def _kill_spawning(self) -> None:
        """Kill -9 a supervisor whose child runs ``chaos.Fan``: its run dies amid its spawns
        (new ones, or those of an earlier run it gets back from their records), perhaps in
        the middle of one, and the next run must end up with each child exactly once."""
        rows = self.cluster.query(
            "SELECT j.claimed_by, (SELECT count(*) FROM atlantis.job_steps s "
            "                       WHERE s.job_id = j.id AND s.kind = 'spawn') "
            "                    < (j.args->>'n')::int "
            "  FROM atlantis.jobs j WHERE j.job = %s AND j.state = 'running'", ("chaos.Fan",))
        candidates = self._claimers(rows)
        if not candidates:
            return
        sup = self.rng.choice(candidates)
        self.counts["kill_spawning"] += 1
        self.notes["spawning_new"] += any(r[1] and _pid(r[0]) == sup.proc.pid
                                          for r in rows or ())
        slot = next(s for s in self.cluster.slots if s.current is sup)
        sup.killed = True
        sup.signal(signal.SIGKILL)
        sup.proc.wait()
        self._later(self.rng.uniform(0.2, 1.0), lambda: self.cluster.start_supervisor(slot))

    def _stop_crunching(self) -> None:
        """Stop (past the lease) or kill a supervisor whose child runs ``chaos.Crunch``,
        most likely inside one of its C calls that hold the GIL: only the lease keeper can
        end that attempt before the row is claimed again."""
        candidates = self._claimers(self.cluster.query(
            "SELECT claimed_by FROM atlantis.jobs WHERE job = 'chaos.Crunch' AND state = 'running'"))
        if not candidates:
            return
        sup = self.rng.choice(candidates)
        self.counts["stop_crunching"] += 1
        if self.rng.random() < 0.5:
            self.notes["crunch_killed"] += 1
            sup.killed = True
            sup.signal(signal.SIGKILL)
            sup.proc.wait()
            slot = next(s for s in self.cluster.slots if s.current is sup)
            self._later(self.rng.uniform(0.2, 1.0), lambda: self.cluster.start_supervisor(slot))
            return
        self.notes["crunch_stopped"] += 1
        sup.stopped = True
        sup.signal(signal.SIGSTOP)

        def resume() -> None:
            sup.stopped = False
            sup.signal(signal.SIGCONT)

        self._later(self.rng.uniform(2 * HEARTBEAT, 3 * HEARTBEAT), resume)

    def _restart_postgres(self) -> None:
        mode = self.rng.choice(["fast", "fast", "immediate"])
        self.cluster.disconnect()
        self.cluster.server.restart(mode)
        self.counts["restart_postgres"] += 1
        self.notes[f"restart_{mode}"] += 1

    def _cut(self) -> None:
        proxy = self.rng.choice(self.cluster.slots).proxy
        if not proxy.running:
            return
        proxy.stop()
        self.counts["cut"] += 1
        self._later(self.rng.uniform(0.1, 2 * HEARTBEAT), proxy.start)

    def _half_open(self) -> None:
        proxy = self.rng.choice(self.cluster.slots).proxy
        if not proxy.flowing.is_set():
            return
        proxy.freeze()
        hold = self.rng.uniform(0.5, 4 * HEARTBEAT)
        self.counts["half_open"] += 1
        if hold > HEARTBEAT:
            self.notes["half_open_past_lease"] += 1
        self._later(hold, proxy.thaw)

    def _cancel(self) -> None:
        # Long running jobs first: the cancel then reaches a handler mid-run (a durable job
        # is long when its bodies are, and is cancelled asleep like any job waiting; so are
        # the waiters, fan-outs and leaves, by their ticks: a fan-out's cancel cascades).
        # A workflow's rows are cancelled with their workflow (_cancel_workflow).
        rows = self.cluster.query(
            "SELECT id FROM atlantis.jobs WHERE state IN ('running', 'available') "
            "AND workflow_id IS NULL "
            "ORDER BY state = 'running' AND CASE "
            "  WHEN job IN ('chaos.Durable', 'chaos.Waiter', 'chaos.Fan', 'chaos.Leaf') "
            "  THEN (args->>'tick_ms')::int >= 300 ELSE (args->>'ticks')::int >= 10 END DESC, "
            "  random() LIMIT 1")
        if not rows:
            return
        job_id = int(rows[0][0])
        self.cancelled.add(job_id)  # before asking: a cancel whose answer is lost still counts
        self.cluster.tide("job", "cancel", str(job_id))
        self.counts["cancel"] += 1

    def _pause(self) -> None:
        if self.paused:
            return
        self.paused = True
        self.cluster.tide("queue", "pause", QUEUE, "--reason", "chaos")
        self.counts["pause"] += 1

        def resume() -> None:
            self.cluster.tide("queue", "resume", QUEUE)
            self.paused = False

        self._later(self.rng.uniform(0.3, 3.0), resume)

    def _order(self) -> None:
        """``tide worker drain`` (now and then ``--exit``: its slot restarts it drained) or
        ``tide worker evict`` of a slot's supervisor, by its name; resumed after a while.
        Its attempts finish or are given back unspent: nothing may be lost or run twice."""
        slot = self.rng.choice(self.cluster.slots)
        name = slot_name(slot.index)
        sup = slot.current
        if name in self.ordered or sup is None or not sup.alive or not sup.announced():
            return
        self.ordered.add(name)
        self.counts["order"] += 1
        if self.rng.random() < 0.4:
            self.notes["order_evict"] += 1
            self.cluster.tide("worker", "evict", name)
        elif self.rng.random() < 0.3:
            self.notes["order_exit"] += 1
            sup.told_to_exit = True
            self.cluster.tide("worker", "drain", name, "--exit")

            def restart() -> None:  # a restart policy: the slot comes back, still drained
                if slot.current is not sup or sup.killed:
                    return  # replaced already, or killed meanwhile: that fault restarts it
                if sup.alive:
                    self._later(0.5, restart)  # not drained yet (or resumed first)
                else:
                    self.cluster.start_supervisor(slot)

            self._later(self.rng.uniform(1.0, 3.0), restart)
        else:
            self.cluster.tide("worker", "drain", name)

        def resume() -> None:
            self.cluster.tide("worker", "resume", name)
            self.ordered.discard(name)

        self._later(self.rng.uniform(1.5, 5.0), resume)

    def _sighup(self) -> None:
        sup = self._pick()
        if sup is None or not sup.announced():
            return
        sup.signal(signal.SIGHUP)
        self.counts["sighup"] += 1

    def _cancel_workflow(self) -> None:
        """Cancel a running workflow, one with a step running first: half the time with
        ``atlantis.cancel_workflow``, else with ``atlantis.cancel`` of its running step's
        row (which cancels the whole workflow). Its state before the cancel is read under
        the instance's lock, in the cancel's transaction."""
        rows = self.cluster.query(
            "SELECT w.id, (SELECT j.id FROM atlantis.jobs j WHERE j.workflow_id = w.id "
            "                 AND NOT j.compensation AND j.state = 'running' LIMIT 1) "
            "  FROM atlantis.workflow_instances w WHERE w.state = 'running' "
            " ORDER BY 2 IS NULL, random() LIMIT 1")
        conn = self.cluster.conn()
        if not rows or conn is None:
            return
        wid, step_job = int(rows[0][0]), rows[0][1]
        through_step = step_job is not None and self.rng.random() < 0.5
        self.workflow_cancelled.add(wid)  # before asking, as for jobs
        self.counts["cancel_workflow"] += 1
        try:
            with conn.transaction():
                row = conn.execute("SELECT state FROM atlantis.workflow_instances "
                                   "WHERE id = %s FOR NO KEY UPDATE", (wid,)).fetchone()
                if through_step:
                    atlantis.cancel(conn, int(step_job), by="chaos")
                    self.notes["cancel_workflow_step"] += 1
                else:
                    atlantis.cancel_workflow(conn, wid, by="chaos")
        except psycopg.OperationalError:  # the server restarts: whether it went through is unknown
            self.cluster.disconnect()
            return
        if row is not None and row[0] == "running":
            self.workflow_cancel_running.add(wid)
        else:
            self.notes["cancel_workflow_late"] += 1
