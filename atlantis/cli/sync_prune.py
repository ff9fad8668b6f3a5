"""``tide db sync --prune``: what ``tide db sync`` reports and does with ``--prune``.

The rules (whose declarations, what keeps one) are :mod:`atlantis.store.prune`'s; this
module says them one line each on stdout, and exits 1 when anything was kept.
"""

from __future__ import annotations

import sys

import click

import atlantis
from atlantis.cli.common import connection
from atlantis.cli.escape import safe
from atlantis.store import migrate, sync
from atlantis.store import prune as store


def sync_prune(ctx: click.Context, registry: atlantis.Registry, yes: bool,
               extra: tuple[str, ...]) -> None:
    """Without ``yes``: print the plan, change nothing (no sync either). With ``yes``: sync,
    then remove the removable declarations in one transaction and print what happened.
    Exit 1 when a declaration was kept for a reason, else 0."""
    jobs = sorted(registry.decls)
    workflows = sorted(registry.workflows)
    namespaces = sorted({*store.namespaces_of([*jobs, *workflows]), *extra})
    with connection(ctx, autocommit=True, deadline=False) as conn:
        if yes:
            migrate(conn)
            sync(conn, list(registry.decls.values()), registry.workflows.values())
            click.echo(f"synced {len(registry.decls)} declarations", err=True)
            decisions = store.prune(conn, namespaces, jobs, workflows)
        else:
            decisions = store.plan(conn, namespaces, jobs, workflows)
    scope = ", ".join(namespaces) or "none"
    if not decisions:
        click.echo(f"nothing to prune: every declaration of namespace {scope} is declared",
                   err=True)
    for d in decisions:
        if d.removable:
            click.echo(f"{'removed' if yes else 'would remove'} {d.kind} {safe(d.name)}")
        else:
            click.echo(f"kept {d.kind} {safe(d.name)}: {safe('; '.join(d.reasons))}")
    if not yes and decisions:
        click.echo("dry run: nothing changed; --yes removes the ones above that may go",
                   err=True)
    if any(not d.removable for d in decisions):
        sys.exit(1)
