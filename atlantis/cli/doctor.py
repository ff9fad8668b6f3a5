"""``tide db doctor``: what is wrong with this atlantis database, if anything.

``tide`` adds the command to its ``db`` group with ``db.add_command(doctor)``. It only reads:
the server version, bloat and dead tuples of ``atlantis.jobs``, transactions that hold back
vacuum, running rows past their lease, queues and declarations no live supervisor serves,
waiting jobs of a type no live supervisor of their queue handles, and missed schedule slots (:mod:`atlantis.store.doctor`). Exit 0 when every check passes, 1
when one found a problem (and, as for every tide command, for a database that cannot be
reached or a missing schema); ``--json`` prints one document either way.
"""

from __future__ import annotations

import sys

import click

from atlantis.cli.escape import safe
from atlantis.store import doctor as checks
from atlantis.units import format_duration


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: every check by name.")
@click.option("--xact-age", default=format_duration(checks.XACT_AGE), show_default=True,
              metavar="DURATION", help="A transaction older than this holds back vacuum.")
@click.option("--lease-grace", default=format_duration(checks.LEASE_GRACE), show_default=True,
              metavar="DURATION", help="A running row this far past its lease is a problem.")
@click.option("--missed-within", default=format_duration(checks.MISSED_WITHIN),
              show_default=True, metavar="DURATION",
              help="Missed schedule slots this recent are a problem.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, xact_age: str, lease_grace: str,
           missed_within: str) -> None:
    """Check the database: bloat, old transactions, expired leases, unserved queues and jobs."""
    from atlantis.cli.common import connection, duration_option, print_json
    ages = (duration_option("--xact-age", xact_age), duration_option("--lease-grace", lease_grace),
            duration_option("--missed-within", missed_within))
    with connection(ctx) as conn:
        report = checks.diagnose(conn, xact_age=ages[0], lease_grace=ages[1],
                                 missed_within=ages[2], home=embedded_home(ctx))
    if as_json:
        print_json(report.document())
    else:
        width = max(len(c.name) for c in report.checks)
        for check in report.checks:
            label = "PROBLEM" if not check.ok else "warning" if check.warning else "ok"
            click.echo(safe(f"{label:7} {check.name:{width}}  {check.summary}"))
            if not check.ok:
                for item in check.items[:10]:
                    click.echo(" " * 10 + safe(", ".join(f"{k}={v}" for k, v in item.items()
                                                         if v is not None)))
        problems, warned = report.problems, report.warnings
        click.echo(f"doctor: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
                   + (f" ({', '.join(c.name for c in problems)})" if problems else "")
                   + (f", {len(warned)} warning{'s' if len(warned) != 1 else ''} "
                      f"({', '.join(c.name for c in warned)})" if warned else ""),
                   err=True)
    if report.problems:
        sys.exit(1)


def embedded_home(ctx: click.Context) -> checks.Home | None:
    """The embedded home doctor looks at, unless a URL names another server."""
    from atlantis.cli.common import explicit_url
    from atlantis.store import embedded

    if explicit_url(ctx):
        return None
    return checks.Home(str(embedded.atlantis_home()), embedded.DEFAULT_MAJOR)
