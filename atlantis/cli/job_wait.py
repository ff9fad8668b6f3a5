"""``tide job wait ID [--timeout D]``: wait for a job to end, as :func:`atlantis.wait` does.

``tide`` adds the command to its ``job`` group. Exit 0 once the job is ``complete`` (its
result printed as JSON on stdout), 1 when it ended ``dead`` or ``cancelled`` (one line on
stderr naming the state and the last error) or is unknown, 3 when ``--timeout`` passed
first (one line; the job goes on).
"""

from __future__ import annotations

import click

import atlantis
from atlantis.cli.common import JOB_ID, connection, duration_option, fail, print_json
from atlantis.errors import JobFailedError, JobNotFoundError, WaitTimeout

#: The exit status of a wait that timed out.
TIMED_OUT = 3


@click.command("wait")
@click.argument("job_id", type=JOB_ID)
@click.option("--timeout", "give_up", default=None, metavar="DURATION",
              help="Give up after this long: exit 3 (default: wait as long as it takes).")
@click.pass_context
def job_wait(ctx: click.Context, job_id: int, give_up: str | None) -> None:
    """Wait for a job to end: print its result (JSON) and exit 0 once complete; exit 1 when
    it ended dead or cancelled, 3 when --timeout passed first."""
    seconds = None if give_up is None else duration_option("--timeout", give_up)
    with connection(ctx, deadline=False) as conn:
        try:
            result = atlantis.wait(conn, job_id, seconds)
        except JobFailedError as exc:
            fail(str(exc))
        except JobNotFoundError:
            fail(f"no job with id {job_id}")
        except WaitTimeout as exc:
            fail(str(exc), code=TIMED_OUT)
    print_json(result)
