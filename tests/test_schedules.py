"""Cron schedules: the slots of an expression (DST included), exactly one job per slot
however many supervisors run, missed slots, paused queues, and `tide schedule list`."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner

from atlantis.app import load_app
from atlantis.declarations import parse_atl
from atlantis.declarations.cron import latest_slot, next_slot, slots, zone
from atlantis.store import sync
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.scheduler import Scheduler
from atlantis.supervisor.settings import Settings
from tests.conftest import Supervisor, wait_for

APP = "tests.apps.sched:registry"
TICK = "sched.Tick"
NIGHTLY = "sched.Nightly"
PARIS = "Europe/Paris"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0,
        microsecond: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


def local(moment: datetime, tz: str) -> str:
    return moment.astimezone(zone(tz)).isoformat()


# --------------------------------------------------------------------------- slots


def test_latest_slot_is_at_or_before_now_and_next_slot_after() -> None:
    at_slot = utc(2024, 5, 1, 3, 0, 0)
    assert latest_slot("0 3 * * *", None, at_slot) == at_slot
    assert latest_slot("0 3 * * *", None, at_slot - timedelta(microseconds=1)) == utc(2024, 4, 30, 3)
    assert next_slot("0 3 * * *", None, at_slot) == utc(2024, 5, 2, 3)
    assert next_slot("0 3 * * *", None, at_slot - timedelta(seconds=1)) == at_slot


def test_utc_unless_a_tz_is_given() -> None:
    now = utc(2024, 1, 15, 12)
    assert latest_slot("0 3 * * *", None, now) == utc(2024, 1, 15, 3)
    assert latest_slot("0 3 * * *", "UTC", now) == utc(2024, 1, 15, 3)
    assert latest_slot("0 3 * * *", PARIS, now) == utc(2024, 1, 15, 2)  # winter: UTC+1
    assert latest_slot("0 3 * * *", PARIS, utc(2024, 7, 15, 12)) == utc(2024, 7, 15, 1)  # UTC+2


def test_six_fields_give_seconds_first() -> None:
    now = utc(2024, 1, 1, 0, 0, 5, 500_000)
    assert latest_slot("*/2 * * * * *", None, now) == utc(2024, 1, 1, 0, 0, 4)
    assert next_slot("*/2 * * * * *", None, now) == utc(2024, 1, 1, 0, 0, 6)
    assert slots("30 0 3 * * *", None, utc(2024, 1, 1), utc(2024, 1, 2, 12)) == [
        utc(2024, 1, 1, 3, 0, 30), utc(2024, 1, 2, 3, 0, 30)]


def test_a_slot_in_the_spring_gap_runs_once_at_the_next_valid_time() -> None:
    # Paris, 2024-03-31: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    found = slots("30 2 * * *", PARIS, utc(2024, 3, 29, 12), utc(2024, 4, 1, 12))
    assert [local(s, PARIS) for s in found] == [
        "2024-03-30T02:30:00+01:00", "2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00"]
    jump = utc(2024, 3, 31, 1)  # 03:00 CEST
    assert latest_slot("30 2 * * *", PARIS, jump - timedelta(seconds=1)) == utc(2024, 3, 30, 1, 30)
    assert latest_slot("30 2 * * *", PARIS, jump) == jump
    assert next_slot("30 2 * * *", PARIS, jump - timedelta(seconds=1)) == jump


def test_slots_of_the_skipped_hour_are_one_slot() -> None:
    found = slots("*/20 * * * *", PARIS, utc(2024, 3, 31, 0, 30), utc(2024, 3, 31, 1, 30))
    assert [local(s, PARIS) for s in found] == [
        "2024-03-31T01:40:00+01:00", "2024-03-31T03:00:00+02:00", "2024-03-31T03:20:00+02:00"]


def test_the_repeated_autumn_hour_runs_once() -> None:
    # Paris, 2024-10-27: 03:00 CEST goes back to 02:00 CET; 02:00-02:59 happen twice.
    found = slots("30 2 * * *", PARIS, utc(2024, 10, 25, 12), utc(2024, 10, 28, 12))
    assert [local(s, PARIS) for s in found] == [
        "2024-10-26T02:30:00+02:00", "2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"]
    hourly = slots("0 * * * *", PARIS, utc(2024, 10, 26, 22, 30), utc(2024, 10, 27, 3, 30))
    assert [local(s, PARIS) for s in hourly] == [
        "2024-10-27T01:00:00+02:00", "2024-10-27T02:00:00+02:00", "2024-10-27T03:00:00+01:00",
        "2024-10-27T04:00:00+01:00"]
    # During the second 02:xx, the slots of that hour already happened (the first time).
    second_pass = utc(2024, 10, 27, 1, 20)  # 02:20 CET
    assert local(latest_slot("*/15 * * * *", PARIS, second_pass) or second_pass, PARIS) == (
        "2024-10-27T02:45:00+02:00")
    assert local(next_slot("*/15 * * * *", PARIS, second_pass) or second_pass, PARIS) == (
        "2024-10-27T03:00:00+01:00")


def test_new_york_changes_too() -> None:
    spring = slots("30 2 * * *", "America/New_York", utc(2024, 3, 9, 12), utc(2024, 3, 10, 12))
    assert [local(s, "America/New_York") for s in spring] == ["2024-03-10T03:00:00-04:00"]
    autumn = slots("30 1 * * *", "America/New_York", utc(2024, 11, 2, 12), utc(2024, 11, 3, 12))
    assert [local(s, "America/New_York") for s in autumn] == ["2024-11-03T01:30:00-04:00"]


@pytest.mark.parametrize("expression", ["30 2 * * *", "0 * * * *", "*/7 * * * *", "0 3 * * *"])
@pytest.mark.parametrize("day", [utc(2024, 3, 30, 12), utc(2024, 10, 26, 12)])
def test_what_a_scheduler_sees_minute_by_minute_is_each_slot_once(
        expression: str, day: datetime) -> None:
    """Polling latest_slot every minute through a DST change finds exactly slots(), in order."""
    seen: list[datetime] = []
    moment = day
    while moment <= day + timedelta(days=1):
        slot = latest_slot(expression, PARIS, moment)
        assert slot is not None and slot <= moment
        nxt = next_slot(expression, PARIS, moment)
        assert nxt is not None and slot < nxt and moment < nxt
        if slot not in seen:
            if seen:
                assert slot > seen[-1]
            seen.append(slot)
        moment += timedelta(minutes=1)
    assert seen[1:] == slots(expression, PARIS, seen[0], day + timedelta(days=1))


# --------------------------------------------------------------------------- the database


def test_sync_stores_stall_schedule_and_tz(db: psycopg.Connection[Any]) -> None:
    rows = {job: rest for job, *rest in db.execute(
        "SELECT job, extract(epoch FROM stall)::float, schedule, tz FROM atlantis.job_types "
        "WHERE job IN (%s, %s)", (TICK, NIGHTLY)).fetchall()}
    assert rows[TICK] == [None, "*/2 * * * * *", None]
    assert rows[NIGHTLY] == [900.0, "30 2 * * *", PARIS]
    changed = parse_atl('job Nightly in sched {\n  args { day date }\n  queue "sched"\n}\n')
    with psycopg.connect(db.info.dsn) as conn:
        sync(conn, changed)
    row = db.execute("SELECT stall, schedule, tz FROM atlantis.job_types WHERE job = %s",
                     (NIGHTLY,)).fetchone()
    assert row == (None, None, None)


def fire(db: psycopg.Connection[Any], job: str, slot: str, grace: str = "60 seconds") -> Any:
    return db.execute("SELECT * FROM atlantis.schedule_fire(%s, %s::timestamptz, %s::interval)",
                      (job, slot, grace)).fetchone()


def test_schedule_fire_enqueues_a_slot_once_with_the_defaults(db: psycopg.Connection[Any]) -> None:
    slot = db.execute("SELECT date_trunc('second', now())::text").fetchone()[0]  # type: ignore[index]
    outcome, job_id = fire(db, TICK, slot)
    assert outcome == "enqueued" and job_id is not None
    assert fire(db, TICK, slot) == ("taken", None)
    job = db.execute("SELECT job, queue, args, state FROM atlantis.jobs WHERE id = %s",
                     (job_id,)).fetchone()
    assert job == (TICK, "sched", {"key": "tick", "note": None}, "available")
    runs = db.execute("SELECT job_id FROM atlantis.schedule_runs WHERE job = %s", (TICK,)).fetchall()
    assert runs == [(job_id,)]


def test_a_late_slot_is_missed_not_run_and_a_new_schedule_skips_its_first(
        db: psycopg.Connection[Any]) -> None:
    # A schedule that never ran: its first slot, long past, is just not run.
    assert fire(db, NIGHTLY, "2024-01-01T01:30:00Z") == ("skipped", None)
    assert db.execute("SELECT count(*) FROM atlantis.schedule_runs").fetchone() == (0,)
    # Once it has run, a slot first seen too late is recorded as missed, once.
    assert fire(db, NIGHTLY, "2024-01-02T01:30:00Z", "100 years")[0] == "enqueued"
    assert fire(db, NIGHTLY, "2024-01-03T01:30:00Z") == ("missed", None)
    assert fire(db, NIGHTLY, "2024-01-03T01:30:00Z") == ("taken", None)
    assert db.execute("SELECT count(*) FROM atlantis.jobs WHERE job = %s",
                      (NIGHTLY,)).fetchone() == (1,)


def test_a_refused_enqueue_records_no_slot(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.Error) as info:
        fire(db, "sched.Unknown", "now")
    assert info.value.sqlstate == "ATL01"
    assert db.execute("SELECT count(*) FROM atlantis.schedule_runs").fetchone() == (0,)


def run_scheduler(db_url: str, decls: list[Any], rounds: int,
                  check: Callable[[Scheduler], None] | None = None, **settings: Any) -> Scheduler:
    """Run ``rounds`` rounds of a scheduler in this process; returns it."""

    async def main() -> Scheduler:
        rt = Runtime(Settings(queues=("sched",), database_url=db_url, **settings))
        scheduler = Scheduler(rt, decls)
        try:
            for _ in range(rounds):
                await scheduler.tick()
            if check is not None:
                check(scheduler)
        finally:
            await rt.close_databases()
        return scheduler

    return asyncio.run(main())


def missed_count(scheduler: Scheduler, job: str) -> float:
    value = scheduler.rt.metrics.registry.get_sample_value(
        "atlantis_schedule_slots_missed_total", {"job": job})
    return value or 0.0


def test_the_scheduler_counts_a_missed_slot_once(db_url: str, db: psycopg.Connection[Any]) -> None:
    now: datetime = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    # Hourly, half an hour from now: the latest slot is some 30 minutes past, beyond the grace.
    expression = f"{(now.minute + 30) % 60} * * * *"
    nightly = dataclasses.replace(load_app(APP).decls[NIGHTLY], schedule=expression, tz=None)
    latest = latest_slot(expression, None, now)
    assert latest is not None
    # Never ran: the past slot is skipped, and not counted.
    first = run_scheduler(db_url, [nightly], 2)
    assert missed_count(first, NIGHTLY) == 0
    assert db.execute("SELECT count(*) FROM atlantis.schedule_runs").fetchone() == (0,)
    # It ran a day ago: the 24 hourly slots since, the latest half an hour past, are missed;
    # counted by one scheduler, in one row.
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, job_id) VALUES (%s, %s, 1)",
               (NIGHTLY, latest - timedelta(days=1)))
    second = run_scheduler(db_url, [nightly], 3)
    third = run_scheduler(db_url, [nightly], 1)
    assert (missed_count(second, NIGHTLY), missed_count(third, NIGHTLY)) == (24, 0)
    rows = db.execute("SELECT slot, job_id, missed, missed_from FROM atlantis.schedule_runs "
                      "WHERE job = %s ORDER BY slot", (NIGHTLY,)).fetchall()
    assert rows == [(latest - timedelta(days=1), 1, 0, None),
                    (latest, None, 24, latest - timedelta(hours=23))]
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)


def test_the_scheduler_serves_only_its_queues_scheduled_jobs(db_url: str) -> None:
    decls = parse_atl('job A in ns { schedule "* * * * *"\n queue "other" }\n'
                      'job B in ns { queue "sched" }\n'
                      'job C in ns { schedule "* * * * *", queue "sched" }\n')

    def check(scheduler: Scheduler) -> None:
        assert list(scheduler.schedules) == ["ns.C"]
        assert len(scheduler.loops()) == 1

    run_scheduler(db_url, decls, 0, check)

    def idle(scheduler: Scheduler) -> None:
        assert scheduler.loops() == []

    run_scheduler(db_url, decls[:2], 0, idle)


def test_two_schedulers_in_one_round_enqueue_a_slot_once(db_url: str,
                                                          db: psycopg.Connection[Any]) -> None:
    decls = [d for d in load_app(APP).decls.values() if d.qualified_name == TICK]

    async def main() -> None:
        runtimes = [Runtime(Settings(queues=("sched",), database_url=db_url)) for _ in range(4)]
        schedulers = [Scheduler(rt, decls) for rt in runtimes]
        try:
            for _ in range(3):
                await asyncio.gather(*(s.tick() for s in schedulers))
        finally:
            for rt in runtimes:
                await rt.close_databases()

    asyncio.run(main())
    runs = db.execute("SELECT slot, job_id FROM atlantis.schedule_runs ORDER BY slot").fetchall()
    jobs = db.execute("SELECT id FROM atlantis.jobs WHERE job = %s ORDER BY id", (TICK,)).fetchall()
    assert runs and all(job_id is not None for _, job_id in runs)
    assert sorted(job_id for _, job_id in runs) == [j for (j,) in jobs]


# --------------------------------------------------------------------------- real supervisors


def enqueued_slots(db: psycopg.Connection[Any]) -> list[tuple[datetime, int]]:
    rows: list[tuple[datetime, int]] = db.execute(
        "SELECT slot, job_id FROM atlantis.schedule_runs WHERE job = %s AND job_id IS NOT NULL "
        "ORDER BY slot", (TICK,)).fetchall()
    return rows


def test_two_supervisors_enqueue_exactly_one_job_per_slot(
        supervise: Callable[..., Supervisor], db: psycopg.Connection[Any]) -> None:
    sups = [supervise(queues=("sched",), app=APP) for _ in range(2)]
    for sup in sups:
        wait_for(lambda sup=sup: "sched.Tick (*/2 * * * * *)" in sup.log(),  # type: ignore[misc]
                 message="the scheduler to start")
    wait_for(lambda: len(enqueued_slots(db)) >= 4, timeout=60, message="four slots enqueued")
    for sup in sups:
        sup.stop()
    runs = enqueued_slots(db)
    slots_ = [slot for slot, _ in runs]
    assert len(set(slots_)) == len(slots_)
    assert all(slot.second % 2 == 0 and slot.microsecond == 0 for slot in slots_)
    jobs = db.execute("SELECT id, args FROM atlantis.jobs WHERE job = %s ORDER BY id",
                      (TICK,)).fetchall()
    assert [job_id for _, job_id in runs] == [job_id for job_id, _ in jobs]
    assert all(args == {"key": "tick", "note": None} for _, args in jobs)
    # Each slot was enqueued by one supervisor, which said so once.
    for slot, job_id in runs:
        lines = [line for sup in sups for line in sup.log().splitlines()
                 if f"enqueued as job={job_id}" in line]
        assert len(lines) == 1, (slot, lines)
    # Every enqueued job ran once.
    ran = db.execute("SELECT job_id, count(*) FROM test_events WHERE key = 'tick' "
                     "GROUP BY job_id").fetchall()
    assert all(count == 1 for _, count in ran)


def test_a_paused_queue_still_receives_its_scheduled_jobs(
        supervise: Callable[..., Supervisor], db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT atlantis.pause('sched', 'upstream down')")
    supervise(queues=("sched",), app=APP)
    wait_for(lambda: len(enqueued_slots(db)) >= 2, timeout=60, message="two slots enqueued")
    states = db.execute("SELECT DISTINCT state FROM atlantis.jobs WHERE job = %s",
                        (TICK,)).fetchall()
    assert states == [("available",)]
    db.execute("SELECT atlantis.resume('sched')")
    wait_for(lambda: db.execute(
        "SELECT count(*) FROM atlantis.jobs WHERE job = %s AND state = 'complete'",
        (TICK,)).fetchone()[0] >= 2, message="the waiting jobs to run")  # type: ignore[index]


# --------------------------------------------------------------------------- tide schedule list


def tide(db_url: str, *args: str) -> Any:
    from atlantis.cli.schedules import schedule
    from atlantis.cli.tide import main

    if "schedule" not in main.commands:
        main.add_command(schedule)
    return CliRunner().invoke(main, ["--database-url", db_url, *args], catch_exceptions=False)


def test_tide_schedule_list(db_url: str, db: psycopg.Connection[Any]) -> None:
    now = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    slot = latest_slot("*/2 * * * * *", None, now)
    outcome, job_id = fire(db, TICK, slot.isoformat())  # type: ignore[union-attr]
    assert outcome == "enqueued"
    result = tide(db_url, "schedule", "list", "--json")
    assert result.exit_code == 0, result.output
    docs = {d["job"]: d for d in orjson.loads(result.stdout)}
    assert set(docs) == {TICK, NIGHTLY}
    tick, nightly = docs[TICK], docs[NIGHTLY]
    assert (tick["schedule"], tick["tz"], tick["queue"]) == ("*/2 * * * * *", None, "sched")
    assert datetime.fromisoformat(tick["last_run"]) == slot
    assert (tick["last_job_id"], tick["last_state"], tick["missed"]) == (job_id, "available", 0)
    assert datetime.fromisoformat(tick["next_run"]) > now
    assert (nightly["schedule"], nightly["tz"], nightly["last_run"]) == ("30 2 * * *", PARIS, None)
    next_run = datetime.fromisoformat(nightly["next_run"])
    assert next_run.astimezone(zone(PARIS)).strftime("%H:%M") in ("02:30", "03:00")
    assert next_run - now <= timedelta(days=1, hours=1)

    human = tide(db_url, "schedule", "list")
    assert human.exit_code == 0
    assert "Next run" in human.stdout and "Last run" in human.stdout
    assert "sched.Nightly" in human.stdout and PARIS in human.stdout
    assert f"{job_id} (available)" in human.stdout


def test_tide_schedule_list_on_a_database_without_schedules(admin_url: str) -> None:
    result = tide(admin_url, "schedule", "list", "--json")
    assert result.exit_code == 1
    # Under --json the error is one JSON object on stdout (issue 36).
    error = orjson.loads(result.stdout)
    assert "tide db migrate" in error["error"] and error["kind"]
    assert "tide db migrate" in tide(admin_url, "schedule", "list").stderr


# --------------------------------------------------------------------------- every slot, once
# A per-second schedule (tests/apps/sched_second.atl). Each slot since the latest recorded is
# fired with its own slot time, whatever the rounds did (a stopped supervisor, a slow round);
# slots past the grace are one row with their count, however many.

SECOND_APP = "tests.apps.sched_second:registry"
SECOND = "persec.Second"
ONE = timedelta(seconds=1)


def db_now(db: psycopg.Connection[Any]) -> datetime:
    value: datetime = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    return value


def second_runs(db: psycopg.Connection[Any]) -> list[tuple[datetime, int | None]]:
    rows: list[tuple[datetime, int | None]] = db.execute(
        "SELECT slot, job_id FROM atlantis.schedule_runs WHERE job = %s ORDER BY slot",
        (SECOND,)).fetchall()
    return rows


def assert_one_job_per_consecutive_slot(db: psycopg.Connection[Any],
                                        runs: list[tuple[datetime, int | None]]) -> None:
    """Every second from the first run to the last has its row and its own job, once."""
    slots_ = [slot for slot, _ in runs]
    gaps = [(a, b) for a, b in zip(slots_, slots_[1:], strict=False) if b - a != ONE]
    assert not gaps, f"slots not fired: {gaps}"
    assert all(job_id is not None for _, job_id in runs), "a slot within the grace was missed"
    jobs = [job_id for (job_id,) in db.execute(
        "SELECT id FROM atlantis.jobs WHERE job = %s ORDER BY id", (SECOND,)).fetchall()]
    assert sorted(job_id for _, job_id in runs if job_id is not None) == jobs


def test_supervisors_stopped_for_seconds_fire_each_slot_of_the_stop_once(
        supervise: Callable[..., Supervisor], db: psycopg.Connection[Any]) -> None:
    sups = [supervise(queues=("persec",), app=SECOND_APP) for _ in range(2)]
    wait_for(lambda: len(second_runs(db)) >= 2, timeout=60, message="two slots enqueued")
    for sup in sups:
        sup.signal(signal.SIGSTOP)
    try:
        stopped = db_now(db)
        wait_for(lambda: db_now(db) >= stopped + 5 * ONE, message="five seconds")
    finally:
        for sup in sups:
            sup.signal(signal.SIGCONT)
    resumed = db_now(db)
    wait_for(lambda: second_runs(db)[-1][0] >= resumed + 2 * ONE, message="slots after the stop")
    for sup in sups:
        sup.stop()
    runs = second_runs(db)
    # The slots that fell while both were stopped (at least four) each got a job, with its
    # own slot time, and so did every other: one per second, none twice, none missed.
    assert len([slot for slot, _ in runs if stopped < slot < resumed]) >= 4
    assert_one_job_per_consecutive_slot(db, runs)
    # Fired late, each said so once, with its own slot.
    logs = "".join(sup.log() for sup in sups)
    for slot, job_id in runs:
        assert logs.count(f"enqueued as job={job_id}\n") + logs.count(
            f"enqueued as job={job_id} ") == 1, (slot, job_id)
        assert f"slot {slot.isoformat()} enqueued as job={job_id}" in logs


def test_rounds_slower_than_the_slots_fire_every_slot(
        supervise: Callable[..., Supervisor], db: psycopg.Connection[Any]) -> None:
    # Each round comes 1.4 s after the last: drift, exaggerated so that every few rounds
    # two slots have passed since the one before.
    sup = supervise("--schedule-interval", "1.4s", queues=("persec",), app=SECOND_APP)
    wait_for(lambda: len(second_runs(db)) >= 10, timeout=60, message="ten slots enqueued")
    sup.stop()
    runs = second_runs(db)
    assert len(runs) >= 10
    assert_one_job_per_consecutive_slot(db, runs)


def missed_rows(db: psycopg.Connection[Any]) -> list[tuple[datetime, datetime, int]]:
    rows: list[tuple[datetime, datetime, int]] = db.execute(
        "SELECT missed_from, slot, missed FROM atlantis.schedule_runs "
        "WHERE job = %s AND job_id IS NULL ORDER BY slot", (SECOND,)).fetchall()
    return rows


def test_a_day_long_outage_is_one_missed_row_with_its_count(
        supervise: Callable[..., Supervisor], db: psycopg.Connection[Any], db_url: str) -> None:
    # The schedule last fired a day ago (job 0: pruned since).
    last = db_now(db).replace(microsecond=0) - timedelta(days=1)
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, job_id) VALUES (%s, %s, 0)",
               (SECOND, last))
    sup = supervise("--schedule-grace", "5s", queues=("persec",), app=SECOND_APP)
    wait_for(lambda: any(job_id is None for _, job_id in second_runs(db)), timeout=30,
             message="the missed slots recorded")
    resumed = db_now(db)
    wait_for(lambda: second_runs(db)[-1][0] >= resumed + ONE, message="slots after the outage")
    sup.stop()
    # Every second after the last run, up to the grace, counted: a day of them, less the grace.
    result = tide(db_url, "schedule", "list", "--json")
    assert result.exit_code == 0, result.output
    doc = {d["job"]: d for d in orjson.loads(result.stdout)}[SECOND]
    count = doc["missed"]
    assert 86_400 - 120 <= count <= 86_400
    # One row counts them: the day is never written (nor walked) slot by slot.
    runs = second_runs(db)
    assert len(runs) < 100
    [(first, to, missed)] = missed_rows(db)
    assert (first, missed) == (last + ONE, count)
    assert count == (to - first) // ONE + 1
    # Then the slots within the grace (5 s) and all later ones: a job each, no gap.
    assert runs[0] == (last, 0) and runs[1] == (to, None)
    fired = runs[2:]
    assert fired[0][0] == to + ONE
    assert 5 <= len([slot for slot, _ in fired if slot <= resumed]) <= 7
    assert_one_job_per_consecutive_slot(db, fired)
    assert f"{count} slots from {first.isoformat()} to {to.isoformat()} missed" in sup.log()

    # tide schedule list: the count, and the run it came in (new keys; the old ones kept).
    assert (doc["missed"], doc["missed_ranges"], doc["last_missed_count"]) == (count, 1, count)
    assert datetime.fromisoformat(doc["last_missed_from"]) == first
    assert datetime.fromisoformat(doc["last_missed"]) == to
    assert datetime.fromisoformat(doc["last_run"]) == fired[-1][0]
    human = tide(db_url, "schedule", "list")
    line = next(line for line in human.stdout.splitlines() if SECOND in line)
    assert f"{count}, last at {to.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S')} UTC" in line

    # tide db doctor: the missed slots, counted, recent.
    doctor = tide(db_url, "db", "doctor", "--json")
    check = orjson.loads(doctor.stdout)["checks"]["missed_schedules"]
    assert not check["ok"]
    assert f"{count} schedule slots missed in the last 1d: {SECOND} ({count})" in check["summary"]
    [row] = [r for r in check["items"] if r["job"] == SECOND]
    assert (row["missed"], row["recent"], row["ranges"]) == (count, count, 1)
    assert datetime.fromisoformat(row["first_missed"]) == first


def test_schedulers_catching_up_together_record_each_slot_once(
        db_url: str, db: psycopg.Connection[Any]) -> None:
    decls = list(load_app(SECOND_APP).decls.values())
    with psycopg.connect(db_url) as conn:
        sync(conn, decls)
    last = db_now(db).replace(microsecond=0) - timedelta(hours=2)
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, job_id) VALUES (%s, %s, 0)",
               (SECOND, last))

    async def main() -> None:
        runtimes = [Runtime(Settings(queues=("persec",), database_url=db_url,
                                     schedule_grace=3.0)) for _ in range(4)]
        schedulers = [Scheduler(rt, decls) for rt in runtimes]
        try:
            for _ in range(3):
                await asyncio.gather(*(s.tick() for s in schedulers))
            counted = sum(missed_count(s, SECOND) for s in schedulers)
            [(_, _, count)] = missed_rows(db)
            assert counted == count  # counted once, by one of them
        finally:
            for rt in runtimes:
                await rt.close_databases()

    asyncio.run(main())
    [(first, to, count)] = missed_rows(db)
    assert (first, count) == (last + ONE, (to - last) // ONE)
    runs = second_runs(db)
    assert runs[:2] == [(last, 0), (to, None)]
    assert runs[2][0] == to + ONE
    assert_one_job_per_consecutive_slot(db, runs[2:])


def test_an_older_release_cannot_fire_a_slot_inside_a_missed_run(
        db: psycopg.Connection[Any]) -> None:
    # A supervisor of the previous release calls schedule_fire while a fleet rolls.
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, missed, missed_from) "
               "VALUES (%s, '2024-01-01T10:00:00Z', 600, '2024-01-01T09:50:01Z')", (TICK,))
    assert fire(db, TICK, "2024-01-01T09:55:00Z") == ("taken", None)
    assert fire(db, TICK, "2024-01-01T10:00:02Z") == ("missed", None)
    assert db.execute("SELECT slot, missed, missed_from FROM atlantis.schedule_runs "
                      "WHERE slot > '2024-01-01T10:00:00Z'").fetchall() == [
        (utc(2024, 1, 1, 10, 0, 2), 1, utc(2024, 1, 1, 10, 0, 2))]


MINUTE, HOUR, DAY = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)


@pytest.mark.parametrize(("expression", "tz", "start", "span"), [
    ("* * * * * *", None, utc(2024, 5, 1, 23, 50), 20 * MINUTE),  # across midnight
    ("* * * * * *", PARIS, utc(2024, 3, 31, 0, 50), 20 * MINUTE),  # the skipped hour: one slot
    ("* * * * * *", PARIS, utc(2024, 10, 27, 0, 50), 20 * MINUTE),  # the repeated hour: once
    ("*/7 * * * * *", "America/New_York", utc(2024, 11, 3, 5, 17, 3), 2 * HOUR),
    ("*/20 */5 1-3 * * *", PARIS, utc(2024, 3, 30, 23, 1, 2), 5 * HOUR),
    ("30 2 * * *", PARIS, utc(2024, 3, 25), 14 * DAY),
    ("15,45 1-3 * * 0", "America/New_York", utc(2024, 10, 28), 10 * DAY),
    ("0 0 L * *", None, utc(2024, 1, 15), 100 * DAY),
    ("0 12 1,15 * 5", None, utc(2024, 1, 1, 12), 60 * DAY),
])
def test_count_slots_counts_what_a_walk_finds(expression: str, tz: str | None, start: datetime,
                                              span: timedelta) -> None:
    from atlantis.declarations.cron import count_slots

    end = start + span + timedelta(seconds=0.5)
    for a, b in [(start, end), (start + timedelta(seconds=0.25), end - span / 3),
                 (start - ONE, start + 3 * ONE)]:
        assert count_slots(expression, tz, a, b) == len(slots(expression, tz, a, b))
    assert count_slots(expression, tz, end, start) == 0


def test_count_slots_of_years_of_seconds_without_walking_them() -> None:
    from atlantis.declarations.cron import count_slots

    start = utc(2020, 1, 1)
    assert count_slots("* * * * * *", None, start, start + timedelta(days=1)) == 86_400
    # Ten years of seconds, one step per day (a walk would take 315 million): each autumn's
    # repeated hour runs once (the skipped spring hour takes no instant).
    ten_years = count_slots("* * * * * *", PARIS, start, utc(2030, 1, 1))
    assert ten_years == (utc(2030, 1, 1) - start) // ONE - 10 * 3600


def test_the_console_shows_missed_runs_by_their_count(db_url: str,
                                                      db: psycopg.Connection[Any]) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    import warnings

    with warnings.catch_warnings():  # as tests/test_console_api.py
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings as ConsoleSettings

    # An outage of 600 slots, one missed slot of an older release, then a run.
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, missed, missed_from) VALUES "
               "(%s, '2024-01-01T10:00:00Z', 600, '2024-01-01T09:40:02Z'), "
               "(%s, '2024-01-01T10:00:02Z', 1, '2024-01-01T10:00:02Z')", (TICK, TICK))
    db.execute("INSERT INTO atlantis.schedule_runs (job, slot, job_id) "
               "VALUES (%s, '2024-01-01T10:00:04Z', 0)", (TICK,))
    with TestClient(create_app(ConsoleSettings(db_url)), base_url="http://127.0.0.1") as client:
        docs = {d["job"]: d for d in client.get("/api/schedules").json()["schedules"]}
        page = client.get("/schedules")
    tick = docs[TICK]
    assert (tick["missed"], tick["missed_ranges"], tick["last_missed_count"]) == (601, 2, 1)
    assert tick["last_missed"] == tick["last_missed_from"]
    assert datetime.fromisoformat(tick["last_missed"]) == utc(2024, 1, 1, 10, 0, 2)
    assert (docs[NIGHTLY]["missed"], docs[NIGHTLY]["last_missed"]) == (0, None)
    assert page.status_code == 200
    assert "<td>601 " in page.text
