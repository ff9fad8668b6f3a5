"""What a reused child's restore of its process state costs per attempt (issue 18).

``python -m benchmarks.restore [--attempts N] [--rounds R]``:

1. ``ProcessState.restore()`` in this process when nothing changed (the usual case), and
   when a handler changed ``os.environ``, the working directory and the umask: CPU time
   of this thread per call;
2. a real child (``python -m atlantis.child --app benchmarks.app:registry``) on pipes, as a
   supervisor drives it: N no-op attempts one after the other, with the restore and with
   it replaced by a no-op in the child, in turn R times: the child's CPU time (its threads'
   ``/proc/PID/task/TID/schedstat``) per attempt, and the wall time from Run written to Done read.

CPU time, not wall time, is what to compare on a busy machine. Medians over the rounds,
in microseconds. No database.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

from atlantis.child.state import ProcessState
from atlantis.protocol.messages import Done, EventReader, Ready, Run, encode

_NO_RESTORE = ("import atlantis.child.state as s\n"
               "s.ProcessState.restore = lambda self: None\n")
_CHILD = "from atlantis.child.main import main\nraise SystemExit(main(sys.argv[1:]))\n"


def in_process(calls: int, rounds: int) -> tuple[float, float]:
    state = ProcessState()
    clean, dirty = [], []
    home = os.getcwd()
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            state.restore()
        clean.append((time.thread_time() - start) / calls)
        spent = 0.0
        for i in range(calls // 10):
            os.environ["BENCH_RESTORE"] = str(i)
            os.chdir(tempfile.gettempdir())
            os.umask(0o077)
            start = time.thread_time()
            assert state.restore() is None
            spent += time.thread_time() - start
        dirty.append(spent / (calls // 10))
    assert os.getcwd() == home
    return statistics.median(clean) * 1e6, statistics.median(dirty) * 1e6


class _Child:
    def __init__(self, restore: bool) -> None:
        ctl_r, self.control = os.pipe()
        self.events, ev_w = os.pipe()
        code = "import sys\n" + ("" if restore else _NO_RESTORE) + _CHILD
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--app", "benchmarks.app:registry",
             "--control-fd", str(ctl_r), "--events-fd", str(ev_w)],
            pass_fds=(ctl_r, ev_w), stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(ctl_r)
        os.close(ev_w)
        self.reader = EventReader()
        assert isinstance(self._next(), Ready)

    def _next(self) -> object:
        while True:
            select.select([self.events], [], [], 30)
            msgs = self.reader.feed(os.read(self.events, 1 << 16))
            if msgs:
                assert len(msgs) == 1
                return msgs[0]

    def attempts(self, n: int) -> tuple[float, float]:
        """Seconds per attempt, of the child's CPU and from Run written to Done read."""
        deadline = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        cpu = self._cpu()
        start = time.perf_counter()
        for i in range(n):
            os.write(self.control, encode(Run(
                job_id=i + 1, job="bench.Noop", queue="bench", attempt=1, max_attempts=1,
                args='{"n": 1}', deadline=deadline, lease_end=time.monotonic() + 3600,
                lease_margin=1.0)))
            done = self._next()
            assert isinstance(done, Done) and done.outcome == "complete", done
        wall = time.perf_counter() - start
        return (self._cpu() - cpu) / n, wall / n

    def _cpu(self) -> float:
        """CPU seconds of the child's threads so far (the scheduler's count, in ns)."""
        total = 0
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        return total / 1e9

    def close(self) -> None:
        os.close(self.control)
        os.close(self.events)
        self.proc.wait(30)


def round_trips(attempts: int, rounds: int) -> dict[bool, tuple[float, float]]:
    """{restore: (CPU, wall) per attempt}."""
    children = {True: _Child(True), False: _Child(False)}
    try:
        for child in children.values():
            child.attempts(attempts // 10)  # warm up
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(rounds):
            for restore, child in children.items():
                times[restore].append(child.attempts(attempts))
        return {restore: (statistics.median(c for c, _w in t) * 1e6,
                          statistics.median(w for _c, w in t) * 1e6)
                for restore, t in times.items()}
    finally:
        for child in children.values():
            child.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.restore")
    parser.add_argument("--attempts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    clean, dirty = in_process(opts.attempts, opts.rounds)
    print(f"restore(), nothing changed:                {clean:8.1f} us CPU")
    print(f"restore(), environ + cwd + umask put back: {dirty:8.1f} us CPU")
    found = round_trips(opts.attempts, opts.rounds)
    (cpu, wall), (cpu0, wall0) = found[True], found[False]
    print(f"no-op attempt, child with restore:    {cpu:8.1f} us CPU {wall:8.1f} us round trip")
    print(f"no-op attempt, child without restore: {cpu0:8.1f} us CPU {wall0:8.1f} us round trip")
    print(f"the restore: {cpu - cpu0:+.1f} us CPU per attempt ({(cpu / cpu0 - 1) * 100:+.1f}%)")

if __name__ == "__main__":
    main()
