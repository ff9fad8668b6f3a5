"""The ledger: one owner for every attempt a supervisor holds (no database needed)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import orjson

from atlantis.store.supervision import ClaimedRow, finish_params
from atlantis.supervisor import policy
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.ledger import Ledger
from atlantis.supervisor.metrics import Metrics
from atlantis.supervisor.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _row(job_id: int, heartbeat: float = 30.0) -> ClaimedRow:
    return ClaimedRow(job_id, "q.Job", "q", "{}", 1, 3, False, 60.0, heartbeat, 1.0,
                      datetime.now(UTC))


def _ledger(lost_kept_for: float = 3600.0, claim_ahead_hold: float = 1.0
            ) -> tuple[Ledger, Clock]:
    clock = Clock()
    settings = Settings(queues=("q",), lost_kept_for=lost_kept_for,
                        claim_ahead_hold=claim_ahead_hold)
    return Ledger(settings, Metrics(), clock), clock


def test_a_lost_attempt_is_known_until_its_row_comes_back_is_rescued_or_time_passes() -> None:
    ledger, clock = _ledger(lost_kept_for=600.0)
    attempts = [ledger.claimed(_row(i), clock()) for i in (1, 2, 3)]
    for a in attempts:
        ledger.started(a)
        ledger.lose(a, "test")
        ledger.end(a, policy.RELEASE)  # a lost attempt's end writes nothing
    assert not ledger.unwritten and not ledger.in_flight
    assert sorted(ledger.known()) == [1, 2, 3]
    ledger.claimed(_row(1), clock())  # back to this supervisor: the old loss is over
    ledger.rescued([2])
    assert ledger.known() == [3]
    clock.t += 601
    assert ledger.known() == []
    assert not ledger.lost


def test_held_rows_are_started_oldest_first_and_stale_ones_given_back() -> None:
    ledger, clock = _ledger(claim_ahead_hold=1.0)
    old = ledger.claimed(_row(1), clock())
    ledger.hold(old)
    clock.t += 2.0  # past the hold: given back, never started
    fresh = [ledger.claimed(_row(i), clock()) for i in (2, 3, 4)]
    for a in fresh:
        ledger.hold(a)
    started: list[int] = []

    def start(a: Attempt) -> bool:
        started.append(a.job_id)
        return True

    given, expired = ledger.take_held(lambda _: len(started) < 2, start)
    assert (given, expired) == (1, 0)
    assert started == [2, 3]
    assert [a.job_id for a in ledger.held] == [4]
    assert [r.job_id for _, r in ledger.ended] == [1]
    assert ledger.ended[0][1].spent is False  # given back unspent


def test_an_attempt_no_child_can_start_keeps_its_place() -> None:
    ledger, clock = _ledger()
    for i in (1, 2, 3):
        ledger.hold(ledger.claimed(_row(i), clock()))
    started: list[int] = []

    def start(a: Attempt) -> bool:
        if a.job_id == 1:
            return False  # no idle child has its handler yet (a reload)
        started.append(a.job_id)
        return True

    ledger.take_held(lambda _: True, start)
    assert started == [2, 3]
    assert [a.job_id for a in ledger.held] == [1]


def test_outcomes_taken_for_writing_go_back_first_when_the_write_fails() -> None:
    ledger, clock = _ledger()
    for i in (1, 2, 3):
        a = ledger.claimed(_row(i), clock())
        ledger.started(a)
        ledger.end(a, policy.Verdict("complete", True))
    batch = ledger.take_ended(2)
    assert [r.job_id for _, r in batch] == [1, 2]
    assert sorted(a.job_id for a in ledger.unwritten) == [1, 2, 3]
    ledger.written(again=True)
    assert [r.job_id for _, r in ledger.ended] == [1, 2, 3]
    ledger.take_ended(10)
    ledger.written()
    assert not ledger.unwritten


def test_a_cancel_reaches_the_attempt_in_flight_once() -> None:
    ledger, clock = _ledger()
    a = ledger.claimed(_row(7), clock())
    ledger.started(a)
    ledger.cancel(7)
    heard = a.cancel_heard_at
    clock.t += 5
    ledger.cancel(7)
    ledger.cancel(8)  # not ours: nothing
    assert heard == 1000.0 and a.cancel_heard_at == heard


def test_a_row_cancelled_before_a_child_takes_it_never_starts() -> None:
    ledger, clock = _ledger()
    told = ledger.claimed(_row(1), clock())  # cancelled while held (a NOTIFY, a workflow)
    on_claim = ledger.claimed(ClaimedRow(2, "q.Job", "q", "{}", 1, 3, True, 60.0, 30.0, 1.0,
                                         datetime.now(UTC)), clock())  # cancelled at claim
    runs = ledger.claimed(_row(3), clock())
    for a in (told, on_claim, runs):
        ledger.hold(a)
    ledger.cancel(1)
    started: list[int] = []

    def start(a: Attempt) -> bool:
        started.append(a.job_id)
        return True

    ledger.take_held(lambda _: True, start)
    assert started == [3]
    ended = {a.job_id: r for a, r in ledger.take_ended(10)}
    assert sorted(ended) == [1, 2]
    assert all(r.state == "cancelled" and r.error is not None and r.error["kind"] == "cancelled"
               and r.child_pid is None for r in ended.values())


def test_a_batch_to_write_takes_its_workflows_in_one_order() -> None:
    """Two batches locking two workflows in opposite orders would deadlock (each finish of a
    step locks its workflow): the store sends every batch's rows by workflow id."""
    ledger, clock = _ledger()
    for job_id, workflow_id in ((1, 9), (2, None), (3, 4), (4, 9), (5, 4)):
        row = ClaimedRow(job_id, "q.Job", "q", "{}", 1, 3, False, 60.0, 30.0, 1.0,
                         datetime.now(UTC), workflow_id=workflow_id)
        a = ledger.claimed(row, clock())
        ledger.started(a)
        ledger.end(a, policy.RELEASE)
    params = finish_params("w", [r for _, r in ledger.take_ended(10)])
    assert [r["id"] for r in orjson.loads(params["results"])] == [2, 3, 5, 1, 4]


def test_the_per_tick_loops_wait_while_nothing_is_in_flight_and_wake_when_an_attempt_starts(
        ) -> None:
    """Ledger.tick: one tick while an attempt is in flight; while none is, it waits until
    one starts (an idle supervisor's timeout, lease and status loops are not woken every
    tick). ``idle`` is an hour here: only the start can end the wait."""
    ledger, clock = _ledger()

    async def scenario() -> None:
        waiting = asyncio.create_task(ledger.tick(0.01, 3600.0))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # nothing in flight: no tick
        a = ledger.claimed(_row(1), clock())
        ledger.started(a)
        await asyncio.wait_for(waiting, 10)  # woken by the start
        await asyncio.wait_for(ledger.tick(0.01, 3600.0), 10)  # in flight: a plain tick
        ledger.end(a, policy.RELEASE)
        again = asyncio.create_task(ledger.tick(0.01, 3600.0))
        await asyncio.sleep(0.1)
        assert not again.done()  # the last attempt left: waiting again
        ledger.started(ledger.claimed(_row(2), clock()))
        await asyncio.wait_for(again, 10)

    asyncio.run(scenario())


def test_stale_held_rows_are_given_back_when_the_soonest_is_due_and_not_before() -> None:
    """The claimer asks for the stale held rows on every wake-up; the ledger keeps the
    soonest time one can be stale, so that the asks before it cost no walk: but a row whose
    heartbeat holds it a shorter time (a quarter of it) must still go back on time, and the
    rows held after a walk keep their own times."""
    ledger, clock = _ledger(claim_ahead_hold=1.0)
    long_held = [ledger.claimed(_row(i), clock()) for i in (1, 2)]  # held 1 s (the hold)
    for a in long_held:
        ledger.hold(a)
    clock.t += 0.5
    short = ledger.claimed(_row(3, heartbeat=0.8), clock())  # held 0.2 s: stale at 1000.7
    ledger.hold(short)
    clock.t = 1000.69
    assert ledger.give_back_held(stale_only=True) == 0
    clock.t = 1000.7
    assert ledger.give_back_held(stale_only=True) == 1
    assert [a.job_id for a in ledger.held] == [1, 2]
    clock.t = 1000.99
    assert ledger.give_back_held(stale_only=True) == 0
    later = ledger.claimed(_row(4), clock())  # held until 1001.99
    ledger.hold(later)
    clock.t = 1001.0
    assert ledger.give_back_held(stale_only=True) == 2
    assert [a.job_id for a in ledger.held] == [4]
    clock.t = 1001.98
    assert ledger.give_back_held(stale_only=True) == 0
    clock.t = 1001.99
    assert ledger.give_back_held(stale_only=True) == 1
    assert not ledger.held
    assert [r.job_id for _, r in ledger.ended] == [3, 1, 2, 4]
