"""The chaos run: supervisors serve a stream of jobs while a driver injects faults at random.

Everything runs on a PostgreSQL of the run's own (:mod:`chaos.server`), which the driver
restarts at will. Each supervisor reaches it through a TCP proxy of its own on 127.0.0.1
(:mod:`chaos.proxy`), which the driver cuts or leaves half-open; handlers record their
history on a direct connection (``--handler-database-url``). After ``--minutes`` of faults
the driver undoes whatever fault is still in force, stops enqueueing, waits for every job
to finish, looks for processes that outlived their supervisor, stops the supervisors and
checks the recorded history (:mod:`chaos.check`).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
import psycopg

import atlantis
from atlantis.app import load_app
from atlantis.store import migrate, sync
from chaos import check
from chaos.proxy import Proxy
from chaos.server import OwnServer

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
APP = "chaos.app:registry"
QUEUE = "chaos"
MARKER = "ATLANTIS_CHAOS_RUN"
"""Environment variable every process of the run carries (supervisors, and through them
their children), with the run's token: how orphans are found."""
HEARTBEAT = 2.0
"""The workload's heartbeat, hence its lease (chaos/jobs.atl)."""
BACKLOG = 150
"""The producer keeps about this many jobs waiting."""


@dataclass
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
    p = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=1.0, help="how long faults are injected")
    p.add_argument("--supervisors", type=int, default=3, help="supervisors serving the queue")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--concurrency", type=int, default=4, help="children per supervisor")
    p.add_argument("--settle", type=float, default=180.0,
                   help="seconds every job may take to finish once the faults stop")
    p.add_argument("--mean-gap", type=float, default=1.0, help="mean seconds between faults")
    p.add_argument("--keep", action="store_true", help="keep the run's folder (logs, data)")
    a = p.parse_args(argv)
    if a.supervisors < 1 or a.concurrency < 1 or a.minutes <= 0 or a.mean_gap <= 0:
        p.error("--supervisors, --concurrency, --minutes and --mean-gap must be positive")
    seed = a.seed if a.seed is not None else secrets.randbelow(2**31)
    return Options(a.minutes, a.supervisors, seed, a.concurrency, a.settle, a.mean_gap, a.keep)


# ---- supervisors ----------------------------------------------------------------------------


@dataclass(eq=False)
class Instance:
    """One supervisor process; a slot gets a new instance when the driver kills its last."""

    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    killed: bool = False
    stopped: bool = False
    stop_code: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)  # a no-op once the process has been reaped


@dataclass
class Slot:
    index: int
    proxy: Proxy
    instances: list[Instance] = field(default_factory=list)

    @property
    def current(self) -> Instance | None:
        return self.instances[-1] if self.instances else None


# ---- the run --------------------------------------------------------------------------------


class Run:
    def __init__(self, opts: Options, folder: Path, server: OwnServer) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.folder = folder
        self.server = server
        self.db_url = psycopg.conninfo.make_conninfo(server.admin_url, dbname="chaos")
        self.token = secrets.token_hex(8)
        self.slots: list[Slot] = []
        self.faults: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()
        self.undo: list[tuple[float, str, Callable[[], None]]] = []
        self.cancelled: set[int] = set()
        self.tides: list[subprocess.Popen[bytes]] = []
        self.paused = False
        self.enqueued = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._next_enqueue = 0.0

    # ---- setup ------------------------------------------------------------------------

    def prepare(self) -> None:
        with psycopg.connect(self.server.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        with psycopg.connect(self.db_url) as conn:
            migrate(conn)
            sync(conn, list(load_app(APP).decls.values()))
            from chaos.app import SCHEMA

            conn.execute(SCHEMA)
            conn.commit()
        for i in range(self.opts.supervisors):
            proxy = Proxy(self.server.socket)
            proxy.start()
            slot = Slot(i, proxy)
            self.slots.append(slot)
            self.start_supervisor(slot)

    def start_supervisor(self, slot: Slot) -> None:
        n = len(slot.instances)
        name = f"s{slot.index}" + (f"#{n}" if n else "")
        isolation = "fresh" if slot.index % 2 else "reuse"
        argv = [str(BIN / "atlantis-supervise"), "--database-url", slot.proxy.url(self.db_url),
                "--handler-database-url", self.db_url, "--queue", QUEUE, "--app", APP,
                "--concurrency", str(self.opts.concurrency), "--isolation", isolation,
                "--poll-interval", "0.2s", "--rescue-interval", "0.5s", "--kill-grace", "1s",
                "--cancel-grace", "1s", "--drain-timeout", "5s", "--max-backoff", "2s",
                "--worker-refresh", "1s", "--pause-poll", "0.5s", "--listen-ping", "2s",
                "--claim-timeout", "2s", "--finish-timeout", "3s"]
        env = {**os.environ, MARKER: self.token}
        env.pop("ATLANTIS_DATABASE_URL", None)
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - closed at the end
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        slot.instances.append(Instance(name, proc, log))

    # ---- the database, directly ---------------------------------------------------------

    def conn(self) -> psycopg.Connection[Any] | None:
        """The driver's own direct connection, or None while the server is down."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            self._conn = psycopg.connect(self.db_url, autocommit=True, connect_timeout=3,
                                         application_name="chaos-driver")
        except psycopg.OperationalError:
            self._conn = None
        return self._conn

    def query(self, sql: Any, params: Any = None) -> list[tuple[Any, ...]] | None:
        conn = self.conn()
        if conn is None:
            return None
        try:
            return conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            conn.close()
            self._conn = None
            return None

    def produce(self, now: float) -> None:
        """Keep about BACKLOG jobs waiting, in a mix of short, long, flaky and doomed ones."""
        if now < self._next_enqueue:
            return
        self._next_enqueue = now + 0.5
        rows = self.query("SELECT count(*) FROM atlantis.jobs WHERE state = 'available'")
        if rows is None or rows[0][0] >= BACKLOG:
            return
        work: list[dict[str, Any]] = []
        doomed: list[dict[str, Any]] = []
        for _ in range(BACKLOG - rows[0][0]):
            r = self.rng.random()
            if r < 0.04:
                doomed.append({"ticks": self.rng.randint(1, 2), "tick_ms": 10})
            elif r < 0.10:
                work.append({"ticks": self.rng.randint(1, 2), "tick_ms": 10, "fail": "first"})
            elif r < 0.14:  # long: spans faults, SIGSTOPs past the lease, cuts
                work.append({"ticks": self.rng.randint(10, 25),
                             "tick_ms": self.rng.randint(100, 150)})
            else:
                work.append({"ticks": self.rng.randint(1, 2), "tick_ms": self.rng.randint(2, 20)})
        conn = self.conn()
        if conn is None:
            return
        try:
            with conn.transaction():
                self.enqueued += len(atlantis.enqueue_many(conn, "chaos.Work", work))
                if doomed:
                    self.enqueued += len(atlantis.enqueue_many(conn, "chaos.Doomed", doomed))
        except psycopg.OperationalError:  # the server restarts: enqueue again later
            conn.close()
            self._conn = None

    # ---- faults -----------------------------------------------------------------------

    def live(self) -> list[Instance]:
        return [s.current for s in self.slots if s.current is not None and s.current.alive]

    def later(self, delay: float, what: str, action: Callable[[], None]) -> None:
        self.undo.append((time.monotonic() + delay, what, action))

    def run_due(self, now: float, *, all_now: bool = False) -> None:
        due = [u for u in self.undo if all_now or u[0] <= now]
        self.undo = [u for u in self.undo if u not in due]
        for _, _, action in sorted(due, key=lambda u: u[0]):
            action()

    def inject(self) -> None:
        kinds = {
            "kill_child": 3.0, "kill_supervisor": 1.0, "stop_supervisor": 1.5,
            "restart_postgres": 0.7, "cut": 1.5, "half_open": 1.5, "cancel": 2.0,
            "pause": 0.6, "sighup": 0.6,
        }
        names = list(kinds)
        kind = self.rng.choices(names, weights=[kinds[k] for k in names])[0]
        getattr(self, f"fault_{kind}")()

    def _pick(self, *, running: bool = True) -> Instance | None:
        candidates = [i for i in self.live() if not (running and i.stopped)]
        return self.rng.choice(candidates) if candidates else None

    def fault_kill_child(self) -> None:
        sup = self._pick()
        if sup is None:
            return
        try:
            children = psutil.Process(sup.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        if not children:
            return
        victim = self.rng.choice(children)
        try:
            victim.kill()  # psutil refuses a pid that was reused meanwhile
        except psutil.NoSuchProcess:
            return
        self.faults["kill_child"] += 1

    def fault_kill_supervisor(self) -> None:
        sup = self._pick(running=False)
        if sup is None:
            return
        sup.killed = True
        sup.signal(signal.SIGKILL)
        sup.proc.wait()
        self.faults["kill_supervisor"] += 1
        slot = next(s for s in self.slots if s.current is sup)
        self.later(self.rng.uniform(0.2, 2.0), "restart", lambda: self.start_supervisor(slot))

    def fault_stop_supervisor(self) -> None:
        sup = self._pick()
        if sup is None:
            return
        pause = self.rng.uniform(0.5, 3 * HEARTBEAT)
        sup.stopped = True
        sup.signal(signal.SIGSTOP)
        self.faults["stop_supervisor"] += 1
        if pause > HEARTBEAT:
            self.notes["stop_past_lease"] += 1

        def resume() -> None:
            sup.stopped = False
            sup.signal(signal.SIGCONT)

        self.later(pause, "SIGCONT", resume)

    def fault_restart_postgres(self) -> None:
        mode = self.rng.choice(["fast", "fast", "immediate"])
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.server.restart(mode)
        self.faults["restart_postgres"] += 1
        self.notes[f"restart_{mode}"] += 1

    def fault_cut(self) -> None:
        slot = self.rng.choice(self.slots)
        if not slot.proxy.running:
            return
        slot.proxy.stop()
        self.faults["cut"] += 1
        self.later(self.rng.uniform(0.1, 2 * HEARTBEAT), "reconnect", slot.proxy.start)

    def fault_half_open(self) -> None:
        slot = self.rng.choice(self.slots)
        if not slot.proxy.flowing.is_set():
            return
        slot.proxy.freeze()
        hold = self.rng.uniform(0.5, 4 * HEARTBEAT)
        self.faults["half_open"] += 1
        if hold > HEARTBEAT:
            self.notes["half_open_past_lease"] += 1
        self.later(hold, "thaw", slot.proxy.thaw)

    def tide(self, *args: str) -> None:
        """Run ``tide`` on the direct URL, in the background (reaped by the main loop)."""
        env = {**os.environ, "ATLANTIS_DATABASE_URL": self.db_url}
        self.tides.append(subprocess.Popen(
            [str(BIN / "tide"), *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

    def reap_tides(self, *, wait: bool = False) -> None:
        for proc in list(self.tides):
            if wait:
                proc.wait(60)
            if proc.poll() is None:
                continue
            self.tides.remove(proc)
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            if proc.stderr:
                proc.stderr.close()
            if proc.returncode != 0 and "nothing to cancel" in err:
                self.notes["cancel_too_late"] += 1  # the job finished first
            elif proc.returncode != 0:
                self.notes["tide_failed"] += 1
                self.say(f"{proc.args!r} exited {proc.returncode}: {err.strip()[-300:]}")

    def fault_cancel(self) -> None:
        # Long running jobs first: the cancel then reaches a handler mid-run.
        rows = self.query("SELECT id FROM atlantis.jobs WHERE state IN ('running', 'available') "
                          "ORDER BY state = 'running' AND (args->>'ticks')::int >= 10 DESC, "
                          "random() LIMIT 1")
        if not rows:
            return
        job_id = int(rows[0][0])
        self.cancelled.add(job_id)  # before asking: a cancel whose answer is lost still counts
        self.tide("job", "cancel", str(job_id))
        self.faults["cancel"] += 1

    def fault_pause(self) -> None:
        if self.paused:
            return
        self.paused = True
        self.tide("queue", "pause", QUEUE, "--reason", "chaos")
        self.faults["pause"] += 1

        def resume() -> None:
            self.tide("queue", "resume", QUEUE)
            self.paused = False

        self.later(self.rng.uniform(0.3, 3.0), "resume", resume)

    def fault_sighup(self) -> None:
        sup = self._pick()
        if sup is None:
            return
        sup.signal(signal.SIGHUP)
        self.faults["sighup"] += 1

    # ---- phases -------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"chaos: {text}", file=sys.stderr, flush=True)

    def chaos(self) -> None:
        start = time.monotonic()
        end = start + self.opts.minutes * 60
        next_fault = start + 2.0  # let the supervisors start first
        next_report = start + 15
        while (now := time.monotonic()) < end:
            self.run_due(now)
            self.reap_tides()
            self.produce(now)
            if now >= next_fault:
                self.inject()
                next_fault = time.monotonic() + self.rng.expovariate(1 / self.opts.mean_gap)
            if now >= next_report:
                next_report = now + 15
                self.say(f"{round(now - start)}s: {self.enqueued} jobs enqueued, "
                         f"{sum(self.faults.values())} faults")
            time.sleep(0.05)

    def calm(self) -> None:
        """Undo every fault still in force; the queue resumed; the server up."""
        self.run_due(time.monotonic(), all_now=True)
        if not self.server.running():
            self.server.start()
        for slot in self.slots:
            slot.proxy.start()
            slot.proxy.thaw()
        self.reap_tides(wait=True)
        self.tide("queue", "resume", QUEUE)
        self.reap_tides(wait=True)
        for slot in self.slots:
            if slot.current is None or not slot.current.alive and slot.current.killed:
                self.start_supervisor(slot)

    def settle(self) -> bool:
        """Wait until every job is finished (or the deadline)."""
        deadline = time.monotonic() + self.opts.settle
        next_report = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = self.query("SELECT count(*) FROM atlantis.jobs "
                              "WHERE state NOT IN ('complete', 'dead', 'cancelled')")
            if rows is not None and rows[0][0] == 0:
                return True
            if rows is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + 10
                self.say(f"settling: {rows[0][0]} jobs not finished yet")
            time.sleep(0.5)
        return False

    def marked(self) -> list[psutil.Process]:
        """Every process carrying this run's marker."""
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER) == self.token:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def orphans(self, grace: float = 10.0) -> list[str]:
        """Marked processes outside every live supervisor's tree, once ``grace`` has passed."""
        deadline = time.monotonic() + grace
        while True:
            keep: set[int] = set()
            for sup in self.live():
                keep.add(sup.proc.pid)
                try:
                    keep |= {c.pid for c in psutil.Process(sup.proc.pid).children(recursive=True)}
                except psutil.NoSuchProcess:
                    pass
            left = []
            for p in self.marked():
                if p.pid in keep:
                    continue
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    left.append(p)
                except psutil.NoSuchProcess:
                    continue
            if not left or time.monotonic() >= deadline:
                return [self.describe(p) for p in left]
            time.sleep(0.2)

    @staticmethod
    def describe(p: psutil.Process) -> str:
        try:
            return f"pid {p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:120]}"
        except psutil.Error:
            return f"pid {p.pid}"

    def stop_supervisors(self) -> None:
        live = self.live()
        for sup in live:
            sup.signal(signal.SIGTERM)
        for sup in live:
            try:
                sup.stop_code = sup.proc.wait(60)
            except subprocess.TimeoutExpired:
                sup.signal(signal.SIGKILL)
                sup.proc.wait()
                sup.stop_code = None

    def history(self) -> check.History:
        conn = psycopg.connect(self.db_url, autocommit=True)
        with conn:
            jobs = [check.JobRow(*r) for r in conn.execute(
                "SELECT id, job, state, attempt, max_attempts, "
                "       state = 'running' AND claimed_until < now() "
                "  FROM atlantis.jobs ORDER BY id").fetchall()]
            events = [check.Event(*r) for r in conn.execute(
                "SELECT job_id, attempt, run, pid, event, at FROM chaos_history ORDER BY id"
            ).fetchall()]
            effects = {int(r[0]): int(r[1]) for r in conn.execute(
                "SELECT job_id, count(*) FROM chaos_effects GROUP BY job_id").fetchall()}
        return check.History(jobs, events, effects, set(self.cancelled))

    def fault_rows(self) -> list[tuple[str, int, str]]:
        f, n = self.faults, self.notes
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
            ("SIGHUP of a supervisor", f["sighup"], ""),
        ]

    def cleanup(self) -> None:
        """Stop everything this run started, by pid, whatever happened."""
        for slot in self.slots:
            for inst in slot.instances:
                if inst.alive:
                    inst.signal(signal.SIGCONT)
                    inst.signal(signal.SIGKILL)
                    inst.proc.wait()
                inst.log.close()
            slot.proxy.thaw()
            slot.proxy.stop()
        for proc in self.tides:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for p in self.marked():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if self._conn is not None:
            self._conn.close()


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    started = time.monotonic()
    print(f"chaos: seed {opts.seed}, {opts.supervisors} supervisors x {opts.concurrency} children, "
          f"{opts.minutes:g} min of faults", file=sys.stderr, flush=True)
    server = OwnServer.create(prefix="atl-c")
    folder = server.home / "logs"
    folder.mkdir()
    run = Run(opts, folder, server)
    ok = False
    try:
        run.prepare()
        run.chaos()
        run.say("faults stop; undoing those in force and waiting for every job to finish")
        run.calm()
        settled = run.settle()
        run.say("settled" if settled else f"not settled after {opts.settle:g}s")
        orphans = run.orphans()
        alive = {id(i) for i in run.live()}
        run.stop_supervisors()
        orphans += [o for o in run.orphans() if o not in orphans]
        history = run.history()
        history.orphans = orphans
        history.supervisors = [
            check.SupervisorFate(i.name, i.killed, id(i) in alive, i.stop_code)
            for s in run.slots for i in s.instances]
        results = check.check(history)
        executions = sum(len(x) for x in check.executions(history.events).values())
        print(check.table(run.fault_rows(), results))
        print(f"\n{len(history.jobs)} jobs, {executions} executions, "
              f"{run.notes['tide_failed']} tide commands failed (database down), "
              f"{time.monotonic() - started:.0f}s in all; seed {opts.seed}")
        ok = all(r.ok for r in results)
        return 0 if ok else 1
    finally:
        run.cleanup()
        if opts.keep or not ok:
            kept = Path(tempfile.mkdtemp(prefix="chaos-logs-"))
            shutil.copytree(folder, kept, dirs_exist_ok=True)
            run.say(f"the supervisors' logs are kept in {kept}")
        server.close()
