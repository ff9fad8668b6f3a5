"""Schedules for long jobs (issue 37): `overlap skip|allow`, slots skipped counted apart from
missed ones, and the operator's switch (`tide schedule disable|enable`, the console).

The SQL first (atlantis.schedule_advance and the older releases' calls, the switch, the locks
two firings and a switch take), then real supervisors: a slot every second and a run of four
seconds, with one supervisor firing and with two."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

from atlantis.app import load_app
from atlantis.declarations import parse_atl
from atlantis.errors import DeclarationError
from atlantis.store import sync
from atlantis.store.schedules import ScheduleNotFoundError, list_schedules, set_enabled
from tests.conftest import Supervisor, free_port, run_tide, scrape_metrics, wait_for

APP = "tests.apps.overlap:registry"
LONG, ALLOW, QUICK = "overlap.Long", "overlap.LongAllow", "overlap.Quick"
ONE = timedelta(seconds=1)


@pytest.fixture
def odb(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's database with tests/apps/overlap.py's declarations."""
    sync(db, list(load_app(APP).decls.values()))
    return db


def db_now(db: psycopg.Connection[Any]) -> datetime:
    value: datetime = db.execute("SELECT date_trunc('second', now())").fetchone()[0]  # type: ignore[index]
    return value


def advance(db: psycopg.Connection[Any], job: str, after: datetime | None,
            due: list[datetime], overlap: str | None = "skip") -> dict[str, Any]:
    row = db.execute(
        "SELECT * FROM atlantis.schedule_advance(%s, %s, NULL, NULL, 0, %s::timestamptz[], %s)",
        (job, after, due, overlap)).fetchone()
    assert row is not None
    names = ("outcome", "last_slot", "job_ids", "job_slots", "skipped", "open_job")
    return dict(zip(names, row, strict=True))


def schedule_row(db: psycopg.Connection[Any], job: str) -> dict[str, Any]:
    cur = db.execute("SELECT * FROM atlantis.schedules WHERE job = %s", (job,))
    names = [c.name for c in cur.description or ()]
    row = cur.fetchone()
    assert row is not None
    return dict(zip(names, row, strict=True))


def cursor(db: psycopg.Connection[Any], job: str) -> datetime | None:
    value: datetime | None = db.execute("SELECT atlantis.schedule_cursor(%s)",
                                        (job,)).fetchone()[0]  # type: ignore[index]
    return value


def runs(db: psycopg.Connection[Any], job: str) -> list[tuple[datetime, int | None]]:
    rows: list[tuple[datetime, int | None]] = db.execute(
        "SELECT slot, job_id FROM atlantis.schedule_runs WHERE job = %s ORDER BY slot",
        (job,)).fetchall()
    return rows


# --------------------------------------------------------------------------- the .atl modifier


def test_overlap_is_skip_by_default_and_allow_when_said() -> None:
    decls = {d.name: d for d in parse_atl(
        'job A in ns { schedule "* * * * *" }\n'
        'job B in ns { schedule "* * * * *"\n overlap allow }\n'
        'job C in ns { schedule "* * * * *"; overlap skip }\n'
        'job D in ns { queue "q" }\n')}
    assert [decls[n].overlap for n in "ABCD"] == ["skip", "allow", "skip", None]
    assert decls["B"].to_json()["overlap"] == "allow"


@pytest.mark.parametrize(("text", "message"), [
    pytest.param('job J in ns {\n  overlap skip\n}\n',
                 "jobs.atl:2:3: overlap needs a schedule in the same job (it says what a slot "
                 "does while an earlier run of the schedule has not ended)",
                 id="overlap-without-schedule"),
    pytest.param('job J in ns {\n  schedule "0 3 * * *"\n  overlap queue\n}\n',
                 "jobs.atl:3:11: invalid overlap 'queue' (expected skip or allow)",
                 id="overlap-unknown-word"),
    pytest.param('job J in ns {\n  schedule "0 3 * * *"\n  overlap "skip"\n}\n',
                 "jobs.atl:3:11: unexpected '\"skip\"' (expected skip or allow)",
                 id="overlap-quoted"),
    pytest.param('job J in ns {\n  schedule "0 3 * * *"\n  overlap\n}\n',
                 "jobs.atl:3:10: unexpected end of line (expected skip or allow)",
                 id="overlap-without-value"),
    pytest.param('job J in ns {\n  schedule "0 3 * * *", overlap skip, overlap allow\n}\n',
                 "jobs.atl:2:39: duplicate modifier 'overlap' (first at jobs.atl:2)",
                 id="overlap-twice"),
])
def test_overlap_refusals_name_file_line_column(text: str, message: str) -> None:
    with pytest.raises(DeclarationError) as info:
        parse_atl(text, "jobs.atl")
    assert str(info.value) == message


def test_sync_stores_the_overlap(odb: psycopg.Connection[Any]) -> None:
    rows = dict(odb.execute("SELECT job, overlap FROM atlantis.job_types WHERE job LIKE "
                            "'overlap.%%'").fetchall())
    assert rows == {LONG: "skip", ALLOW: "allow", QUICK: "skip"}


# --------------------------------------------------------------------------- the SQL


def test_skip_enqueues_no_slot_while_a_run_waits_runs_or_sleeps(
        odb: psycopg.Connection[Any]) -> None:
    now = db_now(odb)
    t = [now - 10 * ONE + i * ONE for i in range(10)]
    first = advance(odb, LONG, None, [t[0]])
    assert first["outcome"] == "done" and first["job_slots"] == [t[0]]
    [run] = first["job_ids"]
    assert first["open_job"] == run and first["skipped"] == 0
    # Waiting, due: the next slots are counted, not enqueued; the cursor follows them.
    second = advance(odb, LONG, t[0], [t[1], t[2]])
    assert (second["outcome"], second["job_ids"], second["skipped"], second["open_job"],
            second["last_slot"]) == ("done", [], 2, run, t[2])
    assert cursor(odb, LONG) == t[2]
    # Running; then waiting for a retry; then suspended by a durable sleep: still open.
    odb.execute("UPDATE atlantis.jobs SET state = 'running', attempt = 1, started_at = now(),"
                " claimed_by = 'w', claimed_until = now() + interval '1h' WHERE id = %s", (run,))
    assert advance(odb, LONG, t[2], [t[3]])["skipped"] == 1
    odb.execute("UPDATE atlantis.jobs SET state = 'available', claimed_by = NULL,"
                " claimed_until = NULL, run_at = now() + interval '1h' WHERE id = %s", (run,))
    assert advance(odb, LONG, t[3], [t[4]])["skipped"] == 1
    odb.execute("UPDATE atlantis.jobs SET suspended_for = 'sleep' WHERE id = %s", (run,))
    assert advance(odb, LONG, t[4], [t[5]])["skipped"] == 1
    row = schedule_row(odb, LONG)
    assert (row["skipped"], row["last_skipped"], row["open_from"]) == (5, t[5], t[0])
    # Ended: the next slot is a job again, and it is the one later slots wait for.
    odb.execute("SELECT atlantis.cancel(%s)", (run,))
    third = advance(odb, LONG, t[5], [t[6], t[7]])
    assert (third["job_slots"], third["skipped"]) == ([t[6]], 1)
    assert third["open_job"] == third["job_ids"][0]
    assert schedule_row(odb, LONG)["open_from"] == t[6]
    assert [job_id is not None for _, job_id in runs(odb, LONG)] == [True, True]
    # 'allow' enqueues whatever runs.
    allowed = advance(odb, LONG, t[7], [t[8], t[9]], overlap="allow")
    assert (len(allowed["job_ids"]), allowed["skipped"]) == (2, 0)
    # tide schedule list's document, from the same rows.
    found, _ = list_schedules(odb)
    doc = {s.job: s for s in found}[LONG].document()
    assert (doc["overlap"], doc["skipped"], doc["last_skipped"], doc["enabled"]) == (
        "skip", 6, t[7], True)
    assert doc["missed"] == 0


def test_a_run_enqueued_by_hand_is_not_a_run_of_the_schedule(
        odb: psycopg.Connection[Any]) -> None:
    import atlantis

    atlantis.enqueue(odb, LONG, {})
    now = db_now(odb)
    assert len(advance(odb, LONG, None, [now])["job_ids"]) == 1


def test_missed_slots_are_missed_not_skipped(odb: psycopg.Connection[Any]) -> None:
    now = db_now(odb)
    first = advance(odb, LONG, None, [now - 600 * ONE])
    assert first["job_ids"]
    # An outage of 500 slots while the run still waits: missed (nothing ran), then skipped.
    row = odb.execute(
        "SELECT * FROM atlantis.schedule_advance(%s, %s, %s, %s, 500, %s::timestamptz[], NULL)",
        (LONG, now - 600 * ONE, now - 599 * ONE, now - 100 * ONE, [now - 99 * ONE])).fetchone()
    assert row is not None and (row[0], row[2], row[4]) == ("done", [], 1)
    assert odb.execute("SELECT missed FROM atlantis.schedule_runs WHERE job = %s AND job_id IS "
                       "NULL", (LONG,)).fetchall() == [(500,)]
    assert schedule_row(odb, LONG)["skipped"] == 1


def test_the_switch_fires_nothing_while_off_and_back_fills_nothing(
        odb: psycopg.Connection[Any]) -> None:
    now = db_now(odb)
    first = advance(odb, QUICK, None, [now - 5 * ONE])
    odb.execute("SELECT atlantis.cancel(%s)", (first["job_ids"][0],))
    assert set_enabled(odb, QUICK, False, by="alice") is True
    assert set_enabled(odb, QUICK, False, by="bob") is False  # who and when stay
    row = schedule_row(odb, QUICK)
    assert (row["enabled"], row["changed_by"]) == (False, "alice")
    off = advance(odb, QUICK, now - 5 * ONE, [now - 4 * ONE, now - 3 * ONE])
    assert (off["outcome"], off["job_ids"], off["skipped"], off["last_slot"]) == (
        "disabled", [], 0, now - 5 * ONE)
    assert len(runs(odb, QUICK)) == 1 and schedule_row(odb, QUICK)["skipped"] == 0
    found, _ = list_schedules(odb)
    quick = {s.job: s for s in found}[QUICK]
    assert (quick.enabled, quick.switched_by, quick.next_run) == (False, "alice", None)
    # On again: the cursor is the moment it was enabled; what came before is dropped.
    assert set_enabled(odb, QUICK, True, by="carol") is True
    row = schedule_row(odb, QUICK)
    assert (row["enabled"], row["changed_by"]) == (True, "carol")
    enabled_from = row["enabled_from"]
    assert enabled_from is not None and enabled_from >= now
    assert cursor(odb, QUICK) == enabled_from
    stale = advance(odb, QUICK, now - 5 * ONE, [now - 4 * ONE])
    assert (stale["outcome"], stale["last_slot"]) == ("stale", enabled_from)
    later = enabled_from.replace(microsecond=0) + ONE
    done = advance(odb, QUICK, enabled_from, [enabled_from.replace(microsecond=0), later])
    assert done["job_slots"] == [later]
    assert odb.execute("SELECT count(*) FROM atlantis.schedule_runs WHERE job = %s AND "
                       "job_id IS NULL", (QUICK,)).fetchone() == (0,)
    assert set_enabled(odb, QUICK, True) is False
    assert schedule_row(odb, QUICK)["enabled_from"] == enabled_from  # not moved


def test_the_switch_refuses_a_job_without_a_schedule(odb: psycopg.Connection[Any]) -> None:
    with pytest.raises(ScheduleNotFoundError) as info:
        set_enabled(odb, "overlap.Nosuch", False)
    assert str(info.value) == "no scheduled job 'overlap.Nosuch': tide schedule list shows them"
    with pytest.raises(ScheduleNotFoundError) as info:
        set_enabled(odb, "tests.Echo", False)
    assert str(info.value) == ("job 'tests.Echo' has no schedule: tide schedule list shows the "
                               "scheduled jobs")
    assert odb.execute("SELECT count(*) FROM atlantis.schedules").fetchone() == (0,)


def test_the_older_releases_calls_follow_the_stored_overlap_and_the_switch(
        odb: psycopg.Connection[Any]) -> None:
    now = db_now(odb)

    def catch_up(job: str, after: datetime | None, due: list[datetime]) -> Any:
        return odb.execute("SELECT * FROM atlantis.schedule_catch_up(%s, %s, NULL, NULL, 0, "
                           "%s::timestamptz[])", (job, after, due)).fetchone()

    # 0.2.0's call: Long is stored 'skip', LongAllow 'allow'.
    outcome, last, ids = catch_up(LONG, None, [now - 3 * ONE])
    assert outcome == "done" and len(ids) == 1
    assert catch_up(LONG, now - 3 * ONE, [now - 2 * ONE]) == ("done", now - 2 * ONE, [])
    assert catch_up(ALLOW, None, [now - 3 * ONE])[0] == "done"
    assert len(catch_up(ALLOW, now - 3 * ONE, [now - 2 * ONE, now - ONE])[2]) == 2
    # Switched off: 'busy', an answer it knows (nothing done, ask again).
    set_enabled(odb, ALLOW, False)
    assert catch_up(ALLOW, now - ONE, [now]) == ("busy", now - ONE, [])

    # 0.1.0's call, one slot at a time.
    def fire(job: str, slot: datetime) -> Any:
        return odb.execute("SELECT * FROM atlantis.schedule_fire(%s, %s, '1 hour')",
                           (job, slot)).fetchone()

    assert fire(LONG, now - ONE) == ("taken", None)  # Long's run still waits: skipped
    assert schedule_row(odb, LONG)["skipped"] == 2
    assert fire(ALLOW, now) == ("taken", None)  # disabled
    set_enabled(odb, ALLOW, True)
    enabled_from = schedule_row(odb, ALLOW)["enabled_from"]
    assert fire(ALLOW, enabled_from.replace(microsecond=0) + ONE)[0] == "enqueued"


def test_two_firings_and_a_switch_lock_the_schedule_row(odb: psycopg.Connection[Any],
                                                         db_url: str) -> None:
    now = db_now(odb)
    with psycopg.connect(db_url) as first:
        # A supervisor's round under way: its slot enqueued, not yet committed.
        fired = first.execute("SELECT job_ids FROM atlantis.schedule_advance(%s, NULL, NULL, "
                              "NULL, 0, %s::timestamptz[], 'skip')",
                              (LONG, [now - 2 * ONE])).fetchone()
        assert fired is not None and len(fired[0]) == 1
        # Another supervisor's round for the next slot: busy, not waiting, nothing done.
        assert advance(odb, LONG, None, [now - ONE])["outcome"] == "busy"
        # An operator's switch waits for the round to end.
        done: list[Any] = []
        pid = odb.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]

        def switch() -> None:
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("SET application_name = 'switch'")
                done.append(set_enabled(conn, LONG, False))

        thread = threading.Thread(target=switch)
        thread.start()
        try:
            wait_for(lambda: odb.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'switch' "
                "AND wait_event_type = 'Lock' AND pid <> %s", (pid,)).fetchone() == (1,),
                message="the switch waiting for the round's lock")
            assert not done
        finally:
            first.commit()
            thread.join(30)
    assert done == [True]
    # The second round, after the first: it follows the first's slot, and would skip.
    stale = advance(odb, LONG, None, [now - ONE])
    assert (stale["outcome"], stale["last_slot"]) == ("disabled", now - 2 * ONE)
    set_enabled(odb, LONG, True)
    enabled_from = schedule_row(odb, LONG)["enabled_from"]
    nxt = advance(odb, LONG, enabled_from, [enabled_from.replace(microsecond=0) + ONE])
    assert (nxt["job_ids"], nxt["skipped"], nxt["open_job"]) == ([], 1, fired[0][0])


# --------------------------------------------------------------------------- tide


def tide(db_url: str, *args: str) -> Any:
    return run_tide(["--database-url", db_url, *args], check=False)


def test_tide_schedule_disable_enable_and_list(odb: psycopg.Connection[Any],
                                               db_url: str) -> None:
    result = tide(db_url, "schedule", "disable", QUICK)
    assert (result.returncode, result.stdout) == (0, f"schedule {QUICK} disabled\n")
    again = tide(db_url, "schedule", "disable", QUICK)
    assert again.stdout == f"schedule {QUICK} disabled (it was disabled already)\n"
    docs = {d["job"]: d for d in orjson.loads(tide(db_url, "schedule", "list", "--json").stdout)}
    quick = docs[QUICK]
    assert (quick["enabled"], quick["next_run"], quick["skipped"], quick["overlap"]) == (
        False, None, 0, "skip")
    assert quick["switched_by"] and quick["switched_at"]
    assert (docs[ALLOW]["enabled"], docs[ALLOW]["overlap"]) == (True, "allow")
    human = tide(db_url, "schedule", "list").stdout
    line = next(line for line in human.splitlines() if QUICK in line)
    assert f"disabled by {quick['switched_by']} at" in line
    assert "Overlap" in human and "Skipped" in human
    assert tide(db_url, "schedule", "enable", QUICK).stdout == f"schedule {QUICK} enabled\n"
    assert tide(db_url, "schedule", "enable", QUICK).stdout == (
        f"schedule {QUICK} enabled (it was enabled already)\n")


def test_tide_schedule_disable_of_an_unknown_name_is_one_line_and_exit_1(
        odb: psycopg.Connection[Any], db_url: str) -> None:
    def said(result: Any) -> list[str]:  # after the line naming the database
        return [line for line in result.stderr.splitlines()
                if not line.startswith("atlantis: using database")]

    result = tide(db_url, "schedule", "disable", "overlap.Nosuch")
    assert (result.returncode, result.stdout) == (1, "")
    assert said(result) == ["tide: no scheduled job 'overlap.Nosuch': tide schedule list "
                            "shows them"]
    unscheduled = tide(db_url, "schedule", "enable", "tests.Echo")
    assert unscheduled.returncode == 1
    assert said(unscheduled) == ["tide: job 'tests.Echo' has no schedule: tide schedule list "
                                 "shows the scheduled jobs"]


# --------------------------------------------------------------------------- the console


def test_the_console_switches_a_schedule_audited(odb: psycopg.Connection[Any],
                                                 db_url: str) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    import re
    import warnings

    with warnings.catch_warnings():  # as tests/test_console_api.py
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings, Token

    secret = "s3cret"
    bearer = {"Authorization": f"Bearer {secret}"}
    settings = Settings(db_url, token=Token("ops", secret))
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as c:
        page = c.get("/schedules")
        assert page.status_code == 200 and "/schedules/action" not in page.text  # no token
        # The API: behind the token.
        assert c.post(f"/api/schedules/{QUICK}/disable").status_code == 403
        r = c.post(f"/api/schedules/{QUICK}/disable", headers=bearer)
        assert r.status_code == 200
        assert r.json() == {"job": QUICK, "enabled": False, "changed": True}
        unknown = c.post("/api/schedules/overlap.Nosuch/enable", headers=bearer)
        assert unknown.status_code == 404
        assert unknown.json()["error"] == ("no scheduled job 'overlap.Nosuch': tide schedule "
                                           "list shows them")
        # The page: logged in, its form confirmed in the browser, with the CSRF token.
        c.post("/login", data={"token": secret, "next": "/schedules"})
        page = c.get("/schedules")
        assert 'data-confirm="Enable the schedule of overlap.Quick?' in page.text
        assert 'data-confirm="Disable the schedule of overlap.Long?' in page.text
        assert "by console:ops at" in page.text
        csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
        assert csrf is not None
        assert c.post("/schedules/action", data={"job": QUICK, "action": "enable"}
                      ).status_code == 403
        r = c.post("/schedules/action", data={"job": QUICK, "action": "enable",
                                              "csrf": csrf.group(1)}, follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/schedules")
        audit = c.get("/api/audit", headers=bearer).json()["audit"]
    assert [(a["action"], a["target"], a["outcome"], a["label"]) for a in reversed(audit)] == [
        ("schedule-disable", QUICK, "changed", "ops"),
        ("schedule-enable", "overlap.Nosuch",
         "refused: no scheduled job 'overlap.Nosuch': tide schedule list shows them", "ops"),
        ("schedule-enable", QUICK, "changed", "ops")]
    assert schedule_row(odb, QUICK)["changed_by"] == "console:ops"


# --------------------------------------------------------------------------- real supervisors


def started(db: psycopg.Connection[Any], key: str) -> list[tuple[int, datetime, datetime | None]]:
    """(job, started, finished) of each run of ``key``, in the order they started."""
    rows: list[tuple[int, datetime, datetime | None]] = db.execute(
        "SELECT job_id, min(at) FILTER (WHERE event = 'started'),"
        "       min(at) FILTER (WHERE event = 'finished')"
        "  FROM test_events WHERE key = %s GROUP BY job_id ORDER BY 2", (key,)).fetchall()
    return rows


def open_runs(db: psycopg.Connection[Any], job: str) -> int:
    count: int = db.execute("SELECT count(*) FROM atlantis.jobs WHERE job = %s AND state IN "
                            "('available', 'running')", (job,)).fetchone()[0]  # type: ignore[index]
    return count


@pytest.mark.parametrize("supervisors", [1, 2])
def test_overlap_skip_never_runs_two_at_once_and_counts_the_skips(
        supervise: Callable[..., Supervisor], odb: psycopg.Connection[Any], db_url: str,
        supervisors: int) -> None:
    ports = [free_port() for _ in range(supervisors)]
    sups = [supervise("--metrics-port", str(port), queues=("overlap",), app=APP, concurrency=2)
            for port in ports]
    most = 0

    def three_runs_ended() -> bool:
        nonlocal most
        most = max(most, open_runs(odb, LONG))
        return sum(1 for _, _, end in started(odb, "long") if end is not None) >= 3

    wait_for(three_runs_ended, timeout=90, message="three runs of four seconds")
    scraped = [scrape_metrics(port) for port in ports]
    for sup in sups:
        sup.stop()
    # Never two at once, no pile-up: at most one run waited or ran at any time, and each run
    # started after the one before had finished.
    assert most == 1
    ran = started(odb, "long")
    for (_, _, end), (_, start, _) in zip(ran, ran[1:], strict=False):
        assert end is not None and start >= end
    # Every slot from the first run on was enqueued or skipped, once; none missed.
    slots = runs(odb, LONG)
    assert all(job_id is not None for _, job_id in slots)
    row = schedule_row(odb, LONG)
    skipped, last = row["skipped"], cursor(odb, LONG)
    assert last is not None and skipped >= 2 * 3
    assert len(slots) + skipped == (last - slots[0][0]) // ONE + 1
    # Counted: tide schedule list, the metric (by the supervisors that skipped them), and
    # not a missed slot for tide db doctor.
    doc = {d["job"]: d for d in orjson.loads(tide(db_url, "schedule", "list", "--json").stdout)}
    assert (doc[LONG]["skipped"], doc[LONG]["missed"]) == (skipped, 0)
    counted = sum(float(line.rsplit(" ", 1)[1]) for text in scraped for line in text.splitlines()
                  if line.startswith(f'atlantis_schedule_slots_skipped_total{{job="{LONG}"}}'))
    assert 0 < counted <= skipped
    doctor = orjson.loads(tide(db_url, "db", "doctor", "--json").stdout)
    assert doctor["checks"]["missed_schedules"]["ok"]
    logs = "".join(sup.log() for sup in sups)
    assert "skipped: its run job=" in logs and "(overlap skip)" in logs
    assert all(f"scheduling {LONG} (* * * * * *)" in sup.log() for sup in sups)  # all fired


def test_overlap_allow_enqueues_every_slot(supervise: Callable[..., Supervisor],
                                           odb: psycopg.Connection[Any]) -> None:
    sup = supervise(queues=("overlap_allow",), app=APP, concurrency=2)
    most = 0

    def six_slots() -> bool:
        nonlocal most
        most = max(most, open_runs(odb, ALLOW))
        return len(runs(odb, ALLOW)) >= 6

    wait_for(six_slots, timeout=60, message="six slots enqueued")
    sup.stop()
    slots = runs(odb, ALLOW)
    assert all(b - a == ONE for (a, _), (b, _) in zip(slots, slots[1:], strict=False))
    assert all(job_id is not None for _, job_id in slots)
    assert most > 1  # runs of four seconds, one a second: they overlapped
    assert schedule_row(odb, ALLOW)["skipped"] == 0


def test_disable_and_enable_with_no_back_fill_across_a_redeploy(
        supervise: Callable[..., Supervisor], odb: psycopg.Connection[Any], db_url: str) -> None:
    sup = supervise(queues=("overlap_quick",), app=APP)
    wait_for(lambda: len(runs(odb, QUICK)) >= 2, timeout=60, message="two slots enqueued")
    assert tide(db_url, "schedule", "disable", QUICK).returncode == 0
    off = odb.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    wait_for(lambda: f"schedule {QUICK} is disabled by an operator" in sup.log(),
             message="the scheduler to see the switch")
    # A redeploy: the supervisor stopped, the declarations synced, a new one started.
    sup.stop()
    assert run_tide(["--database-url", db_url, "db", "sync", "--app", APP],
                    check=False).returncode == 0
    again = supervise(queues=("overlap_quick",), app=APP)
    wait_for(lambda: f"schedule {QUICK} is disabled by an operator" in again.log(),
             message="the new supervisor to see the switch")
    wait_for(lambda: db_now(odb) >= off + 3 * ONE, message="three slots while disabled")
    assert all(slot <= off for slot, _ in runs(odb, QUICK))
    skipped = schedule_row(odb, QUICK)["skipped"]
    assert tide(db_url, "schedule", "enable", QUICK).returncode == 0
    enabled_from = schedule_row(odb, QUICK)["enabled_from"]
    wait_for(lambda: runs(odb, QUICK)[-1][0] >= enabled_from + 2 * ONE,
             message="slots after enabling")
    again.stop()
    slots = runs(odb, QUICK)
    after = [(slot, job_id) for slot, job_id in slots if slot > off]
    # Nothing from the time it was off: neither a job nor a missed slot; then every second,
    # but for a slot whose run was still open (a loaded machine: `overlap skip`), counted.
    assert after[0][0] == enabled_from.replace(microsecond=0) + ONE
    assert all(job_id is not None for _, job_id in slots)
    steps = [(b - a) / ONE for (a, _), (b, _) in zip(after, after[1:], strict=False)]
    assert all(step == int(step) >= 1 for step in steps), steps
    assert sum(int(step) - 1 for step in steps) <= schedule_row(odb, QUICK)["skipped"] - skipped
    assert f"schedule {QUICK} is enabled again" in again.log()


def test_the_bad_input_tables_quote_these_messages() -> None:
    from tests.docs import bad_input_text

    text = bad_input_text()
    for quoted in ("no scheduled job 'overlap.Nosuch': tide schedule list shows them",
                   "job 'tests.Echo' has no schedule: tide schedule list shows the scheduled "
                   "jobs",
                   "jobs.atl:3:11: invalid overlap 'queue' (expected skip or allow)",
                   "jobs.atl:2:3: overlap needs a schedule in the same job (it says what a "
                   "slot does while an earlier run of the schedule has not ended)",
                   f"schedule {QUICK} disabled (it was disabled already)"):
        assert quoted in text, quoted
