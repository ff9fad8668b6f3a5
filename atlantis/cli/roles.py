"""``tide db roles``: the least-privilege roles atlantis defines, and their rights.

``tide db migrate`` creates them when the migrating role may create roles (superuser or
CREATEROLE) and grants them their rights in the database it migrates. Otherwise a
superuser runs what ``tide db roles --sql`` prints (once per cluster for the roles, once
per database for the grants), or ``tide db roles`` connected as one.

``tide`` adds the command with ``db.add_command(roles)``; the connection (and its one-line
failures) is tide's.
"""

from __future__ import annotations

import click

from atlantis.store.migrate import ROLES, apply_roles, roles_sql, schema_problem


@click.command("roles")
@click.option("--sql", "as_sql", is_flag=True,
              help="Print the statements (for a superuser to run) instead of running them.")
@click.pass_context
def roles(ctx: click.Context, as_sql: bool) -> None:
    """Create the atlantis roles and grant them their rights in this database.

    atlantis_enqueuer: enqueue and cancel, through functions only. atlantis_worker: what
    atlantis-supervise needs, syncing declarations included, not migrating.
    atlantis_operator: retry, cancel, pause, resume, prune, and reads. atlantis_reader:
    tide's read commands and a read-only console.
    """
    if as_sql:
        click.echo(roles_sql(), nl=False)
        return
    from atlantis.cli.common import connection, fail

    with connection(ctx, autocommit=True) as conn:
        problem = schema_problem(conn)
        if problem is not None:
            fail(problem)
        granted = apply_roles(conn)
    missing = [role for role in ROLES if role not in granted]
    if granted:
        click.echo(f"granted {', '.join(granted)}", err=True)
    if missing:
        fail(f"missing roles {', '.join(missing)}: this role may not create roles; "
             "run `tide db roles --sql` as a superuser")
