"""What ``benchmarks.compare`` measures besides jobs/s: CPU per job, RSS, latency percentiles.

CPU (psutil) is split into three components, each a difference between a snapshot taken
when the first pickup is seen and one taken when all jobs are seen done:

- ``worker``: the worker process itself (the supervisor, or the peer's worker);
- ``children``: everything below it. Each live descendant counts its own time plus its
  reaped children's (``children_user``/``children_system``), and the worker's reaped
  children count through the worker's own ``children_*``. Processes that come and go
  between the two snapshots (a fork per job) are thereby counted once they are reaped by
  a process of the tree; descendants are also sampled during the run, and one that
  vanished without being reaped by a sampled parent is counted at its last sample;
- ``store``: the PostgreSQL backends serving the scratch database (``pg_stat_activity``,
  sampled during the run; a backend that exits mid-run counts at its last sample and the
  note says so), or the redis-server of a Redis peer. PostgreSQL's background processes
  (WAL writer, checkpointer, autovacuum) are not counted, for anybody.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import psutil


def cpu_seconds(proc: psutil.Process, with_children: bool = True) -> float:
    t = proc.cpu_times()
    own = t.user + t.system
    return own + (t.children_user + t.children_system if with_children else 0.0)


@dataclasses.dataclass
class Snapshot:
    worker: float = 0.0
    children: float = 0.0
    store: float = 0.0


class CpuMeter:
    """Samples a worker's process tree and the store's processes (see the module's doc)."""

    def __init__(self, worker_pid: int, store_pids: Callable[[], Iterable[int]]) -> None:
        self.worker = psutil.Process(worker_pid)
        self.store_pids = store_pids
        self.tree: dict[int, tuple[int, float]] = {}  # pid -> (ppid, cpu with reaped children)
        self.store: dict[int, float] = {}  # pid -> cpu seconds, last seen
        self.store_start: dict[int, float] = {}
        self.gone_backends = 0
        self.start: Snapshot | None = None

    def _sample_tree(self) -> None:
        try:
            kids = self.worker.children(recursive=True)
        except psutil.Error:
            return
        for kid in kids:
            try:
                self.tree[kid.pid] = (kid.ppid(), cpu_seconds(kid))
            except psutil.Error:
                continue

    def _sample_store(self) -> set[int]:
        live = set()
        for pid in self.store_pids():
            try:
                self.store[pid] = cpu_seconds(psutil.Process(pid), with_children=False)
                live.add(pid)
            except psutil.Error:
                continue
        return live

    def sample(self) -> None:
        self._sample_tree()
        self._sample_store()

    def snapshot(self) -> Snapshot:
        """The tree's and the store's CPU seconds now (all of their lives)."""
        live_tree = {}
        try:
            worker_own = cpu_seconds(self.worker, with_children=False)
            worker_reaped = cpu_seconds(self.worker) - worker_own
            kids = self.worker.children(recursive=True)
        except psutil.Error:
            return Snapshot()
        for kid in kids:
            try:
                live_tree[kid.pid] = (kid.ppid(), cpu_seconds(kid))
            except psutil.Error:
                continue
        # Gone, and its parent gone too: nobody in the tree reaped it, count its last sample.
        alive = set(live_tree) | {self.worker.pid}
        orphans = sum(cpu for pid, (ppid, cpu) in self.tree.items()
                      if pid not in alive and ppid not in alive)
        self.tree.update(live_tree)
        live_store = self._sample_store()
        if self.start is not None:
            self.gone_backends = sum(1 for pid in self.store_start if pid not in live_store)
        return Snapshot(worker=worker_own,
                        children=worker_reaped + sum(c for _, c in live_tree.values()) + orphans,
                        store=sum(self.store.values()))

    def begin(self) -> None:
        self.start = self.snapshot()
        self.store_start = dict(self.store)

    def end(self) -> Snapshot:
        """CPU seconds spent since :meth:`begin`, per component."""
        now = self.snapshot()
        start = self.start or Snapshot()
        return Snapshot(worker=now.worker - start.worker,
                        children=max(0.0, now.children - start.children),
                        store=now.store - start.store)


class RssSampler:
    """The worker's RSS and one long-lived child's, sampled with the drain's progress."""

    def __init__(self, worker_pid: int) -> None:
        self.worker = psutil.Process(worker_pid)
        self.samples: list[tuple[float, int, int | None]] = []  # (progress, worker, child)
        self.child: psutil.Process | None = None

    def sample(self, progress: float) -> None:
        try:
            rss = self.worker.memory_info().rss
        except psutil.Error:
            return
        child_rss: int | None = None
        try:
            if self.child is None or not self.child.is_running():
                kids = [k for k in self.worker.children(recursive=True)
                        if "zygote" not in " ".join(k.cmdline())]
                self.child = kids[-1] if kids else None
            if self.child is not None:
                child_rss = self.child.memory_info().rss
        except psutil.Error:
            self.child = None
        self.samples.append((progress, rss, child_rss))

    def peak_mb(self) -> float | None:
        return max(s[1] for s in self.samples) / 2**20 if self.samples else None

    def quarters(self, which: int = 1) -> tuple[float, float] | None:
        """Mean RSS (MB) over the first and the last quarter of the drain (1: worker, 2: child)."""
        first = [s[which] for s in self.samples if s[0] <= 0.25 and s[which] is not None]
        last = [s[which] for s in self.samples if s[0] >= 0.75 and s[which] is not None]
        if not first or not last:
            return None
        return (sum(x or 0 for x in first) / len(first) / 2**20,
                sum(x or 0 for x in last) / len(last) / 2**20)


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (``pct`` in 0-100) of ``values``, or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
