"""The typed protocol: every message round-trips; anything else is refused on arrival."""

from __future__ import annotations

import orjson
import pytest

from atlantis.protocol.framing import HEADER, ProtocolError
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
    Lease,
    Ready,
    Run,
    Unsafe,
    ZygoteFatal,
    ZygoteReady,
    clean,
    decode,
    dumps,
    encode,
)

EVERY = [
    Run(job_id=1, job="a.B", queue="q", attempt=1, max_attempts=3, args='{"n": 1}',
        deadline="2026-01-01T00:00:00+00:00", lease_end=12.5, lease_margin=0.5, database_url=None),
    Lease(job_id=1, lease_end=3.0), Cancel(job_id=1), Ready(pid=5, tree="ab"), Fatal(error="x"),
    Checkpoint(job_id=1, pct=None, msg="m"), Checkpoint(job_id=1, pct=50.0, msg=""),
    Done(job_id=1, outcome="failed", error=ChildError(kind="args", message="m", traceback=None)),
    Done(job_id=1, outcome="snooze", delay=3.0), Done(job_id=1, outcome="complete", leftovers=["t"]),
    Fork(token=1), Forked(token=1, pid=9), Exited(pid=9, code=-9), ZygoteReady(pid=3),
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
    "missing job id": {"t": "done", "outcome": "complete"},
    "unknown type": {"t": "run-everything", "job_id": 1},
    "no type": {"job_id": 1},
    "huge message": {"t": "fatal", "error": "x" * 300_000},
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
