"""The chaos run: supervisors serve a stream of jobs while a driver injects faults at random.

Everything runs on a PostgreSQL of the run's own (:mod:`chaos.server`), which the driver
restarts at will; each supervisor reaches it through a TCP proxy of its own
(:mod:`chaos.cluster`); handlers record their history directly (:mod:`chaos.app`). After
``--minutes`` of faults (:mod:`chaos.faults`) the driver undoes whatever fault is still in
force, stops enqueueing, waits for every job to finish, looks for processes that outlived
their supervisor, stops the supervisors and checks the recorded history
(:mod:`chaos.check`, :mod:`chaos.durable`, :mod:`chaos.waits`). All along, a thread samples
the running rows of the limited job (:class:`Sampler`), and the driver sends the waiters
their events (:mod:`chaos.sender`). Exit 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

import atlantis
from chaos import check, durable, waits
from chaos.app import DURABLE, LIMITED, registry
from chaos.cluster import Cluster
from chaos.faults import Faults, say
from chaos.sender import Sender
from chaos.server import OwnServer

BACKLOG = 150
"""The producer keeps about this many jobs waiting."""
WORKFLOWS = 10
"""... and about this many workflows (``chaos.Order``) running or compensating."""
WORKFLOW = "chaos.Order"
LIMITED_BACKLOG = 20
"""... and about this many ``chaos.Limited`` waiting, over ACCOUNTS (the first ones the
busiest), so that both its limits are reached again and again."""
CRUNCH = "chaos.Crunch"
CRUNCHING = 1
"""... and about this many ``chaos.Crunch`` waiting or running: C calls of about 1.5-4 s each
(on a quiet machine of two cores) that hold the GIL, so that a fault finds an attempt whose
lease only the keeper can end (one at a time: each holds a core, its grandchild another)."""
DURABLES = 6
"""... and about this many ``chaos.Durable`` waiting, running or asleep (issue 34)."""
ACCOUNTS = {"a0": 4, "a1": 2, "a2": 1, "a3": 1}
"""Account -> relative weight."""
PER_ACCOUNT = next(lim.n for lim in registry.decls[LIMITED].limits if lim.by == ("account",))
IN_ALL = next(lim.n for lim in registry.decls[LIMITED].limits if not lim.by)
"""Its limits, as chaos/jobs.atl declares them."""
SAMPLE_EVERY = 0.1
"""Seconds between two samples of the running rows of ``chaos.Limited``."""


@dataclass(frozen=True)
class Options:
    minutes: float = 1.0
    supervisors: int = 3
    seed: int = 0
    concurrency: int = 4
    settle: float = 180.0
    """After the faults: how long every job may take to finish."""
    mean_gap: float = 1.0
    """Mean time between two faults (exponentially distributed)."""
    keep: bool = False


def parse(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="scripts/chaos",
                                description="A Jepsen-style run of atlantis under faults.")
    p.add_argument("--minutes", type=float, default=1.0, help="how long faults are injected")
    p.add_argument("--supervisors", type=int, default=3, help="supervisors serving the queue")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--concurrency", type=int, default=4, help="children per supervisor")
    p.add_argument("--settle", type=float, default=180.0,
                   help="seconds every job may take to finish once the faults stop")
    p.add_argument("--mean-gap", type=float, default=1.0, help="mean seconds between faults")
    p.add_argument("--keep", action="store_true",
                   help="keep the supervisors' logs (they are kept anyway when a check fails)")
    a = p.parse_args(argv)
    if a.supervisors < 1 or a.concurrency < 1 or a.minutes <= 0 or a.mean_gap <= 0:
        p.error("--supervisors, --concurrency, --minutes and --mean-gap must be positive")
    seed = a.seed if a.seed is not None else secrets.randbelow(2**31)
    return Options(a.minutes, a.supervisors, seed, a.concurrency, a.settle, a.mean_gap, a.keep)


#: A workflow doomed to time out takes its 30 s timeout to fail: none starts this close to
#: the end of the faults, so that the settle waits for none.
SLOW_BEFORE_END = 35.0


class Producer:
    """Keeps about BACKLOG jobs waiting: mostly short ones, some long (they span faults and
    outlive leases), some failing their first attempt, some failing every attempt; and
    about WORKFLOWS workflows going, some doomed to fail at a step or to time out, some
    with compensations failing their first attempt; and about DURABLES durable jobs, whose
    arguments come from a random stream of their own (``durable_rng``), so that a seed
    draws the rest of the mix as it did before them."""

    def __init__(self, cluster: Cluster, rng: random.Random,
                 durable_rng: random.Random | None = None) -> None:
        self.cluster = cluster
        self.rng = rng
        self.durable_rng = durable_rng or random.Random(rng.random())
        self.enqueued = 0
        self.started = 0
        self._next = 0.0
        self.slow_ok = True
        """Whether a workflow may still be doomed to time out: not in the fault phase's last
        SLOW_BEFORE_END seconds, where it would only lengthen the wait for the settle."""

    def step(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + 0.5
        rows = self.cluster.query(
            "SELECT count(*) FILTER (WHERE job NOT IN ('chaos.Limited', 'chaos.Durable', "
            "                          'chaos.Waiter', 'chaos.Fan', 'chaos.Leaf') "
            "                          AND state = 'available'), "
            "       count(*) FILTER (WHERE job = 'chaos.Limited' AND state = 'available'), "
            "       (SELECT count(*) FROM atlantis.workflow_instances "
            "         WHERE state IN ('running', 'compensating')), "
            "       count(*) FILTER (WHERE job = 'chaos.Crunch'), "
            "       count(*) FILTER (WHERE job = 'chaos.Durable') "
            "  FROM atlantis.jobs WHERE state = 'available' "
            "    OR (job IN ('chaos.Crunch', 'chaos.Durable') AND state = 'running')")
        if rows is None:
            return
        waiting, held, going, crunching, durables = rows[0]
        flows = [self.workflow_args() for _ in range(min(4, max(0, WORKFLOWS - going)))]
        work: list[dict[str, Any]] = []
        doomed: list[dict[str, Any]] = []
        rng = self.rng
        for _ in range(max(0, BACKLOG - waiting)):
            r = rng.random()
            if r < 0.04:
                doomed.append({"ticks": rng.randint(1, 2), "tick_ms": 10})
            elif r < 0.10:
                work.append({"ticks": rng.randint(1, 2), "tick_ms": 10, "fail": "first"})
            elif r < 0.17:
                work.append({"ticks": rng.randint(10, 25), "tick_ms": rng.randint(100, 150)})
            else:
                work.append({"ticks": rng.randint(1, 2), "tick_ms": rng.randint(2, 20)})
        limited = [self.limited_args() for _ in range(max(0, LIMITED_BACKLOG - held))]
        crunch = [{"calls": rng.randint(1, 2), "digits": rng.randint(2000, 5000),
                   "grandchild": rng.random() < 0.5}
                  for _ in range(max(0, CRUNCHING - crunching))]
        durables_args = [durable.args(self.durable_rng)
                         for _ in range(max(0, DURABLES - durables))]
        conn = self.cluster.conn()
        if conn is None or not (work or doomed or flows or limited or crunch or durables_args):
            return
        try:
            with conn.transaction():
                if work:
                    self.enqueued += len(atlantis.enqueue_many(conn, "chaos.Work", work))
                if limited:
                    self.enqueued += len(atlantis.enqueue_many(conn, LIMITED, limited))
                if doomed:
                    self.enqueued += len(atlantis.enqueue_many(conn, "chaos.Doomed", doomed))
                if crunch:
                    self.enqueued += len(atlantis.enqueue_many(conn, CRUNCH, crunch))
                if durables_args:
                    self.enqueued += len(atlantis.enqueue_many(conn, DURABLE, durables_args))
                for args in flows:
                    atlantis.start_workflow(conn, WORKFLOW, args)
            self.started += len(flows)
        except psycopg.OperationalError:  # the server restarts: enqueue again later
            self.cluster.disconnect()

    def limited_args(self) -> dict[str, Any]:
        """Mostly short; 10% run 1-4 s (past their lease, across faults), 5% fail once."""
        rng = self.rng
        account = rng.choices(list(ACCOUNTS), weights=list(ACCOUNTS.values()))[0]
        r = rng.random()
        if r < 0.05:
            return {"account": account, "ticks": 1, "tick_ms": 10, "fail": "first"}
        if r < 0.15:
            return {"account": account, "ticks": rng.randint(10, 25),
                    "tick_ms": rng.randint(100, 150)}
        return {"account": account, "ticks": rng.randint(1, 3), "tick_ms": rng.randint(20, 80)}

    def workflow_args(self) -> dict[str, Any]:
        """Short steps; 10% fail for good at charge, 10% at ship (the last step), 5% time
        out (notify outlasts the workflow); a third of compensations fail once."""
        rng = self.rng
        r = rng.random()
        doom = ("charge" if r < 0.10 else "ship" if r < 0.20
                else "slow" if r < 0.25 and self.slow_ok else "never")
        return {"ticks": rng.randint(1, 3), "tick_ms": rng.randint(5, 60), "doom": doom,
                "fail": "first" if rng.random() < 0.33 else "never"}


class Sampler:
    """Samples, every SAMPLE_EVERY seconds on a connection of its own (in a thread), how
    many rows of ``chaos.Limited`` are ``running`` per account: one statement, so one
    snapshot, stamped by PostgreSQL's clock. While the server restarts it tries again."""

    QUERY = ("SELECT clock_timestamp(), coalesce(jsonb_object_agg(account, n), '{}') "
             "  FROM (SELECT args->>'account' AS account, count(*) AS n FROM atlantis.jobs "
             "         WHERE job = 'chaos.Limited' AND state = 'running' GROUP BY 1) r")

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[check.LimitSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limit-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[check.LimitSample]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.samples

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3,
                                           application_name="chaos-sampler")
                row = conn.execute(self.QUERY).fetchone()
            except psycopg.OperationalError:
                if conn is not None:
                    conn.close()
                conn = None
                continue
            if row is not None:
                self.samples.append(check.LimitSample(row[0], {str(k): int(v)
                                                               for k, v in row[1].items()}))
        if conn is not None:
            conn.close()


def inject_faults(opts: Options, faults: Faults, producer: Producer, sender: Sender,
                  rng: random.Random) -> None:
    start = time.monotonic()
    end = start + opts.minutes * 60
    next_fault = start + 2.0  # let the supervisors start first
    next_report = start + 15
    while (now := time.monotonic()) < end:
        faults.tick(now=now)
        producer.slow_ok = end - now > SLOW_BEFORE_END
        producer.step(now)
        sender.step(now)
        if now >= next_fault:
            faults.inject()
            next_fault = time.monotonic() + rng.expovariate(1 / opts.mean_gap)
        if now >= next_report:
            next_report = now + 15
            say(f"{round(now - start)}s: {producer.enqueued} jobs enqueued, "
                f"{producer.started} workflows started, {len(sender.sent)} events sent, "
                f"{sum(faults.counts.values())} faults")
        time.sleep(0.05)


def settle(cluster: Cluster, seconds: float) -> bool:
    """Wait until every job and every workflow is finished, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    next_report = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = cluster.query(
            "SELECT (SELECT count(*) FROM atlantis.jobs "
            "         WHERE state NOT IN ('complete', 'dead', 'cancelled')), "
            "       (SELECT count(*) FROM atlantis.workflow_instances "
            "         WHERE state IN ('running', 'compensating'))")
        if rows is not None and rows[0] == (0, 0):
            return True
        if rows is not None and time.monotonic() >= next_report:
            next_report = time.monotonic() + 10
            say(f"settling: {rows[0][0]} jobs and {rows[0][1]} workflows not finished yet")
        time.sleep(0.5)
    return False


def read_history(cluster: Cluster, faults: Faults, samples: list[check.LimitSample],
                 sent: list[waits.Sent]) -> check.History:
    with psycopg.connect(cluster.db_url, autocommit=True) as conn:
        jobs = [check.JobRow(*r) for r in conn.execute(
            "SELECT id, job, state, attempt, max_attempts, "
            "       state = 'running' AND claimed_until < now(), "
            "       workflow_id, step, compensation, "
            "       workflow_id IS NOT NULL AND NOT compensation AND args->>'doom' = step, "
            "       parent_id "
            "  FROM atlantis.jobs ORDER BY id").fetchall()]
        events = [check.Event(*r) for r in conn.execute(
            "SELECT job_id, attempt, run, pid, event, at FROM chaos_history ORDER BY id"
        ).fetchall()]
        # A plain job's key is its id; a workflow's rows' keys hold a colon.
        effects = {int(r[0]): int(r[1]) for r in conn.execute(
            "SELECT job_id, count(*) FROM chaos_effects WHERE key NOT LIKE '%:%' "
            "GROUP BY job_id").fetchall()}
        keyed = {str(r[0]): int(r[1]) for r in conn.execute(
            "SELECT key, count(*) FROM chaos_effects WHERE key LIKE '%:%' GROUP BY key"
        ).fetchall()}
        workflows = [check.WorkflowRow(*r) for r in conn.execute(
            "SELECT id, state, cause, failed_step, args->>'doom' = 'slow' "
            "  FROM atlantis.workflow_instances ORDER BY id"
        ).fetchall()]
        steps = [check.StepRow(*r) for r in conn.execute(
            "SELECT w.id, s.step, s.compensate, s.job_id, s.comp_job_id, "
            "       coalesce(s.started, false) "
            "  FROM atlantis.workflow_instances w, atlantis.workflow_step_states(w.id) s "
            " ORDER BY w.id, s.ord").fetchall()]
        limited = {int(r[0]): str(r[1]) for r in conn.execute(
            "SELECT id, args->>'account' FROM atlantis.jobs WHERE job = %s", (LIMITED,)
        ).fetchall()}
        durable_history = durable.read(conn)
        wait_history = waits.read(conn, sent)
    return check.History(jobs, events, effects, set(faults.cancelled),
                         set(faults.cancel_accepted), workflows=workflows, steps=steps,
                         keyed=keyed, workflow_cancelled=set(faults.workflow_cancelled),
                         workflow_cancel_running=set(faults.workflow_cancel_running),
                         limited=limited, samples=samples, per_account=PER_ACCOUNT,
                         in_all=IN_ALL, durable=durable_history, waits=wait_history)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    started = time.monotonic()
    say(f"seed {opts.seed}, {opts.supervisors} supervisors x {opts.concurrency} children, "
        f"{opts.minutes:g} min of faults")
    rng = random.Random(opts.seed)
    server = OwnServer.create(prefix="atl-c")
    folder = server.home / "logs"
    folder.mkdir()
    cluster = Cluster(server, folder, opts.concurrency)
    faults = Faults(cluster, rng)
    sampler = Sampler(cluster.db_url)
    ok = False
    try:
        cluster.prepare(opts.supervisors)
        sampler.start()
        producer = Producer(cluster, rng, random.Random(f"durable {opts.seed}"))
        sender = Sender(cluster, random.Random(f"waits {opts.seed}"))
        inject_faults(opts, faults, producer, sender, rng)
        say("faults stop; undoing those in force and waiting for every job to finish")
        faults.calm()
        if not sender.finish(opts.settle):
            say("some events could not be sent")
        say("settled" if settle(cluster, opts.settle) else f"not settled after {opts.settle:g}s")
        samples = sampler.stop()
        orphans = cluster.orphans()
        alive = {id(i) for i in cluster.live()}
        cluster.stop_supervisors()
        orphans += [o for o in cluster.orphans() if o not in orphans]
        history = read_history(cluster, faults, samples, sender.sent)
        history.orphans = orphans
        history.supervisors = [
            check.SupervisorFate(i.name, i.killed, id(i) in alive, i.stop_code, i.proc.returncode,
                                 i.told_to_exit)
            for i in cluster.instances()]
        results = check.check(history)
        print(check.table(faults.rows(), results))
        in_flows = sum(1 for j in history.jobs if j.workflow_id is not None)
        print(f"\n{len(history.jobs)} jobs ({in_flows} of them steps and compensations of "
              f"{len(history.workflows)} workflows, {len(history.limited)} {LIMITED} under "
              f"concurrency {PER_ACCOUNT} by account and {IN_ALL} in all, "
              f"{len(history.samples)} samples of its running rows, "
              f"{len(history.durable.plans)} {DURABLE}, {len(history.waits.waiters)} "
              f"{waits.WAITER} ({len(history.waits.sent)} events sent to them), "
              f"{len(history.waits.fans)} {waits.FAN} ({len(history.waits.spawns)} "
              f"children spawned)), "
              f"{len(history.events)} events recorded, "
              f"{faults.notes['tide_failed']} tide commands failed (database down), "
              f"{time.monotonic() - started:.0f}s in all; seed {opts.seed}")
        ok = all(r.ok for r in results)
        return 0 if ok else 1
    finally:
        sampler.stop()
        cluster.cleanup()
        if opts.keep or not ok:
            kept = tempfile.mkdtemp(prefix="chaos-logs-")
            shutil.copytree(folder, kept, dirs_exist_ok=True)
            say(f"the supervisors' logs are kept in {kept}")
        server.close()


if __name__ == "__main__":
    sys.exit(main())
