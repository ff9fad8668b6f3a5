"""``tide``'s listings as tables: jobs, dead letters, queues, supervisors, a job's handler
steps.

On a terminal, with colour and the free-text columns cut to fit its width; in a pipe,
whole and plain (no colour, no width limit, no trailing spaces).
"""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import click
import orjson
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from atlantis.cli.escape import safe
from atlantis.cli.render import STATE_STYLES, progress_bar, relative, short_duration, since
from atlantis.presentation import job_estimate
from atlantis.store.admin import JobRow
from atlantis.store.fleet import HELD_CAP, NO_LIMITS, QueueLimits, QueueStats, WorkerRow
from atlantis.store.steps import StepRow
from atlantis.units import format_size

SMALL_BAR = 10
#: A handler step's value is shown cut to this many characters of its JSON (``--json`` has
#: it whole).
STEP_VALUE_CHARS = 80
STALLED_STYLE = "bold red"


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: a header a person reads; ``flexible`` columns (free text) are the ones
    cut with an ellipsis when a terminal is too narrow; ``right`` aligns numbers."""

    header: str
    flexible: bool = False
    right: bool = False


Cell = str | Text


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> None:
    """A table on stdout: with colour on a terminal, free-text columns cut to fit its width
    (never the others); whole and plain in a pipe."""
    # Text, never str: rich would read "[...]" as markup and ":name:" as an emoji. Every
    # cell is one line: newlines and other controls are shown escaped (see safe()).
    cells = [[Text(safe(c)) if isinstance(c, str) else c for c in row] for row in rows]
    tty = sys.stdout.isatty()
    naturals = [max([cell_len(col.header)] + [row[i].cell_len for row in cells])
                for i, col in enumerate(columns)]
    widths = list(naturals)
    gaps = 2 * (len(columns) - 1)
    if tty:
        # The free-text columns share what the others leave of the terminal's width.
        flexible = [i for i, col in enumerate(columns) if col.flexible]
        fixed = sum(w for i, w in enumerate(naturals) if i not in flexible) + gaps
        room = shutil.get_terminal_size().columns - fixed
        for n, i in enumerate(sorted(flexible, key=lambda i: naturals[i])):
            share = max(room // (len(flexible) - n), min(naturals[i], 12))
            widths[i] = min(naturals[i], share)
            room -= widths[i]
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold" if tty else "")
    for col, width in zip(columns, widths, strict=True):
        table.add_column(col.header, no_wrap=True, justify="right" if col.right else "left",
                         overflow="ellipsis", width=width)
    for row in cells:
        table.add_row(*row)
    if tty:
        # Never narrower than the table: a terminal too narrow for it wraps lines instead
        # of rich dropping whole columns.
        Console(width=sum(widths) + gaps, markup=False, emoji=False, highlight=False).print(table)
        return
    buffer = io.StringIO()
    Console(file=buffer, width=sum(widths) + gaps + 1, color_system=None, markup=False,
            emoji=False, highlight=False).print(table)
    click.echo("\n".join(line.rstrip() for line in buffer.getvalue().splitlines()))


def styled(text: str, style: str | None) -> Text:
    return Text(safe(text), style=style or "")


def job_table(jobs: Sequence[JobRow]) -> None:
    columns = [Column("ID", right=True), Column("JOB"), Column("QUEUE"), Column("STATE"),
               Column("ATTEMPT", right=True), Column("PROGRESS"), Column("ETA", right=True),
               Column("WHEN"), Column("MESSAGE", flexible=True), Column("LAST ERROR", flexible=True)]
    rows: list[list[Cell]] = []
    for job in jobs:
        now = job.db_now
        state = styled(job.state + (" STALLED" if job.stalled else ""),
                       STALLED_STYLE if job.stalled else STATE_STYLES.get(job.state))
        bar = progress_bar(job.progress_pct, SMALL_BAR) if job.progress_pct is not None else ""
        guess = job_estimate(job)
        eta = short_duration(guess.eta_seconds) if guess.eta_seconds is not None else ""
        rows.append([str(job.id), job.job, job.queue, state, f"{job.attempt}/{job.max_attempts}",
                     bar, eta, when(job, now), job.progress_msg or "",
                     # an earlier attempt's error is no news once the job is complete
                     "" if job.state == "complete" else job.last_error or ""])
    print_table(columns, rows)


def when(job: JobRow, now: datetime) -> str:
    """The latest thing that happened to a job, relatively: due, started, finished."""
    if job.finished_at is not None:
        return f"{job.state} {relative(job.finished_at, now)}"
    if job.running:
        return f"started {relative(job.started_at, now)}"
    if job.run_at > now:
        return f"due {relative(job.run_at, now)}"
    return f"waiting {since(job.run_at, now)}"


def dlq_table(jobs: Sequence[JobRow]) -> None:
    columns = [Column("ID", right=True), Column("JOB"), Column("QUEUE"),
               Column("ATTEMPTS", right=True), Column("DIED"), Column("FAILURES", right=True),
               Column("LAST ERROR", flexible=True)]
    rows: list[list[Cell]] = [
        [str(j.id), j.job, j.queue, f"{j.attempt}/{j.max_attempts}",
         relative(j.finished_at, j.db_now), str(j.error_count), styled(j.last_error or "", "red")]
        for j in jobs
    ]
    print_table(columns, rows)


def queue_table(queues: Sequence[QueueStats],
                limits: Mapping[str, QueueLimits] | None = None) -> None:
    """``tide queue stats``. LIMIT is the queue's concurrency limit; SLOTS the attempts it
    counts (running/limit), or without one the running attempts of limited jobs; HELD the due
    jobs of limited jobs or queues not running yet."""
    columns = [Column("QUEUE"), Column("WAITING", right=True), Column("OLDEST", right=True),
               Column("LATER", right=True), Column("RUNNING", right=True),
               Column("STALLED", right=True), Column("LIMIT", right=True),
               Column("SLOTS", right=True), Column("HELD", right=True), Column("DONE/MIN", right=True),
               Column("DONE/HOUR", right=True), Column("COMPLETE", right=True),
               Column("DEAD", right=True), Column("CANCELLED", right=True),
               Column("SUPERVISORS", right=True), Column("STATUS", flexible=True)]
    rows: list[list[Cell]] = []
    for q in queues:
        notes: list[tuple[str, str | None]] = []
        if q.paused:
            why = f": {q.paused_reason}" if q.paused_reason else ""
            notes.append((f"paused{why} (by {q.paused_by or '?'})", "yellow"))
        if q.unserved and not q.supervisors:
            notes.append(("no live supervisor serves it", STALLED_STYLE))
        if q.unserved_jobs and q.supervisors:
            notes.append((f"no live supervisor handles {', '.join(q.unserved_jobs)}",
                           STALLED_STYLE))
        if not q.declared:
            notes.append(("no declaration names it", None))
        status = Text("; ").join(styled(t, s) for t, s in notes) if notes else Text("ok")
        oldest = short_duration(q.oldest_waiting_seconds) if q.oldest_waiting_seconds else ""
        stalled = styled(str(q.stalled), STALLED_STYLE if q.stalled else None)
        later = max(0, q.available - q.due)
        lim = (limits or {}).get(q.queue, NO_LIMITS)
        rows.append([q.queue, _count(q, "due"), oldest,
                     f"≈{later}" if {"due", "available"} & set(q.approximate) else str(later),
                     _count(q, "running"), stalled, *_limit_cells(q, lim),
                     str(q.completed_last_minute),
                     str(q.completed_last_hour), _count(q, "complete"),
                     styled(_count(q, "dead"), "red" if q.dead else None),
                     _count(q, "cancelled"), str(q.supervisors), status])
    print_table(columns, rows)


def _limit_cells(q: QueueStats, lim: QueueLimits) -> list[Cell]:
    """LIMIT, SLOTS and HELD of a queue: a queue limit counts every running attempt of the
    queue (full: in yellow)."""
    held = f"≥{lim.held}" if lim.held >= HELD_CAP else str(lim.held)
    if lim.concurrency_limit is None:
        return ["-", str(lim.limited_running), held]
    full = q.running >= lim.concurrency_limit
    return [str(lim.concurrency_limit),
            styled(f"{_count(q, 'running')}/{lim.concurrency_limit}", "yellow" if full else None),
            held]


def _count(q: QueueStats, state: str) -> str:
    """A queue's count of ``state``; an estimate (above fleet.COUNT_CAP) reads "≈12345"."""
    count = int(getattr(q, state))
    return f"≈{count}" if state in q.approximate else str(count)


def worker_table(workers: Sequence[WorkerRow]) -> None:
    columns = [Column("HOST"), Column("PID", right=True), Column("QUEUES"), Column("STATUS"),
               Column("IN FLIGHT", right=True), Column("MEMORY", right=True), Column("UP"),
               Column("SEEN"), Column("JOBS", flexible=True), Column("NAME"),
               Column("ID")]
    rows: list[list[Cell]] = []
    for w in workers:
        jobs = []
        for j in w.jobs:
            if not isinstance(j, dict):
                continue
            text = f"#{j.get('job_id')}/{j.get('attempt')}"
            if j.get("child_pid"):
                text += f" pid {j['child_pid']}"
            if j.get("rss"):
                text += f" {format_size(int(j['rss']))}"
            jobs.append(text)
        status = styled(w.status, "yellow" if w.status != "running" else None)
        if w.silent_for is not None:
            status = styled(f"silent for {short_duration(w.silent_for)}", "red")
        rows.append([w.host, str(w.pid), ",".join(w.queues), status,
                     f"{w.in_flight}/{w.concurrency}", format_size(w.memory) if w.memory else "",
                     since(w.started_at, w.db_now), relative(w.seen_at, w.db_now),
                     ", ".join(jobs), w.name or "-", w.id])
    print_table(columns, rows)


def step_table(records: Sequence[StepRow], now: datetime) -> None:
    """``tide job steps``: one row a record, oldest first; ``now`` is the database's clock
    the ages are read against."""
    columns = [Column("NAME"), Column("KIND"), Column("RECORDED"), Column("ATTEMPT", right=True),
               Column("SIZE", right=True), Column("VALUE", flexible=True)]
    rows: list[list[Cell]] = [
        [r.name, r.kind, relative(r.recorded_at, now), str(r.attempt), format_size(r.bytes),
         step_value(r, now)]
        for r in records
    ]
    print_table(columns, rows)


def step_value(record: StepRow, now: datetime) -> str:
    """A record's value on one line: its JSON cut to :data:`STEP_VALUE_CHARS` characters;
    a sleep's wake time, absolute and relative."""
    if record.kind == "sleep":
        try:
            until = datetime.fromisoformat(orjson.loads(record.value)["until"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            until = None
        if until is not None:
            wake = "wakes" if until > now else "woke"
            return (f"{wake} {relative(until, now)} "
                    f"({until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC)")
    text = record.value
    if len(text) > STEP_VALUE_CHARS:
        text = f"{text[:STEP_VALUE_CHARS]}... ({format_size(record.bytes)}; --json shows it whole)"
    return text
