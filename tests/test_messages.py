"""The typed protocol: every message round-trips; anything else is refused on arrival. The
lease cell carries a child's last words back, whatever is in it."""

from __future__ import annotations

import mmap
import os

import orjson
import pytest

from atlantis.protocol.framing import HEADER, ProtocolError, clean
from atlantis.protocol.leasecell import MAX_WORDS, SIZE, LeaseCell
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
    Preload,
    Ready,
    Run,
    Stopping,
    Unsafe,
    ZygoteFatal,
    ZygoteReady,
    decode,
    dumps,
    encode,
)

EVERY = [
    Run(job_id=1, job="a.B", queue="q", attempt=1, max_attempts=3, args='{"n": 1}',
        deadline="2026-01-01T00:00:00+00:00", lease_end=12.5, lease_margin=0.5, database_url=None),
    Cancel(job_id=1), Stopping(job_id=1), Ready(pid=5, tree="ab"), Fatal(error="x"),
    Checkpoint(job_id=1, pct=None, msg="m"), Checkpoint(job_id=1, pct=50.0, msg=""),
    Done(job_id=1, outcome="failed", error=ChildError(kind="args", message="m", traceback=None)),
    Done(job_id=1, outcome="snooze", delay=3.0), Done(job_id=1, outcome="complete", leftovers=["t"]),
    Done(job_id=1, outcome="complete", preload=["asyncio", "psycopg"]),
    Fork(token=1), Preload(modules=["psutil"]), Forked(token=1, pid=9), Exited(pid=9, code=-9), ZygoteReady(pid=3),
    ZygoteFatal(error="e"), Unsafe(reason="threads"),
]


@pytest.mark.parametrize("msg", EVERY, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg: object) -> None:
    assert decode(dumps(msg)) == msg  # type: ignore[arg-type]
    reader = EventReader(expect=(type(msg),))
    frame = encode(msg)
    assert reader.feed(frame[:3]) == [] and reader.feed(frame[3:]) == [msg]


FORGED = {
    "outcome release (free retries)": {"t": "done", "job_id": 1, "outcome": "release"},
    "outcome cancelled": {"t": "done", "job_id": 1, "outcome": "cancelled"},
    "attempt overwritten": {"t": "done", "job_id": 1, "outcome": "failed", "attempt": 99},
    "attempt inside the error": {"t": "done", "job_id": 1, "outcome": "failed",
                                 "error": {"kind": "exception", "message": "m", "attempt": 9}},
    "unknown error kind": {"t": "done", "job_id": 1, "outcome": "failed",
                           "error": {"kind": "timeout", "message": "m"}},
    "delay a string": {"t": "done", "job_id": 1, "outcome": "snooze", "delay": "soon"},
    "pct a string": {"t": "checkpoint", "job_id": 1, "pct": "nan", "msg": ""},
    "job id a float": {"t": "checkpoint", "job_id": 1.5, "pct": 1, "msg": ""},
    "job id a bool": {"t": "checkpoint", "job_id": True, "pct": 1, "msg": ""},
    "leftovers a string": {"t": "done", "job_id": 1, "outcome": "complete", "leftovers": "x"},
    "leftovers of numbers": {"t": "done", "job_id": 1, "outcome": "complete", "leftovers": [1]},
    "preload of a module not on the list": {"t": "done", "job_id": 1, "outcome": "complete",
                                            "preload": ["os"]},
    "preload a string": {"t": "preload", "modules": "psycopg"},
    "missing job id": {"t": "done", "outcome": "complete"},
    "unknown type": {"t": "run-everything", "job_id": 1},
    "no type": {"job_id": 1},
    "huge message": {"t": "fatal", "error": "x" * 300_000},
    "a lease frame (renewals go through the lease cell)": {"t": "lease", "job_id": 1,
                                                           "lease_end": 3.0},
}


@pytest.mark.parametrize("raw", FORGED.values(), ids=FORGED.keys())
def test_forged_messages_are_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        EventReader().feed(HEADER.pack(len(b := orjson.dumps(raw))) + b)


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"', b"1e999", b"{", b"null"])
def test_undecodable_frames_are_refused(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        EventReader().feed(HEADER.pack(len(body)) + body)


def test_a_child_may_not_send_what_only_the_supervisor_sends() -> None:
    with pytest.raises(ProtocolError, match="unexpected message"):
        EventReader().feed(encode(Run(job_id=1, job="j", queue="q", attempt=1, max_attempts=1,
                                      args="{}", deadline="d", lease_end=1, lease_margin=1)))


def test_frames_over_one_mebibyte_are_refused_before_they_are_read() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        EventReader().feed(HEADER.pack(MAX_EVENT_FRAME + 1))


def test_clean_removes_nul_and_escapes_lone_surrogates() -> None:
    assert clean("a\x00b") == "ab"
    assert clean("x\ud800y") == "x\\ud800y"
    assert clean("plain é") == "plain é"
    orjson.dumps(clean("\udcff\x00"))


def test_a_child_may_not_be_sent_a_lease_frame_any_more() -> None:
    reader = EventReader(expect=(Run, Cancel, Stopping))  # as the child's watchdog reads
    with pytest.raises(ProtocolError, match="unknown message type 'lease'"):
        reader.feed(HEADER.pack(len(b := orjson.dumps({"t": "lease", "job_id": 1,
                                                        "lease_end": 3.0}))) + b)


@pytest.fixture
def cells() -> tuple[LeaseCell, LeaseCell, mmap.mmap]:
    """The supervisor's cell, the child's, and the raw page they share (one memfd)."""
    ours, fd = LeaseCell.create()
    try:
        return ours, LeaseCell(fd), mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)  # the mappings outlive the descriptor


def test_the_lease_cell_carries_the_lease_one_way_and_last_words_the_other(
        cells: tuple[LeaseCell, LeaseCell, mmap.mmap]) -> None:
    ours, theirs, _ = cells
    assert (theirs.get(), ours.last_words()) == (0.0, "")
    ours.set(12.5)
    assert theirs.get() == 12.5
    theirs.set_last_words("the child lost its control pipe ([Errno 9] Bad file descriptor)")
    theirs.set_last_words("no lease renewal reached this child before the lease's end")
    assert ours.last_words() == "no lease renewal reached this child before the lease's end"
    assert ours.get() == 12.5  # the words leave the lease alone
    theirs.set_last_words("x" + "é" * MAX_WORDS)  # cut to fit, on a character's boundary
    assert MAX_WORDS % 2 == 0 and ours.last_words() == "x" + "é" * (MAX_WORDS // 2 - 1)
    theirs.set_last_words("nul \x00 and \ud800")
    assert ours.last_words() == "nul  and \\ud800"
    ours.close()
    theirs.close()
    assert ours.last_words() == ""
    theirs.set_last_words("after close: ignored, never raised")


def test_last_words_are_read_safely_whatever_the_child_left_in_its_memory(
        cells: tuple[LeaseCell, LeaseCell, mmap.mmap]) -> None:
    ours, _, raw = cells
    raw[16:24] = b"\xff\xff\xff\xff" + b"\xff\x00ab"  # a length past the page; not UTF-8, NUL
    words = ours.last_words()
    assert words.startswith("\\xffab") and len(words) <= MAX_WORDS
    orjson.dumps(words)
