"""``tide schedule``: the cron schedules declared in ``.atl`` files (``schedule "CRON"``),
and the operator's switch of each (``disable``, ``enable``).

``tide`` adds the group with ``main.add_command(schedule)``; the connection (and its
one-line failures: exit 1 for an unreachable database or a missing schema) is tide's.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from atlantis.cli.escape import safe
from atlantis.store.schedules import (
    Schedule,
    ScheduleNotFoundError,
    list_schedules,
    set_enabled,
)
from atlantis.units import format_duration


@click.group()
def schedule() -> None:
    """Cron schedules: jobs enqueued once per slot by the supervisors."""


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document: every schedule with next_run, last_run, missed, "
                   "skipped, enabled and more.")
@click.pass_context
def schedule_list(ctx: click.Context, as_json: bool) -> None:
    """Each scheduled job: its cron, time zone, next run and last run, the slots missed and
    skipped, and whether it is enabled."""
    from atlantis.cli.common import connection, print_json

    with connection(ctx) as conn:
        found, now = list_schedules(conn)
    if as_json:
        print_json([s.document() for s in found])
        return
    if not found:
        click.echo("no scheduled jobs (declare one with schedule \"CRON\" in a .atl file)",
                   err=True)
        return
    _table(found, now)


@schedule.command("disable")
@click.argument("name")
@click.pass_context
def schedule_disable(ctx: click.Context, name: str) -> None:
    """Switch off the schedule of job NAME (namespace.Job): no slot is enqueued, nor counted
    missed, until `tide schedule enable NAME`. Kept in the database: a redeploy, a
    restart or `tide db sync` leaves it off."""
    _switch(ctx, name, enabled=False)


@schedule.command("enable")
@click.argument("name")
@click.pass_context
def schedule_enable(ctx: click.Context, name: str) -> None:
    """Switch the schedule of job NAME on again. The slots since it was disabled are not
    back-filled: the next one to run is the first after now."""
    _switch(ctx, name, enabled=True)


def _switch(ctx: click.Context, name: str, *, enabled: bool) -> None:
    from atlantis.cli.common import connection, fail, operator_name

    with connection(ctx) as conn:
        try:
            changed = set_enabled(conn, name, enabled, by=operator_name())
        except ScheduleNotFoundError as exc:
            fail(str(exc), kind="not_found")
    word = "enabled" if enabled else "disabled"
    click.echo(f"schedule {safe(name)} {word}" + ("" if changed else f" (it was {word} already)"))


def _table(found: list[Schedule], now: datetime) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console.width = 1000  # a pipe or a file gets whole lines, never cut
    table = Table(box=None, pad_edge=False)
    for header in ("Job", "Queue", "Schedule", "Time zone", "Next run", "Last run", "Last job",
                   "Missed", "Overlap", "Skipped", "State"):
        table.add_column(header, overflow="fold")
    for s in found:
        last_job = "" if s.last_job_id is None else f"{s.last_job_id} ({s.last_state or 'pruned'})"
        table.add_row(*(Text(safe(cell)) for cell in (
            s.job, s.queue, s.schedule, s.tz or "UTC", _when(s.next_run, now),
            _when(s.last_run, now), last_job, _missed(s, now), s.overlap,
            _count(s.skipped, s.last_skipped, now), _state(s, now))))
    console.print(table)


def _missed(s: Schedule, now: datetime) -> str:
    """``86400, last at 2024-05-02 03:00:00 UTC (5m ago)``; empty when none was missed."""
    return _count(s.missed, s.last_missed, now)


def _count(count: int, last: datetime | None, now: datetime) -> str:
    """``3, last at 2024-05-02 03:00:00 UTC (5m ago)``; empty for none."""
    if not count:
        return ""
    return f"{count}, last at {_when(last, now)}"


def _state(s: Schedule, now: datetime) -> str:
    """``enabled``, or ``disabled by alice at 2024-05-02 03:00:00 UTC (5m ago)``."""
    if s.enabled:
        return "enabled"
    return f"disabled by {s.switched_by or '?'} at {_when(s.switched_at, now)}"


def _when(moment: datetime | None, now: datetime) -> str:
    """``2024-05-01 03:00 UTC (in 3h)``; ``-`` for nothing."""
    if moment is None:
        return "-"
    seconds = round((moment - now).total_seconds())
    if seconds > 0:
        relative = f"in {_coarse(seconds)}"
    elif seconds < 0:
        relative = f"{_coarse(-seconds)} ago"
    else:
        relative = "now"
    return f"{_utc(moment)} ({relative})"


def _coarse(seconds: int) -> str:
    """A duration to the minute past an hour, to the hour past a day: ``1d2h``, ``3h5m``."""
    unit = 3600 if seconds >= 86_400 else 60 if seconds >= 3600 else 1
    return format_duration(round(seconds / unit) * unit)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
