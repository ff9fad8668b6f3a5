"""The child on its own (no supervisor, no database): hostile handlers end their attempt only.

Each test starts ``python -m atlantis.child`` (or the zygote) on pipes and a lease cell of its
own, plays the supervisor's part with typed frames, and checks the ``Done`` it gets back, or
how the child ended and its last words (in the lease cell, and on stderr). See
``tests/apps/hostile.py`` for the modes.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import orjson
import psutil
import pytest

import atlantis
from atlantis.child import tree
from atlantis.child.channel import Channel
from atlantis.child.exits import EXIT_APP_ERROR, EXIT_PROTOCOL
from atlantis.child.text import (
    MAX_ERROR_CHARS,
    MAX_SNOOZE,
    checkpoint_msg,
    checkpoint_pct,
    child_error,
    describe,
    snooze_delay,
    text_of,
)
from atlantis.child.tree import last_pid, tasks_created
from atlantis.child.zygote import rehearse
from atlantis.context import AttemptFlags, JobContext
from atlantis.limits import MAX_CHECKPOINT_CHARS
from atlantis.protocol.framing import HEADER
from atlantis.protocol.leasecell import LeaseCell
from atlantis.protocol.messages import (
    MAX_EVENT_FRAME,
    Cancel,
    Checkpoint,
    ChildError,
    Done,
    EventReader,
    Exited,
    Fatal,
    Fork,
    Forked,
    FromChild,
    Message,
    Preload,
    Ready,
    Run,
    ZygoteReady,
    decode,
    dumps,
    encode,
)
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.hostile:registry"
_ids = itertools.count(1)


class Peer:
    """The supervisor's end of a child's pipes: send control frames, read events."""

    def __init__(self, control: int, events: int, stderr_path: Path,
                 cell: LeaseCell | None = None) -> None:
        self.control, self.events, self.stderr_path = control, events, stderr_path
        self.cell = cell
        self.reader = EventReader()
        self.pending: list[FromChild] = []

    def send(self, msg: Message) -> None:
        os.write(self.control, encode(msg))

    def run(self, mode: str | None = None, *, job: str = "hostile.Misbehave",
            args: str | None = None, lease: float = 3600.0, margin: float = 1.0,
            cancelled: bool = False) -> int:
        """Send a ``Run`` (with its ``Cancel`` in the same write, if ``cancelled``)."""
        job_id = next(_ids)
        if args is None:
            args = orjson.dumps({"mode": mode, "key": None}).decode()
        deadline = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()
        lease_end = time.monotonic() + lease
        if self.cell is not None:  # as the supervisor does: the cell first, then the Run
            self.cell.set(lease_end)
        frames = encode(Run(job_id=job_id, job=job, queue="hostile", attempt=1, max_attempts=1,
                            args=args, deadline=deadline, lease_end=lease_end,
                            lease_margin=margin))
        os.write(self.control, frames + (encode(Cancel(job_id=job_id)) if cancelled else b""))
        return job_id

    def next(self, timeout: float = 15.0) -> FromChild | None:
        """The next event, or None at end of stream."""
        end = time.monotonic() + timeout
        while not self.pending:
            left = end - time.monotonic()
            assert left > 0, f"no event within {timeout}s; stderr: {self.stderr()!r}"
            ready, _, _ = select.select([self.events], [], [], left)
            if not ready:
                continue
            data = os.read(self.events, 1 << 20)
            if not data:
                return None
            self.pending.extend(self.reader.feed(data))  # type: ignore[arg-type]
        return self.pending.pop(0)

    def done(self, job_id: int) -> tuple[list[Checkpoint], Done]:
        checkpoints = []
        while True:
            msg = self.next()
            assert msg is not None, f"the child ended before its Done; stderr: {self.stderr()!r}"
            if isinstance(msg, Checkpoint):
                assert msg.job_id == job_id
                checkpoints.append(msg)
                continue
            assert isinstance(msg, Done), msg
            assert msg.job_id == job_id
            return checkpoints, msg

    def attempt(self, mode: str | None = None, *, job: str = "hostile.Misbehave",
                args: str | None = None) -> tuple[list[Checkpoint], Done]:
        return self.done(self.run(mode, job=job, args=args))

    def still_serves(self) -> None:
        _, done = self.attempt("ok")
        assert done.outcome == "complete" and done.error is None, done

    def stderr(self) -> str:
        return self.stderr_path.read_text("utf-8", "backslashreplace")


class Child(Peer):
    """``python -m atlantis.child`` on pipes of its own, in a session of its own."""

    def __init__(self, tmp: Path, app: str = APP, expect_ready: bool = True,
                 own_session: bool = True) -> None:
        ctl_r, control = os.pipe()
        events, ev_w = os.pipe()
        cell, cell_fd = LeaseCell.create()
        super().__init__(control, events, tmp / f"child-{next(_ids)}.err", cell)
        self.cell: LeaseCell = cell
        self._err: IO[bytes] = self.stderr_path.open("w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atlantis.child", "--app", app,
             "--control-fd", str(ctl_r), "--events-fd", str(ev_w), "--lease-fd", str(cell_fd)],
            pass_fds=(ctl_r, ev_w, cell_fd), stdin=subprocess.DEVNULL,
            stdout=self._err, stderr=self._err, start_new_session=own_session, cwd=ROOT,
        )
        for fd in (ctl_r, ev_w, cell_fd):
            os.close(fd)
        if expect_ready:
            ready = self.next()
            assert isinstance(ready, Ready) and ready.pid == self.proc.pid

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)

    def last_words(self, job_id: int | str) -> str:
        """Why the dead child said it stopped ``job_id``'s attempt: the lease cell's words,
        which the supervisor records, and the line on stderr for people say the same."""
        assert self.proc.poll() is not None
        words = self.cell.last_words()
        assert f"atlantis: job={job_id}: {words}; stopping the attempt" in self.stderr()
        return words

    def close(self) -> None:
        for fd in (self.control, self.events):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(15)
        self._err.close()
        self.cell.close()


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    """A fresh child, for tests that end it."""
    c = Child(tmp_path)
    yield c
    c.close()


@pytest.fixture(scope="module")
def survivor_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    c = Child(tmp_path_factory.mktemp("survivor"))
    yield c
    c.close()


@pytest.fixture
def survivor(survivor_child: Child) -> Iterator[Child]:
    """One child for every failure it must survive: each test proves it still serves."""
    assert survivor_child.proc.poll() is None, survivor_child.stderr()
    yield survivor_child
    assert survivor_child.proc.poll() is None, survivor_child.stderr()


# ---- failures the child reports and survives ----------------------------------------------

REPORTED = {
    "ok": ("complete", None, None),
    "discard-int": ("discard", "discarded", "123"),
    "discard-none": ("discard", "discarded", "discarded by handler"),
    "unprintable": ("failed", "exception", "UnprintableError: <unprintable UnprintableError>"),
    "odd-class": ("failed", "exception", "OddError: odd"),
    "evil-str": ("failed", "exception", "EvilStrError: evil"),
    "surrogate": ("failed", "exception", "ValueError: bad \\ud800 value"),
    "nul": ("failed", "exception", "ValueError: nul  byte"),
    "keyboard-interrupt": ("failed", "exception", "KeyboardInterrupt"),
    "generator-exit": ("failed", "exception", "GeneratorExit"),
    "exit3": ("failed", "exit", "handler called sys.exit(3)"),
    "no-such-mode": ("failed", "exception", "ValueError: unknown mode 'no-such-mode'"),
}


@pytest.mark.parametrize("mode", REPORTED)
def test_a_hostile_result_is_reported_and_the_child_serves_on(survivor: Child, mode: str) -> None:
    outcome, kind, message = REPORTED[mode]
    _, done = survivor.attempt(mode)
    assert done.outcome == outcome
    if kind is None:
        assert done.error is None
    else:
        assert done.error is not None
        assert (done.error.kind, done.error.message) == (kind, message)
    survivor.still_serves()
    survivor.still_serves()


def test_a_huge_error_is_clipped(survivor: Child) -> None:
    _, done = survivor.attempt("huge-error")
    assert done.outcome == "failed" and done.error is not None
    assert MAX_ERROR_CHARS < len(done.error.message) < MAX_ERROR_CHARS + 100
    assert "[truncated: 10000012 characters in all]" in done.error.message
    assert done.error.traceback is not None and len(done.error.traceback) < MAX_ERROR_CHARS + 100
    assert done.error.traceback.endswith("x" * 1000 + "\n")
    survivor.still_serves()


def test_an_error_of_control_characters_still_fits_a_frame(survivor: Child) -> None:
    _, done = survivor.attempt("control-chars")
    assert done.outcome == "failed" and done.error is not None
    assert done.error.message.startswith("ValueError: \x01\x01")
    assert len(done.error.message) < MAX_ERROR_CHARS + 100
    survivor.still_serves()


def test_tracebacks_come_with_failures(survivor: Child) -> None:
    _, done = survivor.attempt("surrogate")
    assert done.error is not None and done.error.traceback is not None
    assert "in misbehave" in done.error.traceback
    assert done.error.traceback.endswith("ValueError: bad \\ud800 value\n")


def test_snooze_delays_are_finite_and_non_negative(survivor: Child) -> None:
    _, done = survivor.attempt("snooze-huge")
    assert (done.outcome, done.delay, done.error) == ("snooze", MAX_SNOOZE, None)
    survivor.still_serves()


@pytest.mark.parametrize(("mode", "shown"), [
    ("snooze-inf", "inf"), ("snooze-nan", "nan"), ("snooze-negative", "-5.0"),
])
def test_a_snooze_of_nan_inf_or_negative_fails_the_attempt(survivor: Child, mode: str,
                                                           shown: str) -> None:
    """Issue 18: no guessed delay (it was 0 or ten years); the attempt fails, saying why."""
    _, done = survivor.attempt(mode)
    assert done.outcome == "failed" and done.error is not None
    assert (done.error.kind, done.error.message) == (
        "exception",
        f"invalid Snooze({shown}): the delay must be a finite number of seconds, 0 or more")
    assert done.error.traceback is not None and "Snooze" in done.error.traceback
    survivor.still_serves()


@pytest.mark.parametrize(("mode", "pct", "msg"), [
    ("checkpoint-nan", None, "nan"),
    ("checkpoint-inf", 100.0, "inf"),
    ("checkpoint-huge", 50.0, "y" * MAX_CHECKPOINT_CHARS),
    ("checkpoint-dirty", 50.0, "ab\\ud800c"),
])
def test_checkpoints_are_made_fit_to_send(survivor: Child, mode: str, pct: float | None,
                                          msg: str) -> None:
    checkpoints, done = survivor.attempt(mode)
    assert done.outcome == "complete", done
    assert [(c.pct, c.msg) for c in checkpoints] == [(pct, msg)]
    survivor.still_serves()


def test_an_unprintable_checkpoint_message_is_survived(survivor: Child) -> None:
    checkpoints, done = survivor.attempt("checkpoint-unprintable")
    assert done.outcome == "complete", done
    assert all(c.msg == "<unprintable>" for c in checkpoints)
    survivor.still_serves()


@pytest.mark.parametrize("args", [
    "not json at all",
    "[1, 2]",
    '"a string"',
    '{"mode": "ok", "key": null, "no_such_field": 1}',
])
def test_args_not_valid_for_the_declaration_fail_with_kind_args(survivor: Child, args: str) -> None:
    _, done = survivor.attempt(args=args)
    assert done.outcome == "failed" and done.error is not None
    assert done.error.kind == "args", done.error
    assert "hostile.Misbehave" in done.error.message
    survivor.still_serves()


def test_an_args_type_that_refuses_fails_with_kind_args(survivor: Child) -> None:
    _, done = survivor.attempt(job="hostile.ArgsBoom", args='{"key": "k"}')
    assert done.outcome == "failed" and done.error is not None
    assert done.error.kind == "args"
    assert "these args are not for me" in done.error.message
    survivor.still_serves()


def test_an_unknown_job_is_discarded(survivor: Child) -> None:
    _, done = survivor.attempt(job="hostile.Nope", args="{}")
    assert done.outcome == "discard" and done.error is not None
    assert done.error.kind == "discarded" and "hostile.Nope" in done.error.message
    survivor.still_serves()


def test_a_cancel_reaches_the_handler(survivor: Child) -> None:
    job_id = survivor.run("sleep")
    survivor.send(Cancel(job_id=job_id + 1000))  # another job's: ignored
    survivor.send(Cancel(job_id=job_id))
    _, done = survivor.done(job_id)
    assert done.outcome == "discard" and done.error is not None
    assert done.error.message == "saw the cancel"
    survivor.still_serves()


def test_a_cancel_that_comes_with_its_run_reaches_the_handler(survivor: Child) -> None:
    """Read before the handler starts, it is in the flags the handler's context is made with."""
    job_id = survivor.run("sleep", cancelled=True)
    _, done = survivor.done(job_id)
    assert done.outcome == "discard" and done.error is not None
    assert done.error.message == "saw the cancel"
    survivor.still_serves()  # the next attempt's flags are its own


@pytest.mark.parametrize("short_attempts_before", [0, 20])
def test_renewed_leases_keep_the_attempt_alive_and_it_hears_its_cancel(
        survivor: Child, short_attempts_before: int) -> None:
    """After short attempts the watchdog thread sleeps; it takes the pipe over for a long one."""
    for _ in range(short_attempts_before):
        assert survivor.attempt("ok")[1].outcome == "complete"
    job_id = survivor.run("sleep", lease=2.0, margin=0.5)
    for _ in range(10):  # 2.5 s: past the first lease's end, renewed through the cell
        survivor.cell.set(time.monotonic() + 2.0)
        time.sleep(0.25)
    survivor.send(Cancel(job_id=job_id))
    _, done = survivor.done(job_id)
    assert done.outcome == "discard" and done.error is not None
    assert done.error.message == "saw the cancel"
    survivor.still_serves()


# ---- faults that end the child, loudly -----------------------------------------------------

def test_sigterm_fails_the_attempt_then_the_child_exits(child: Child) -> None:
    job_id = child.run("announce-sleep")
    # Once the handler runs: SIGTERM between attempts would end the child (-15) instead.
    wait_for(lambda: f"handler ran: job {job_id}" in child.stderr(), timeout=15,
             message="the handler to run")
    child.proc.send_signal(signal.SIGTERM)
    _, done = child.done(job_id)
    assert done.outcome == "failed" and done.error is not None
    assert (done.error.kind, done.error.message) == ("terminated", "terminated by SIGTERM")
    assert child.wait() == 0


def test_closing_every_descriptor_then_returning_ends_the_child(child: Child) -> None:
    job_id = child.run("close-fds")
    assert child.next() is None  # no Done: the child could not send it
    code = child.wait()
    # As a rule the Done cannot be sent (exit 4); the watchdog thread may notice its control
    # pipe gone first (SIGKILL), and then either may speak first.
    assert code in (EXIT_PROTOCOL, -signal.SIGKILL)
    words = child.cell.last_words()
    assert (words == "the child lost its events pipe ([Errno 9] Bad file descriptor)"
            or words.startswith("the child lost its control pipe ("))
    # The cell keeps the latest words; a control pipe noticed gone after the attempt ended
    # is said for no job (job=-). When both threads speak, the one that wrote the cell last
    # may be killed (SIGKILL) before its line reaches stderr: one of the two lines is there.
    said = re.findall(r"atlantis: job=(\d+|-): (the child lost its (?:events|control) pipe "
                      r"\([^)]*\)); stopping the attempt", child.stderr())
    assert said and all(job in (str(job_id), "-") for job, _ in said)
    assert words in {why for _, why in said} or len(said) < 2


def test_closing_every_descriptor_then_sleeping_ends_the_child(child: Child) -> None:
    started = time.monotonic()
    job_id = child.run("close-fds-sleep")
    assert child.next() is None
    assert child.wait() == -signal.SIGKILL
    assert time.monotonic() - started < 10  # not the 20 s sleep, nor the lease's end
    # Its events pipe closed too: the lease cell still carries why.
    assert child.last_words(job_id).startswith("the child lost its control pipe (")


def test_a_child_taken_out_of_its_session_says_so_and_exits(tmp_path: Path) -> None:
    # Not leading a session of its own (started by hand), the child's os.setsid() works
    # and takes it out of reach of a kill of its group: it must not run another attempt.
    c = Child(tmp_path, own_session=False)
    try:
        _, done = c.attempt("setsid")
        assert done.outcome == "complete" and done.error is None, done
        assert done.retire is not None and "another session or process group" in done.retire
        assert c.wait() == 0
    finally:
        c.close()


def test_a_watchdog_that_dies_kills_the_tree(child: Child) -> None:
    job_id = child.run("kill-watchdog")
    assert child.next() is None
    assert child.wait() == -signal.SIGKILL
    assert child.last_words(job_id) == "the child's watchdog failed (RuntimeError)"


@pytest.mark.parametrize("children_files", [True, False])
def test_the_sweep_finds_descendants_when_the_boot_time_moves(
    monkeypatch: pytest.MonkeyPatch, children_files: bool
) -> None:
    """psutil dates a process by the boot time, read anew from /proc/stat each time, plus
    its start since boot; psutil's ``children()`` drops a child that looks older than its
    parent. A boot time that moves between two reads (a clock step) hid a ``setsid``
    grandchild from the sweep of a supervisor's kill -9, and it outlived everything. The
    sweep reads the kernel's parent links, with no clock involved. (Without
    ``/proc/PID/task/TID/children`` it falls back to psutil, clock and all.)"""
    import psutil._pslinux as pslinux

    real = pslinux.boot_time
    reads = itertools.count()
    if children_files:  # every read an hour earlier than the last: each child looks older
        monkeypatch.setattr(pslinux, "boot_time", lambda: real() - 3600.0 * next(reads))
    monkeypatch.setattr(tree, "_HAS_CHILDREN_FILES", children_files)
    script = ("import subprocess, time; subprocess.Popen(['sleep', '60']); print(1, flush=True); "
              "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
        grandchildren = tree.children_of(proc.pid)
        assert len(grandchildren) == 1
        assert proc.pid in [p.pid for p in tree.descendants(recursive=False)]
        found = [p.pid for p in tree.descendants()]
        assert proc.pid in found and grandchildren[0] in found
        assert [p.pid for p in tree.processes_under(proc.pid)] == grandchildren
    finally:
        for pid in tree.children_of(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def test_a_lost_events_pipe_ends_the_child_with_exit_protocol(child: Child) -> None:
    os.close(child.events)
    job_id = child.run("ok")
    assert child.wait() == EXIT_PROTOCOL
    assert child.last_words(job_id) == "the child lost its events pipe ([Errno 32] Broken pipe)"


@pytest.mark.parametrize("short_attempts_before", [0, 20])
def test_a_lease_that_is_not_renewed_kills_the_child(child: Child, short_attempts_before: int) -> None:
    for _ in range(short_attempts_before):  # the watchdog thread asleep: woken for this lease
        assert child.attempt("ok")[1].outcome == "complete"
    job_id = child.run("sleep", lease=1.0, margin=0.25)
    assert child.next() is None
    assert child.wait() == -signal.SIGKILL
    assert child.last_words(job_id) == "no lease renewal reached this child before the lease's end"


def test_a_run_whose_lease_already_ended_runs_nothing(tmp_path: Path) -> None:
    """A ``Run`` that arrives with its lease over (or within the margin of its end) kills
    the child before any of the handler runs: another worker may already have the row."""
    c = Child(tmp_path)
    try:
        assert c.attempt("announce")[1].outcome == "complete"
        assert "handler ran" in c.stderr()
        job_id = c.run("announce", lease=0.1, margin=0.5)
        assert c.next() is None
        assert c.wait() == -signal.SIGKILL
        assert c.last_words(job_id) == "the lease had ended before the attempt could start"
        assert f"handler ran: job {job_id}" not in c.stderr()
    finally:
        c.close()


@pytest.mark.parametrize("short_attempts_before", [0, 20])
def test_renewals_through_the_lease_cell_keep_the_attempt_alive_until_they_stop(
        tmp_path: Path, short_attempts_before: int) -> None:
    """The supervisor renews through the shared cell, without a frame; when it stops, the
    watchdog (asleep after short attempts, or reading the pipe) still kills the attempt."""
    c = Child(tmp_path)
    try:
        for _ in range(short_attempts_before):
            assert c.attempt("ok")[1].outcome == "complete"
        job_id = c.run("sleep", lease=2.0, margin=0.5)
        for _ in range(12):  # 3 s: past the first lease's end, renewed through the cell only
            c.cell.set(time.monotonic() + 2.0)
            time.sleep(0.25)
        assert c.proc.poll() is None, c.stderr()
        assert "no lease renewal" not in c.stderr()
        # The renewals stop: the attempt dies at the end of the last one.
        assert c.next() is None
        assert c.wait() == -signal.SIGKILL
        assert c.last_words(job_id).startswith("no lease renewal reached this child")
    finally:
        c.close()


@pytest.mark.parametrize("frame", [
    HEADER.pack(5) + b"hello",
    encode(Checkpoint(job_id=1, pct=1.0, msg="not for the child")),
    HEADER.pack(len(b'{"t": "run"}')) + b'{"t": "run"}',
])
def test_a_malformed_control_frame_kills_the_child(child: Child, frame: bytes) -> None:
    os.write(child.control, frame)
    assert child.next() is None
    assert child.wait() == -signal.SIGKILL
    assert child.last_words("-").startswith("corrupt control stream (")


def test_eof_on_the_control_pipe_ends_the_child(child: Child) -> None:
    os.close(child.control)
    assert child.wait() == -signal.SIGKILL
    assert child.cell.last_words() == ""  # quietly: nobody is left to hear it


def test_an_app_that_cannot_load_is_fatal(tmp_path: Path) -> None:
    c = Child(tmp_path, app="tests.apps.no_such_app:registry", expect_ready=False)
    try:
        msg = c.next()
        assert isinstance(msg, Fatal) and "no_such_app" in msg.error
        assert c.wait() == EXIT_APP_ERROR
    finally:
        c.close()


# ---- the zygote ----------------------------------------------------------------------------

class Zygote:
    def __init__(self, tmp: Path) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.stderr_path = tmp / "zygote.err"
        self._err = self.stderr_path.open("w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atlantis.child.zygote", "--app", APP,
             "--socket-fd", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=self._err,
            stderr=self._err, start_new_session=True, cwd=ROOT,
        )
        theirs.close()
        self.sock.settimeout(15)

    def receive(self) -> Message:
        return decode(self.sock.recv(65536))

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(15)
        self._err.close()


def _worker_fds() -> tuple[list[int], list[int]]:
    """The worker's five descriptors, and the supervisor's ends (control, events, out)."""
    ctl_r, ctl_w = os.pipe()
    ev_r, ev_w = os.pipe()
    out_r, out_w = os.pipe()
    _cell, cell_fd = LeaseCell.create()
    return [ctl_r, ev_w, out_w, out_w, cell_fd], [ctl_w, ev_r, out_r]


def test_the_zygote_loads_what_its_workers_needed_once_asked(tmp_path: Path) -> None:
    """It starts with the app alone (a fork of a smaller heap is cheaper); a worker says in
    its Done what it imported that the zygote lacked; a Preload makes the zygote load it
    before its next fork, so that later workers start with it."""
    z = Zygote(tmp_path)

    def maps() -> str:
        return Path(f"/proc/{z.proc.pid}/maps").read_text()

    def attempt(token: int, mode: str) -> Done:
        theirs, ours = _worker_fds()
        socket.send_fds(z.sock, [dumps(Fork(token=token))], theirs)
        for fd in (*theirs[:3], theirs[4]):
            os.close(fd)
        forked = z.receive()
        assert isinstance(forked, Forked) and forked.token == token
        worker = Peer(ours[0], ours[1], z.stderr_path)
        assert isinstance(worker.next(), Ready)
        _, done = worker.attempt(mode)
        assert z.receive() == Exited(pid=forked.pid, code=-signal.SIGKILL)
        for fd in ours:
            os.close(fd)
        return done

    try:
        assert isinstance(z.receive(), ZygoteReady)
        assert "_asyncio" not in maps() and "_psutil" not in maps() and "libpq" not in maps()
        done = attempt(1, "uses-asyncio")
        assert done.outcome == "complete" and done.preload == ["asyncio"], done
        assert attempt(2, "ok").preload is None
        z.sock.send(dumps(Preload(modules=["asyncio"])))
        theirs, _ours = _worker_fds()  # a Preload carries no descriptor: this one is dropped
        socket.send_fds(z.sock, [dumps(Preload(modules=["psutil"]))], theirs[:1])
        for fd in {*theirs, *_ours}:
            os.close(fd)
        done = attempt(3, "uses-asyncio")  # forked after the Preload: asyncio was there
        assert done.outcome == "complete" and done.preload is None, done
        assert "_asyncio" in maps() and "_psutil" not in maps()
        assert "1 descriptors, expected 0" in z.stderr_path.read_text()
    finally:
        z.close()


def test_the_zygote_drops_malformed_packets_and_forks_on_a_valid_one(tmp_path: Path) -> None:
    z = Zygote(tmp_path)
    try:
        ready = z.receive()
        assert isinstance(ready, ZygoteReady) and ready.pid == z.proc.pid
        theirs, ours = _worker_fds()
        socket.send_fds(z.sock, [b"not json"], theirs)
        socket.send_fds(z.sock, [dumps(Fork(token=1))], theirs[:2])
        socket.send_fds(z.sock, [dumps(Ready(pid=1, tree="x"))], theirs)
        z.sock.send(dumps(Fork(token=2)))
        socket.send_fds(z.sock, [b'{"t": "fork", "token": "three"}'], theirs)
        socket.send_fds(z.sock, [dumps(Fork(token=4))], theirs)
        for fd in (*theirs[:3], theirs[4]):
            os.close(fd)
        forked = z.receive()
        assert isinstance(forked, Forked) and forked.token == 4
        control, events, out = ours
        worker = Peer(control, events, z.stderr_path)
        ready_msg = worker.next()
        assert isinstance(ready_msg, Ready) and ready_msg.pid == forked.pid
        _, done = worker.attempt("discard-int")
        assert done.outcome == "discard" and done.error is not None and done.error.message == "123"
        # One attempt per worker: once its Done is out it kills its tree, as the EOF of its
        # control pipe would make it, without waiting for that EOF.
        exited = z.receive()
        assert exited == Exited(pid=forked.pid, code=-signal.SIGKILL)
        assert worker.next() is None  # nothing after its Done
        for fd in (control, events, out):
            os.close(fd)
        log = z.stderr_path.read_text()
        assert log.count("atlantis-zygote: dropped a malformed packet") == 5, log
        assert "2 descriptors, expected 5" in log and "0 descriptors, expected 5" in log
        z.sock.shutdown(socket.SHUT_RDWR)
        assert z.proc.wait(15) == 0
    finally:
        z.close()


def test_the_zygote_rehearses_a_worker_without_calling_the_app_or_leaving_anything(
        tmp_path: Path) -> None:
    """The rehearsal before the first fork fills the caches a worker's path fills (each
    job's logger here) and calls no handler; it leaves no descriptor, thread or process."""
    (tmp_path / "r.atl").write_text(
        'job Count in rh {\n  args { n int not null }\n  queue "rh"\n}\n')
    registry = atlantis.Registry.from_atl(tmp_path / "r.atl")
    calls: list[object] = []
    registry.register("rh.Count", lambda ctx, args: calls.append(args))
    name = "atlantis.job.rh.Count"
    assert name not in logging.Logger.manager.loggerDict
    fds = set(os.listdir("/proc/self/fd"))
    threads = threading.enumerate()
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    rehearse(registry)
    assert calls == []
    assert isinstance(logging.Logger.manager.loggerDict.get(name), logging.Logger)
    assert set(os.listdir("/proc/self/fd")) == fds
    assert threading.enumerate() == threads
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children


# ---- in-process: the helpers that make results fit ------------------------------------------

def test_the_last_pid_moves_with_every_new_task() -> None:
    """The supervisor counts trees only when it moved: a thread and a process both move it."""
    before = last_pid()
    assert before is not None
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    after_thread = last_pid()
    assert after_thread != before
    subprocess.run(["true"], check=True)
    assert last_pid() != after_thread


def test_the_count_of_tasks_created_grows_by_every_thread_and_process() -> None:
    """The supervisor counts a tree again only once the host created as many tasks as it
    has room for under the limit: every thread and every process must add to the count."""
    before = tasks_created()
    assert before is not None
    threads = [threading.Thread(target=lambda: None) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    subprocess.run(["true"], check=True)
    after = tasks_created()
    assert after is not None and after >= before + 21


def test_the_context_reads_the_flags_it_was_made_with() -> None:
    flags = AttemptFlags()
    ctx = JobContext(job_id=1, job="hostile.Misbehave", queue="hostile", attempt=1,
                     max_attempts=1, deadline=datetime.now(UTC), logger=logging.getLogger("t"),
                     flags=flags)
    assert (ctx.cancelled, ctx.stopping) == (False, False)
    flags.stopping = True
    assert (ctx.cancelled, ctx.stopping) == (False, True)
    flags.cancelled = True
    assert (ctx.cancelled, ctx.stopping) == (True, True)
    assert "flags" not in repr(ctx)
    alone = JobContext(job_id=2, job="j", queue="q", attempt=1, max_attempts=1,
                       deadline=datetime.now(UTC), logger=logging.getLogger("t"))
    assert (alone.cancelled, alone.stopping) == (False, False)


def test_a_result_that_cannot_be_encoded_is_replaced_by_a_failure() -> None:
    r, w = os.pipe()
    try:
        bad = Done(job_id=7, outcome="failed", error=ChildError(kind="exception", message="\ud800"))
        Channel(w).send_done(bad)
        (msg,) = EventReader().feed(os.read(r, 1 << 20))
        assert isinstance(msg, Done) and msg.job_id == 7 and msg.outcome == "failed"
        assert msg.error is not None and msg.error.kind == "exception"
        assert msg.error.message.startswith("<the result could not be encoded: ")
    finally:
        os.close(r)
        os.close(w)


def test_a_result_too_large_for_a_frame_loses_its_traceback_first() -> None:
    r, w = os.pipe()
    try:
        big = "\x01" * (MAX_EVENT_FRAME // 6)
        done = Done(job_id=8, outcome="failed",
                    error=ChildError(kind="exception", message="m", traceback=big))
        sent = threading.Thread(target=Channel(w).send_done, args=(done,))
        sent.start()
        data = b""
        while not data or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
            data += os.read(r, 1 << 20)
        sent.join()
        (msg,) = EventReader().feed(data)
        assert msg == Done(job_id=8, outcome="failed", error=ChildError(kind="exception", message="m"))
    finally:
        os.close(r)
        os.close(w)


class _Broken:
    def __str__(self) -> str:
        raise SystemExit(1)

    __repr__ = __str__


def test_text_helpers_accept_anything() -> None:
    assert text_of(_Broken()) == "<unprintable>"
    assert text_of("a\x00b\udc80") == "ab\\udc80"
    assert describe(ValueError()) == "ValueError"
    assert [snooze_delay(v) for v in (math.nan, -1, math.inf, 1e300, 2.5, "x", _Broken())] == [
        0.0, 0.0, MAX_SNOOZE, MAX_SNOOZE, 2.5, 0.0, 0.0]
    assert [checkpoint_pct(v) for v in (math.nan, math.inf, -math.inf, 42, _Broken())] == [
        None, 100.0, 0.0, 42.0, None]
    assert checkpoint_msg(_Broken()) == "<unprintable>"
    assert checkpoint_msg("\ud800" * 2000) == ("\\ud800" * 2000)[:MAX_CHECKPOINT_CHARS]
    error = child_error("discarded", 123)
    assert (error.kind, error.message, error.traceback) == ("discarded", "123", None)


def test_a_child_whose_app_never_touches_the_database_never_loads_psycopg(
        tmp_path: Path) -> None:
    # A child names its run's fence without the store (atlantis.protocol.fence): an app that
    # imports no database driver costs no driver in each of its children (some 20 MB). Nor
    # does a sync app load asyncio (some 20 ms of every child's start), nor an attempt that
    # starts no process psutil (some 15 ms).
    peer = Child(tmp_path, app="benchmarks.app:registry")
    try:
        _, done = peer.attempt(job="bench.Noop", args='{"n": 1}')
        assert done.outcome == "complete" and done.error is None, done
        maps = Path(f"/proc/{peer.proc.pid}/maps").read_text()
        assert "psycopg" not in maps and "libpq" not in maps
        assert "_asyncio" not in maps
        assert "_psutil" not in maps
    finally:
        peer.close()
    # A zygote starts with the app alone, and loads what its workers turned out to need
    # when the supervisor asks (atlantis.child.preload; the zygote's tests below).
    code = ("import sys; import benchmarks.app; from atlantis.child import preload; "
            "before = sorted(preload.loaded()); preload.load(['asyncio', 'psutil', 'psycopg']); "
            "print(before, sorted({m.split('.')[0] for m in sys.modules} "
            "& {'psycopg', 'asyncio', 'psutil'}), preload.imported_since(frozenset()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == ("[] ['asyncio', 'psutil', 'psycopg'] "
                           "['asyncio', 'psutil', 'psycopg']")
