"""What a chaos run starts: its own PostgreSQL, a TCP proxy and a supervisor per slot, and
``tide`` commands; and how it finds, at the end, processes that outlived their supervisor.

Every supervisor reaches the server through its slot's proxy on 127.0.0.1, so the driver
can cut or freeze one supervisor's connections; handlers and ``tide`` use the server's
unix socket directly. Every process of the run carries :data:`MARKER` in its environment
(children inherit it from their supervisor): that is how orphans are found, and how the
final cleanup finds whatever is left, by pid.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
import psycopg

from atlantis.app import load_app
from atlantis.store import migrate, sync
from chaos.proxy import Proxy
from chaos.server import OwnServer

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
APP = "chaos.app:registry"
UNLIMITED_APP = "chaos.app:unlimited"
LIMITED_SLOTS = 2
"""The supervisors of the first slots serve ``chaos.Limited`` too (APP), so that its limits
hold across two of them; the others serve the rest (UNLIMITED_APP) and claim ahead, which a
supervisor serving a limited job never does."""
QUEUE = "chaos"
MARKER = "ATLANTIS_CHAOS_RUN"
"""Environment variable every process of the run carries, with the run's token."""


@dataclass(eq=False)
class Instance:
    """One supervisor process; a slot gets a new instance when the driver kills its last."""

    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    killed: bool = False
    stopped: bool = False
    stop_code: int | None = None
    told_to_exit: bool = False
    """``tide worker drain --exit`` was asked of it: it may exit by itself (code 0)."""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def announced(self) -> bool:
        """Whether it said which database it uses: by then its signal handlers are set (a
        signal before that finds a bare interpreter starting, which any process would die of)."""
        self.log.flush()
        path = Path(self.log.name)
        return path.exists() and b"using database" in path.read_bytes()[:4096]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)  # a no-op once the process has been reaped: no pid reuse


@dataclass(eq=False)
class Slot:
    index: int
    proxy: Proxy
    instances: list[Instance] = field(default_factory=list)

    @property
    def current(self) -> Instance | None:
        return self.instances[-1] if self.instances else None


def slot_name(index: int) -> str:
    """The ``--name`` of every supervisor of slot ``index``: an operator's drain or eviction
    (the ``order`` fault) is kept for it across the slot's restarts."""
    return f"chaos-s{index}"


class Cluster:
    def __init__(self, server: OwnServer, folder: Path, concurrency: int) -> None:
        self.server = server
        self.folder = folder
        self.concurrency = concurrency
        self.db_url = psycopg.conninfo.make_conninfo(server.admin_url, dbname="chaos")
        self.token = secrets.token_hex(8)
        self.slots: list[Slot] = []
        self.tides: list[subprocess.Popen[bytes]] = []
        self.tide_errors: list[str] = []
        self._conn: psycopg.Connection[Any] | None = None

    def prepare(self, supervisors: int) -> None:
        """The database (migrated, the workload synced, the history tables), then the slots."""
        with psycopg.connect(self.server.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
            # A connection whose startup packet never comes (a half-open proxy) holds up even
            # an immediate shutdown for this long: the server's child waits for it.
            conn.execute("ALTER SYSTEM SET authentication_timeout = '3s'")
            conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(self.db_url) as conn:
            migrate(conn)
            app = load_app(APP)
            sync(conn, list(app.decls.values()), workflows=list(app.workflows.values()))
            from chaos.app import SCHEMA

            conn.execute(SCHEMA)
            conn.commit()
        for i in range(supervisors):
            proxy = Proxy(self.server.socket)
            proxy.start()
            slot = Slot(i, proxy)
            self.slots.append(slot)
            self.start_supervisor(slot)

    def start_supervisor(self, slot: Slot) -> None:
        """A new supervisor in ``slot``: odd slots run ``--isolation fresh``, even ones reuse;
        the first LIMITED_SLOTS serve ``chaos.Limited`` too."""
        n = len(slot.instances)
        name = f"s{slot.index}" + (f"#{n}" if n else "")
        isolation = "fresh" if slot.index % 2 else "reuse"
        app = APP if slot.index < LIMITED_SLOTS else UNLIMITED_APP
        argv = [str(BIN / "atlantis-supervise"), "--database-url", slot.proxy.url(self.db_url),
                "--handler-database-url", self.db_url, "--queue", QUEUE, "--app", app,
                "--concurrency", str(self.concurrency), "--isolation", isolation,
                "--poll-interval", "0.2s", "--rescue-interval", "0.5s", "--kill-grace", "1s",
                "--cancel-grace", "1s", "--drain-timeout", "5s", "--max-backoff", "2s",
                "--worker-refresh", "1s", "--pause-poll", "0.5s", "--listen-ping", "2s",
                "--claim-timeout", "2s", "--finish-timeout", "3s",
                "--name", slot_name(slot.index)]
        env = {**os.environ, MARKER: self.token}
        env.pop("ATLANTIS_DATABASE_URL", None)
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - closed by cleanup()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        slot.instances.append(Instance(name, proc, log))

    def live(self) -> list[Instance]:
        return [s.current for s in self.slots if s.current is not None and s.current.alive]

    def instances(self) -> list[Instance]:
        return [i for s in self.slots for i in s.instances]

    # ---- the driver's own direct connection ---------------------------------------------

    def conn(self) -> psycopg.Connection[Any] | None:
        """The driver's connection, or None while the server is down."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            self._conn = psycopg.connect(self.db_url, autocommit=True, connect_timeout=3,
                                         application_name="chaos-driver")
        except psycopg.OperationalError:
            self._conn = None
        return self._conn

    def disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def query(self, sql: Any, params: Any = None) -> list[tuple[Any, ...]] | None:
        """The rows of ``sql``, or None if the server could not be reached."""
        conn = self.conn()
        if conn is None:
            return None
        try:
            return conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            self.disconnect()
            return None

    # ---- tide ---------------------------------------------------------------------------

    def tide(self, *args: str) -> None:
        """Run ``tide`` on the direct URL, in the background (see :meth:`reap_tides`)."""
        env = {**os.environ, "ATLANTIS_DATABASE_URL": self.db_url}
        self.tides.append(subprocess.Popen(
            [str(BIN / "tide"), *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

    def reap_tides(self, *, wait: bool = False) -> list[tuple[list[str], int, str]]:
        """The commands that ended: (arguments, exit code, stderr)."""
        ended = []
        for proc in list(self.tides):
            if wait:
                proc.wait(60)
            if proc.poll() is None:
                continue
            self.tides.remove(proc)
            assert proc.stderr is not None
            err = proc.stderr.read().decode(errors="replace")
            proc.stderr.close()
            ended.append(([str(a) for a in proc.args][1:], proc.returncode, err))  # type: ignore[union-attr]
        return ended

    # ---- the end ------------------------------------------------------------------------

    def marked(self) -> list[psutil.Process]:
        """Every process carrying this run's marker."""
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER) == self.token:
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def orphans(self, grace: float = 10.0) -> list[str]:
        """Marked processes outside every live supervisor's tree, once ``grace`` has passed
        (a child whose supervisor was just killed needs a moment to die)."""
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
                try:
                    if p.pid not in keep and p.status() != psutil.STATUS_ZOMBIE:
                        left.append(p)
                except psutil.NoSuchProcess:
                    continue
            if not left or time.monotonic() >= deadline:
                return [_describe(p) for p in left]
            time.sleep(0.2)

    def stop_supervisors(self) -> None:
        """SIGTERM every live supervisor (a drain), and note how each exits."""
        live = self.live()
        for sup in live:
            sup.signal(signal.SIGCONT)
            sup.signal(signal.SIGTERM)
        for sup in live:
            try:
                sup.stop_code = sup.proc.wait(60)
            except subprocess.TimeoutExpired:
                sup.signal(signal.SIGKILL)
                sup.proc.wait()

    def cleanup(self) -> None:
        """Stop everything this run started, by pid, whatever happened."""
        for inst in self.instances():
            if inst.alive:
                inst.signal(signal.SIGCONT)
                inst.signal(signal.SIGKILL)
                inst.proc.wait()
            inst.log.close()
        for slot in self.slots:
            slot.proxy.thaw()
            slot.proxy.stop()
        for proc in self.tides:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for p in self.marked():
            try:
                p.kill()
            except psutil.Error:
                pass
        self.disconnect()


def _describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:120]}"
    except psutil.Error:
        return f"pid {p.pid}"
