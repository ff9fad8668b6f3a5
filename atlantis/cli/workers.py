"""``tide worker``: the supervisors, and an operator's orders to one of them.

``list`` shows them; ``drain``, ``evict`` and ``resume`` act on one, through the database
(store/orders.py), so they work across hosts. An order is kept for the supervisor's name
(``atlantis-supervise --name``), so that a drained supervisor stays drained across its own
restarts until it is resumed. ``tide`` adds the group with ``main.add_command(worker)``.
"""

from __future__ import annotations

from typing import Any

import click

from atlantis.cli import tables
from atlantis.cli.common import connection, fail, operator_name, print_json, show_rows
from atlantis.presentation import worker_document
from atlantis.store import fleet, orders
from atlantis.store.orders import Ordered, WorkerOrderError


@click.group()
def worker() -> None:
    """Supervisors: list them; drain, evict or resume one."""


@worker.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def worker_list(ctx: click.Context, as_json: bool) -> None:
    """Live supervisors: host, pid, queues, status (running, draining, drained), in-flight
    jobs and their children's memory. Orders kept for a name no supervisor runs under now
    are listed after the table."""
    with connection(ctx) as conn:
        rows = fleet.list_workers(conn)
        standing = orders.standing_orders(conn)
    show_rows(rows, as_json, worker_document, tables.worker_table)
    running = {w.name for w in rows}
    for o in standing:
        if o.name not in running and not as_json:
            click.echo(f"{o.name}: {o.action} order kept (asked by {o.asked_by}); no supervisor "
                       f"of that name runs now: one that starts under it starts drained "
                       f"(tide worker resume {o.name})", err=True)


def _order(ctx: click.Context, worker_id: str, action: str, exit_when_drained: bool) -> Ordered:
    with connection(ctx) as conn:
        try:
            return orders.order(conn, worker_id, action, exit_when_drained=exit_when_drained,
                                by=operator_name())
        except WorkerOrderError as exc:
            fail(str(exc), kind="not_found" if "no supervisor" in str(exc) else "refused")


def _said(w: Ordered, action: str, exit_when_drained: bool, as_json: bool) -> None:
    if as_json:
        doc: dict[str, Any] = {"id": w.id, "name": w.name, "order": action,
                               "exit": exit_when_drained, "silent": w.silent,
                               "in_flight": w.in_flight}
        print_json(doc)
        return
    if w.silent:
        click.echo(f"supervisor {w.id} is silent: the {action} is recorded; it obeys if it "
                   f"wakes, and its rows are released when their leases end, not sooner")
        return
    then = "then exits" if exit_when_drained else f"then stays up, idle, until tide worker " \
        f"resume {w.name}"
    if action == "evict":
        click.echo(f"supervisor {w.id} ({w.name}): evicted; its {w.in_flight} attempts in "
                   f"flight are stopped and their rows given back; it claims nothing, {then}")
    else:
        click.echo(f"supervisor {w.id} ({w.name}): draining; its {w.in_flight} attempts in "
                   f"flight finish, it claims nothing new, {then}")


@worker.command("drain")
@click.argument("worker_id", metavar="ID")
@click.option("--exit", "exit_when_drained", is_flag=True,
              help="Exit once drained, instead of staying up idle (a restarted supervisor of "
                   "the same name still starts drained).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def worker_drain(ctx: click.Context, worker_id: str, exit_when_drained: bool,
                 as_json: bool) -> None:
    """Let the supervisor ID (an id or a name, from tide worker list) finish its attempts in
    flight and claim nothing new; it then stays up and idle ("drained"), across its own
    restarts, until tide worker resume."""
    w = _order(ctx, worker_id, "drain", exit_when_drained)
    _said(w, "drain", exit_when_drained, as_json)


@worker.command("evict")
@click.argument("worker_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def worker_evict(ctx: click.Context, worker_id: str, as_json: bool) -> None:
    """Stop the attempts of the supervisor ID now, as a drain timeout does (their rows given
    back, unspent); it is then drained. A silent supervisor obeys when it wakes; its leases
    rule meanwhile."""
    w = _order(ctx, worker_id, "evict", False)
    _said(w, "evict", False, as_json)


@worker.command("resume")
@click.argument("worker_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def worker_resume(ctx: click.Context, worker_id: str, as_json: bool) -> None:
    """Lift the drain or eviction of the supervisor ID (an id or a name): it claims again."""
    with connection(ctx) as conn:
        try:
            name = orders.resume(conn, worker_id, by=operator_name())
        except WorkerOrderError as exc:
            fail(str(exc), kind="not_found")
    if as_json:
        print_json({"worker": worker_id, "name": name, "resumed": name is not None})
    elif name is None:
        click.echo(f"supervisor {worker_id} was not drained: nothing to resume")
    else:
        click.echo(f"supervisor {name}: resumed, claiming again")
