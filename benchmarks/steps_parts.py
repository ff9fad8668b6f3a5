"""Parts 3 and 4 of ``python -m benchmarks.steps`` (its docstring says what they measure):
the contact import both ways, and plain jobs beside jobs asleep."""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg

import atlantis
from benchmarks.runs import insert_atlantis
from benchmarks.scratch import scratch_database
from benchmarks.steps_harness import Poller, checkpoint, prepare, say, supervising, verdict
from benchmarks.tables import markdown

IMPORT_JOBS = {"state": "bench.ImportState", "steps": "bench.ImportSteps"}
SPAN = ("SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 "
        "FROM atlantis.jobs WHERE id > %s AND job = %s")


def one_import(which: str, accounts: int, contacts: int, concurrency: int,
               env: dict[str, str]) -> tuple[float, str]:
    """One import of ``accounts`` accounts on a fresh database: (seconds, note)."""
    job = IMPORT_JOBS[which]
    with scratch_database("atl_import") as url:
        prepare(url)
        with psycopg.connect(url) as conn:
            atlantis.enqueue_many(conn, job, [{"account_id": f"account-{n}"}
                                              for n in range(accounts)])
            conn.commit()
        checkpoint()
        poller = Poller(url)
        try:
            with supervising(url, concurrency, env) as proc:
                poller.until("SELECT count(*) FILTER (WHERE state IN ('complete', 'dead')) "
                             "FROM atlantis.jobs WHERE job = %s", (job,),
                             lambda n: n >= accounts, proc, timeout=600, poll=0.1)
            seconds = float(poller.one(SPAN, (0, job)))
            stored = poller.one("SELECT count(*) FROM contacts")
            dead = poller.one("SELECT count(*) FROM atlantis.jobs WHERE state = 'dead'")
        finally:
            poller.close()
    note = "" if stored == accounts * contacts and not dead else (
        f"{stored:,} contacts stored of {accounts * contacts:,}, {dead} dead")
    return seconds, note


def page_writes(pages: int = 200) -> tuple[float, float]:
    """Milliseconds of one page's writes from this process (its 100 contacts upserted with
    ``executemany`` in a transaction, as both handlers do): on a connection with psycopg's
    default options, as the guide's handler opens, and on one with the step connection's
    (``atlantis.store.steps.CONNECT_OPTIONS``: nothing prepared). Medians of 3 turns."""
    from atlantis.store import steps as store
    from examples.contacts.app import _UPSERT_CONTACT, ensure_schema
    from examples.contacts.crm import contact

    def turn(url: str, options: dict[str, Any], account: str) -> float:
        with psycopg.connect(url, **{**options, "autocommit": True}) as conn:
            started = time.perf_counter()
            for page in range(pages):
                rows = [(account, c["id"], c["name"], c["email"]) for c in
                        (contact(account, page * 100 + i) for i in range(100))]
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(_UPSERT_CONTACT, rows)
            return (time.perf_counter() - started) / pages * 1000

    with scratch_database("atl_pages") as url:
        with psycopg.connect(url) as conn:
            ensure_schema(conn)
        got = [(turn(url, {}, f"a{n}"), turn(url, store.CONNECT_OPTIONS, f"b{n}"))
               for n in range(3)]
    return statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)


def import_part(accounts: int, contacts: int, rounds: int, concurrency: int,
                page_delay: float = 0.0) -> list[str]:
    from examples.contacts.app import CRM_URL_ENV
    from examples.contacts.crm import FakeCRM

    pages = accounts * -(-contacts // 100)
    table = [["round", "state table s", "transaction steps s", "state ÷ steps", "note"]]
    ratios = []
    with FakeCRM(page_delay=page_delay, contacts_per_account=contacts) as crm:
        env = {CRM_URL_ENV: crm.url}
        for i in range(rounds):
            order = ("state", "steps") if i % 2 == 0 else ("steps", "state")
            got: dict[str, tuple[float, str]] = {}
            for which in order:
                say(f"import: {which}, {accounts} accounts x {contacts:,} contacts, "
                    f"{page_delay * 1000:g} ms a page upstream ...")
                got[which] = one_import(which, accounts, contacts, concurrency, env)
                say(f"import:   {got[which][0]:.2f} s")
                time.sleep(1.0)
            (state, n1), (steps, n2) = got["state"], got["steps"]
            ratios.append(state / steps)
            table.append([f"{i + 1} ({' '.join(order)})", f"{state:.2f}", f"{steps:.2f}",
                          f"{state / steps:.2f}x", "; ".join(filter(None, [n1, n2]))])
    median = statistics.median(ratios)
    table.append(["median", "", "", f"**{median:.2f}x**", f"≥ 1.0x: {verdict(median >= 1.0)}"])
    upstream = ("the CRM answers at once: bound by the CPU" if not page_delay else
                f"the CRM answers each page after {page_delay * 1000:g} ms, a slow upstream")
    head = [f"### the contact import: {accounts} accounts x {contacts:,} contacts "
            f"({pages:,} pages), `--concurrency {concurrency}`, {upstream}", markdown(table)]
    if page_delay:
        return head
    say("import: one page's writes from this process, prepared and not ...")
    prepared, unprepared = page_writes()
    return head + [f"A page's writes (100 upserts) from this process: {prepared:.2f} ms on "
                   f"a connection with psycopg's defaults (statements prepared after 5 uses), "
                   f"{unprepared:.2f} ms with the step connection's options (none prepared)."]


def put_to_sleep(url: str, sleepers: int, concurrency: int) -> float:
    """Enqueue ``sleepers`` ``bench.Asleep`` of an hour and run each to its sleep: seconds
    of the run."""
    with psycopg.connect(url) as conn:
        for first in range(0, sleepers, 1000):
            atlantis.enqueue_many(conn, "bench.Asleep", [
                {"n": n, "seconds": 3600.0} for n in range(first, min(first + 1000, sleepers))])
            conn.commit()
    poller = Poller(url)
    try:
        started = time.monotonic()
        with supervising(url, concurrency) as proc:
            poller.until("SELECT count(*) FROM atlantis.jobs WHERE job = 'bench.Asleep' AND "
                         "(state = 'running' OR (state = 'available' AND suspended_for IS NULL))",
                         None, lambda n: n == 0, proc, timeout=120 + sleepers / 5, poll=0.25)
            took = time.monotonic() - started
        asleep = poller.one("SELECT count(*) FROM atlantis.jobs WHERE job = 'bench.Asleep' "
                            "AND state = 'available' AND suspended_for IS NOT NULL")
    finally:
        poller.close()
    if asleep != sleepers:
        raise RuntimeError(f"{asleep} of {sleepers} jobs asleep")
    return took


def drain(url: str, jobs: int, concurrency: int) -> float:
    """Enqueue ``jobs`` ``bench.Noop`` and drain them with a new supervisor: jobs/s from
    the first claim to the last finish (the rows' own timestamps)."""
    poller = Poller(url)
    try:
        last = int(poller.one("SELECT coalesce(max(id), 0) FROM atlantis.jobs"))
        insert_atlantis(url, jobs)
        checkpoint()
        with supervising(url, concurrency) as proc:
            poller.until("SELECT count(*) FROM atlantis.jobs WHERE id > %s AND "
                         "state IN ('complete', 'dead')", (last,), lambda n: n >= jobs, proc,
                         timeout=120 + jobs / 20, poll=0.1)
        return jobs / float(poller.one(SPAN, (last, "bench.Noop")))
    finally:
        poller.close()


def asleep_part(sleepers: int, jobs: int, rounds: int, concurrency: int) -> list[str]:
    table: list[list[str]] = [["round", "jobs/s, none asleep", f"jobs/s, {sleepers:,} asleep",
                               "asleep ÷ none", ""]]
    ratios = []
    with scratch_database("atl_asleep") as beside, scratch_database("atl_alone") as alone:
        prepare(beside)
        prepare(alone)
        say(f"asleep: putting {sleepers:,} jobs to sleep for an hour ...")
        took = put_to_sleep(beside, sleepers, concurrency)
        say(f"asleep:   {took:.1f} s ({sleepers / took:,.0f} runs to a sleep a second)")
        for url in (beside, alone):  # both start settled: no autovacuum of the sleeps' updates
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
        for url in (alone, beside):  # a warm-up drain each, not counted
            say(f"asleep: warm-up drain of {max(1, jobs // 4):,} plain jobs ...")
            drain(url, max(1, jobs // 4), concurrency)
        for i in range(rounds):
            order = ("alone", "beside") if i % 2 == 0 else ("beside", "alone")
            got: dict[str, float] = {}
            for which in order:
                say(f"asleep: drain of {jobs:,} plain jobs, {which} ...")
                got[which] = drain(beside if which == "beside" else alone, jobs, concurrency)
                say(f"asleep:   {got[which]:,.0f} jobs/s")
                time.sleep(1.0)
            ratios.append(got["beside"] / got["alone"])
            table.append([f"{i + 1} ({' '.join(order)})", f"{got['alone']:,.0f}",
                          f"{got['beside']:,.0f}", f"{ratios[-1]:.3f}x", ""])
    median = statistics.median(ratios)
    table.append(["median", "", "", f"**{median:.3f}x** ({min(ratios):.3f}-{max(ratios):.3f}x)",
                  f"≥ 0.95x: {verdict(median >= 0.95)}"])
    return [f"### {jobs:,} plain jobs beside {sleepers:,} asleep, `--concurrency {concurrency}`"
            f" (putting them to sleep: {took:.1f} s, {sleepers / took:,.0f} a second)",
            markdown(table)]
